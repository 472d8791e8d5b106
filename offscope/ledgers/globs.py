"""Glob and path-template matching, shared by every matcher in offscope.

Glob language (one for all target kinds):
  `**` any characters, including the separator;
  `*`  any characters except the separator;
  `?`  one character except the separator;
  `[abc]` / `[a-z]` / `[!abc]` a character class (a range's first character
       must not sort after its last: `[z-a]` is an error).
The separator is `/` for paths and repositories and absent for records and
accounts (there `*` and `**` mean the same thing). `**/` at the start or after
a `/` also matches no directory at all: `/srv/**/x` matches `/srv/x`.
Wildcards match any character, a newline included.

Path templates add captures: `/repos/{owner}/{repo}/**` captures one segment
(one or more characters, no separator) per `{name}`.

Matching is linear in the length of the value, whatever the glob. The values
come from the agent (a tool argument can be megabytes), so a backtracking regex
with two wildcards in the middle (`/srv/**/data/**/*.json`) would let one call
stall the proxy's event loop for seconds. A glob is therefore compiled to one of:
  * a literal compared with `==`;
  * a Python regex, only when its shape keeps backtracking linear (at most one
    wildcard whose end is not forced by the next character, and that one last);
  * otherwise a lazily built DFA (one dict lookup per character); captures then
    come from one backward pass (which states can still reach the end) and one
    forward walk that takes the same choices a greedy regex would, so captures
    are the same as the regex's, without backtracking.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GLOB_CHARS = set("*?[")
_CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class GlobError(ValueError):
    pass


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


# What `parse` reads as syntax or refuses: the glob characters, a lone `]`, and (in a
# template) the braces of a capture.
_SYNTAX = frozenset("*?[]{}")


def is_literal(pattern: str) -> bool:
    """`pattern` is plain characters: `parse` could not refuse it and would only spell it
    out atom by atom (ledgers list records by the hundred thousand; most are literals)."""
    return bool(pattern) and _SYNTAX.isdisjoint(pattern)


def literal_prefix(pattern: str) -> tuple[str, str]:
    """Split a glob into its literal prefix and the rest: 'a/b*/c' -> ('a/b', '*/c')."""
    for i, c in enumerate(pattern):
        if c in GLOB_CHARS:
            return pattern[:i], pattern[i:]
    return pattern, ""


# --- the compiled form: a list of atoms --------------------------------------


@dataclass(frozen=True, slots=True)
class CharSet:
    """The characters one atom accepts: ranges, possibly negated."""

    ranges: tuple[tuple[str, str], ...]
    negated: bool = False

    def __contains__(self, ch: str) -> bool:
        inside = any(lo <= ch <= hi for lo, hi in self.ranges)
        return inside != self.negated

    @property
    def literal(self) -> str | None:
        if not self.negated and len(self.ranges) == 1 and self.ranges[0][0] == self.ranges[0][1]:
            return self.ranges[0][0]
        return None

    def regex(self) -> str:
        if self.literal is not None:
            return re.escape(self.literal)
        if self.negated and not self.ranges:
            return "."  # compiled with DOTALL
        body = "".join(
            re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}"
            for lo, hi in self.ranges
        )
        return f"[{'^' if self.negated else ''}{body}]"


_ANY = CharSet((), negated=True)

# Atom kinds. An atom is (kind, argument); the NFA state q means "about to match atom q".
CHAR = 0  # one character in the CharSet, then q + 1
STAR = 1  # zero or more characters in the CharSet (greedy), then q + 1
SKIP = 2  # an optional group of the next `n` atoms (greedy: enter first)
OPEN = 3  # start of capture `name`
CLOSE = 4  # end of capture `name`

Atom = tuple[int, Any]


def _char_class(pattern: str, i: int) -> tuple[CharSet, int]:
    """Parse the class starting at pattern[i] == '['; return it and the index after ']'."""
    end = pattern.find("]", i + 2 if pattern.startswith(("[!", "[]"), i) else i + 1)
    if end == -1:
        raise GlobError(f"unclosed '[' in glob {pattern!r}")
    body = pattern[i + 1 : end]
    negated = body[:1] in ("!", "^")
    if negated:
        body = body[1:]
    if not body:
        raise GlobError(f"empty character class in glob {pattern!r}")
    ranges: list[tuple[str, str]] = []
    j = 0
    while j < len(body):
        if j + 2 < len(body) and body[j + 1] == "-":
            lo, hi = body[j], body[j + 2]
            if lo > hi:
                raise GlobError(
                    f"bad character range {lo}-{hi} in glob {pattern!r} "
                    f"(write the lower character first: [{hi}-{lo}])"
                )
            ranges.append((lo, hi))
            j += 3
        else:
            ranges.append((body[j], body[j]))
            j += 1
    return CharSet(tuple(ranges), negated), end + 1


def parse(pattern: str, sep: str | None = "/", *, captures: bool = False) -> list[Atom]:
    """A glob (or a path template when captures=True) as a list of atoms."""
    if not pattern:
        raise GlobError("empty pattern")
    not_sep = CharSet(((sep, sep),), negated=True) if sep else _ANY
    atoms: list[Atom] = []
    names: set[str] = set()
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                # `/**/` also matches a single `/` (zero directories).
                if sep and pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == sep):
                    atoms += [(SKIP, 2), (STAR, _ANY), (CHAR, CharSet(((sep, sep),)))]
                    i += 3
                    continue
                atoms.append((STAR, _ANY))
                i += 2
            else:
                atoms.append((STAR, not_sep))
                i += 1
        elif c == "?":
            atoms.append((CHAR, not_sep))
            i += 1
        elif c == "[":
            charset, i = _char_class(pattern, i)
            atoms.append((CHAR, charset))
        elif c == "]":
            raise GlobError(f"unmatched ']' in glob {pattern!r}")
        elif captures and c == "{":
            m = _CAPTURE.match(pattern, i)
            if not m:
                raise GlobError(f"bad capture in template {pattern!r}: use {{name}}")
            name = m.group(1)
            if name in names:
                raise GlobError(f"capture {{{name}}} appears twice in {pattern!r}")
            names.add(name)
            atoms += [(OPEN, name), (CHAR, not_sep), (STAR, not_sep), (CLOSE, name)]
            i = m.end()
        elif captures and c == "}":
            raise GlobError(f"unmatched '}}' in template {pattern!r}")
        else:
            atoms.append((CHAR, CharSet(((c, c),))))
            i += 1
    return atoms


def _regex(atoms: list[Atom]) -> str:
    out: list[str] = []
    closers: list[int] = []  # atom index after which an optional group closes
    for q, (kind, arg) in enumerate(atoms):
        if kind == CHAR:
            out.append(arg.regex())
        elif kind == STAR:
            out.append(f"{arg.regex()}*")
        elif kind == SKIP:
            out.append("(?:")
            closers.append(q + arg)
        elif kind == OPEN:
            out.append(f"(?P<{arg}>")
        else:
            out.append(")")
        while closers and closers[-1] == q:
            out.append(")?")
            closers.pop()
    return "".join(out)


def _backtracks_linearly(atoms: list[Atom], sep: str | None) -> bool:
    """True when a backtracking regex for these atoms runs in linear time.

    A star whose end is forced (a no-separator star followed by the separator)
    can only give characters back one at a time, each failing at once. Any
    other star is a real choice; with one such choice, last of all, the regex
    tries each end once against a fixed-length rest. Two choices nest: O(n^2).
    """
    stars = [q for q, (kind, _) in enumerate(atoms) if kind == STAR]
    for q in stars[:-1]:
        if atoms[q][1] is _ANY or sep is None:
            return False
        r = q + 1
        while r < len(atoms) and atoms[r][0] in (OPEN, CLOSE):
            r += 1
        if not (r < len(atoms) and atoms[r][0] == CHAR and atoms[r][1].literal == sep):
            return False
    return True


# --- matching -----------------------------------------------------------------


class GlobMatch:
    """What a successful match returns (the subset of re.Match offscope uses)."""

    __slots__ = ("_groups",)

    def __init__(self, groups: dict[str, str]) -> None:
        self._groups = groups

    def groupdict(self) -> dict[str, str]:
        return dict(self._groups)


_NO_GROUPS = GlobMatch({})

# Bounds on the lazily built automata (per glob): past them, matching goes on
# uncached, still linear, so hostile input cannot grow memory without bound.
_MAX_DFA_STATES = 2048
_MAX_CACHED_STEPS = 20_000


class _StateTable:
    """The states of one lazily built DFA: each a set of NFA states, numbered in the
    order met, with its row of cached transitions. Bounded by _MAX_DFA_STATES states
    and _MAX_CACHED_STEPS transitions; callers hold the automaton's lock."""

    def __init__(self) -> None:
        self.ids: dict[frozenset[int], int] = {}
        self.sets: list[frozenset[int]] = []
        self.rows: list[dict[str, int]] = []
        self.cached = 0

    def intern(self, states: frozenset[int]) -> int | None:
        """The number of this set of NFA states (a new one when unseen); None when full."""
        sid = self.ids.get(states)
        if sid is None:
            if len(self.sets) >= _MAX_DFA_STATES:
                return None
            sid = len(self.sets)
            self.sets.append(states)
            self.rows.append({})
            self.ids[states] = sid
        return sid

    def cache(self, sid: int, ch: str, nxt: int) -> None:
        """Remember that `ch` leads from state `sid` to `nxt`, while there is room."""
        if self.cached < _MAX_CACHED_STEPS:
            self.rows[sid][ch] = nxt
            self.cached += 1


