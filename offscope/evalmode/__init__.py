"""Eval mode: the scope-conformance grid.

case.py and cases/ (the eval cases), world.py (the fixture world), agent.py (the
reference agent), sim/ (the simulated model and its dispositions), harness.py (CA,
loopback servers, embedded proxy, bounded workers; shared with the boundary
probes), grid.py (cases x cells x repetitions) and merge.py (shards of one grid),
report/ (results.json and its rendering) and stats/ (the statistics they use).
"""
