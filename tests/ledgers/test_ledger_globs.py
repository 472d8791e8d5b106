"""Globs: the linear-time matcher means exactly what the old backtracking regex
meant on ordinary input, and hostile values cannot make it slow.

The reference is the translator offscope used before the linear matcher
(copied below, unchanged): every property compares against it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offscope.ledgers import CallInput, CompiledLedger, Ledger
from offscope.ledgers import globs as globs_module
from offscope.ledgers.globs import GlobError, compile_glob, is_glob
from offscope.ledgers.matcher import MAX_VALUE_CHARS, TargetSet, normalize

# --- the reference: the regex translation offscope shipped before -------------

_CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _old_translate(pattern: str, sep: str | None, captures: bool) -> str:
    not_sep = f"[^{re.escape(sep)}]" if sep else "."
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                if sep and pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == sep):
                    out.append(f"(?:.*{re.escape(sep)})?")
                    i += 3
                    continue
                out.append(".*")
                i += 2
            else:
                out.append(f"{not_sep}*")
                i += 1
        elif c == "?":
            out.append(not_sep)
            i += 1
        elif c == "[":
            end = pattern.find(
                "]", i + 2 if pattern.startswith("[!", i) or pattern.startswith("[]", i) else i + 1
            )
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
        elif captures and c == "{":
            m = _CAPTURE.match(pattern, i)
            assert m
            out.append(f"(?P<{m.group(1)}>{not_sep}+)")
            i = m.end()
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def old_regex(pattern: str, sep: str | None = "/", captures: bool = False) -> re.Pattern[str]:
    return re.compile(r"\A" + _old_translate(pattern, sep, captures) + r"\Z")


# --- generated globs and values ---------------------------------------------------

# (glob token, strategy for text it matches); ordinary input: no newlines.
_CHARS = "ab./-"
_TOKENS: list[tuple[str, st.SearchStrategy[str]]] = [
    ("a", st.just("a")),
    ("b", st.just("b")),
    (".", st.just(".")),
    ("-", st.just("-")),
    ("/", st.just("/")),
    ("*", st.text("ab.-", max_size=4)),
    ("**", st.text(_CHARS, max_size=5)),
    ("**/", st.text(_CHARS, max_size=5)),
    ("?", st.sampled_from("ab.-")),
    ("[ab]", st.sampled_from("ab")),
    ("[!a]", st.sampled_from("b.-/")),
    ("[a-c]", st.sampled_from("abc")),
]
_CAPTURES = [
    ("{x}", st.text("ab.-", min_size=1, max_size=4)),
    ("{y}", st.text("ab.-", min_size=1, max_size=4)),
]


@st.composite
def glob_and_values(draw, captures: bool = False, start: str = "") -> tuple[str, list[str]]:
    pool = _TOKENS + (_CAPTURES if captures else [])
    picks = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=8))
    if captures:  # each capture name at most once
        seen: set[str] = set()

        def repeated(name: str) -> bool:
            if name in seen:
                return True
            seen.add(name)
            return False

        picks = [p for p in picks if not (p[0].startswith("{") and repeated(p[0]))] or [pool[0]]
    pattern = start + "".join(tok for tok, _ in picks)
    # Values built to match (when the tokens allow it), mutated, and random.
    built = start + "".join(draw(strat) for _, strat in picks)
    values = [
        built,
        built[:-1],
        built + draw(st.sampled_from(["a", "/", "/a", ".b"])),
        draw(st.text(_CHARS + "c", max_size=20)),
    ]
    return pattern, values


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(case=glob_and_values(), sep=st.sampled_from(["/", None]))
def test_same_matches_as_the_old_regex(case: tuple[str, list[str]], sep: str | None) -> None:
    pattern, values = case
    new, old = compile_glob(pattern, sep), old_regex(pattern, sep)
    for value in values:
        assert bool(new.match(value)) == bool(old.match(value)), (pattern, sep, value, new)


@PROPERTY
@given(case=glob_and_values(captures=True, start="/"))
def test_same_captures_as_the_old_regex(case: tuple[str, list[str]]) -> None:
    pattern, values = case
    new, old = compile_glob(pattern, "/", captures=True), old_regex(pattern, "/", captures=True)
    for value in values:
        got, want = new.match(value), old.match(value)
        assert bool(got) == bool(want), (pattern, value, new)
        if want:
            assert got is not None
            assert got.groupdict() == want.groupdict(), (pattern, value, new)


@PROPERTY
@given(case=glob_and_values(start="/"))
def test_uncached_fallback_agrees(case: tuple[str, list[str]]) -> None:
    """Past the DFA's state bound the automaton runs uncached: same answers."""
    pattern, values = case
    old = old_regex(pattern, "/")
    saved = globs_module._MAX_DFA_STATES
    globs_module._MAX_DFA_STATES = 1
    try:
        new = compile_glob(pattern, "/")
        for value in values:
            assert bool(new.match(value)) == bool(old.match(value)), (pattern, value)
    finally:
        globs_module._MAX_DFA_STATES = saved