class _Automaton:
    """The glob as an NFA over atom positions, run as a lazily built DFA."""

    def __init__(self, atoms: list[Atom]) -> None:
        self.atoms = atoms
        self.m = m = len(atoms)
        self.closure = [self._eps(q) for q in range(m + 1)]
        # Forward DFA states keep only the states that consume (and the accept state).
        self._consuming = [
            frozenset(p for p in c if p == m or atoms[p][0] in (CHAR, STAR)) for c in self.closure
        ]
        self._forward = _StateTable()
        self._lock = threading.Lock()
        self._forward.intern(self._consuming[0])
        # The backward automaton (for captures): its states are sets of live NFA states.
        self._backward = _StateTable()
        self._backward.intern(frozenset(q for q in range(m + 1) if m in self.closure[q]))

    def _eps(self, q: int) -> frozenset[int]:
        seen: set[int] = set()
        stack = [q]
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            if p == self.m:
                continue
            kind, arg = self.atoms[p]
            if kind == SKIP:
                stack += [p + 1, p + arg + 1]
            elif kind in (OPEN, CLOSE, STAR):
                stack.append(p + 1)
        return frozenset(seen)

    def _step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        out: set[int] = set()
        for q in states:
            if q != self.m:
                kind, charset = self.atoms[q]
                if ch in charset:
                    out |= self._consuming[q] if kind == STAR else self._consuming[q + 1]
        return frozenset(out)

    def _transition(self, sid: int, ch: str) -> int | None:
        """The DFA state after `ch` (-1: no match possible); None when the cache is full."""
        with self._lock:
            nxt_set = self._step(self._forward.sets[sid], ch)
            if not nxt_set:
                nxt = -1
            else:
                interned = self._forward.intern(nxt_set)
                if interned is None:
                    return None
                nxt = interned
            self._forward.cache(sid, ch, nxt)
            return nxt

    def fullmatch(self, s: str) -> bool:
        rows = self._forward.rows
        state = 0
        for ch in s:
            nxt = rows[state].get(ch)
            if nxt is None:
                nxt = self._transition(state, ch)
                if nxt is None:  # too many DFA states: run the NFA uncached (a second linear pass)
                    return self._simulate(s)
            if nxt < 0:
                return False
            state = nxt
        return self.m in self._forward.sets[state]

    def _simulate(self, s: str) -> bool:
        states = self._consuming[0]
        for ch in s:
            states = self._step(states, ch)
            if not states:
                return False
        return self.m in states

    # -- captures --------------------------------------------------------------

    def _live(self, s: str) -> list[frozenset[int]]:
        """live[i]: the states (any atom index) from which s[i:] is accepted."""
        n = len(s)
        live: list[frozenset[int]] = [frozenset()] * (n + 1)
        sets, rows = self._backward.sets, self._backward.rows
        bid: int | None = 0
        cur = live[n] = sets[0]
        for i in range(n - 1, -1, -1):
            ch = s[i]
            nxt = rows[bid].get(ch) if bid is not None else None
            if nxt is None:
                nxt_set = self._back_step(cur, ch)
                with self._lock:
                    nxt = self._backward.intern(nxt_set)
                    if nxt is not None and bid is not None:
                        self._backward.cache(bid, ch, nxt)
                cur = nxt_set
            else:
                cur = sets[nxt]
            bid = nxt
            live[i] = cur
        return live

    def _back_step(self, later: frozenset[int], ch: str) -> frozenset[int]:
        # States p that consume ch into a live state, then every q that reaches such a p.
        ready = set()
        for p in range(self.m):
            kind, charset = self.atoms[p]
            if kind in (CHAR, STAR) and ch in charset and (p if kind == STAR else p + 1) in later:
                ready.add(p)
        return frozenset(q for q in range(self.m + 1) if not ready.isdisjoint(self.closure[q]))

    def captures(self, s: str) -> dict[str, str] | None:
        if not self.fullmatch(s):  # the cheap forward pass rejects most values
            return None
        live = self._live(s)
        groups: dict[str, str] = {}
        starts: dict[str, int] = {}
        q = i = 0
        atoms, n = self.atoms, len(s)
        while q < self.m:
            kind, arg = atoms[q]
            if kind == OPEN:
                starts[arg] = i
                q += 1
            elif kind == CLOSE:
                groups[arg] = s[starts[arg] : i]
                q += 1
            elif kind == SKIP:  # greedy: enter the group if the rest can still match
                q = q + 1 if q + 1 in live[i] else q + arg + 1
            elif kind == STAR:  # greedy: consume while the rest can still match
                if arg is _ANY:
                    while i < n and q in live[i + 1]:
                        i += 1
                else:  # `*` and captures: anything but the separator
                    sep = arg.ranges[0][0]
                    while i < n and s[i] != sep and q in live[i + 1]:
                        i += 1
                q += 1
            else:  # CHAR: liveness guarantees it matches
                i += 1
                q += 1
        return groups


