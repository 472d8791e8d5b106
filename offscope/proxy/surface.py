"""The four changes, observed in production: tool surfaces, the model id, the
scope clause and credential fingerprints.

Scope behaviour is a property of the whole assembly (model, scope prompt,
tool surface, credentials), so the proxy records each of them as it passes:

- a **tool surface** is the set of tools an agent is offered, hashed: an MCP
  server's `tools/list` result (names, descriptions, input schemas,
  annotations) per server, and an LLM request's `tools` array per run. The
  hash is sha256 over canonical JSON and does not depend on the tools' order;
- the **model id** an LLM request names;
- the **scope clause**: the part of the system prompt the ledger's
  `scope_clause.marker` regex finds, hashed (the prompt itself is not kept);
- a **credential fingerprint** per upstream: HMAC-SHA256 of the Authorization
  header or API-key header under a per-deployment salt. The credential never
  leaves the process; two fingerprints are comparable only under one salt,
  which is why each carries the salt's own id.

This module is pure (no engine, no I/O except reading the salt file); the
engine calls `Drift` and writes what it returns into the trace.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from offscope.errors import InputError
from offscope.ledgers.hostnames import ascii_host
from offscope.ledgers.matcher import CallInput, default_stage
from offscope.proxy.extract.readings import canonical_path
from offscope.vocab import STAGE_RANK

SALT_ENV = "OFFSCOPE_FINGERPRINT_SALT"
SALT_FILE_ENV = "OFFSCOPE_FINGERPRINT_SALT_FILE"
FIRST_SEEN = "first-seen"
#: request headers that carry a credential to the upstream (lower case). Not
#: Proxy-Authorization: that one is for the proxy and never leaves it.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
#: the parts of an MCP tool that change what the agent is offered
MCP_TOOL_FIELDS = ("name", "description", "inputSchema", "annotations")
_MAX_TRACKED = 4096  # servers and runs remembered (bounded memory)
_MAX_NAMES = 50  # tool names listed per change in the trace
_MAX_FLOOR_TOOLS = 10_000  # tools whose strictest stage a server's floor remembers


def canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Surface:
    """A tool surface: its hash and each tool's own hash, by name, and for an
    MCP surface the stage each tool's annotations give its calls."""

    digest: str
    tools: Mapping[str, str]
    stages: Mapping[str, str] = field(default_factory=dict, compare=False)

    def diff(self, old: Surface | None) -> tuple[list[str], list[str], list[str]]:
        """(added, removed, changed) tool names against an older surface."""
        before = old.tools if old else {}
        added = sorted(set(self.tools) - set(before))
        removed = sorted(set(before) - set(self.tools))
        changed = sorted(n for n in self.tools if n in before and before[n] != self.tools[n])
        return added, removed, changed


def surface_of(tools: Iterable[tuple[str, Any]]) -> Surface:
    """The surface of (name, definition) pairs: order-independent (the hash is
    over the sorted per-tool hashes), and a tool listed twice counts once."""
    return _surface({name: _sha(canonical(definition)) for name, definition in tools})


def _surface(per_tool: Mapping[str, str], stages: Mapping[str, str] | None = None) -> Surface:
    return Surface(
        _sha(canonical(sorted(f"{n}\0{h}" for n, h in per_tool.items()))),
        dict(per_tool),
        dict(stages or {}),
    )


def annotation_stage(name: str, annotations: Any) -> str:
    """The stage a tool's annotations give its calls (the tagger's own rule,
    `default_stage`): investigate for `readOnlyHint: true`, else act."""
    ann = annotations if isinstance(annotations, dict) else None
    return default_stage(CallInput(source="mcp", tool=name, annotations=ann))


def has_more(message: Any) -> bool:
    """A page of a paginated tools/list that is not the last one."""
    result = message.get("result") if isinstance(message, dict) else None
    return isinstance(result, dict) and bool(result.get("nextCursor"))


