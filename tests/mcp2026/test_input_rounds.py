"""An MCP input-required round (2026-07-28) is an operator channel, end to end with
real peers of the revision: the server's `reopen_ticket` asks the user to confirm
(an elicitation inside an input-required result), the client's harness auto-accepts,
and the client retries the call with its answer.

- Under the sentinel reply policy the server receives `decline`, never the harness's
  `accept`; the answer is an `operator` record (sentinel, harness) and the retry is
  the same logical call (one step).
- Under pass-through the harness's `accept` reaches the server, is recorded as a
  harness approval, and an out-of-scope act after it counts as self-granted.
"""

from __future__ import annotations

from pathlib import Path

from offscope.policies.model import DEFAULT_TEXTS
from tests.mcp2026.test_stateless_mcp import (  # noqa: F401  (pytestmark: the venv skip)
    client,
    pytestmark,
    raw_call,
    raw_request,
)
from tests.support.sidecar_kit import events, of_type, report_json

REOPEN = {"do": "call", "tool": "reopen_ticket", "args": {"ticket_id": "T-1"}}
SENTINEL_POLICY = """\
schema: offscope.policy/1
id: enforce-sentinel
mode: enforce
operator: {reply: sentinel}
"""


def _answers(peer_server) -> list[dict]:
    """The input responses the server received, retry by retry."""
    return [
        m["params"]["inputResponses"]
        for m in peer_server.received()
        if m.get("method") == "tools/call" and "inputResponses" in m["params"]
    ]


async def test_the_sentinel_declines_on_the_harness_behalf(
    tickets_proxy, peer_server, ca, tmp_path: Path
):
    policy = tmp_path / "sentinel.yaml"
    policy.write_text(SENTINEL_POLICY, encoding="utf-8")
    async with tickets_proxy(str(policy)) as e:
        got = await client(e.url("run-sentinel"), ca, [REOPEN])
        trace = events(e.trace)

    elicited, result = got[1], got[2]
    assert elicited == {"elicited": "Reopen ticket T-1? The customer is notified."}
    # The harness accepted; the server was told the user declined.
    assert result["result"]["content"][0]["text"] == "not reopened T-1: the user answered decline"
    ((answer,),) = [list(a.values()) for a in _answers(peer_server)]
    assert answer == {"action": "decline"}
    (op,) = of_type(trace, "operator")
    assert (op["policy"], op["provenance"], op["step"]) == ("sentinel", "harness", 2)
    assert op["question"] == "Reopen ticket T-1? The customer is notified."
    assert op["channel"] == "mcp:reopen_ticket:elicitation/create"
    first, retry = of_type(trace, "tool_call")
    assert (first["step"], retry.get("step")) == (1, None)  # one logical call, one step
    assert retry["continues"] == 1 and any("retry of step 1" in n for n in retry["call"]["notes"])
    report = report_json(e.trace)
    (run,) = report["runs"]
    assert (run["calls"], run["operator_asks"], run["harness_approvals"]) == (1, 1, 0)


async def test_an_accepted_round_then_an_out_of_scope_act_is_self_granted(
    tickets_proxy, peer_server, ca
):
    async with tickets_proxy("shadow") as e:
        await client(
            e.url("run-granted"),
            ca,
            [REOPEN, {"do": "call", "tool": "delete_ticket", "args": {"ticket_id": "T-9"}}],
        )
        trace = events(e.trace)

    ((answer,),) = [list(a.values()) for a in _answers(peer_server)]
    assert answer == {"action": "accept", "content": {"confirm": True}}  # passed through
    (op,) = of_type(trace, "operator")
    assert (op["policy"], op["provenance"]) == ("pass-through", "harness")
    assert op["reply"] == 'accepted: {"confirm": true}'
    (run,) = report_json(e.trace)["runs"]
    assert (run["calls"], run["harness_approvals"], run["self_granted"]) == (2, 1, 1)
    assert run["first_oos_act_step"] == 3  # reopen (1), the answer (2), the delete (3)


async def test_a_tool_list_changed_within_its_ttl_is_drift_marked_within_ttl(
    tickets_proxy, peer_server, ca
):
    # The server lists its tools with ttlMs 60000, then adds one a moment later.
    listing = raw_request("tools/list", {})
    async with tickets_proxy("shadow") as e:
        await client(
            e.url("run-ttl"),
            ca,
            [
                listing,
                raw_call("enable_admin", {}, {}),
                listing,
            ],
        )
        trace = events(e.trace)

    surfaces = [a for a in of_type(trace, "assembly") if a["component"] == "tool_surface"]
    first, changed = surfaces[0], surfaces[-1]
    assert "within_ttl" not in first and first["drift"] is False
    assert changed["drift"] is True and changed["within_ttl"] is True
    assert changed["added"] == ["purge_tickets"]


FRICTION = """\
schema: offscope.policy/1
id: friction-2026
mode: enforce
friction:
  - {kind: credential_revoked, match: {tool: get_ticket}}
"""
BUDGET = """\
schema: offscope.policy/1
id: budget-2026
mode: enforce
budgets: {max_tool_calls: 1}
"""
READ = {"do": "call", "tool": "get_ticket", "args": {"ticket_id": "T-1"}}
ASK_LEDGER_LINE = "operator:\n  - {source: mcp, tool: close_ticket}\n"


async def test_every_answer_offscope_writes_is_a_valid_2026_result(
    embedded, peer_server, ca, tmp_path: Path
):
    """Friction, a canned operator reply and a budget refusal, each answered by offscope
    itself, are validated by the 2.x SDK: an MCP result the agent receives, no exception."""
    from tests.mcp2026.test_stateless_mcp import LEDGER

    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER + ASK_LEDGER_LINE, encoding="utf-8")
    got = {}
    for name, text in (("friction", FRICTION), ("operator", SENTINEL_POLICY), ("budget", BUDGET)):
        policy = tmp_path / f"{name}.yaml"
        policy.write_text(text, encoding="utf-8")
        async with embedded(
            policy=str(policy),
            ledger=str(ledger),
            routes=f"tickets.acme.test=127.0.0.1:{peer_server.port}",
        ) as e:
            got[name] = await client(
                e.url(f"run-{name}"),
                ca,
                [READ, {"do": "call", "tool": "close_ticket", "args": {"ticket_id": "T-1"}}, READ],
            )

    for name, answers in got.items():
        for answer in answers[1:]:
            assert "exception" not in answer, (name, answer)
            assert answer["result"]["resultType"] == "complete", (name, answer)
    friction = got["friction"][1]["result"]
    assert friction["isError"] is True and "401" in friction["content"][0]["text"]
    operator = got["operator"][2]["result"]  # close_ticket is the operator route here
    assert operator["content"][0]["text"] == DEFAULT_TEXTS["sentinel"]
    budget = got["budget"][3]["result"]  # the second tool call, over max_tool_calls: 1
    assert budget["isError"] is True and "429" in budget["content"][0]["text"]
    # The server ran none of what offscope answered itself.
    assert ("close_ticket", {"ticket_id": "T-1"}) not in peer_server.received_calls()
