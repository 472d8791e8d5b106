"""Other readings of one request: where reasonable servers disagree on a URL.

The tagger reads a request one way (dot segments and `%2e` resolved, repeated
slashes folded, query values as sent). Servers do not all agree with it or
with each other: Tomcat and Spring drop `;params` from path segments
(`/a/..;/b`), IIS and some frameworks treat `\\` as `/`, proxies and
frameworks that decode twice turn `%252e` into `.`, some routers are
case-insensitive or decode `%2F` to `/`, and frameworks pick the first or the
last of a repeated query parameter (`?dry_run=true&dry_run=false`) or strip
`[]` from `id[]=`.

`alternative_readings(call)` lists each such other reading of a call; the
engine tags every reading, and when they disagree on an out-of-scope target
or the stage the request is ambiguous (refused or tagged by its most
out-of-scope reading, per the policy's `ambiguous` switch). The check costs
nothing for an ordinary request: only the hazards it contains are read again.

`canonical_path(path)` (offscope/ledgers/matcher.py, exposed here) is every
one of those readings at once, plus what the most lenient routers add
(Starlette decodes every percent-escape, Express ignores case and a trailing
slash): the one spelling all aliases of an endpoint share. Tool-surface pins
and grants key on it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import unquote

from offscope.ledgers.matcher import (
    ENCODED_SEPARATOR,
    PATH_PARAMS,
    CallInput,
    all_path_readings,
    canonical_path,
)

__all__ = ["Reading", "alternative_readings", "canonical_path"]


@dataclass(frozen=True, slots=True)
class Reading:
    why: str
    call: CallInput
    # Read with a case-insensitive router: it matches routes regardless of case but
    # hands the handler the identifiers as sent, so a target that differs from one
    # of the plain reading's only by case is the same target.
    case_folded: bool = False


def alternative_readings(call: CallInput) -> list[Reading]:
    """Each plausible other reading of the call, with what differs."""
    out: list[Reading] = []
    path = call.path or ""
    if path:
        readings = _path_readings(path)
        for why, other in readings:
            out.append(Reading(why, replace(call, path=other), other == path.lower()))
        if len(readings) > 1:  # a server may apply them all
            out.append(
                Reading(
                    "all path readings together", replace(call, path=all_path_readings(path)), True
                )
            )
    if call.query:
        out.extend(
            Reading(why, other, case_folded="folded" in why) for why, other in _query_readings(call)
        )
    return out


def _path_readings(path: str) -> list[tuple[str, str]]:
    readings: list[tuple[str, str]] = []
    if ";" in path:
        readings.append(("';' path parameters dropped", PATH_PARAMS.sub("", path)))
    if "\\" in path:
        readings.append(("'\\' read as '/'", path.replace("\\", "/")))
    if "%" in path:
        if "%25" in path.lower():
            readings.append(("percent-decoded twice", unquote(unquote(path))))
        if ENCODED_SEPARATOR.search(path):
            readings.append(("encoded '/' or '\\' decoded", ENCODED_SEPARATOR.sub("/", path)))
    if path != path.lower():
        readings.append(("path read case-insensitively", path.lower()))
    return readings


def _query_readings(call: CallInput) -> list[tuple[str, CallInput]]:
    query = call.query
    out: list[tuple[str, CallInput]] = []
    if any(len(values) > 1 for values in query.values()):
        out.append(
            (
                "first of a repeated parameter",
                replace(call, query={k: v[:1] for k, v in query.items()}),
            )
        )
        out.append(
            (
                "last of a repeated parameter",
                replace(call, query={k: v[-1:] for k, v in query.items()}),
            )
        )
    if any(k.endswith("[]") or k != k.lower() for k in query):
        folded: dict[str, list[str]] = {}
        for key, values in query.items():
            folded.setdefault(key.removesuffix("[]").lower(), []).extend(values)
        out.append(
            ("parameter names folded ('id[]', 'ID' read as 'id')", replace(call, query=folded))
        )
    return out
