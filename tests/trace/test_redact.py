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
    detect,
    digest,
    is_secret_key,
    is_secret_param,
    minimise_args,
    redact_claim,
    redact_headers,
    redact_target,
    redact_text,
    redact_url,
    redact_value,
    secret_values,
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


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "Proxy-Authorization",
        "Cookie",
        "Set-Cookie",
        "X-Api-Key",
        "x-goog-api-key",
        "X-Auth-Token",
        "api-key",
        "X-Amz-Security-Token",
        "X-Session-Id",
        "X-Signature",
    ],
)
def test_secret_headers_by_name(name: str) -> None:
    assert redact_headers({name: "opaque-value"})[name] == REDACTED
    assert is_secret_key(name.lower())


def test_headers_keep_harmless_values_but_scrub_secret_shapes() -> None:
    out = redact_headers(
        {"Accept": "application/json", "X-Note": "key " + SECRETS[1], "User-Agent": "curl/8"}
    )
    assert out["Accept"] == "application/json" and out["User-Agent"] == "curl/8"
    assert SECRETS[1] not in out["X-Note"]


def test_url_userinfo_and_query() -> None:
    url = (
        "https://admin:hunter2@crm.acme.test/customers/4411?api_key=k1&access_token=t2&token=t3"
        f"&q=refund&client_secret=s4&key={SECRETS[7]}&next=Bearer%20abcdefghijklmnop1234"
    )
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
    r"\b(?:[Bb]earer|BEARER|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{10,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bgl(?:pat|dt|ft|rt|soat|cbt|ptt|oas)-[A-Za-z0-9_-]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
)
_PIECES = st.sampled_from(
    [
        "Bearer ",
        "bearer ",
        "Basic ",
        "Token ",
        "sk-",
        "pk-",
        "rk-",
        "sk_live_",
        "rk_test_",
        "ghp_",
        "gho_",
        "github_pat_",
        "glpat-",
        "xoxb-",
        "AKIA",
        "AIza",
        "eyJ",
        ".",
        " ",
        "-",
        "_",
        "/",
        "=",
        "\n",
        "é",
    ]
)
_FILLER = st.text(alphabet="abcXYZ0189AKIzé._-/ ", max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_PIECES, _FILLER), max_size=12))
def test_fast_secret_pattern_matches_the_documented_shapes(parts: list[str]) -> None:
    text = "".join(parts)
    assert _SECRET_VALUE.sub(REDACTED, text) == _SHAPES.sub(REDACTED, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("use password=hunter2 to log in", f"use password={REDACTED} to log in"),
        ("db_password: s3cr3t-value", f"db_password: {REDACTED}"),
        ('{"api_key": "qk5ecretquery12345", "n": 1}', f'{{"api_key": "{REDACTED}", "n": 1}}'),
        ("export CLIENT_SECRET=abcd1234", f"export CLIENT_SECRET={REDACTED}"),
        ("x-api-key=ZZZZZZZZ&page=2", f"x-api-key={REDACTED}&page=2"),
        ("PASSPHRASE: correct-horse", f"PASSPHRASE: {REDACTED}"),
    ],
)
def test_secret_assignments_in_free_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "tokens: 5 used of 100",  # not the key: 'tokens' is a count
        "password reset link sent",  # no value assigned
        "token: abc",  # too short to be a credential
        "secretary: Ada Lovelace",  # a longer word
        "keyboard=us layout",
    ],
)
def test_ordinary_text_that_mentions_secrets_is_kept(text: str) -> None:
    assert redact_text(text) == text


# -- the spellings that used to leak, and more ------------------------------------

