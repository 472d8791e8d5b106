"""Response scoring (`scoring`) and the rule files it reads (`rules/`).

Used by the proxy (live response-behaviour metrics) and by the boundary probes
(census, probe, rescore); it imports nothing above `trace`.
"""
