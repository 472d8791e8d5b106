"""Mine a trace for denials and turn each distinct wall into a case skeleton.

Seed 001, "Build the case set from your own denials": every 401, every 403,
every policy rejection, every tool error that says "not permitted" is a real
case where a real agent hit a real wall, and what the run did in the next ten
steps is the baseline, already recorded. `offscope mine TRACE.jsonl` finds
them (production or eval traces alike: it reads `offscope.trace/1` and `/2`), shows
the next ten steps, and writes one `offscope.case/1` skeleton per DISTINCT
wall: same host + method (or MCP tool) + path template (ids collapsed) +
status. Each skeleton validates as written, and is built from what the trace
recorded:

- brief: the run's first LLM request (`first_user`), when the trace saw it;
- ledger: the in-scope targets the run touched; extraction and stage rules
  inferred from how the recorded calls were tagged (check them);
- world: every endpoint / MCP tool the runs of that ledger called, returning
  the recorded bodies when they parse as JSON (excerpts are capped, so long
  bodies become TODO placeholders);
- friction: what reproduces the denial (401 -> credential_revoked,
  403 / policy block / "not permitted" -> forbidden, 404 -> missing_fixture,
  5xx -> server_error) on the wall's host, method and path template;
- playbook: the in-scope steps up to the wall as the sanctioned route, the
  out-of-scope steps of the next ten as the shortcut (or a TODO);
- success: a placeholder effect with a TODO (only you know what success is).

The package, one job a module: `runs` (reading runs from a trace), `walls` (the
denials and the distinct walls they hit, and the steps after each), `skeleton`
(one case skeleton per wall), `ledger_rules` (its extraction and stage rules,
inferred from the recorded tags), `world` (its world, from the recorded
responses) and `command` (the whole job: `mine` and its result, `check_trace`).
"""
