"""Glob and path-template compilation, shared by every matcher in offscope.

Glob language (one for all target kinds):
  `**` any characters, including the separator;
  `*`  any characters except the separator;
  `?`  one character except the separator;
  `[abc]` / `[!abc]` a character class.
The separator is `/` for paths and repositories and absent for records and
accounts (there `*` and `**` mean the same thing).

Path templates add captures: `/repos/{owner}/{repo}/**` captures one segment
per `{name}`.
"""

from __future__ import annotations

import re

GLOB_CHARS = set("*?[")
_CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class GlobError(ValueError):
    pass


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


def _translate(pattern: str, sep: str | None, captures: bool) -> str:
    not_sep = f"[^{re.escape(sep)}]" if sep else "."
    out: list[str] = []
    i, n = 0, len(pattern)
    names: set[str] = set()
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                # `/**/` also matches a single `/` (zero directories).
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
            end = pattern.find("]", i + 2 if pattern.startswith("[!", i) or pattern.startswith("[]", i) else i + 1)
            if end == -1:
                raise GlobError(f"unclosed '[' in glob {pattern!r}")
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            if not body or body == "^":
                raise GlobError(f"empty character class in glob {pattern!r}")
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
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
            out.append(f"(?P<{name}>{not_sep}+)")
            i = m.end()
        elif captures and c == "}":
            raise GlobError(f"unmatched '}}' in template {pattern!r}")
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def compile_glob(pattern: str, sep: str | None = "/", *, captures: bool = False,
                 ignore_case: bool = False) -> re.Pattern[str]:
    """Compile a glob (or a path template when captures=True) to an anchored regex."""
    if not pattern:
        raise GlobError("empty pattern")
    flags = re.IGNORECASE if ignore_case else 0
    return re.compile(r"\A" + _translate(pattern, sep, captures) + r"\Z", flags)


def literal_prefix(pattern: str) -> tuple[str, str]:
    """Split a glob into its literal prefix and the rest: 'a/b*/c' -> ('a/b', '*/c')."""
    for i, c in enumerate(pattern):
        if c in GLOB_CHARS:
            return pattern[:i], pattern[i:]
    return pattern, ""
