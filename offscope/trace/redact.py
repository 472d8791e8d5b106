"""Redaction: secrets are removed before anything is stored or logged.

The proxy calls this on every flow, so the checks run cheapest first:

1. Names. A header, query parameter or JSON field whose name says "secret"
   (`password`, `pwd`, `api key`, `X-Api-Key`, `ssh_key`, `otp`, ...) loses its
   value. Names are split into words (`apiKey`, `x-api-key`, `api key` are all
   `api` + `key`), so `secretary` or `max_tokens` are not secrets. Cached.
2. Shapes checked in every string, one regex each with a first-character
   lookahead: `Bearer`/`Basic` credentials, well-known key prefixes, PEM private
   key blocks, `user:pass@` in URLs, and secret assignments in free text
   (`password=...`, `"api_key": "..."`, "my password is ...").
3. Detectors, run only on candidates (a string holding a run of at least 16
   token characters): the regex plugins of Yelp's `detect-secrets` (its
   maintained list of vendor key formats: Stripe, GitLab, Slack, Twilio, npm,
   PyPI, Azure, JWT, ...) and its Shannon-entropy measure with its default
   base64 limit (4.5 bits per character) on tokens of 20 or more characters
   that mix upper case, lower case and digits (an AWS secret key, most
   generated API keys).

Argument values are also minimised (`minimise_args`): unless the ledger keeps
a field (`keep_args`), the trace stores its name and a digest, not its value.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, unquote_plus, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"
MAX_STRING = 2000
MAX_ITEMS = 200
MAX_DEPTH = 12

# -- 1. names --------------------------------------------------------------------

# A name is split into lower-case words: camelCase, kebab, snake and spaces alike.
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Words that make a name secret wherever they appear.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "passcode",
        "secret",
        "secrets",
        "token",
        "credential",
        "credentials",
        "creds",
        "cred",
        "auth",
        "authorization",
        "oauth",
        "cookie",
        "session",
        "signature",
        "otp",
        "totp",
        "hotp",
        "mfa",
        "pin",
        "privkey",
        "apikey",
        "bearer",
        "jwt",
        "csrf",
        "xsrf",
    }
)
# "key" is secret after these words (`api key`, `ssh_key`, `X-Api-Key`) or alone;
# an `idempotency_key` or a `sort_key` is not.
_KEY_QUALIFIERS = frozenset(
    {
        "api",
        "ssh",
        "private",
        "priv",
        "secret",
        "access",
        "signing",
        "encryption",
        "master",
        "client",
        "app",
        "license",
        "auth",
        "deploy",
        "pgp",
        "gpg",
        "account",
        "shared",
        "service",
        "storage",
        "subscription",
        "x",
        "hmac",
        "aws",
        "stripe",
        "openai",
    }
)
# Names that count tokens (`max_tokens`, `token_count`) are not credentials.
_COUNT_WORDS = frozenset(
    {
        "tokens",
        "count",
        "limit",
        "usage",
        "used",
        "total",
        "max",
        "min",
        "budget",
        "remaining",
        "length",
        "estimate",
    }
)
# Concatenations the word split cannot see (`xapikey`, `dbpassword`).
_SECRET_JOINED = (
    "password",
    "passwd",
    "passphrase",
    "apikey",
    "accesskey",
    "privatekey",
    "secretkey",
    "clientsecret",
    "authtoken",
    "accesstoken",
    "refreshtoken",
    "sessiontoken",
    "idtoken",
    "apitoken",
    "sshkey",
    "privkey",
)
# Query parameters that carry credentials by convention (OAuth `code`, a
# signed URL's `sig`, Google's `key`); as JSON fields these words are ordinary.
_SECRET_QUERY = frozenset({"code", "key", "sig", "s", "k"})


@lru_cache(maxsize=4096)  # names repeat on every flow (headers, fields); the cache is bounded
def is_secret_key(name: str) -> bool:
    words = [w.lower() for w in _NAME_WORDS.findall(name)]
    found = _SECRET_WORDS.intersection(words)
    if found - {"token"} or (found and not _COUNT_WORDS.intersection(words)):
        return True
    for i, w in enumerate(words):
        if w in ("key", "keys") and (len(words) == 1 or (i and words[i - 1] in _KEY_QUALIFIERS)):
            return True
    joined = "".join(words)
    return any(j in joined for j in _SECRET_JOINED)


@lru_cache(maxsize=1024)
def is_secret_param(name: str) -> bool:
    """A query parameter's name: the secret names plus the query conventions."""
    return name.lower() in _SECRET_QUERY or is_secret_key(name)


