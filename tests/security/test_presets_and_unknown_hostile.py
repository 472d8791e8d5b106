"""Hostile end-to-end tests for two holes of the enforce boundary, with real processes.

1. A file can no longer switch enforcement off. `offscope proxy --policy
   enforce` runs in a working directory that holds a planted file `enforce`
   (`mode: shadow`) and a folder `shadow`: the enforce preset is in force
   (an out-of-scope act never reaches the upstream, which records what it
   answered), also after the planted file changes and the proxy hot-reloads.
   `offscope mcp --policy shadow` starts in a directory with a folder named
   `shadow`; `offscope mcp --policy enforce` next to a planted `enforce` blocks.

2. Unknown is not in scope. `offscope mcp` in front of the real
   `@modelcontextprotocol/server-filesystem` (installed from npm into a
   cache; skipped, with the reason, when npm or the registry is not there)
   and in front of a FastMCP server with the same tools that records every
   call it receives. With the ledger the docs used to show (it reads only
   `{args.path}`), `move_file` out of the named tree is refused under enforce
   and the file stays where it was; `read_multiple_files` with an
   out-of-tree path is refused under `block_at: investigate`; a shadow run of
   the same move moves the file (the server would have done it). With the
   docs' ledger now (it reads every file argument) the same calls are out of
   scope by their targets. Asserted on the disk, on what the server received
   and on the trace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support.hostile import ScriptedUpstream
from tests.support.sidecar_kit import LEDGER_YAML, ProxyProcess, events, of_type
from tests.support.stdio_kit import REPO, env

pytestmark = pytest.mark.timeout(300)

PLANTED = "schema: offscope.policy/1\nid: planted\nmode: shadow\n"


def plant(cwd: Path) -> Path:
    """What an agent that can write to the server's directory leaves there."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "enforce").write_text(PLANTED)
    (cwd / "shadow").mkdir()
    return cwd


def wait_for(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def log_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


# -- 1. presets are names, files are paths ---------------------------------------


def answer(method: str, path: str, headers: dict[str, str], body: bytes):
    return 200, {"content-type": "application/json"}, b'{"ok":true}'


def test_proxy_enforce_preset_survives_a_planted_file_and_a_reload(tmp_path, confdir, monkeypatch):
    cwd = plant(tmp_path / "agent-writable")
    monkeypatch.chdir(cwd)  # the proxy subprocess starts here
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    with (
        ScriptedUpstream(answer) as up,
        ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            policy="enforce",
            routes=up.routes("crm.acme.test"),
            confdir=confdir,
        ) as proxy,
        httpx.Client(proxy=proxy.proxy_url("run-1"), timeout=30) as agent,
    ):
        assert proxy.control("GET", "/readyz").json()["policy"] == "enforce"
        inside = agent.post("http://crm.acme.test/customers/4411", json={"note": "ok"})
        outside = agent.post("http://crm.acme.test/customers/9999", json={"refund": 1})
        assert inside.status_code == 200 and outside.status_code == 403

        # The agent rewrites its planted file, then the ledger changes: the proxy
        # reloads (the ledger's new id shows it did) and enforce stays in force.
        (cwd / "enforce").write_text(PLANTED.replace("planted", "planted-again"))
        edited = ledger.with_suffix(".tmp")  # replaced whole: a reload never reads half a file
        edited.write_text(LEDGER_YAML.replace("id: sidecar-e2e", "id: sidecar-reloaded"))
        edited.replace(ledger)
        ready = lambda: proxy.control("GET", "/readyz").json()  # noqa: E731
        assert wait_for(lambda: ready()["ledger"] == "sidecar-reloaded", 60), proxy.stderr()[-2000:]
        assert ready()["policy"] == "enforce"
        with httpx.Client(proxy=proxy.proxy_url("run-2"), timeout=30) as later:
            again = later.post("http://crm.acme.test/customers/9999", json={"refund": 2})
        assert again.status_code == 403
        answered = up.wait_answered(1)
        stderr = proxy.stderr()

    assert answered == ["/customers/4411"]  # neither out-of-scope act reached the upstream
    logs = log_lines(stderr)
    loaded = [r for r in logs if r.get("event") == "policy_loaded"]
    assert loaded and loaded[0]["source"] == "preset enforce" and loaded[0]["policy"] == "enforce"
    assert not [r for r in logs if r.get("event") == "reloaded" and r.get("file") == "policy"]
    assert "policy enforce (enforce; preset enforce" in stderr  # the banner
    trace = events(proxy.trace)
    starts = of_type(trace, "run_start")
    assert {s["run"] for s in starts} == {"run-1", "run-2"}
    assert all(
        s["policy"] == "enforce" and s["policy_source"].startswith("preset enforce (")
        for s in starts
    )
    blocked = [e for e in of_type(trace, "tool_call") if e["decision"] == "block"]
    assert [(e["run"], e["call"]["scope"]) for e in blocked] == [("run-1", "out"), ("run-2", "out")]