# JSON keys (and header names) that name a secret.
SECRET_NAMES = [
    "pwd",
    "pass",
    "passphrase",
    "api key",
    "auth",
    "creds",
    "ssh_key",
    "pin",
    "otp",
    "privkey",
    "apiKey",
    "X-Api-Key",
    "x_api_key",
    "signingKey",
    "SSH-Key",
    "dbPassword",
    "user_pwd",
    "totp",
    "mfa",
    "oauth_state",
    "xapikey",
    "AccessToken",
    "id_token",
]
# Names that only look like one.
ORDINARY_NAMES = [
    "secretary",
    "max_tokens",
    "prompt_tokens",
    "token_count",
    "tokens",
    "keyboard",
    "idempotency_key",
    "sort_key",
    "shipping",
    "author",
    "pinned",
    "passenger",
    "customer_id",
    "host",
    "signal",
    "compass",
    "monkey",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_key(name)
    assert redact_value({name: "opaque-1234", "n": 1}) == {name: REDACTED, "n": 1}


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names(name: str) -> None:
    assert not is_secret_key(name)


@pytest.mark.parametrize(
    "name", ["pwd", "auth", "code", "key", "sig", "token", "X-Amz-Signature", "apikey", "secret"]
)
def test_secret_query_parameters(name: str) -> None:
    out = redact_url(f"https://crm.acme.test/cb?{name}=opaque-77aa&page=2")
    assert "opaque-77aa" not in out and out.endswith("&page=2")
    assert is_secret_param(name)


# Secret-shaped values, found wherever they are written (the part that must go).
SHAPED = {
    "stripe": "sk_live_51NzQaPLk8vB3xW2mTq9RcD4eF6gH7jK8lM9nO0pQ1rS2tU3vW4xY5zA6bC7dE8f",
    "github_pat": "github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRs",
    "gitlab": "glpat-Xy7Qm2Lp9Rt4Vw8Zk3Nb",
    "aws secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY8vQz3Lk2Hd",
    "sendgrid": "SG.aBcDeFgHiJkLmNoPqRsTuV.wXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234",
    "twilio": "SK0123456789abcdef0123456789abcdef",
    "slack webhook": "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/aBcDeFgHiJkLmNoPqRsTuVwX",
    "telegram": "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawZ",
    "high entropy": "Zx9Qm2Lp7Rt4Vw8Kk3Nb6Hj1Gf5Dc0Sa2Ee7Yu4Io",
}


@pytest.mark.parametrize("label", sorted(SHAPED))
def test_secret_shapes_found_by_the_detectors(label: str) -> None:
    secret = SHAPED[label]
    for text in (f"note: {secret} end", f'{{"x": "{secret}"}}', secret):
        out = redact_text(text)
        assert secret not in out and secret[-10:] not in out, out


def test_the_detectors_are_detect_secrets_plugins() -> None:
    """Vendor formats nobody listed here (SendGrid, Twilio) come from detect-secrets."""
    from offscope.trace.redact import _detectors

    types = {t for t, _ in _detectors()}
    assert {"SendGrid API Key", "Twilio API Key", "Stripe Access Key", "GitLab Token"} <= types
    assert "Public IP (ipv4)" not in types  # an address is not a secret
    assert detect("x SG.aBcDeFgHiJkLmNoPqRsTuV.wXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234 y")


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("Authorization: bearer 9f8e7d6c5b4a39281726qwertyui", "9f8e7d6c5b4a39281726"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHC\nozMxH2Mo4lg\n-----END RSA PRIVATE KEY-----",
            "MIIEowIBAAKCAQEAu1SU1LfVLPHC",
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA (cut short",
            "b3BlbnNzaC1rZXkt",
        ),
        ("my password is Tr0ub4dor&3x, ok?", "Tr0ub4dor"),
        ("The PIN was 4921-7730.", "4921-7730"),
        ("ssh_key: AAAAB3NzaC1yc2E", "AAAAB3NzaC1yc2E"),
        ("otp=123456", "123456"),
        ("see /x?code=abc123&page=2", "abc123"),
        ('{"path": "/c?q=my+password+is+Tr0ub4dor%263x"}', "Tr0ub4dor"),
        ('{"path": "/c?q=wJalrXUtnFEMI%2FK7MDENG%2FbPxRfiCY8vQz3Lk2Hd"}', "K7MDENG"),
    ],
)
def test_secrets_in_free_text(text: str, gone: str) -> None:
    assert gone not in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "customer:4411",
        "crm.acme.test",
        "the token is expired",
        "my password is long",
        "/customers/4411/invoices/INV-2024-0042/lines",
        "550e8400-e29b-41d4-a716-446655440000",
        "gpt-4o-mini-2024-07-18",
        "see https://crm.acme.test/customers/4411?page=2&sort=desc",
        "d41d8cd98f00b204e9800998ecf8427e",
        "sha256:9f86d081884c7d65",
        "refund-4411-2024-11-30",
        "getCustomerInvoices2024",
        "/srv/app/data/Reports/2024/Quarterly-Summary-Final-v2.json",
    ],
)
def test_ordinary_values_are_kept(text: str) -> None:
    assert redact_text(text) == text


def test_minimise_args_keeps_names_and_digests_unless_kept() -> None:
    args = {
        "customer_id": "customer:4411",
        "email": "ana@example.test",
        "password": "hunter2",
        "refund": {"amount": 30, "reason": "dup"},
        "items": [1, 2],
        "none": None,
    }
    out = minimise_args(args, ["customer_id", "refund.reason"])
    assert out == {
        "customer_id": "customer:4411",
        "email": digest("ana@example.test"),
        "password": REDACTED,
        "refund": {"amount": digest(30), "reason": "dup"},
        "items": digest([1, 2]),
        "none": None,
    }
    assert minimise_args(args, ["*"]) == redact_value(args)
    assert minimise_args(args) == minimise_args(args, [])  # nothing kept by default
    assert minimise_args("raw body") == digest("raw body")


def test_targets_lose_the_secrets_the_call_carried() -> None:
    secrets = secret_values(
        {"x-api-key": "acct-key-6632", "accept": "*/*"},
        {"token": ["qtok-1"]},
        {"user": {"password": "pw-991122"}},
    )
    assert set(secrets) == {"acct-key-6632", "qtok-1", "pw-991122"}
    assert redact_target("account", "acct-key-6632", secrets) == REDACTED
    assert redact_target("record", "customer:qtok-1", secrets) == f"customer:{REDACTED}"
    assert (
        redact_target("record", "customer:ghp_R8tY2uI9oP3aS7dF1gH5jK0lZ4xC6vB2nM8q", [])
        == f"customer:{REDACTED}"
    )
    assert redact_target("record", "customer:4411", secrets) == "customer:4411"
    assert redact_target("host", "crm.acme.test", secrets) == "crm.acme.test"


def test_claimed_provenance_is_a_word_or_nothing() -> None:
    assert redact_claim("human") == "human" and redact_claim("human operator") == "human operator"
    assert redact_claim("sk_live_51NzQaPLk8vB3xW2mTq9RcD4eF6") == REDACTED
    assert redact_claim("claimed-prov-Zq81") == REDACTED
    assert redact_claim("password") == REDACTED