@PROPERTY
@given(cases=st.lists(glob_and_values(start="/"), min_size=1, max_size=6))
def test_target_set_membership_equals_any_old_regex(cases: list[tuple[str, list[str]]]) -> None:
    patterns = list(dict.fromkeys(p for p, _ in cases))
    target_set = TargetSet("path", patterns)
    for _, values in cases:
        for raw in values:
            value = normalize("path", raw)
            if not value:
                continue
            # A literal target is normalised like the value ('/a/.' is '/a').
            want = any(
                old_regex(p).match(value) or (not is_glob(p) and normalize("path", p) == value)
                for p in patterns
            )
            assert (value in target_set) == want, (patterns, value)


# --- the documented semantics (README, ledger section) ------------------------------------


def _ledger(**targets: list[str]) -> CompiledLedger:
    return CompiledLedger(
        Ledger.model_validate({"schema": "offscope.ledger/1", "id": "globs", "targets": targets})
    )


@pytest.mark.parametrize(
    ("host", "inside"),
    [
        ("a.acme.test", True),
        ("x.y.acme.test", True),
        ("A.ACME.TEST", True),
        ("acme.test", False),
        ("evilacme.test", False),
        ("acme.test.evil", False),
    ],
)
def test_suffix_host_glob_matches_subdomains_at_any_depth(host: str, inside: bool) -> None:
    assert _ledger(hosts=["*.acme.test"]).contains("host", host) is inside
    # The same meaning through the general matcher (a class forces it off the hash path).
    assert _ledger(hosts=["*.acme.te[s]t"]).contains("host", host) is inside


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("/srv/app/x", True),
        ("/srv/app/x/y/z", True),
        ("/srv/app/.env", True),
        ("/srv/app", False),
        ("/srv/application", False),
        ("/srv/other/x", False),
        ("/srv/app/../etc/x", False),
    ],
)
def test_double_star_path_matches_everything_below(path: str, inside: bool) -> None:
    assert _ledger(paths=["/srv/app/**"]).contains("path", path) is inside
    assert _ledger(paths=["/srv/ap[p]/**"]).contains("path", path) is inside


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("/srv/data/a.json", True),
        ("/srv/x/data/a.json", True),
        ("/srv/x/data/y/z/a.json", True),
        ("/srv/xdata/a.json", False),
        ("/srv/data/a.json.bak", False),
        ("/srv/data/a/json", False),
    ],
)
def test_mid_path_wildcards(path: str, inside: bool) -> None:
    assert _ledger(paths=["/srv/**/data/**/*.json"]).contains("path", path) is inside


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("/srv/[z-a]", "bad character range z-a"),
        ("/srv/[!]", "empty character class"),
        ("/srv/[ab", "unclosed '['"),
        ("/srv/a]", "unmatched ']'"),
    ],
)
def test_bad_globs_are_glob_errors(bad: str, message: str) -> None:
    with pytest.raises(GlobError, match=re.escape(message)):
        compile_glob(bad)


# --- hostile values: linear time, bounded memory --------------------------------------

