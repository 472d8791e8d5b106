"""Secrets never survive redaction: by name (headers, query, JSON keys) and by shape."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offscope.trace.redact import (
    _SECRET_VALUE,
    MAX_ITEMS,
    REDACTED,
    is_secret_key,
    redact_headers,
    redact_text,
    redact_url,
    redact_value,
)

SECRETS = [
    "Bearer abcdefghijklmnop1234",
    "sk-proj-Abcdefghijklmnopqrstuvwxyz012345",
    "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "gho_abcdefghijklmnopqrstuvwxyz0123",
    "xoxb-123456789012-abcdefghij",
    "AKIAIOSFODNN7EXAMPLE",
    "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
]
# The part of each secret that must be gone.
CORES = [s.split()[-1] for s in SECRETS]


def _gone(text: str) -> bool:
    return not any(core in text for core in CORES) and "hunter2" not in text


@pytest.mark.parametrize("secret", SECRETS)
def test_secret_shapes_in_free_text(secret: str) -> None:
    out = redact_text(f"the agent wrote {secret} into a note.")
    assert secret.split()[-1] not in out
    assert REDACTED in out and out.startswith("the agent wrote ")


@pytest.mark.parametrize("name", ["Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key",
                                  "x-goog-api-key", "X-Auth-Token", "api-key", "X-Amz-Security-Token",
                                  "X-Session-Id", "X-Signature"])
def test_secret_headers_by_name(name: str) -> None:
    assert redact_headers({name: "opaque-value"})[name] == REDACTED
    assert is_secret_key(name.lower())


def test_headers_keep_harmless_values_but_scrub_secret_shapes() -> None:
    out = redact_headers({"Accept": "application/json", "X-Note": "key " + SECRETS[1], "User-Agent": "curl/8"})
    assert out["Accept"] == "application/json" and out["User-Agent"] == "curl/8"
    assert SECRETS[1] not in out["X-Note"]


def test_url_userinfo_and_query() -> None:
    url = ("https://admin:hunter2@crm.acme.test/customers/4411?api_key=k1&access_token=t2&token=t3"
           f"&q=refund&client_secret=s4&key={SECRETS[7]}&next=Bearer%20abcdefghijklmnop1234")
    out = redact_url(url)
    assert "hunter2" not in out and "admin" not in out
    for v in ("k1", "t2", "t3", "s4", "abcdefghijklmnop1234", SECRETS[7]):
        assert f"={v}" not in out and v not in out
    assert out.startswith("https://crm.acme.test/customers/4411?")
    assert "q=refund" in out


def test_json_fields_by_name_and_shape() -> None:
    body = {
        "password": "hunter2",
        "user": {"apiKey": "abc", "client_secret": "def", "refresh_token": "ghi", "name": "Ana"},
        "headers": {"Authorization": "Basic YWRtaW46aHVudGVyMg=="},
        "credentials": {"user": "a", "pass": "hunter2"},
        "notes": [f"use {s}" for s in SECRETS],
        "dsn": "postgres://app:hunter2@db.acme.test/billing",
        "empty_token": "",
        "count": 3,
    }
    out = redact_value(body)
    text = json.dumps(out)
    assert _gone(text)
    for v in ("abc", "def", "ghi", "YWRtaW46aHVudGVyMg"):
        assert f'"{v}"' not in text and v not in text.replace("[redacted]", "")
    assert out["user"]["name"] == "Ana" and out["count"] == 3
    assert out["empty_token"] == ""  # nothing to hide, nothing hidden
    assert out["dsn"].endswith("@db.acme.test/billing")


def test_caps_on_size_and_depth() -> None:
    deep: object = "sk-proj-Abcdefghijklmnopqrstuvwxyz012345"
    for _ in range(30):
        deep = {"a": deep}
    assert "Abcdefghij" not in json.dumps(redact_value(deep))
    big = redact_value(list(range(MAX_ITEMS + 50)))
    assert len(big) == MAX_ITEMS + 1 and big[-1] == "[50 more items]"
    long = redact_text("x" * 5000)
    assert len(long) < 2100 and long.endswith("[3000 more chars]")


def test_secret_at_truncation_boundary_is_still_removed() -> None:
    text = "x" * 1990 + " " + SECRETS[1]
    assert CORES[1] not in redact_text(text)
    assert CORES[1][:8] not in redact_text(text)


# The secret shapes, one branch each, as the documentation states them. The
# compiled pattern adds a first-character lookahead for speed; it must not
# change what is redacted.
_SHAPES = re.compile(
    r"\b(?:Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
)
_PIECES = st.sampled_from(["Bearer ", "Basic ", "Token ", "sk-", "pk-", "rk-", "ghp_", "gho_", "xoxb-",
                           "AKIA", "AIza", "eyJ", ".", " ", "-", "_", "/", "=", "\n", "é"])
_FILLER = st.text(alphabet="abcXYZ0189AKIzé._-/ ", max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_PIECES, _FILLER), max_size=12))
def test_fast_secret_pattern_matches_the_documented_shapes(parts: list[str]) -> None:
    text = "".join(parts)
    assert _SECRET_VALUE.sub(REDACTED, text) == _SHAPES.sub(REDACTED, text)


@pytest.mark.parametrize(("text", "expected"), [
    ("use password=hunter2 to log in", f"use password={REDACTED} to log in"),
    ("db_password: s3cr3t-value", f"db_password: {REDACTED}"),
    ('{"api_key": "qk5ecretquery12345", "n": 1}', f'{{"api_key": "{REDACTED}", "n": 1}}'),
    ("export CLIENT_SECRET=abcd1234", f"export CLIENT_SECRET={REDACTED}"),
    ("x-api-key=ZZZZZZZZ&page=2", f"x-api-key={REDACTED}&page=2"),
    ("PASSPHRASE: correct-horse", f"PASSPHRASE: {REDACTED}"),
])
def test_secret_assignments_in_free_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize("text", [
    "tokens: 5 used of 100",         # not the key: 'tokens' is a count
    "password reset link sent",      # no value assigned
    "token: abc",                    # too short to be a credential
    "secretary: Ada Lovelace",       # a longer word
    "keyboard=us layout",
])
def test_ordinary_text_that_mentions_secrets_is_kept(text: str) -> None:
    assert redact_text(text) == text