def test_proxy_reads_a_policy_file_only_when_given_as_a_path(tmp_path, confdir, monkeypatch):
    cwd = plant(tmp_path / "ops")
    monkeypatch.chdir(cwd)
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    with (
        ScriptedUpstream(answer) as up,
        ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            policy="./enforce",
            routes=up.routes("crm.acme.test"),
            confdir=confdir,
        ) as proxy,
        httpx.Client(proxy=proxy.proxy_url("run-1"), timeout=30) as agent,
    ):
        assert proxy.control("GET", "/readyz").json()["policy"] == "planted"
        assert agent.post("http://crm.acme.test/customers/9999", json={}).status_code == 200
        answered = up.wait_answered(1)
    assert answered == ["/customers/9999"]  # shadow, as the file says: it was asked for by path
    (start,) = of_type(events(proxy.trace), "run_start")
    assert start["policy_source"].startswith(f"file {cwd / 'enforce'} (")


def test_a_bare_name_that_is_no_preset_exits_2_naming_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(plant(tmp_path / "cwd"))
    (tmp_path / "cwd" / "mine").write_text(PLANTED)
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    for command in (["proxy", "--listen", "127.0.0.1:0", "--control-listen", ""], ["mcp"]):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "offscope.cli",
                *command,
                "--ledger",
                str(ledger),
                "--policy",
                "mine",
                "--",
                "true",
            ]
            if command == ["mcp"]
            else [
                sys.executable,
                "-m",
                "offscope.cli",
                *command,
                "--ledger",
                str(ledger),
                "--policy",
                "mine",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(),
        )
        assert proc.returncode == 2, proc.stderr
        assert (
            "not a preset" in proc.stderr
            and "enforce-strict" in proc.stderr
            and "./mine" in proc.stderr
        )


STDIO_LEDGER = """\
schema: offscope.ledger/1
id: stdio-files
targets:
  paths: ["/srv/app", "/srv/app/**"]
extract:
  - match: {source: mcp}
    targets: {path: "{args.path}"}
"""


async def _stdio(args: list[str], cwd: Path, calls: list[tuple[str, dict]]) -> list[Any]:
    params = StdioServerParameters(command=sys.executable, args=args, env=env(), cwd=str(cwd))
    with open(os.devnull, "w") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            await s.list_tools()
            return [await s.call_tool(name, arguments) for name, arguments in calls]


def _wrapper(ledger: Path, trace: Path, policy: str, record: Path) -> list[str]:
    server = REPO / "tests" / "support" / "stdio_server.py"
    return [
        "-m", "offscope.cli", "mcp", "--ledger", str(ledger), "--trace", str(trace),
        "--log-level", "warning", "--policy", policy, "--run", "stdio-1",
        "--", sys.executable, str(server), str(record),
    ]  # fmt: skip


@pytest.mark.parametrize("policy", ["shadow", "enforce"])
async def test_mcp_starts_with_the_preset_next_to_planted_files(tmp_path, policy):
    cwd = plant(tmp_path / "server-dir")
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(STDIO_LEDGER)
    trace, record = tmp_path / "trace.jsonl", tmp_path / "received.jsonl"
    results = await _stdio(
        _wrapper(ledger, trace, policy, record),
        cwd,
        [("read_file", {"path": "/srv/app/a"}), ("delete_file", {"path": "/srv/legacy/x"})],
    )
    received = [json.loads(line) for line in record.read_text().splitlines()]
    deleted = [r["path"] for r in received if r.get("tool") == "delete_file"]
    assert not results[0].isError
    (start,) = of_type(events(trace), "run_start")
    assert start["policy"] == policy and start["policy_source"].startswith(f"preset {policy} (")
    decisions = [e["decision"] for e in of_type(events(trace), "tool_call")]
    if policy == "enforce":  # the planted `enforce` (mode: shadow) was not read
        assert results[1].isError and results[1].content[0].text.startswith("HTTP 403: ")
        assert deleted == [] and decisions == ["allow", "block"]
    else:
        assert deleted == ["/srv/legacy/x"] and decisions == ["allow", "shadow"]


# -- 2. unknown is not in scope: the filesystem server ------------------------------