class Glob:
    """A compiled glob: `match(value)` is a full match (like an anchored regex);
    it returns an object with `groupdict()`, or None."""

    __slots__ = ("pattern", "literal", "regex", "match", "_automaton")

    def __init__(
        self,
        pattern: str,
        sep: str | None = "/",
        *,
        captures: bool = False,
        ignore_case: bool = False,
    ) -> None:
        self.pattern = pattern
        atoms = parse(pattern.lower() if ignore_case else pattern, sep, captures=captures)
        self.literal: str | None = None
        self.regex: re.Pattern[str] | None = None
        self._automaton: _Automaton | None = None
        # `match` is bound once to the cheapest engine: it runs on every call.
        match: Callable[[str], re.Match[str] | GlobMatch | None]
        if all(kind == CHAR and arg.literal is not None for kind, arg in atoms):
            self.literal = literal = "".join(arg.literal for _, arg in atoms)
            match = lambda value: _NO_GROUPS if value == literal else None  # noqa: E731
        elif _backtracks_linearly(atoms, sep):
            self.regex = re.compile(r"\A" + _regex(atoms) + r"\Z", re.DOTALL)
            match = self.regex.match
        else:
            self._automaton = automaton = _Automaton(atoms)
            if any(kind == OPEN for kind, _ in atoms):

                def match(value: str) -> GlobMatch | None:
                    groups = automaton.captures(value)
                    return None if groups is None else GlobMatch(groups)
            else:
                match = lambda value: _NO_GROUPS if automaton.fullmatch(value) else None  # noqa: E731
        if ignore_case:
            exact = match
            match = lambda value: exact(value.lower())  # noqa: E731
        self.match = match

    def __repr__(self) -> str:
        engine = (
            "literal" if self.literal is not None else "regex" if self.regex is not None else "dfa"
        )
        return f"Glob({self.pattern!r}, {engine})"


def compile_glob(
    pattern: str, sep: str | None = "/", *, captures: bool = False, ignore_case: bool = False
) -> Glob:
    """Compile a glob (or a path template when captures=True) for full, linear-time matching."""
    return Glob(pattern, sep, captures=captures, ignore_case=ignore_case)


def glob_regex(pattern: str, sep: str | None = "/", *, captures: bool = False) -> str:
    """The anchored (backtracking) regex with the same meaning as the glob. Only
    for reference and tests: matching goes through `compile_glob`."""
    return r"\A" + _regex(parse(pattern, sep, captures=captures)) + r"\Z"
