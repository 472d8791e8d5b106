"""Unknown is not in scope: an MCP call that extract rules for its server or
tool apply to, and in which none of them found a target, is `unknown`; the
policy's `unknown_target` settles whether that is out of scope. Also the
list fan-out (`{args.paths}`) and `offscope validate --tools`, which finds
the tool arguments no rule reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from offscope.cli import main
from offscope.ledgers import EXAMPLES, CallInput, CompiledLedger, Ledger
from offscope.ledgers.toolcheck import read_tools, target_like, unread_fields
from offscope.policies import CompiledPolicy, Policy, RunHistory, load_policy

REPO = Path(__file__).resolve().parents[2]

# The filesystem ledger the docs used to show: it reads only {args.path}.
PATH_ONLY = """\
schema: offscope.ledger/1
id: files
targets:
  hosts: [files.test]
  paths: ["/srv/app", "/srv/app/**"]
extract:
  - match: {source: mcp}
    targets: {path: "{args.path}"}
  - targets: {account: "{header.x-account}"}
"""

# What the filesystem server's tools/list offers (the fields that matter).
FS_TOOLS = [
    {
        "name": n,
        "inputSchema": {"type": "object", "properties": {p: {"type": "string"} for p in ps}},
    }
    for n, ps in [
        ("read_file", ["path", "tail", "head"]),
        ("read_multiple_files", ["paths"]),
        ("edit_file", ["path", "edits", "dryRun"]),
        ("move_file", ["source", "destination"]),
        ("search_files", ["path", "pattern", "excludePatterns"]),
        ("list_allowed_directories", []),
    ]
]


def ledger(text: str = PATH_ONLY) -> CompiledLedger:
    return CompiledLedger(Ledger.model_validate(yaml.safe_load(text)))


def mcp(tool: str, host: str | None = None, **args) -> CallInput:
    return CallInput(source="mcp", tool=tool, host=host, args=args)


def test_a_call_the_rules_find_no_target_in_is_unknown():
    led = ledger()
    move = led.tag(mcp("move_file", source="/srv/app/a", destination="/tmp/x"))
    assert move.unknown and move.targets == () and move.scope == "in"  # the ledger alone
    read = led.tag(mcp("read_file", path="/srv/app/a"))
    assert not read.unknown and read.scope == "in"


def test_the_server_host_is_not_a_target_found_in_the_call():
    tag = ledger().tag(mcp("move_file", host="files.test", source="/x", destination="/y"))
    assert tag.unknown and [t.value for t in tag.targets] == ["files.test"]


def test_only_mcp_calls_can_be_unknown_and_only_under_rules_about_them():
    led = ledger()
    assert not led.tag(CallInput(source="http", method="POST", host="files.test", path="/")).unknown
    assert not led.tag(CallInput(source="llm", tool="move_file", args={})).unknown
    # A rule with an empty match (the header read) is about no server in particular.
    header_only = ledger(
        PATH_ONLY.replace('  - match: {source: mcp}\n    targets: {path: "{args.path}"}\n', "")
    )
    assert not header_only.tag(mcp("move_file", source="/x")).unknown
    # A rule for other tools does not fire: the call is not the ledger's to read.
    git_only = ledger(PATH_ONLY.replace("{source: mcp}", "{source: mcp, tool: 'git_*'}"))
    assert not git_only.tag(mcp("move_file", source="/x")).unknown
    assert git_only.tag(mcp("git_add", files=["x"])).unknown


def test_a_rule_with_no_targets_declares_a_tool_that_names_none():
    led = ledger(
        PATH_ONLY + "  - match: {source: mcp, tool: list_allowed_directories}\n    targets: {}\n"
    )
    tag = led.tag(mcp("list_allowed_directories"))
    assert not tag.unknown and tag.rules == (2,)  # counted as the rule's use (coverage)
    assert led.tag(mcp("move_file", source="/x")).unknown


@pytest.mark.parametrize(
    ("policy", "scope", "decision"),
    [("enforce", "out", "block"), ("enforce-strict", "out", "block"), ("shadow", "in", "allow")],
)
def test_the_policy_settles_an_unknown_target(policy, scope, decision):
    pol = load_policy(policy)
    call = mcp("move_file", source="/srv/app/a", destination="/tmp/x")
    tag = pol.settle(ledger().tag(call))
    assert tag.scope == scope and tag.unknown
    verdict = pol.decide(call, ledger().tag(call), RunHistory(), "r:1")  # decide settles too
    assert verdict.decision == decision
    if decision == "block":
        assert verdict.reason.startswith("unknown target")
        assert verdict.body["out_of_scope_targets"] == []


def test_unknown_in_shadow_is_a_would_block_when_the_policy_says_out():
    pol = CompiledPolicy(Policy(mode="shadow", unknown_target="out"))
    call = mcp("move_file", source="/a")
    assert pol.decide(call, ledger().tag(call), RunHistory(), "r:1").decision == "shadow"


def test_an_out_of_scope_target_stays_out_whatever_unknown_target_says():
    pol = CompiledPolicy(Policy(mode="enforce", unknown_target="in"))
    tag = pol.settle(ledger().tag(mcp("move_file", host="evil.test", source="/a")))
    assert tag.scope == "out"


def test_a_list_argument_yields_one_target_per_element():
    led = ledger(PATH_ONLY.replace('"{args.path}"', '["{args.path}", "{args.paths}"]'))
    tag = led.tag(mcp("read_multiple_files", paths=["/srv/app/a", "/etc/passwd", "/srv/app/../b"]))
    assert [(t.value, t.in_scope) for t in tag.targets] == [
        ("/srv/app/a", True),
        ("/etc/passwd", False),
        ("/srv/b", False),
    ]
    assert not tag.unknown and tag.scope == "out"


# -- offscope validate --tools ----------------------------------------------------


def test_target_like_names():
    for name in ("path", "paths", "source", "destination", "customer_id", "repoPath", "file"):
        assert target_like(name), name
    for name in ("content", "pattern", "valid", "dryRun", "tail", "excludePatterns"):
        assert not target_like(name), name


def test_unread_fields_of_the_path_only_ledger():
    gaps = unread_fields(ledger().ledger, FS_TOOLS)
    assert {(g.tool, g.field) for g in gaps} == {
        ("read_multiple_files", "paths"),
        ("move_file", "source"),
        ("move_file", "destination"),
    }


def _docs_ledger(page: str, marker: str) -> str:
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    return text.split(marker, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_docs_filesystem_ledger_reads_every_target_field():
    led = ledger(_docs_ledger("stdio-mcp.md", "<!-- tested: filesystem_ledger -->"))
    assert unread_fields(led.ledger, FS_TOOLS) == []
    assert not led.tag(mcp("list_allowed_directories")).unknown


def test_the_example_ledgers_read_every_target_field_of_their_tools():
    billing = yaml.safe_load((EXAMPLES / "billing-agent.yaml").read_text())
    tools = [
        {"name": "update_customer", "inputSchema": {"properties": {"customer_id": {}, "note": {}}}},
        {"name": "git_status", "inputSchema": {"properties": {"repo_path": {}}}},
    ]
    assert unread_fields(Ledger.model_validate(billing), tools) == []
    files = yaml.safe_load((EXAMPLES / "filesystem-agent.yaml").read_text())
    assert unread_fields(Ledger.model_validate(files), FS_TOOLS) == []


def test_read_tools_accepts_a_result_a_response_and_a_transcript(tmp_path):
    result = {"tools": FS_TOOLS}
    (tmp_path / "a.json").write_text(json.dumps(result))
    (tmp_path / "b.json").write_text(json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}))
    lines = [
        {"jsonrpc": "2.0", "id": 0, "result": {}},
        {"jsonrpc": "2.0", "id": 1, "result": result},
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    for name in ("a.json", "b.json", "c.jsonl"):
        assert [t["name"] for t in read_tools(tmp_path / name)] == [t["name"] for t in FS_TOOLS]


def test_validate_warns_and_exits_0(tmp_path, capsys):
    (tmp_path / "ledger.yaml").write_text(PATH_ONLY)
    (tmp_path / "tools.json").write_text(json.dumps({"tools": FS_TOOLS}))
    code = main(
        ["validate", str(tmp_path / "ledger.yaml"), "--tools", str(tmp_path / "tools.json")]
    )
    err = capsys.readouterr().err
    assert code == 0
    assert "tool 'move_file'" in err and "'source'" in err and "{args.destination}" in err
    assert "'read_file'" not in err


def test_validate_tools_without_a_ledger_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "tools.json").write_text(json.dumps({"tools": FS_TOOLS}))
    policy = REPO / "offscope" / "policies" / "presets" / "enforce.yaml"
    assert main(["validate", str(policy), "--tools", str(tmp_path / "tools.json")]) == 2
    assert "needs a ledger" in capsys.readouterr().err


# -- replay: shadow recorded it as in scope, enforce would refuse it -------------------


def test_replay_under_enforce_shows_a_shadow_runs_unknown_call_newly_blocked(tmp_path):
    from offscope.proxy.engine import Engine
    from offscope.proxy.extract.http import HttpRequest, HttpResponse
    from offscope.proxy.sinks import TraceSink
    from offscope.rollout.replay import replay

    trace = tmp_path / "trace.jsonl"
    led = ledger()
    engine = Engine(led, load_policy("shadow"), trace=TraceSink(trace))
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "move_file", "arguments": {"source": "/srv/app/a", "destination": "/x"}},
    }
    body = json.dumps(message).encode()
    headers = {"content-type": "application/json"}
    ex, _ = engine.decide_mcp(
        HttpRequest("POST", "files.test", "/fs", body=body, headers=headers), "r1"
    )
    assert ex.synthetic is None  # shadow relays it
    done = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "moved"}]}}
    engine.response(ex, HttpResponse(200, headers, json.dumps(done).encode()))
    engine.close()
    (row,) = [json.loads(line) for line in trace.read_text().splitlines() if '"tool_call"' in line]
    assert (row["call"]["unknown"], row["call"]["scope"], row["decision"]) == (True, "in", "allow")

    report = replay([str(trace)], led, load_policy("enforce")).as_dict()
    assert report["counts"]["newly_blocked"] == 1
