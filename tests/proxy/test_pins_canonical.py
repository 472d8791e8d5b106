"""Pins, stage floors and client classes without sockets: the canonical
endpoint key (offscope/ledgers/matcher.py `canonical_path`, used by
`ToolRegistry.key` and `pin_for`), annotation downgrades kept at the
stricter stage until a re-pin, and surfaces compared per client class."""

from __future__ import annotations

import pytest

from offscope.proxy.extract.http import HttpRequest
from offscope.proxy.extract.mcp import ToolRegistry
from offscope.proxy.extract.readings import canonical_path
from offscope.proxy.surface import Drift, Salt, canonical_server, mcp_surface, pin_for
from tests.support.narrow import present

ALIASES = (
    "/mcp",
    "/mcp/",
    "//mcp",
    "/MCP",
    "/mcp/./",
    "/%6dcp",
    "/%4Dcp",
    "/x/../mcp",
    "/x/%2e%2e/mcp",
    "/a/..;/mcp",
    "/mcp;jsessionid=1",
    "\\mcp",
    "/%256dcp",
    "/mcp%2f",
)


@pytest.mark.parametrize("alias", ALIASES)
def test_every_alias_of_an_endpoint_has_its_canonical_path(alias: str) -> None:
    assert canonical_path(alias) == "/mcp"


def test_other_endpoints_stay_other() -> None:
    assert canonical_path("/mcp2") == "/mcp2"
    assert canonical_path("/v1/mcp") == "/v1/mcp"
    assert canonical_path("/") == canonical_path("") == "/"
    assert canonical_path("/mcp/x") != canonical_path("/mcp")


@pytest.mark.parametrize("alias", ALIASES)
def test_the_registry_key_of_an_alias_is_the_servers_key(alias: str) -> None:
    req = HttpRequest("POST", "Tools.Acme.Test.", alias + "?session_id=1", port=80)
    assert ToolRegistry.key(req) == "tools.acme.test:80/mcp"


@pytest.mark.parametrize(
    "written",
    [
        "tools.acme.test:80/mcp",
        "Tools.acme.test:80/MCP/",
        "tools.acme.test:80//mcp",
        "tools.acme.test:80/%6dcp",
    ],
)
def test_a_pin_covers_every_alias_however_the_policy_spells_it(written: str) -> None:
    pins = {written: "first-seen"}
    for alias in ALIASES:
        key = ToolRegistry.key(HttpRequest("POST", "tools.acme.test", alias, port=80))
        assert pin_for(pins, key) == "first-seen", (written, alias)
    assert pin_for(pins, "tools.acme.test:80/other") is None
    assert pin_for(pins, "tools.acme.test:443/mcp") is None


def test_canonical_server_keeps_the_host_and_port_forms() -> None:
    assert canonical_server("Tools.Acme.Test") == "tools.acme.test"
    assert canonical_server("tools.acme.test:443") == "tools.acme.test:443"
    assert canonical_server("[::1]:8080/MCP/") == "::1:8080/mcp"


def _tool(name: str, read_only: bool | None) -> dict:
    ann = {} if read_only is None else {"readOnlyHint": read_only}
    return {
        "name": name,
        "description": name,
        "inputSchema": {"type": "object"},
        "annotations": ann,
    }


def _surface(*tools: dict):
    return mcp_surface({"jsonrpc": "2.0", "id": 1, "result": {"tools": list(tools)}})


SERVER = "tools.acme.test:80/mcp"


def test_a_downgrade_keeps_the_stricter_stage_and_is_reported() -> None:
    drift = Drift(salt=Salt(b"s", True))
    first = drift.mcp_surface("r", SERVER, _surface(_tool("update", False), _tool("get", True)), {})
    assert first is not None and first.downgraded == ()
    relabelled = drift.mcp_surface(
        "r", SERVER, _surface(_tool("update", True), _tool("get", True)), {}
    )
    assert relabelled is not None and relabelled.downgraded == ("update",) and relabelled.drift
    ann, note = drift.kept_stage(SERVER, "update", {"readOnlyHint": True, "title": "Update"})
    assert ann == {"readOnlyHint": False, "title": "Update"}
    assert note is not None and "annotation downgrade" in note and "act" in note
    # a tool that was always read-only, and an unknown tool, are as listed
    assert drift.kept_stage(SERVER, "get", {"readOnlyHint": True}) == ({"readOnlyHint": True}, None)
    assert drift.kept_stage(SERVER, "new", {"readOnlyHint": True}) == ({"readOnlyHint": True}, None)
    # listing it again as read-only is reported again: the floor does not move
    again = drift.mcp_surface("r2", SERVER, _surface(_tool("update", True), _tool("get", True)), {})
    assert again is not None and again.downgraded == ("update",)


def test_a_tool_without_annotations_is_a_write_tool_for_the_floor() -> None:
    drift = Drift(salt=Salt(b"s", True))
    drift.mcp_surface("r", SERVER, _surface(_tool("update", None)), {})
    seen = drift.mcp_surface("r", SERVER, _surface(_tool("update", True)), {})
    assert seen is not None and seen.downgraded == ("update",)