def mcp_surface(message: Any) -> Surface | None:
    """The surface of a `tools/list` JSON-RPC response (None if it is not one)."""
    result = message.get("result") if isinstance(message, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    per_tool: dict[str, str] = {}
    stages: dict[str, str] = {}
    for tool in tools:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            name = tool["name"]
            per_tool[name] = _sha(canonical({k: tool.get(k) for k in MCP_TOOL_FIELDS}))
            stages[name] = annotation_stage(name, tool.get("annotations"))
    return _surface(per_tool, stages)


def llm_tools_surface(tools: list[dict[str, Any]]) -> Surface:
    """The surface of the tools an LLM request declares (its dialect's `tools`: each
    function once, Gemini's `functionDeclarations` groups flattened): each entry is
    hashed whole, as it is what the model is shown."""
    return surface_of([(_llm_tool_name(item), item) for item in tools])


def _llm_tool_name(entry: dict[str, Any]) -> str:
    fn = entry.get("function")
    for name in (
        entry.get("name"),
        fn.get("name") if isinstance(fn, dict) else None,
        entry.get("type"),
    ):
        if isinstance(name, str) and name:
            return name
    return "?"


# -- the scope clause -----------------------------------------------------------


def system_prompt(body: Any) -> str | None:
    """The system prompt of an LLM request in any of the dialects offscope
    reads: OpenAI chat (`system`/`developer` messages), Responses
    (`instructions`), Anthropic (`system`), Gemini (`systemInstruction`)."""
    if not isinstance(body, dict):
        return None
    parts: list[str] = []
    for key in ("instructions", "system", "systemInstruction", "system_instruction"):
        parts.extend(_texts(body.get(key)))
    for msg in body.get("messages") or body.get("input") or []:
        if isinstance(msg, dict) and msg.get("role") in ("system", "developer"):
            parts.extend(_texts(msg.get("content")))
    return "\n".join(parts) if parts else None


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        for key in ("text", "parts", "content"):
            if key in value:
                return _texts(value[key])
    return []


def scope_clause_hash(prompt: str | None, marker: re.Pattern[str]) -> str:
    """sha256 of the clause the marker finds (its `clause` group if it has one,
    else the whole match), whitespace-normalised; `absent` when not found."""
    found = marker.search(prompt or "")
    if found is None:
        return "absent"
    clause = found.group("clause") if "clause" in marker.groupindex else found.group(0)
    return _sha(" ".join(clause.split()))


# -- credential fingerprints ------------------------------------------------------


@dataclass(frozen=True)
class Salt:
    key: bytes
    configured: bool  # False: a random salt for this process only

    @property
    def id(self) -> str:
        """The salt's own id: fingerprints are comparable iff their ids are equal."""
        if not self.configured:
            return "process-local"
        return hmac.new(self.key, b"offscope salt id", hashlib.sha256).hexdigest()[:8]

    def fingerprint(self, credential: str) -> str:
        digest = hmac.new(self.key, credential.encode("utf-8", "surrogateescape"), hashlib.sha256)
        return "hmac-sha256:" + digest.hexdigest()[:16]


def load_salt(env: Mapping[str, str] | None = None) -> Salt:
    """The per-deployment salt: `$OFFSCOPE_FINGERPRINT_SALT`, else the file
    `$OFFSCOPE_FINGERPRINT_SALT_FILE`; without either, a random salt (the
    fingerprints then only compare within this process)."""
    env = os.environ if env is None else env
    value = env.get(SALT_ENV, "").strip()
    if not value and env.get(SALT_FILE_ENV):
        try:
            value = Path(env[SALT_FILE_ENV]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InputError(
                f"cannot read the fingerprint salt: {exc.strerror or exc}",
                path=env[SALT_FILE_ENV],
                hint=f"{SALT_FILE_ENV} names a file holding the per-deployment salt",
            ) from None
    if value:
        return Salt(value.encode("utf-8"), True)
    return _PROCESS_SALT  # one per process: the grid and its embedded proxy agree


_PROCESS_SALT = Salt(secrets.token_bytes(32), False)


def fingerprints(credentials: Mapping[str, str | None], salt: Salt | None = None) -> dict[str, Any]:
    """A configuration block of credentials by upstream: each salted
    fingerprint (or "none"), and the salt's id (what `offscope gate` reads)."""
    salt = salt or load_salt()
    return {
        "salt_id": salt.id,
        "upstreams": {
            k: salt.fingerprint(v) if v else "none" for k, v in sorted(credentials.items())
        },
    }


def credential_of(headers: Mapping[str, str]) -> str | None:
    """The credential a request carries to its upstream (headers in lower case)."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            return value.strip()
    return None


# -- pins ----------------------------------------------------------------------------


def pin_for(pins: Mapping[str, str], server: str) -> str | None:
    """The pin that applies to an MCP server key (`host:port/path`, canonical:
    `ToolRegistry.key`): by the full key, else `host:port`, else `host`. The
    policy's keys are compared in the same canonical spelling, so a pin on
    `host:80/mcp` covers `/MCP`, `/mcp/`, `//mcp`, `/mcp/./` and `/%6dcp`."""
    if not pins:
        return None
    canonical_pins = _canonical_pins(tuple(pins.items()))
    host_port = server.partition("/")[0]
    for key in (server, host_port, host_port.rpartition(":")[0]):
        if key and key in canonical_pins:
            return canonical_pins[key]
    return None


def canonical_server(key: str) -> str:
    """A server as a policy names it (`host`, `host:port` or `host:port/path`)
    in the spelling `ToolRegistry.key` gives a request."""
    host_port, slash, path = key.strip().partition("/")
    host, sep, port = host_port.rpartition(":")
    if not (sep and port.isdigit()):
        host, sep, port = host_port, "", ""
    head = ascii_host(host.strip("[]")) + sep + port  # a request's IPv6 host has no brackets
    return head + canonical_path("/" + path) if slash else head


@lru_cache(maxsize=32)
def _canonical_pins(items: tuple[tuple[str, str], ...]) -> dict[str, str]:
    canonical_pins: dict[str, str] = {}
    for key, pin in items:  # two spellings of one server: the first one written applies
        canonical_pins.setdefault(canonical_server(key), pin)
    return canonical_pins


# -- the tracker -------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One of the four, seen on a run for the first time or changed."""

    component: str  # model | scope_clause | tool_surface | credential
    source: str  # mcp | llm | http
    upstream: str
    value: str
    previous: str | None = None
    tools: int | None = None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    salt_id: str | None = None
    drift: bool = False  # counts in offscope_tool_surface_changes_total
    # tools whose annotations now give a weaker stage than before: kept at the
    # stricter one (counted in offscope_tool_stage_downgrades_total)
    downgraded: tuple[str, ...] = ()
    clients: str | None = None  # the client-capabilities class the surface is for
    # The surface changed while the server's previous list was still fresh by its own
    # `ttlMs` (2026-07-28): it told clients to cache a list it then changed.
    within_ttl: bool = False


@dataclass
class _Floor:
    """The strictest stage each tool of a server has been listed with since the
    last (re)pin: a later listing may raise it, never lower it."""

    pin: str | None
    stages: dict[str, str]


@dataclass
class Drift:
    """What the proxy remembers across flows: each MCP server's last surface
    (process-wide: a server's surface changing is news whichever run saw it),
    pinned surfaces, and per run the last value of each component (so the
    trace gets an event only when a run first sees a value or it changes).

    Servers are canonical `host:port/path` keys (`ToolRegistry.key`). A server
    may list other tools to clients with other capabilities: its surfaces are
    compared per client class (the digest of the capabilities a session's
    `initialize` declared), so alternating clients are not drift. Pins and
    stage floors are per server, whatever the class."""

    salt: Salt = field(default_factory=load_salt)
    servers: OrderedDict[str, Surface] = field(default_factory=OrderedDict)  # by class key
    pinned: OrderedDict[str, tuple[str, Surface]] = field(
        default_factory=OrderedDict
    )  # server -> (pin, its surface)
    floors: OrderedDict[str, _Floor] = field(default_factory=OrderedDict)  # server -> floor
    llm_last: OrderedDict[str, Surface] = field(default_factory=OrderedDict)
    runs: OrderedDict[str, dict[tuple[str, str], str]] = field(default_factory=OrderedDict)
    _fingerprints: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _pages: OrderedDict[str, Surface] = field(default_factory=OrderedDict)  # server -> pages so far
    _classes: OrderedDict[str, str] = field(default_factory=OrderedDict)  # server#session -> class
    # class key -> until when the last list is fresh by its `ttlMs` (the server's clock promise)
    _fresh_until: OrderedDict[str, float] = field(default_factory=OrderedDict)

    # per run ---------------------------------------------------------------------

    def _seen(self, run: str, component: str, upstream: str, value: str) -> str | None | bool:
        """The run's previous value, None when first seen, False when unchanged."""
        memory = self.runs.get(run)
        if memory is None:
            memory = self.runs[run] = {}
            _trim(self.runs)
        self.runs.move_to_end(run)
        old = memory.get((component, upstream))
        if old == value:
            return False
        memory[(component, upstream)] = value
        return old

    def observe(
        self, run: str, component: str, source: str, upstream: str, value: str, **extra: Any
    ) -> Observation | None:
        previous = self._seen(run, component, upstream, value)
        if previous is False:
            return None
        return Observation(component, source, upstream, value, previous, **extra)  # type: ignore[arg-type]

    # credentials ----------------------------------------------------------------------

    def credential(
        self, run: str, source: str, upstream: str, headers: Mapping[str, str]
    ) -> Observation | None:
        value = credential_of(headers)
        if value is None:
            return None
        fp = self._fingerprints.get(value)
        if fp is None:  # HMAC once per distinct credential, not per request
            fp = self._fingerprints[value] = self.salt.fingerprint(value)
            while len(self._fingerprints) > 256:
                self._fingerprints.popitem(last=False)
        return self.observe(run, "credential", source, upstream, fp, salt_id=self.salt.id)

    # client classes -------------------------------------------------------------------

    def client_class(self, server: str, session: str, capabilities: Any) -> None:
        """A session's `initialize` declared these client capabilities: its
        tools/list results are compared with those of clients like it."""
        try:
            found = _sha(canonical(capabilities))[7:23]
        except (ValueError, TypeError, RecursionError):  # too deep to hash: one class of its own
            found = "unreadable"
        self._classes[f"{server}#{session}"] = found
        _remember(self._classes, f"{server}#{session}")

    def _class(self, server: str, session: str | None) -> str | None:
        return self._classes.get(f"{server}#{session}") if session else None

    def _key(self, server: str, session: str | None) -> str:
        found = self._class(server, session)
        return f"{server}#clients:{found}" if found else server

    # tool surfaces --------------------------------------------------------------------

    def page(
        self, server: str, surface: Surface, more: bool, session: str | None = None
    ) -> Surface | None:
        """A paginated tools/list is one surface: pages are gathered (per
        session) until the one without a `nextCursor`; None until then."""
        key = f"{server}#{session}" if session else server
        before = self._pages.pop(key, None)
        if before is not None:
            surface = _surface(
                {**before.tools, **surface.tools}, {**before.stages, **surface.stages}
            )
        if more:
            self._pages[key] = surface
            _trim(self._pages)
            return None
        return surface

    def mcp_surface(
        self,
        run: str,
        server: str,
        surface: Surface,
        pins: Mapping[str, str],
        session: str | None = None,
        now: float = 0.0,
        ttl_ms: int | None = None,
    ) -> Observation | None:
        """A server's tools/list result. A change against the last surface the
        server listed to clients like this session's (or against its pin, the
        first time) is drift, whichever run saw it; a run also gets an event the
        first time it sees a surface, and one whenever a tool's annotations
        would weaken its stage (the stricter stage is kept: `kept_stage`).
        `ttl_ms` (2026-07-28): how long the server said this list stays fresh; a
        change before the previous list's ttl ran out is marked `within_ttl`."""
        key = self._key(server, session)
        last = self.servers.get(key)
        fresh_until = self._fresh_until.pop(key, None)
        if ttl_ms:
            self._fresh_until[key] = now + ttl_ms / 1000
            _remember(self._fresh_until, key)
        self.servers[key] = surface
        _remember(self.servers, key)
        pin = pin_for(pins, server)
        if (
            pin is not None
            and self._pinned(server, pin) is None
            and pin in (FIRST_SEEN, surface.digest)
        ):
            self.pinned[server] = (pin, surface)
            _remember(self.pinned, server)
        downgraded = self._lower_floor(server, surface, pin)
        drift = (last is not None and last.digest != surface.digest) or (
            last is None and pin not in (None, FIRST_SEEN) and pin != surface.digest
        )
        new_for_run = self._seen(run, "tool_surface", key, surface.digest) is not False
        if not (drift or new_for_run or downgraded):
            return None
        against = last or (self._pinned(server, pin) if pin else None)
        added, removed, changed = surface.diff(against)
        previous = (
            against.digest if against is not None and against.digest != surface.digest else None
        )
        return Observation(
            "tool_surface",
            "mcp",
            server,
            surface.digest,
            previous,
            len(surface.tools),
            _cap(added),
            _cap(removed),
            _cap(changed),
            drift=drift,
            downgraded=_cap(downgraded),
            clients=self._class(server, session),
            within_ttl=drift and fresh_until is not None and now < fresh_until,
        )

    def _lower_floor(self, server: str, surface: Surface, pin: str | None) -> list[str]:
        """Update the server's stage floor with a listing; the tools the listing
        would downgrade (act -> investigate, ...), which keep their floor.

        The floor starts at the first listing and restarts only when a human
        (re)pins: the policy's pin for the server changed to one this listing
        satisfies (`first-seen`, or its digest)."""
        floor = self.floors.get(server)
        repinned = (
            floor is not None
            and pin is not None
            and pin != floor.pin
            and pin in (FIRST_SEEN, surface.digest)
        )
        if floor is None or repinned:
            accepted = pin if pin in (FIRST_SEEN, surface.digest) else None
            self.floors[server] = _Floor(accepted, dict(surface.stages))
            _remember(self.floors, server)
            return []
        self.floors.move_to_end(server)
        downgraded = []
        for tool, stage in surface.stages.items():
            kept = floor.stages.get(tool)
            if kept is not None and STAGE_RANK[stage] < STAGE_RANK[kept]:
                downgraded.append(tool)
            else:
                floor.stages[tool] = stage
        while len(floor.stages) > _MAX_FLOOR_TOOLS:  # bounded: oldest tools first
            floor.stages.pop(next(iter(floor.stages)))
        return sorted(downgraded)

    def kept_stage(
        self, server: str, tool: str, annotations: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, str | None]:
        """The annotations a call to `tool` is staged with: as listed, unless
        the server listed the tool with a stricter stage before (since the last
        re-pin); then read-only hints are dropped, with a note saying why."""
        floor = self.floors.get(server)
        kept = floor.stages.get(tool) if floor is not None else None
        if kept is None or STAGE_RANK[annotation_stage(tool, annotations)] >= STAGE_RANK[kept]:
            return annotations, None
        note = (
            f"tool {tool!r} was listed by {server} as a {kept} tool before; its new annotations "
            f"(readOnlyHint) are ignored and the stage stays {kept} until a human re-pins the "
            "tool surface (annotation downgrade)"
        )
        return {**(annotations or {}), "readOnlyHint": False}, note

    def llm_surface(self, run: str, upstream: str, surface: Surface) -> Observation | None:
        """An LLM request's tools, per run: a change within a run is drift."""
        key = f"{run}\0{upstream}"
        last = self.llm_last.get(key)
        self.llm_last[key] = surface
        _remember(self.llm_last, key)
        if last is not None and last.digest == surface.digest:
            return None
        added, removed, changed = surface.diff(last)
        return Observation(
            "tool_surface",
            "llm",
            upstream,
            surface.digest,
            last.digest if last else None,
            len(surface.tools),
            _cap(added),
            _cap(removed),
            _cap(changed),
            drift=last is not None,
        )

    def _pinned(self, server: str, pin: str) -> Surface | None:
        """The surface pinned for a server under this pin (a reloaded policy
        with another pin starts over)."""
        found = self.pinned.get(server)
        return found[1] if found is not None and found[0] == pin else None

    def unpinned(
        self, server: str, tool: str, pins: Mapping[str, str], session: str | None = None
    ) -> str | None:
        """Why a call to `tool` on `server` is outside the pinned surface, or None."""
        pin = pin_for(pins, server)
        if pin is None:
            return None
        pinned = self._pinned(server, pin)
        if pinned is None:
            return (
                f"the tool surface of {server} is pinned ({pin}) and no tools/list matching the pin "
                "has been seen"
            )
        if tool not in pinned.tools:
            return f"tool {tool!r} is not in the pinned tool surface of {server}"
        current = self.servers.get(self._key(server, session)) or self.servers.get(server)
        if current is not None and current.tools.get(tool) not in (None, pinned.tools[tool]):
            return f"tool {tool!r} changed on {server} since its tool surface was pinned"
        return None


def _remember(memory: OrderedDict[str, Any], key: str) -> None:
    """Mark `key` recently used and forget the least recently used beyond the bound."""
    memory.move_to_end(key)
    _trim(memory)


def _trim(memory: OrderedDict[Any, Any]) -> None:
    while len(memory) > _MAX_TRACKED:
        memory.popitem(last=False)


def _cap(names: list[str]) -> tuple[str, ...]:
    return tuple(n[:200] for n in names[:_MAX_NAMES])