# A FastMCP server with the filesystem server's tools (the same names and
# arguments, the same effect on disk), recording each call it receives.
FASTMCP_FS = """
import json, shutil, sys
from pathlib import Path
from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

RECORD = Path(sys.argv[1])
ROOT = sys.argv[2]
server = FastMCP("fs-twin")
READ = ToolAnnotations(readOnlyHint=True)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=True)

def note(**call):
    with RECORD.open("a") as f:
        f.write(json.dumps(call) + "\\n")

@server.tool(annotations=READ)
def read_file(path: str) -> str:
    note(tool="read_file", path=path)
    return Path(path).read_text()

@server.tool(annotations=READ)
def read_multiple_files(paths: list[str]) -> str:
    note(tool="read_multiple_files", paths=paths)
    return "\\n---\\n".join(f"{p}:\\n{Path(p).read_text()}" for p in paths)

@server.tool(annotations=WRITE)
def move_file(source: str, destination: str) -> str:
    note(tool="move_file", source=source, destination=destination)
    shutil.move(source, destination)
    return f"Successfully moved {source} to {destination}"

@server.tool(annotations=READ)
def list_allowed_directories() -> str:
    note(tool="list_allowed_directories")
    return "Allowed directories:\\n" + ROOT

server.run("stdio")
"""

NPM_PACKAGE = "@modelcontextprotocol/server-filesystem"


@pytest.fixture(scope="session")
def npm_filesystem_server() -> str:
    """The published server, installed once into a cache directory."""
    cache = Path(
        os.environ.get("OFFSCOPE_TEST_NPM_CACHE")
        or Path.home() / ".cache" / "offscope-tests" / "server-filesystem"
    )
    binary = cache / "node_modules" / ".bin" / "mcp-server-filesystem"
    if binary.exists():
        return str(binary)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("npm/node not installed: cannot install " + NPM_PACKAGE)
    cache.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund", NPM_PACKAGE],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install {NPM_PACKAGE} timed out (no registry?)")
    if proc.returncode != 0 or not binary.exists():
        pytest.skip(f"npm install {NPM_PACKAGE} failed: {proc.stderr[-300:]}")
    return str(binary)