# -- 2. shapes checked in every string ---------------------------------------------

_SECRET_VALUE = re.compile(
    # The lookahead names every branch's first character: a necessary condition
    # the regex engine checks before trying the branches at each position
    # (2.5x faster on typical bodies; same matches).
    r"(?=[BbTsprgxAe])"
    r"(?:\b(?:[Bb]earer|BEARER|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{10,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bgl(?:pat|dt|ft|rt|soat|cbt|ptt|oas)-[A-Za-z0-9_-]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})"
)
# A PEM private key, from its BEGIN line to its END line (or to the end of a
# truncated string): the body is base64, nothing of it is kept.
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
    r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
# `password=hunter2`, `"api_key": "..."`, `db_password: ...` written in free text
# or in a body excerpt: the value goes when the key names a secret. The
# lookahead is the keys' first letters (as for _SECRET_VALUE: a fast reject).
_SECRET_ASSIGNMENT = re.compile(
    r"(?=[pPsStTaAcCoO])(?<![A-Za-z])"
    r"(password|passwd|passphrase|passcode|pwd|secret|token|api[-_ ]?key|apikey|access[-_]?key"
    r"|private[-_]?key|privkey|ssh[-_]?key|client[-_]?secret|credentials?|creds|auth[-_]?token"
    r"|pin|otp)"
    r"(\"?\s*[:=]\s*\"?)(?!\[redacted|%5Bredacted)([^\s\"'&,;}]{4,})",  # not what is already gone
    re.IGNORECASE,
)
# Words one of the two regexes above needs, in the lower-cased text: a text without
# any skips both (one scan in C).
_ASSIGNMENT_HINT = re.compile(r"pass|pwd|secret|token|key|cred|pin|otp")
# "my password is hunter2", "the PIN was 4921": a sentence, not an assignment.
_SECRET_SENTENCE = re.compile(
    r"(?<![A-Za-z])(password|passwd|passphrase|passcode|pwd|pin|otp|secret|api key|token)"
    r"(\s+(?:is|was)\s*:?\s+[\"']?)(?!\[redacted)([^\s\"'<>]{4,})",
    re.IGNORECASE,
)
# user:password@ in a URL written inside a value (redact_url handles whole URLs).
_USERINFO = re.compile(r"(?<=://)[^\s/?#@:]+:[^\s/?#@]+@")


def _sentence_value(m: re.Match[str]) -> str:
    value = m.group(3)
    # A word ("the token is expired") is prose; a value with a digit or a symbol,
    # or a long word, is what was said.
    if value.isalpha() and len(value) < 10:
        return m.group(0)
    return m.group(1) + m.group(2) + REDACTED


# -- 3. detectors, on candidates only ------------------------------------------------

# A run of token characters long enough to hold a generated credential.
_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_-]{16,}")
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9+/=_-]*")
_ENTROPY_LIMIT = 4.5  # detect-secrets' default for base64 strings


