"""The one tagger: a compiled ledger that tags a call as in or out of scope.

`CompiledLedger(ledger).tag(call)` is the only place offscope decides scope,
for the proxy and the eval grid alike. Membership is compiled: exact targets
and `*.suffix` / trailing-`**` globs are hash lookups, so the cost of tagging
a call does not grow with the number of targets (bench/tagging.py); only
globs with wildcards in the middle fall back to one combined regex.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from offscope.ledgers.globs import Glob, compile_glob, is_glob, literal_prefix
from offscope.ledgers.hostnames import ascii_host
from offscope.ledgers.kinds import KINDS
from offscope.ledgers.model import Grant, Ledger, Match, TargetLists
from offscope.vocab import Source, Stage, StageFrom, TargetKind

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Well-known LLM provider endpoints. An exchange is an LLM call only when its
# destination is one of these or a host the ledger's `llm.hosts` declares: a
# path that merely looks like an LLM API (`/x/chat/completions`) on any other
# host is an ordinary, tagged tool call (it could carry anything anywhere).
BUILTIN_LLM_HOSTS = (
    "api.openai.com",
    "*.openai.azure.com",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
    "*-aiplatform.googleapis.com",
    "bedrock-runtime.*.amazonaws.com",
    "api.mistral.ai",
    "api.groq.com",
    "api.together.xyz",
    "api.together.ai",
    "openrouter.ai",
    "api.deepseek.com",
    "api.x.ai",
    "api.fireworks.ai",
    "api.cohere.com",
    "api.perplexity.ai",
)
_MAX_TARGETS_PER_CALL = 64
# Longest target value that can be in scope (PATH_MAX on Linux). Longer values
# are tagged out of scope; hosts are at most 253 characters anyway.
MAX_VALUE_CHARS = 4096


@dataclass(slots=True)
class CallInput:
    """What the tagger needs to know about one call; built by the extractors.

    No transport types here: the same input comes from an HTTP flow, an MCP
    JSON-RPC message or a tool call inside an LLM response.
    """

    source: Source
    tool: str = "http"
    method: str | None = None
    host: str | None = None
    path: str | None = None
    query: dict[str, list[str]] = field(default_factory=dict)
    args: Any = None
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    basic_auth_user: str | None = None
    annotations: dict[str, Any] | None = (
        None  # tool annotations (MCP tools/list, an LLM request's tools)
    )
    # sha-256 of the raw request body when it is not read as JSON (a form, text,
    # bytes): grants bind it, so a bodyless call's grant admits no form body
    body_digest: str | None = None


@dataclass(slots=True, frozen=True)
class TargetTag:
    kind: TargetKind
    value: str
    in_scope: bool
    grant: str | None = None


@dataclass(slots=True, frozen=True)
class TagResult:
    targets: tuple[TargetTag, ...]
    stage: Stage
    operator: bool
    stage_from: StageFrom = "default"
    rules: tuple[
        int, ...
    ] = ()  # indices of the extract rules that yielded a target (ledger coverage)
    # An MCP tool call that extract rules for its server or tool apply to, and
    # none of them found a target in (`CompiledLedger.tag`): the ledger cannot
    # say what it touches. Whether that is out of scope is the policy's
    # `unknown_target` (`CompiledPolicy.settle` sets `unknown_is_out`).
    unknown: bool = False
    unknown_is_out: bool = False

    @property
    def targets_in_scope(self) -> bool:
        return all(t.in_scope for t in self.targets)

    @property
    def in_scope(self) -> bool:
        return self.targets_in_scope and not (self.unknown and self.unknown_is_out)

    @property
    def scope(self) -> str:
        return "in" if self.in_scope else "out"

    @property
    def grants(self) -> tuple[str, ...]:
        return tuple(t.grant for t in self.targets if t.grant)


def _grant_binds(g: Grant, call: CallInput) -> bool:
    """Whether a grant's endpoint (host, path, query string) is the call's.

    A grant that names a path is bound to one request: what `offscope requests
    approve` writes. A field such a grant lacks comes from an older offscope,
    which did not bind it, and is read so that it never widens the grant: no `query_digest`
    binds the empty query, no `host` binds no host (the grant applies to no
    call: the next one files a new request). A grant without a path (written
    by hand for a target) binds only the fields it names."""
    if g.path is not None:
        if g.host is None or ascii_host(g.host) != ascii_host(call.host or ""):
            return False
        if canonical_path(g.path) != canonical_path(call.path):
            return False
        return (g.query_digest or query_digest({})) == query_digest(call.query)
    if g.host is not None and ascii_host(g.host) != ascii_host(call.host or ""):
        return False
    return g.query_digest is None or g.query_digest == query_digest(call.query)


# --- normalisation: one canonical spelling per target kind -----------------


def normalize(kind: TargetKind, value: str) -> str:
    value = value.strip()
    if kind == "host":  # lower case, no port, no trailing dot, punycode
        return ascii_host(value)
    if kind == "repository":
        value = value.lower().strip("/")
        return value[:-4] if value.endswith(".git") else value
    if kind == "path":
        path = posixpath.normpath(unquote(value)) if value else value
        # normpath keeps a leading '//' (POSIX); fold it so it cannot dodge a glob.
        return "/" + path.lstrip("/") if path.startswith("//") else path
    if kind == "record":
        kind_part, _, ident = value.partition(":")
        return f"{kind_part.lower()}:{ident}"
    return value


_DOT_SEGMENT = re.compile(r"%2e", re.IGNORECASE)


def url_path(path: str | None) -> str:
    """A request path as the server resolves it: dot segments (also `%2e`-encoded)
    removed and repeated slashes folded, so `/repos/acme/billing/../../x/y` cannot
    match a rule for `acme/billing`. Other escapes are kept for the captures."""
    if not path:
        return ""
    if not path.startswith("/") or ("." not in path and "%" not in path and "//" not in path):
        return path
    resolved = posixpath.normpath(_DOT_SEGMENT.sub(".", path))
    resolved = "/" + resolved.lstrip("/")
    return resolved + "/" if path.endswith("/") and resolved != "/" else resolved


PATH_PARAMS = re.compile(r";[^/]*")
ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)


def all_path_readings(path: str) -> str:
    """A path read by a server that applies every lenient reading at once
    (offscope/proxy/extract/readings.py lists each): percent-decoded twice,
    encoded `/` and `\\` decoded, `\\` read as `/`, `;params` dropped, case folded."""
    path = unquote(unquote(path)) if "%25" in path.lower() else path
    path = ENCODED_SEPARATOR.sub("/", path).replace("\\", "/")
    return PATH_PARAMS.sub("", path).lower()


def canonical_path(path: str | None) -> str:
    """The one spelling every alias of an endpoint shares: `all_path_readings`,
    then what the most lenient routers add (Starlette decodes every
    percent-escape, Express ignores case and a trailing slash), dot segments
    resolved and repeated slashes folded. `/mcp/`, `//mcp`, `/MCP`, `/mcp/./`,
    `/%6dcp` and `/a/..;/mcp` all give `/mcp`. Tool-surface pins and grants key
    on it. (A path without its query string.)"""
    if not path:
        return "/"
    decoded = unquote(all_path_readings(path)).replace("\\", "/")
    resolved = url_path("/" + decoded.lstrip("/")).lower()
    return resolved.rstrip("/") or "/"


def canonical_pattern(kind: TargetKind, raw: str) -> str:
    """A target pattern as the matcher compiles it (hosts in their ASCII
    spelling, a record's type part in lower case, like `normalize`)."""
    if kind == "host":
        return ascii_host(raw)
    if kind == "record":
        type_part, _, ident = raw.partition(":")
        return f"{type_part.lower()}:{ident}"
    return raw


class TargetSet:
    """Compiled membership test for the in-scope targets of one kind."""

    def __init__(self, kind: TargetKind, patterns: list[str]) -> None:
        self.kind = kind
        sep = KINDS[kind].separator
        self._exact: set[str] = set()
        self._host_suffixes: set[str] = set()  # '*.acme.test' -> '.acme.test'
        self._prefixes: set[str] = set()  # 'a/b/**' -> 'a/b/'
        self._prefix_lengths: set[int] = set()
        self._segment_prefixes: set[str] = set()  # 'acme/*' -> 'acme/' (one more segment)
        general: list[str] = []
        for raw in patterns:
            pattern = canonical_pattern(kind, raw)
            prefix, rest = literal_prefix(pattern)
            if not rest:
                self._exact.add(normalize(kind, pattern))
            elif (
                kind == "host"
                and pattern.startswith("*.")
                and not any(c in pattern[2:] for c in "*?[")
            ):
                self._host_suffixes.add(pattern[1:])
            elif rest == "**" or (rest == "*" and sep is None):
                self._prefixes.add(prefix)
                self._prefix_lengths.add(len(prefix))
            elif rest == "*" and prefix.endswith(sep or "\0"):
                self._segment_prefixes.add(prefix)
            else:
                general.append(pattern)
        # Globs whose regex backtracks linearly share one alternation; the rest run
        # as automata, each behind a literal-prefix check.
        regexes: list[str] = []
        self._automata: list[tuple[str, Glob]] = []
        for pattern in general:
            glob = compile_glob(pattern, sep)
            if glob.regex is not None:
                regexes.append(glob.regex.pattern)
            else:
                self._automata.append((literal_prefix(pattern)[0], glob))
        self._general = re.compile("|".join(regexes), re.DOTALL) if regexes else None

    def __contains__(self, value: str) -> bool:
        if len(value) > MAX_VALUE_CHARS:
            return False
        if value in self._exact:
            return True
        if self._host_suffixes:
            i = value.find(".")
            while i != -1:
                if value[i:] in self._host_suffixes:
                    return True
                i = value.find(".", i + 1)
        # A wildcard may match nothing: 'a/b/**' matches 'a/b/', 'inv:1-*' matches 'inv:1-'
        # (the general matcher's meaning; normalised paths never end in '/' anyway).
        if self._prefixes:
            for n in self._prefix_lengths:
                if len(value) >= n and value[:n] in self._prefixes:
                    return True
        if self._segment_prefixes:
            cut = value.rfind("/")
            if cut != -1 and value[: cut + 1] in self._segment_prefixes:
                return True
        if self._general and self._general.match(value):
            return True
        return any(
            value.startswith(prefix) and glob.match(value) for prefix, glob in self._automata
        )


# --- rule matching ----------------------------------------------------------


def _dig(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
        if data is None:
            return None
    return data


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class CompiledMatch:
    """A `Match` compiled once; `captures(call)` is None when it does not match."""

    def __init__(self, m: Match) -> None:
        self.source = m.source
        self.host = compile_glob(m.host, None, ignore_case=True) if m.host else None
        self.path = compile_glob(m.path, "/", captures=True) if m.path else None
        methods = [m.method] if isinstance(m.method, str) else m.method
        self.methods = frozenset(methods) if methods else None
        tools = [m.tool] if isinstance(m.tool, str) else m.tool
        self.tool = None
        if tools:  # one glob: its own engine; several: tried in turn
            globs = [compile_glob(t, None) for t in tools]
            self.tool = (
                globs[0].match
                if len(globs) == 1
                else (lambda name: next((m for g in globs if (m := g.match(name))), None))
            )
        self.query = {k: compile_glob(v, None) for k, v in (m.query or {}).items()}
        self.args = {k: compile_glob(v, None) for k, v in (m.args or {}).items()}
        self.literal_host = m.host if m.host and not is_glob(m.host) else None

    def captures(self, call: CallInput) -> dict[str, str] | None:
        if self.source and call.source != self.source:
            return None
        if self.host and not (call.host and self.host.match(normalize("host", call.host))):
            return None
        if self.methods and (call.method or "").upper() not in self.methods:
            return None
        if self.tool and not self.tool(call.tool or ""):
            return None
        for name, pattern in self.query.items():
            if not any(pattern.match(v) for v in call.query.get(name, ())):
                return None
        for dotted, pattern in self.args.items():
            value = _dig(call.args, dotted)
            if value is None or not pattern.match(_as_text(value)):
                return None
        if self.path:
            m = self.path.match(url_path(call.path))
            if not m:
                return None
            return m.groupdict()
        return {}


_TEMPLATE_REF = re.compile(r"\{([^{}]+)\}")


class Template:
    """'{owner}/{repo}' or 'customer:{args.customer_id}', rendered per call."""

    def __init__(self, text: str) -> None:
        self.parts = _TEMPLATE_REF.split(text)  # even: literal, odd: reference

    def render(self, captures: dict[str, str], call: CallInput) -> list[str]:
        choices: list[list[str]] = []
        for i, part in enumerate(self.parts):
            if i % 2 == 0:
                choices.append([part])
                continue
            values = _resolve(part, captures, call)
            if not values:
                return []
            choices.append(values)
        out = [
            "".join(combo)
            for combo in itertools.islice(itertools.product(*choices), _MAX_TARGETS_PER_CALL)
        ]
        return [v for v in out if v]


def _resolve(ref: str, captures: dict[str, str], call: CallInput) -> list[str]:
    if "." not in ref:
        v = captures.get(ref)
        return [unquote(v)] if v else []
    ns, _, rest = ref.partition(".")
    if ns in ("args", "body"):
        value = _dig(call.args, rest)
    elif ns == "query":
        return [v for v in call.query.get(rest, []) if v]
    elif ns == "header":
        value = call.headers.get(rest.lower())
    elif ns == "basic_auth":
        value = call.basic_auth_user if rest == "user" else None
    elif ns == "url":
        value = {"host": call.host, "path": call.path}.get(rest)
    else:
        value = None
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [_as_text(v) for v in value if v is not None and not isinstance(v, dict | list)]
    if isinstance(value, dict):
        return []
    return [_as_text(value)]


def args_digest(args: Any) -> str:
    """A stable digest of call arguments (grants bind to it)."""
    blob = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def raw_body_digest(body: bytes) -> str:
    """The digest of a request body offscope does not read as JSON."""
    return hashlib.sha256(b"offscope raw body\0" + body).hexdigest()[:16]


def call_digest(call: CallInput) -> str:
    """What a grant's `args_digest` binds: the call's JSON arguments (an MCP or
    LLM tool call's arguments, an HTTP JSON body; null without a body), or its
    raw body when that is not JSON."""
    return call.body_digest or args_digest(call.args)


def query_digest(query: dict[str, list[str]] | None) -> str:
    """What a grant's `query_digest` binds: the query parameters, each name's
    values in the order sent (`?a=1&a=2` is not `?a=2&a=1`, nor `?a=1`)."""
    return args_digest(query or {})


def default_stage(call: CallInput) -> Stage:
    """Stage from the call's own shape, before the ledger's stage rules."""
    if call.tool == "websocket":  # an upgrade opens a channel that can carry any act
        return "act"
    if call.annotations and call.source in ("mcp", "llm"):
        if call.annotations.get("readOnlyHint"):
            return "investigate"
        return "act"
    if call.method:
        return "investigate" if call.method.upper() in _READ_METHODS else "act"
    return "act"


def _has_port(endpoint: str) -> bool:
    """'host:port' (not a bare IPv6 address)."""
    head, sep, port = endpoint.rpartition(":")
    return bool(sep) and port.isdigit() and (":" not in head or head.endswith("]"))


def split_url(url: str) -> tuple[str | None, str | None, dict[str, list[str]]]:
    """host, path and query of a URL found in tool arguments."""
    from urllib.parse import parse_qs

    try:
        parts = urlsplit(url)
    except ValueError:
        return None, None, {}
    if not parts.hostname:
        return None, None, {}
    return parts.hostname, parts.path or "/", parse_qs(parts.query, keep_blank_values=True)


def _recorded_fields(ledger: Ledger) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """What the ledger's rules read of a call besides its destination, so that
    the trace keeps it and the call can be tagged again (`offscope replay`):
    the argument fields rules read (their values are targets or rule inputs),
    the headers templates read, and whether a template reads the basic-auth user."""
    fields: list[str] = []
    headers: list[str] = []
    basic_auth = False
    matches = (
        [r.match for r in ledger.extract]
        + [r.match for r in ledger.stages]
        + list(ledger.operator)
        + list(ledger.humans.routes)
    )
    for m in matches:
        fields.extend(m.args or {})
    for rule in ledger.extract:
        for texts in rule.targets.values():
            for text in [texts] if isinstance(texts, str) else texts:
                for ref in _TEMPLATE_REF.findall(text):
                    ns, _, rest = ref.partition(".")
                    if ns in ("args", "body") and rest:
                        fields.append(rest)
                    elif ns == "header" and rest:
                        headers.append(rest.lower())
                    elif ns == "basic_auth":
                        basic_auth = True
    return tuple(dict.fromkeys(fields)), tuple(dict.fromkeys(headers)), basic_auth


def _ledger_hash(ledger: Ledger) -> str:
    # An unset scope_clause is left out, so adding the field kept every hash.
    unset = {"scope_clause"} if ledger.scope_clause is None else None
    return hashlib.sha256(
        ledger.model_dump_json(by_alias=True, exclude=unset).encode()
    ).hexdigest()[:12]


class CompiledLedger:
    """A ledger compiled for tagging. Build once per (re)load, share freely."""

    run_scoped = False  # True: a run's own targets applied to this ledger (`with_targets`)

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.id = ledger.id
        self.hash = _ledger_hash(ledger)
        t = ledger.targets
        self._sets: dict[TargetKind, TargetSet] = {k: TargetSet(k, t.of_kind(k)) for k in KINDS}
        # Extraction rules (with their index in the ledger) indexed by literal host so
        # a call only tries its own.
        self._extract_by_host: dict[
            str, list[tuple[int, CompiledMatch, list[tuple[TargetKind, Template]]]]
        ] = {}
        self._extract_any: list[tuple[int, CompiledMatch, list[tuple[TargetKind, Template]]]] = []
        self._extract_rules: list[
            tuple[int, Match, CompiledMatch, list[tuple[TargetKind, Template]]]
        ] = []
        # Rules about a server or tool (they name a source, host, path or tool):
        # when one fires on an MCP call and no rule finds a target, the call's
        # target is unknown. A rule with an empty match (a header read on every
        # call) is about no server in particular.
        self._about_a_tool: set[int] = set()
        for i, rule in enumerate(ledger.extract):
            compiled = CompiledMatch(rule.match)
            m = rule.match
            if m.source or m.host or m.path or m.tool:
                self._about_a_tool.add(i)
            templates = [
                (kind, Template(text))
                for kind, texts in rule.targets.items()
                for text in ([texts] if isinstance(texts, str) else texts)
            ]
            self._extract_rules.append((i, rule.match, compiled, templates))
            if compiled.literal_host:
                self._extract_by_host.setdefault(compiled.literal_host, []).append(
                    (i, compiled, templates)
                )
            else:
                self._extract_any.append((i, compiled, templates))
        self._stages = [(CompiledMatch(r.match), r.stage) for r in ledger.stages]
        self._operator = [CompiledMatch(m) for m in ledger.operator]
        llm_hosts = [h for h in ledger.llm.hosts if not _has_port(h)]
        if ledger.llm.builtin_hosts:
            llm_hosts += BUILTIN_LLM_HOSTS
        self._llm_hosts = TargetSet("host", llm_hosts)
        self._llm_endpoints = {h.lower().rstrip(".") for h in ledger.llm.hosts if _has_port(h)}
        self._human_routes = [CompiledMatch(m) for m in ledger.humans.routes]
        self._grants = self._index_grants(ledger.grants)
        self.rule_fields, self.read_headers, self.reads_basic_auth = _recorded_fields(ledger)
        self.kept_args = tuple(dict.fromkeys([*ledger.keep_args, *self.rule_fields]))
        self.run: str | None = (
            None  # set on a run's view (`for_run`): its 'run'-scoped grants apply
        )

    def for_run(self, run_id: str) -> CompiledLedger:
        """This ledger as one run sees it: grants scoped to another run do not
        apply. Shares every compiled part; the ledger itself when it has no
        run-scoped grant (the common case costs nothing)."""
        if not self._run_scoped or self.run == run_id:
            return self
        view = copy.copy(self)
        view.run = run_id
        return view

    def grant(self, grant_id: str) -> Grant | None:
        """A grant of this ledger by id (for the approver and time in the trace)."""
        return self._grant_ids.get(grant_id)

    def with_grants(self, grants: Sequence[Grant]) -> CompiledLedger:
        """This ledger plus reviewed grants (its overlay file), sharing every
        compiled part: applying an approval recompiles no target or rule."""
        if not grants:
            return self
        ledger = self.ledger.model_copy(update={"grants": [*self.ledger.grants, *grants]})
        extended = copy.copy(self)
        extended.ledger, extended.hash = ledger, _ledger_hash(ledger)
        extended._grants = extended._index_grants(ledger.grants)
        return extended

    def with_targets(self, targets: TargetLists, replace: bool = False) -> CompiledLedger:
        """This ledger with a run's own targets added to its targets (or in their
        place): the run's scope (POST /runs). Only the target sets are compiled
        again; rules, operator routes and grants are shared."""
        if replace:
            merged = targets
        else:
            merged = TargetLists.model_validate(
                {
                    f: list(dict.fromkeys([*getattr(self.ledger.targets, f), *getattr(targets, f)]))
                    for f in TargetLists.model_fields
                }
            )
        ledger = self.ledger.model_copy(update={"targets": merged})
        derived = copy.copy(self)
        derived.ledger, derived.hash = ledger, _ledger_hash(ledger)
        derived._sets = {kind: TargetSet(kind, merged.of_kind(kind)) for kind in self._sets}
        derived.run_scoped = True
        return derived

    def _index_grants(self, grants: Sequence[Grant]) -> dict[str, list[Grant]]:
        index: dict[str, list[Grant]] = {}
        self._grant_ids = {g.id: g for g in grants}
        self._run_scoped = any(g.scope == "run" for g in grants)
        for g in grants:
            kind, _, value = g.target.partition(":")
            key = f"{kind}:{normalize(kind, value)}" if kind in self._sets else g.target
            index.setdefault(key, []).append(g)
        return index

    # -- queries used by the proxy -----------------------------------------

    def is_llm_host(self, host: str, port: int | None = None) -> bool:
        """Whether a destination is a declared LLM endpoint (built-in or `llm.hosts`)."""
        name = normalize("host", host)
        if name in self._llm_hosts:
            return True
        return port is not None and f"{name}:{port}" in self._llm_endpoints

    def is_operator(self, call: CallInput) -> bool:
        """An operator route, bound to where it was declared: a route naming a host
        matches only there; one naming no host matches only on in-scope hosts (or on
        the LLM channel, answered in the agent's own harness). The same tool name
        anywhere else is an ordinary tagged call, not a channel to a human."""
        for m in self._operator:
            if m.captures(call) is None:
                continue
            if m.host is not None or call.source == "llm":
                return True
            if call.host and normalize("host", call.host) in self._sets["host"]:
                return True
        return False

    def reaches_person(self, call: CallInput) -> bool:
        """Whether an operator call's route is declared to reach a person."""
        return any(m.captures(call) is not None for m in self._human_routes)

    def contains(self, kind: TargetKind, value: str) -> bool:
        return normalize(kind, value) in self._sets[kind]

    def stage_of(self, call: CallInput) -> Stage:
        return self.staged(call)[0]

    def staged(self, call: CallInput) -> tuple[Stage, StageFrom]:
        """The call's stage and where it came from: a ledger stage rule, the
        tool's declared annotations, or the default (method, else act)."""
        for compiled, stage in self._stages:
            if compiled.captures(call) is not None:
                return stage, "ledger"
        stage = default_stage(call)
        return stage, "annotation" if call.annotations and call.source in (
            "mcp",
            "llm",
        ) else "default"

    def targets_of(self, call: CallInput) -> list[tuple[TargetKind, str]]:
        return self._extract(call)[0]

    def _extract(
        self, call: CallInput
    ) -> tuple[list[tuple[TargetKind, str]], tuple[int, ...], bool]:
        """The call's targets, which extract rules yielded one (or, with
        `targets: {}`, declared that the call names none), and whether a rule
        about the call's server or tool fired."""
        found: list[tuple[TargetKind, str]] = []
        used: list[int] = []
        about = False
        host = normalize("host", call.host) if call.host else None
        if host is not None:
            found.append(("host", host))
        by_host = self._extract_by_host.get(host) if host else None
        rules = self._extract_any + by_host if by_host else self._extract_any
        for i, compiled, templates in rules:
            caps = compiled.captures(call)
            if caps is None:
                continue
            about = about or i in self._about_a_tool
            n = len(found)
            for kind, template in templates:
                found.extend((kind, normalize(kind, v)) for v in template.render(caps, call))
            if len(found) > n or not templates:
                used.append(i)
        # Keep first-seen order, drop repeats, bound the size.
        return list(dict.fromkeys(found))[:_MAX_TARGETS_PER_CALL], tuple(used), about

    def tag(self, call: CallInput, now: datetime | None = None) -> TagResult:
        found, rules, about = self._extract(call)
        tags = self.membership(found, call, now)
        stage, stage_from = self.staged(call)
        # The host names the server, not what the call touches: an MCP call whose
        # server has extract rules and in which none found a target is unknown.
        unknown = call.source == "mcp" and about and not rules
        return TagResult(tags, stage, self.is_operator(call), stage_from, rules, unknown)

    def membership(
        self, found: Sequence[tuple[TargetKind, str]], call: CallInput, now: datetime | None = None
    ) -> tuple[TargetTag, ...]:
        """Normalised targets tagged in or out of scope (a grant brings one in)."""
        tags = []
        for kind, value in found:
            inside = value in self._sets[kind]
            grant = (
                None
                if inside or len(value) > MAX_VALUE_CHARS
                else self._grant_for(kind, value, call, now)
            )
            tags.append(TargetTag(kind, value, inside or grant is not None, grant))
        return tuple(tags)

    def _grant_for(
        self, kind: TargetKind, value: str, call: CallInput, now: datetime | None
    ) -> str | None:
        grants = self._grants.get(f"{kind}:{value}")
        if not grants:
            return None
        now = now or datetime.now(UTC)
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        for g in grants:
            expires = datetime.fromisoformat(g.expires)
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=UTC)
            if expires <= now:
                continue  # expired grants stop applying
            if g.scope == "run" and g.run != self.run:
                continue  # another run's approval
            if g.tool and g.tool != call.tool:
                continue
            if g.method and g.method != (call.method or "").upper():
                continue
            if not _grant_binds(g, call):
                continue
            if g.args_digest and g.args_digest != call_digest(call):
                continue
            return g.id
        return None

    # -- what a tool can reach (policy `filter_tools`) ----------------------------

    def never_in_scope(self, call: CallInput) -> str | None:
        """Why every call of this tool is out of scope, or None when some call
        of it can be in scope. `call` is the tool as offered: its source, name
        and (MCP) server host and path, no arguments.

        A tool is never in scope when its host is not in scope, when the ledger
        lists it in `denied_tools`, or when an extraction rule that fires on
        every call of it (no method, query or argument condition) names a
        target that no in-scope pattern or grant of that kind can match. Only
        the literal parts of a template are known before the call: a target
        whose value depends on the arguments is unreachable only when its
        literal start or end rules out every pattern ('customer:{args.id}'
        with only 'invoice:*' in scope). When in doubt, the tool is kept."""
        if call.host:
            host = normalize("host", call.host)
            if host not in self._sets["host"] and not self._granted("host", [host], [host]):
                return f"host {host} is not in scope"
        for glob in self.ledger.denied_tools:
            if compile_glob(glob, None).match(call.tool):
                return f"listed in the ledger's denied_tools ({glob!r})"
        for i, match, compiled, templates in self._extract_rules:
            if match.args or match.query or match.method or (match.path and not call.path):
                continue  # depends on the call: may not fire
            caps = compiled.captures(call)
            if caps is None:
                continue
            for kind, template in templates:
                known = _known_parts(template, caps, call)
                if not self._reachable(kind, known):
                    shown = "*".join(known)
                    return f"extract[{i}] gives it a {kind} target {shown!r} that is never in scope"
        return None

    def _reachable(self, kind: TargetKind, known: list[str]) -> bool:
        """Whether a value made of `known` literal parts with anything between
        them could be in scope (by a pattern or a grant)."""
        if len(known) == 1:
            value = normalize(kind, known[0])
            return value in self._sets[kind] or self._granted(kind, [value], [value])
        prefix, suffix = known[0].lower(), known[-1].lower()
        patterns = [p.lower() for p in self.ledger.targets.of_kind(kind)]
        return any(_compatible(p, prefix, suffix) for p in patterns) or self._granted(
            kind, [prefix], [suffix]
        )

    def _granted(self, kind: str, prefixes: list[str], suffixes: list[str]) -> bool:
        """Whether any grant of this kind (for this run) could cover such a value."""
        for key, grants in self._grants.items():
            g_kind, _, value = key.partition(":")
            if g_kind != kind or not any(g.scope == "ledger" or g.run == self.run for g in grants):
                continue
            value = value.lower()
            if any(value.startswith(p.lower()) for p in prefixes) and any(
                value.endswith(s.lower()) for s in suffixes
            ):
                return True
        return False


_GLOB_CHARS = re.compile(r"[*?\[]")


def _known_parts(template: Template, captures: dict[str, str], call: CallInput) -> list[str]:
    """A template's value split at the parts only the call's arguments decide:
    ['customer:', ''] for 'customer:{args.id}'; one part when all is known."""
    parts, current = [], ""
    for i, part in enumerate(template.parts):
        if i % 2 == 0:
            current += part
            continue
        values = (
            _resolve(part, captures, call) if "." not in part or part.startswith("url.") else []
        )
        if len(values) == 1:
            current += values[0]
        else:
            parts.append(current)
            current = ""
    parts.append(current)
    return parts


def _compatible(pattern: str, prefix: str, suffix: str) -> bool:
    """Whether some value starting with `prefix` and ending with `suffix` could
    match the glob `pattern` (by its literal start and end; a cheap,
    conservative test: it may say yes when no value matches, never no when one does)."""
    first = _GLOB_CHARS.search(pattern)
    if first is None:
        return (
            pattern.startswith(prefix)
            and pattern.endswith(suffix)
            and len(pattern) >= len(prefix) + len(suffix)
        )
    head = pattern[: first.start()]
    tail = pattern[max(m.end() for m in _GLOB_CHARS.finditer(pattern)) :]
    if "]" in tail:  # the end of a character class: its literal tail starts after it
        tail = tail[tail.index("]") + 1 :]
    return (head.startswith(prefix) or prefix.startswith(head)) and (
        tail.endswith(suffix) or suffix.endswith(tail)
    )