class Files:
    """A tree the ledger names, and a place outside it that the server can also reach."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.tree = self.root / "tree"
        self.outside = self.root / "outside"
        self.tree.mkdir(parents=True)
        self.outside.mkdir()
        for name in ("a.txt", "b.txt", "c.txt"):
            (self.tree / name).write_text(f"{name} in the tree\n")
        (self.outside / "secret.txt").write_text("not yours\n")


@pytest.fixture(params=["npm", "fastmcp"])
def fs_server(request, tmp_path):
    """(command to start the server over `files`, where it records calls or None)."""
    files = Files(tmp_path / "disk")
    record = tmp_path / "received.jsonl"
    if request.param == "npm":
        command = [request.getfixturevalue("npm_filesystem_server"), str(files.root)]
        return files, command, None
    script = tmp_path / "fs_twin.py"
    script.write_text(textwrap.dedent(FASTMCP_FS))
    return files, [sys.executable, str(script), str(record), str(files.root)], record


def docs_filesystem_ledger() -> str:
    text = (REPO / "docs" / "stdio-mcp.md").read_text(encoding="utf-8")
    return (
        text.split("<!-- tested: filesystem_ledger -->", 1)[1]
        .split("```yaml\n", 1)[1]
        .split("```")[0]
    )


def _fs_ledger(tmp_path: Path, text: str, files: Files, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("/srv/app", str(files.tree)))
    return path


async def _fs_session(
    tmp_path: Path, ledger: Path, policy: str, command: list[str], calls: list[tuple[str, dict]]
) -> tuple[list[Any], list[dict[str, Any]]]:
    trace = tmp_path / f"trace-{ledger.stem}-{Path(policy).stem}.jsonl"
    args = [
        "-m", "offscope.cli", "mcp", "--ledger", str(ledger), "--policy", policy,
        "--trace", str(trace), "--log-level", "warning", "--", *command,
    ]  # fmt: skip
    results = await _stdio(args, tmp_path, calls)
    return results, of_type(events(trace), "tool_call")


def _received(record: Path | None) -> list[dict[str, Any]] | None:
    if record is None:
        return None  # the published server records nothing: the disk and the trace tell
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def _refused(result: Any) -> bool:
    return result.isError and result.content[0].text.startswith("HTTP 403: ")


async def test_move_file_out_of_the_tree_is_refused_under_enforce(tmp_path, fs_server):
    files, command, record = fs_server
    ledger = _fs_ledger(tmp_path, STDIO_LEDGER, files, "path-only")  # reads only {args.path}
    move = {"source": str(files.tree / "a.txt"), "destination": str(files.outside / "a.txt")}
    (result,), (row,) = await _fs_session(
        tmp_path, ledger, "enforce", command, [("move_file", move)]
    )

    assert _refused(result)
    assert (files.tree / "a.txt").exists() and not (files.outside / "a.txt").exists()
    assert _received(record) in (None, [])
    assert row["call"]["tool"] == "move_file" and row["call"]["unknown"] is True
    assert (row["call"]["scope"], row["call"]["stage"], row["decision"]) == ("out", "act", "block")
    assert row["reason"].startswith("unknown target")


async def test_the_same_move_under_shadow_moves_the_file(tmp_path, fs_server):
    """The control: without enforce the server does move it (the refusal above is offscope's)."""
    files, command, record = fs_server
    ledger = _fs_ledger(tmp_path, STDIO_LEDGER, files, "path-only")
    move = {"source": str(files.tree / "b.txt"), "destination": str(files.outside / "b.txt")}
    (result,), (row,) = await _fs_session(
        tmp_path, ledger, "shadow", command, [("move_file", move)]
    )

    assert not result.isError
    assert not (files.tree / "b.txt").exists() and (files.outside / "b.txt").exists()
    assert _received(record) in (None, [{"tool": "move_file", **move}])
    assert (row["call"]["unknown"], row["call"]["scope"], row["decision"]) == (True, "in", "allow")


async def test_read_multiple_files_out_of_the_tree_is_refused_at_block_at_investigate(
    tmp_path, fs_server
):
    files, command, record = fs_server
    ledger = _fs_ledger(tmp_path, STDIO_LEDGER, files, "path-only")
    strict = tmp_path / "strict.yaml"  # a policy file, given as a path
    strict.write_text(
        "schema: offscope.policy/1\nid: strict\nmode: enforce\nblock_at: investigate\n"
    )
    paths = [str(files.tree / "c.txt"), str(files.outside / "secret.txt")]
    results, rows = await _fs_session(
        tmp_path,
        ledger,
        str(strict),
        command,
        [
            ("read_file", {"path": str(files.tree / "c.txt")}),
            ("read_multiple_files", {"paths": paths}),
        ],
    )

    assert not results[0].isError and "c.txt in the tree" in results[0].content[0].text
    assert _refused(results[1]) and "not yours" not in results[1].content[0].text
    received = _received(record)
    assert received is None or [r["tool"] for r in received] == ["read_file"]
    assert [
        (r["call"]["tool"], r["call"]["scope"], r["call"]["stage"], r["decision"]) for r in rows
    ] == [
        ("read_file", "in", "investigate", "allow"),
        ("read_multiple_files", "out", "investigate", "block"),
    ]
    assert rows[1]["call"]["unknown"] is True and "unknown" not in rows[0]["call"]


async def test_the_docs_ledger_reads_every_file_argument(tmp_path, fs_server):
    files, command, record = fs_server
    ledger = _fs_ledger(tmp_path, docs_filesystem_ledger(), files, "docs")
    move = {"source": str(files.tree / "a.txt"), "destination": str(files.outside / "a.txt")}
    paths = [str(files.tree / "c.txt"), str(files.outside / "secret.txt")]
    results, rows = await _fs_session(
        tmp_path,
        ledger,
        "enforce-strict",
        command,
        [
            ("list_allowed_directories", {}),
            ("read_multiple_files", {"paths": paths[:1]}),
            ("read_multiple_files", {"paths": paths}),
            ("move_file", move),
        ],
    )

    assert not results[0].isError and not results[1].isError
    assert _refused(results[2]) and _refused(results[3])
    assert (files.tree / "a.txt").exists() and not (files.outside / "a.txt").exists()
    received = _received(record)
    assert received is None or [r["tool"] for r in received] == [
        "list_allowed_directories",
        "read_multiple_files",
    ]
    assert [(r["call"]["tool"], r["call"]["scope"], r["decision"]) for r in rows] == [
        ("list_allowed_directories", "in", "allow"),  # `targets: {}`: names no file
        ("read_multiple_files", "in", "allow"),
        ("read_multiple_files", "out", "block"),
        ("move_file", "out", "block"),
    ]
    assert not any(r["call"].get("unknown") for r in rows)  # every file argument is read
    targets = {(t["value"], t["in_scope"]) for t in rows[3]["call"]["targets"]}
    assert targets == {(move["source"], True), (move["destination"], False)}
    assert {(t["value"], t["in_scope"]) for t in rows[2]["call"]["targets"]} == {
        (paths[0], True),
        (paths[1], False),
    }