@lru_cache(maxsize=1)
def _detectors() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """detect-secrets' regex plugins, loaded once: (secret type, pattern).

    Its public-IP plugin is left out (an address is not a secret), and so are
    its keyword and high-entropy plugins, which this module does itself (names
    above; entropy below, with the plugin's own measure)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    found: list[tuple[str, re.Pattern[str]]] = []
    plugins: dict[str, type] = get_mapping_from_secret_type_to_class()
    for secret_type, cls in sorted(plugins.items()):
        if not issubclass(cls, RegexBasedDetector) or cls.__name__ == "IPPublicDetector":
            continue
        # A property in the base class's typing, a plain class attribute on every plugin.
        denylist = cast("Iterable[re.Pattern[str]]", cls.denylist)
        found.extend((secret_type, rx) for rx in denylist)
    return tuple(found)


@lru_cache(maxsize=1)
def _entropy() -> Any:
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

    return Base64HighEntropyString().calculate_shannon_entropy


def _secret_span(text: str, m: re.Match[str], secret_type: str) -> tuple[int, int]:
    if secret_type == "Private Key":  # the marker only: the key follows it
        return m.start(), len(text)
    # The secret is the last group long enough to be one (keyword plugins
    # capture the value), else the whole match; a match that stops inside a
    # token (Stripe's 24 characters of a longer key) takes the rest of it.
    start, end = m.span()
    for i in range(len(m.groups()), 0, -1):
        if m.group(i) and len(m.group(i)) >= 8:
            start, end = m.span(i)
            break
    tail = _TOKEN_TAIL.match(text, end)
    return start, tail.end() if tail else end


def _high_entropy(token: str) -> bool:
    if "/" in token and any(
        seg.isalpha() and seg.islower() and len(seg) >= 3 for seg in token.split("/")
    ):
        return False  # a path of words, not a key
    if not (
        any(c.isdigit() for c in token)
        and any(c.isupper() for c in token)
        and any(c.islower() for c in token)
    ):
        return False
    return _entropy()(token) > _ENTROPY_LIMIT


def _candidates(text: str) -> list[tuple[int, int]]:
    """Spans of tokens that could be generated credentials. Paths are split at
    their slashes; hex (ids, digests, UUIDs) and lower-case words are not
    candidates, so ordinary bodies skip the detectors entirely."""
    out = []
    for m in _CANDIDATE.finditer(text):
        token, start = m.group(0), m.start()
        if "/" in token and _is_path(token):
            for seg in _SEGMENT.finditer(token):
                if seg.end() - seg.start() >= 16 and not _BENIGN.fullmatch(seg.group(0)):
                    out.append((start + seg.start(), start + seg.end()))
        elif not _BENIGN.fullmatch(token):
            out.append(m.span())
    return out


def _is_path(token: str) -> bool:
    return any(seg.isalpha() and seg.islower() and len(seg) >= 3 for seg in token.split("/"))


_SEGMENT = re.compile(r"[^/]+")
_BENIGN = re.compile(r"[0-9a-f-]+|[a-z_.-]+")
_CONTEXT = (
    80  # characters before a candidate that plugins read ("aws_secret_key = '", a webhook URL)
)


def detect(text: str) -> list[tuple[int, int]]:
    """Spans of secrets the detectors find in `text` (sorted, may overlap).
    Each candidate token is scanned with a little context, not the whole text."""
    spans = []
    if "PuTTY-User-Key" in text:
        spans.append((text.index("PuTTY-User-Key"), len(text)))
    for start, end in _candidates(text):
        lo = max(0, start - _CONTEXT)
        window = text[lo : end + 2]
        for secret_type, rx in _detectors():
            for m in rx.finditer(window):
                a, b = _secret_span(window, m, secret_type)
                spans.append((lo + a, lo + b))
        token = text[start:end]
        if len(token) >= 20 and _high_entropy(token):
            spans.append((start, end))
    return sorted(spans)


def _cut(text: str, spans: Iterable[tuple[int, int]]) -> str:
    out, pos = [], 0
    for start, end in spans:
        if end <= pos:
            continue
        start = max(start, pos)
        out.append(text[pos:start])
        out.append(REDACTED)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str, limit: int = MAX_STRING) -> str:
    # Secrets are looked for a little past the cut, so one straddling it goes whole.
    extra = len(text) - limit
    if extra > 0:
        text = text[: limit + 200]
    text = _redact(text)
    if "=" in text and ("?" in text or "&" in text):
        text = _QUERY_PAIR.sub(_query_pair, text)
    if extra > 0:
        return text[:limit] + f"…[{extra} more chars]"
    return text


# Longest field whose redaction is cached (`redact_field`).
_CACHED_CHARS = 512


def redact_field(text: str, limit: int = MAX_STRING) -> str:
    """`redact_text` of a field that repeats from call to call (a host, a target, a
    path, a URL, a note): cached when short. Not for bodies or excerpts, which
    rarely repeat and would only push the fields out of the cache."""
    if len(text) <= _CACHED_CHARS:
        return _redact_field(text, limit)
    return redact_text(text, limit)


@lru_cache(maxsize=8192)  # a pure function of its arguments
def _redact_field(text: str, limit: int) -> str:
    return redact_text(text, limit)


def _redact(text: str) -> str:
    text = _SECRET_VALUE.sub(REDACTED, text)
    if "PRIVATE KEY" in text:
        text = _PEM.sub(REDACTED, text)
    lowered = text.lower()  # a case-insensitive scan costs µs per line: look for a key first
    if _ASSIGNMENT_HINT.search(lowered):
        text = _SECRET_ASSIGNMENT.sub(rf"\1\2{REDACTED}", text)
        if " is " in lowered or " was " in lowered:
            text = _SECRET_SENTENCE.sub(_sentence_value, text)
    if "://" in text:  # userinfo only follows a scheme
        text = _USERINFO.sub(REDACTED + "@", text)
    spans = detect(text)
    if spans:
        text = _cut(text, spans)
    return text


# `?code=...&q=my+password+is+...` inside a text (an upstream quoting the URL it
# was sent): the conventions of redact_url, and the shapes on the decoded value.
_QUERY_PAIR = re.compile(r"(?<=[?&])([A-Za-z0-9_.~%\[\]-]{1,64})=([^&\s\"'#<>\\]+)")


def _query_pair(m: re.Match[str]) -> str:
    name, value = m.group(1), m.group(2)
    if value.startswith(("%5Bredacted", REDACTED)):
        return m.group(0)
    if is_secret_param(unquote(name)):
        return f"{name}={REDACTED}"
    if "%" in value or "+" in value:
        decoded = unquote_plus(value)
        if _redact(decoded) != decoded:
            return f"{name}={REDACTED}"
    return m.group(0)


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_key(k) else redact_text(v)) for k, v in headers.items()}


def _key(k: Any) -> str:
    key = str(k)
    # A secret pasted as a key is still a secret; short keys cannot hold one.
    return redact_text(key, 200) if len(key) >= 16 else key


def _map_capped(value: dict, field: Callable[[str, Any], Any]) -> dict[str, Any]:
    """A dict's first MAX_ITEMS entries under their redacted keys (`_key`), each value
    `field(key, value)`, and a marker counting the keys left out."""
    out: dict[str, Any] = {}
    for i, (k, v) in enumerate(value.items()):
        if i >= MAX_ITEMS:
            out["…"] = f"[{len(value) - MAX_ITEMS} more keys]"
            break
        key = _key(k)
        out[key] = field(key, v)
    return out


def redact_value(value: Any, depth: int = 0) -> Any:
    """Redact a JSON-like value: secret-named keys, secret-shaped strings, size caps."""
    if depth > MAX_DEPTH:
        return "[truncated: too deep]"
    if isinstance(value, dict):
        return _map_capped(
            value,
            lambda key, v: (
                REDACTED
                if is_secret_key(key) and v not in (None, "")
                else redact_value(v, depth + 1)
            ),
        )
    if isinstance(value, list):
        items = [redact_value(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"[{len(value) - MAX_ITEMS} more items]")
        return items
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_url(url: str) -> str:
    """Drop credentials from the authority and secret query parameters."""
    if "?" not in url and "@" not in url:
        return redact_field(url)  # nothing to take apart
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_field(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode(
        [
            (k, REDACTED if is_secret_param(k) else redact_text(v, 500))
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
    )
    return redact_field(urlunsplit((parts.scheme, netloc, parts.path, query, "")))


# -- what the trace keeps of a call ------------------------------------------------


def digest(value: Any) -> str:
    """A short, stable digest of a value: equal values compare equal in the trace.
    Not a secret-keeping device (a short value can be guessed from it), which is
    why secret-named fields are redacted, never digested."""
    if isinstance(value, str | int | float | bool):  # the common case: the same JSON, faster
        blob = json.dumps(value)
    else:
        blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()[:16]


KEEP_ALL = "*"


def minimise_args(args: Any, keep: Iterable[str] = ()) -> Any:
    """Arguments as the trace stores them: field names, with each value replaced
    by its digest unless its dotted path (or a parent's) is in `keep`; `*` keeps
    every value. Kept values are redacted as usual; secret-named fields are
    redacted whatever `keep` says."""
    keep = frozenset(keep)
    if KEEP_ALL in keep:
        return redact_value(args)
    return _minimise(args, "", keep, 0)


def _minimise(value: Any, path: str, keep: frozenset[str], depth: int) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict) or depth > MAX_DEPTH:
        return digest(value)

    def field(key: str, v: Any) -> Any:
        dotted = f"{path}.{key}" if path else key
        if is_secret_key(key) and v not in (None, ""):
            return REDACTED
        if dotted in keep:
            return redact_value(v, depth + 1)
        return _minimise(v, dotted, keep, depth + 1)

    return _map_capped(value, field)


def secret_values(headers: dict[str, str], query: dict[str, list[str]], args: Any) -> list[str]:
    """Values a call carried under secret names (headers, query parameters,
    JSON fields), longest first, so that a copy of one elsewhere (a target an
    extract rule captured, an upstream's echo) can be removed too."""
    found: list[str] = []
    for name, value in headers.items():
        if is_secret_key(name):
            found.append(value)
            found.append(value.partition(" ")[2].strip())  # "Bearer TOKEN" -> TOKEN
    for name, values in query.items():
        if is_secret_param(name):
            found.extend(values)
    found.extend(json_secret_values(args, numbers=True))
    return sorted({v for v in found if len(v) >= 4}, key=len, reverse=True)


def json_secret_values(tree: Any, *, numbers: bool) -> list[str]:
    """The values under secret-named keys anywhere in a parsed JSON tree (strings, and
    integers too with `numbers`), walking at most 1,000 objects and arrays: a hostile body
    costs a bounded walk."""
    kinds = (str, int) if numbers else (str,)
    found: list[str] = []
    stack, budget = [tree], 1000
    while stack and budget:
        budget -= 1
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, kinds) and not isinstance(v, bool) and is_secret_key(str(k)):
                    found.append(str(v))
                elif isinstance(v, dict | list):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
    return found


def redact_target(kind: str, value: str, secrets: Iterable[str] = ()) -> str:
    """A target value as stored and logged: a secret the call carried, or one
    the detectors see, is removed (a record keeps its type: `customer:[redacted]`)."""
    prefix, ident = "", value
    if kind == "record":
        prefix, sep, ident = value.partition(":")
        prefix += sep
    for secret in secrets:
        if secret in ident:
            ident = ident.replace(secret, REDACTED)
    return prefix + redact_field(ident, 500)


_CLAIM_WORD = re.compile(r"[A-Za-z][A-Za-z _-]{0,31}")


def redact_claim(claimed: str) -> str:
    """A provenance the agent claimed (`human`, `operator`, ...) is kept to show
    the attempt; anything that is not a short word is not a claim but a value
    the agent put there, and is not stored."""
    if (
        _CLAIM_WORD.fullmatch(claimed)
        and redact_text(claimed) == claimed
        and not is_secret_key(claimed)
    ):
        return claimed
    return REDACTED


# Loaded now, not on the first secret-looking flow: importing the plugins takes
# about 0.2 s, which would stall the event loop (every agent) in the middle of traffic.
_detectors()
_entropy()