# Each of these took seconds to hours with the backtracking regex (issue: a 146 KiB
# argument stalled the proxy 10 s; `/srv/**a**a**a**x` on a 1 KB path took 44 s).
# The timeout is a hang guard, far above the linear matcher's cost.
ADVERSARIAL = [
    ("/srv/**/data/**/*.json", "/srv/" + "data/" * 200_000 + "x.jso"),
    ("/srv/**a**a**a**x", "/srv/" + "a" * 1_000_000),
    ("/srv/*a*a*a*x", "/srv/" + "a" * 1_000_000),
    ("/**/repos/{owner}/{repo}/**", "/" + "repos/" * 200_000),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("pattern", "value"), ADVERSARIAL, ids=[p for p, _ in ADVERSARIAL])
def test_adversarial_values_use_the_automaton_and_answer(pattern: str, value: str) -> None:
    glob = compile_glob(pattern, "/", captures="{" in pattern)
    assert glob.regex is None and glob.literal is None, (
        "this shape must not run as a backtracking regex"
    )
    got = glob.match(value)
    if "{" in pattern:  # greedy like the regex: the last two 'repos' segments
        assert got is not None and got.groupdict() == {"owner": "repos", "repo": "repos"}
    else:
        assert got is None
    # And still right on ordinary values after the hostile one.
    ordinary = {
        "/srv/**/data/**/*.json": "/srv/a/data/b.json",
        "/srv/**a**a**a**x": "/srv/abaxax",
        "/srv/*a*a*a*x": "/srv/aaax",
        "/**/repos/{owner}/{repo}/**": "/v1/repos/acme/billing/pulls",
    }
    assert glob.match(ordinary[pattern]) is not None


def test_automaton_caches_are_bounded() -> None:
    glob = compile_glob("/srv/**a**b**c**x")
    automaton = glob._automaton
    assert automaton is not None
    for start in range(0, 60_000, 500):  # 60,000 distinct characters
        assert not glob.match("/srv/" + "".join(chr(0x4E00 + start + i) for i in range(500)))
    assert automaton._forward.cached <= globs_module._MAX_CACHED_STEPS
    assert len(automaton._forward.sets) <= globs_module._MAX_DFA_STATES
    assert glob.match("/srv/a/b/c/x")


def test_safe_shapes_still_use_the_regex_engine() -> None:
    """The common shapes keep Python's regex (fast); its backtracking is linear there."""
    for pattern, sep in [
        ("**/forks", "/"),
        ("/repos/{owner}/{repo}/**", "/"),
        ("*.acme.test", None),
        ("draft_*", None),
        ("/srv/*/logs/*.txt", "/"),
    ]:
        assert compile_glob(pattern, sep, captures="{" in pattern).regex is not None, pattern
    for pattern, sep in [
        ("/srv/**/data/**/*.json", "/"),
        ("*a*", None),
        ("**/x/**/y", "/"),
        ("**a*/x", "/"),
    ]:
        assert compile_glob(pattern, sep).regex is None, pattern


# --- the value cap ---------------------------------------------------------------------


def test_values_over_the_cap_are_out_of_scope_never_truncated_in() -> None:
    led = CompiledLedger(
        Ledger.model_validate(
            {
                "schema": "offscope.ledger/1",
                "id": "cap",
                "targets": {"paths": ["/srv/**"]},
                "extract": [{"match": {"source": "mcp"}, "targets": {"path": "{args.path}"}}],
                "grants": [
                    {
                        "id": "g-long",
                        "target": "path:/srv/" + "a" * MAX_VALUE_CHARS,
                        "approver": "ops",
                        "expires": "2999-01-01T00:00:00Z",
                    }
                ],
            }
        )
    )

    def path_tag(path: str):
        result = led.tag(
            CallInput("mcp", tool="read_file", args={"path": path}), now=datetime.now(UTC)
        )
        return next(t for t in result.targets if t.kind == "path")

    at_cap = "/srv/" + "a" * (MAX_VALUE_CHARS - len("/srv/"))
    assert path_tag(at_cap).in_scope
    over = path_tag(at_cap + "b")
    assert not over.in_scope and over.value == at_cap + "b"  # kept whole, not cut to fit
    granted = path_tag("/srv/" + "a" * MAX_VALUE_CHARS)  # a grant cannot bring it back either
    assert not granted.in_scope and granted.grant is None