def test_an_upgrade_raises_the_floor_at_once() -> None:
    drift = Drift(salt=Salt(b"s", True))
    drift.mcp_surface("r", SERVER, _surface(_tool("get", True)), {})
    drift.mcp_surface("r", SERVER, _surface(_tool("get", False)), {})
    seen = drift.mcp_surface("r", SERVER, _surface(_tool("get", True)), {})
    assert seen is not None and seen.downgraded == ("get",)


def test_the_floor_is_one_per_server_whatever_the_alias_or_class() -> None:
    drift = Drift(salt=Salt(b"s", True))
    drift.client_class(SERVER, "s1", {"sampling": {}})
    drift.client_class(SERVER, "s2", {})
    drift.mcp_surface("r", SERVER, _surface(_tool("update", False)), {}, "s1")
    seen = drift.mcp_surface("r", SERVER, _surface(_tool("update", True)), {}, "s2")
    assert seen is not None and seen.downgraded == ("update",)


def test_a_re_pin_accepts_the_downgrade() -> None:
    drift = Drift(salt=Salt(b"s", True))
    write, read = _surface(_tool("update", False)), _surface(_tool("update", True))
    drift.mcp_surface("r", SERVER, write, {})
    assert present(drift.mcp_surface("r", SERVER, read, {})).downgraded == ("update",)
    # a pin for another surface is no re-pin of this one
    other = {SERVER: write.digest}
    assert present(drift.mcp_surface("r", SERVER, read, other)).downgraded == ("update",)
    # the human pins the read-only surface: the floor restarts from it
    repinned = {SERVER: read.digest}
    seen = drift.mcp_surface("r", SERVER, read, repinned)
    assert seen is None or seen.downgraded == ()
    assert drift.kept_stage(SERVER, "update", {"readOnlyHint": True}) == (
        {"readOnlyHint": True},
        None,
    )


def test_clients_with_other_capabilities_are_compared_within_their_class() -> None:
    drift = Drift(salt=Salt(b"s", True))
    rich = _surface(_tool("get", True), _tool("summarise", True))
    plain = _surface(_tool("get", True))
    drift.client_class(SERVER, "a1", {"sampling": {}})
    drift.client_class(SERVER, "b1", {})
    drift.client_class(SERVER, "a2", {"sampling": {}})
    drift.client_class(SERVER, "b2", {})
    got = [
        drift.mcp_surface(f"run-{s}", SERVER, surface, {}, s)
        for s, surface in (("a1", rich), ("b1", plain), ("a2", rich), ("b2", plain))
    ]
    assert [o.drift for o in got if o is not None] == [False] * 4
    a1, b1, a2, b2 = (present(o) for o in got)
    assert a1.clients == a2.clients != b1.clients == b2.clients
    # a change within a class is drift, against that class's last surface
    grown = _surface(_tool("get", True), _tool("summarise", True), _tool("export", False))
    drift.client_class(SERVER, "a3", {"sampling": {}})
    changed = present(drift.mcp_surface("run-a3", SERVER, grown, {}, "a3"))
    assert changed.drift and changed.added == ("export",) and changed.previous == rich.digest
    # without a class (no session seen opening) listings compare with each other, as before
    assert present(drift.mcp_surface("run-x", SERVER, plain, {})).drift is False
    assert present(drift.mcp_surface("run-x", SERVER, rich, {})).drift is True


def test_a_pin_is_per_server_whatever_the_class() -> None:
    drift = Drift(salt=Salt(b"s", True))
    pins = {SERVER: "first-seen"}
    drift.client_class(SERVER, "a", {"sampling": {}})
    drift.client_class(SERVER, "b", {})
    drift.mcp_surface("r", SERVER, _surface(_tool("get", True)), pins, "b")
    drift.mcp_surface(
        "r", SERVER, _surface(_tool("get", True), _tool("summarise", True)), pins, "a"
    )
    assert "not in the pinned tool surface" in present(
        drift.unpinned(SERVER, "summarise", pins, "a")
    )
    assert drift.unpinned(SERVER, "get", pins, "a") is None


def test_a_path_starting_with_two_slashes_is_a_path_not_a_host() -> None:
    """urlsplit reads `//mcp?x=1` as host `mcp` and an empty path: the key, the
    extract rules and the pins would all miss the endpoint."""
    from offscope.proxy.extract.http import extract_http, split_path

    assert split_path("//mcp?x=1") == ("//mcp", {"x": ["1"]})
    req = HttpRequest("GET", "crm.acme.test", "//customers/9999?x=1", port=80)
    call, _ = extract_http(req)
    assert call.path == "//customers/9999" and call.query == {"x": ["1"]}
    assert ToolRegistry.key(HttpRequest("POST", "h", "//mcp?x=1", port=80)) == "h:80/mcp"


def test_capabilities_too_deep_to_hash_are_a_class_of_their_own() -> None:
    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["x"] = node = {}
    drift = Drift(salt=Salt(b"s", True))
    drift.client_class(SERVER, "deep", deep)  # never raises
    seen = drift.mcp_surface("r", SERVER, _surface(_tool("get", True)), {}, "deep")
    assert seen is not None and seen.clients == "unreadable"
