"""No secret reaches the trace, the scope-request log or the proxy's output.

A corpus of secret spellings (the 43 an attacker's review found leaking, plus
more) is sent through a real `offscope proxy` subprocess to a loopback upstream
that echoes every request back: as JSON keys, query parameters, headers, free
text, record ids and accounts an extract rule captures, the claimed provenance
of an operator ask, an MCP tool call's arguments, and in the upstream's echo.
The ledger keeps every argument value (`keep_args: ['*']`, the worst case for
leaks), and the policy blocks every out-of-scope call (enforce-strict), so the
secret ids an extract rule captured are also filed in the request log.
Then nothing of any secret may be found in the trace file, the request log,
stdout or stderr (debug logging on), while ordinary values stay as they were.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import pytest

from tests.support.sidecar_kit import ProxyProcess, events, of_type

pytestmark = pytest.mark.timeout(180)

HOSTS = ("crm.acme.test", "ops.acme.test", "tools.acme.test", "billing.acme.test")

LEDGER = """\
schema: offscope.ledger/1
id: secrets-e2e
targets:
  hosts: [crm.acme.test, ops.acme.test, tools.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: /lookup}
    targets: {record: "customer:{query.token}"}
  - match: {host: billing.acme.test}
    targets: {account: "{header.x-api-key}"}
  - match: {source: mcp}
    targets: {record: "customer:{args.customer_id}"}
operator:
  - {host: ops.acme.test, path: /ask}
keep_args: ["*"]
"""

MINIMAL_LEDGER = """\
schema: offscope.ledger/1
id: minimal-args
targets:
  hosts: [crm.acme.test]
keep_args: [customer_id, refund.reason]
"""

# -- the corpus (all fake; shaped like the real thing) -------------------------------

# JSON field names whose value is a secret, whatever the value looks like.
JSON_KEYS = [
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
    # more spellings
    "password",
    "passwd",
    "secret",
    "client_secret",
    "access_token",
    "refresh_token",
    "apiKey",
    "x_api_key",
    "private_key",
    "session_token",
    "totp",
    "Authorization",
    "db_password",
    "signingKey",
    "mfa",
]
# Query parameters whose value is a secret.
QUERY_KEYS = [
    "pwd",
    "auth",
    "code",
    "key",
    "sig",
    "token",
    "access_token",
    "api_key",
    "password",
    "client_secret",
    "X-Amz-Signature",
    "apikey",
    "secret",
]
PEM_BODY = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw"
# Values that are secrets by their shape, wherever they are written.
VALUES = {
    "stripe": "sk_live_51NzQaPLk8vB3xW2mTq9RcD4eF6gH7jK8lM9nO0pQ1rS2tU3vW4xY5zA6bC7dE8f",
    "stripe-restricted": "rk_live_51NzQaPLk8vB3xW2mTq9RcD4eF6gH7jK8lM9",
    "github-pat": "github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234",
    "gitlab": "glpat-Xy7Qm2Lp9Rt4Vw8Zk3Nb",
    "aws-secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY8vQz3Lk2Hd",
    "bearer-lower": "bearer 9f8e7d6c5b4a39281726qwertyui",
    "pem": f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\nk3Jz9QvLmN2pR8sT\n-----END RSA PRIVATE KEY-----",
    "my-password": "my password is Tr0ub4dor&3x",
    # more shapes
    "github-classic": "ghp_R8tY2uI9oP3aS7dF1gH5jK0lZ4xC6vB2nM8q",
    "slack": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "aws-key-id": "AKIAQ3EGT7QWXY5ZPLMN",
    "google": "AIzaSyD8x9QmLp2Rt4Vw8Zk3Nb7Hj5Gf1Cd6Ea0",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03NyIsInNjb3BlIjoiYWRtaW4ifQ.Qm9va2Vk_c2lnbmF0dXJlX2hlcmU",
    "sendgrid": "SG.aBcDeFgHiJkLmNoPqRsTuV.wXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234",
    "openai": "sk-proj-Q7mX2kL9pR4tV8wZ3nB6hJ5gF1dC0sA",
    "twilio": "SK0123456789abcdef0123456789abcdef",
    "npm": "npm_Zq8Wx3Lk9Pm2Rt7Vb4Nc6Hj1Gf5Dd0Ss8Aa",
    "basic": "Basic YWdlbnQ6aHVudGVyMi1wYXNzd29yZA==",
    "assignment": "password=Cr4zyH0rse!batt",
    "sentence-pin": "the PIN was 4921-7730",
    "userinfo": "postgres://app:S3cr3tDbPw9@db.acme.test/billing",
    "high-entropy": "Zx9Qm2Lp7Rt4Vw8Kk3Nb6Hj1Gf5Dc0Sa2Ee7Yu4Io",
}
# The part of each value that must not survive (a prefix like "bearer " may).
VALUE_CORES = {
    "bearer-lower": "9f8e7d6c5b4a39281726qwertyui",
    "pem": PEM_BODY,
    "my-password": "Tr0ub4dor&3x",
    "basic": "YWdlbnQ6aHVudGVyMi1wYXNzd29yZA",
    "assignment": "Cr4zyH0rse!batt",
    "sentence-pin": "4921-7730",
    "userinfo": "S3cr3tDbPw9",
}
HEADERS = {
    "Authorization": "Bearer hdr-AuthBearer-7Qm2Lp9",
    "X-Api-Key": "hdr-apikey-55ab",
    "Cookie": "session=hdr-cookie-sess-91",
    "X-Auth-Token": "hdr-authtoken-3344",
}
CLAIMED = "claimed-prov-Zq81-secret"
RECORD_SECRETS = {
    "path": "sk_live_51RecordIdInPathQaPLk8vB3xW2mTq9Rc",
    "query": "qtok-record-7781-zz",
    "account": "acct-key-6632-billing",
}
MCP_SECRET = "mcp-pwd-Lk2299"
HOST_SECRET = "ghp_H0stHeaderR8tY2uI9oP3aS7dF1gH5jK0lZ4x"


def _corpus_secrets() -> dict[str, str]:
    """label -> the string that must appear nowhere."""
    out = {f"json:{k}": _json_value(k) for k in JSON_KEYS}
    out |= {f"query:{k}": _query_value(k) for k in QUERY_KEYS}
    out |= {f"value:{k}": VALUE_CORES.get(k, v) for k, v in VALUES.items()}
    out |= {f"header:{k}": v.split("=", 1)[-1].split(" ")[-1] for k, v in HEADERS.items()}
    out |= {"claimed-provenance": CLAIMED, "mcp:password": MCP_SECRET, "host-header": HOST_SECRET}
    out |= {f"record:{k}": v for k, v in RECORD_SECRETS.items()}
    return out


def _json_value(key: str) -> str:
    return f"jv-{''.join(c for c in key if c.isalnum())}-Qx7{len(key)}"


def _query_value(key: str) -> str:
    return f"qv-{''.join(c for c in key if c.isalnum())}-Lm4{len(key)}"


# -- a loopback upstream that echoes everything back ------------------------------


class EchoAll:
    """Answers with the request's path, headers and body (JSON-RPC calls get a
    JSON-RPC result quoting their arguments): every secret comes back."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(size).decode("utf-8", "replace") if size else ""
                echo: dict[str, Any] = {
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": raw,
                }
                try:
                    msg = json.loads(raw) if raw else None
                except ValueError:
                    msg = None
                if isinstance(msg, dict) and msg.get("jsonrpc") == "2.0":
                    args = (msg.get("params") or {}).get("arguments")
                    payload: Any = {
                        "jsonrpc": "2.0",
                        "id": msg.get("id"),
                        "result": {"content": [{"type": "text", "text": json.dumps(args)}]},
                    }
                elif self.path.startswith("/ask"):
                    payload = {"reply": f"echo: {raw}"}
                else:
                    payload = echo
                out = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def routes(self) -> str:
        return ",".join(f"{h}=127.0.0.1:{self.server.server_address[1]}" for h in HOSTS)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[EchoAll]:
    up = EchoAll()
    yield up
    up.stop()


def _proxy(
    tmp: Path,
    ledger_yaml: str,
    up: EchoAll,
    confdir: str,
    name: str,
    policy: str = "enforce-strict",
) -> ProxyProcess:
    ledger = tmp / f"{name}.yaml"
    ledger.write_text(ledger_yaml)
    return ProxyProcess(
        tmp,
        ledger=str(ledger),
        policy=policy,
        routes=up.routes(),
        confdir=confdir,
        name=name,
        extra=["--log-level", "debug"],
    )


def _send_corpus(c: httpx.Client) -> list[int]:
    statuses = []
    crm = "http://crm.acme.test"
    for key in JSON_KEYS:  # as JSON keys, in scope: forwarded and echoed
        statuses.append(
            c.post(f"{crm}/customers/4411", json={key: _json_value(key), "n": 1}).status_code
        )
    for key in QUERY_KEYS:  # as query parameters
        statuses.append(c.get(f"{crm}/customers/4411", params={key: _query_value(key)}).status_code)
    for (
        label,
        value,
    ) in VALUES.items():  # by shape: free text, an ordinary query parameter, a header
        statuses.append(
            c.post(f"{crm}/customers/4411", json={"note": f"[{label}] {value} (end)"}).status_code
        )
        statuses.append(c.get(f"{crm}/customers/4411", params={"q": value}).status_code)
        if "\n" not in value:
            statuses.append(c.get(f"{crm}/customers/4411", headers={"X-Note": value}).status_code)
    for name, value in HEADERS.items():  # secret headers, echoed back by the upstream
        statuses.append(c.get(f"{crm}/customers/4411", headers={name: value}).status_code)
    # A Host header that disagrees with the destination (refused, and noted as sent).
    statuses.append(c.get(f"{crm}/customers/4411", headers={"Host": HOST_SECRET}).status_code)
    # The claimed provenance of an operator ask.
    statuses.append(
        c.post(
            "http://ops.acme.test/ask",
            json={"question": "may I?"},
            headers={"X-Offscope-Provenance": CLAIMED},
        ).status_code
    )
    statuses.append(
        c.post(
            "http://ops.acme.test/ask", json={"question": "may I?", "provenance": VALUES["stripe"]}
        ).status_code
    )
    # Secrets an extract rule captures as a record id or an account (out of scope:
    # blocked, so they are also filed in the request log).
    statuses.append(c.get(f"{crm}/customers/{RECORD_SECRETS['path']}").status_code)
    statuses.append(c.get(f"{crm}/lookup", params={"token": RECORD_SECRETS["query"]}).status_code)
    statuses.append(
        c.get(
            "http://billing.acme.test/invoices", headers={"X-Api-Key": RECORD_SECRETS["account"]}
        ).status_code
    )
    # An MCP tool call with a secret argument; the upstream's result quotes it.
    statuses.append(
        c.post(
            "http://tools.acme.test/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {
                    "name": "login",
                    "arguments": {
                        "customer_id": "4411",
                        "password": MCP_SECRET,
                        "note": VALUES["github-pat"],
                    },
                },
            },
        ).status_code
    )
    return statuses


def _forms(secret: str) -> set[str]:
    """The secret as the files could spell it: raw, JSON-escaped, URL-encoded, and
    its tail (a detector that stops early must not leave the rest behind)."""
    forms = {secret, json.dumps(secret)[1:-1], quote(secret, safe=""), quote_plus(secret)}
    if len(secret) >= 20:
        forms.add(secret[-12:])
    return {f for f in forms if f}


def test_no_secret_reaches_trace_request_log_or_logs(
    tmp_path: Path, confdir: str, upstream: EchoAll
) -> None:
    proxy = _proxy(tmp_path, LEDGER, upstream, confdir, "sec")
    with proxy:
        with httpx.Client(proxy=proxy.proxy_url("secrets-1"), timeout=20) as c:
            statuses = _send_corpus(c)
        proxy.control("POST", "/runs/secrets-1/end", json={"reason": "end"})
    assert proxy.proc.returncode == 0
    assert statuses.count(200) > len(statuses) // 2  # the in-scope calls went through

    trace = proxy.trace.read_text(encoding="utf-8")
    files = {
        "trace": trace,
        "request log": proxy.requests.read_text(encoding="utf-8"),
        "stderr": proxy.stderr(),
        "stdout": proxy.stdout(),
    }
    secrets = _corpus_secrets()
    assert len(secrets) >= 43 + 20
    leaks = [
        f"{label} in {where}"
        for label, secret in secrets.items()
        for where, text in files.items()
        if any(form in text for form in _forms(secret))
    ]
    assert not leaks, "\n".join(leaks)

    # The channels were really exercised: calls recorded, echoes kept, ids filed.
    evs = events(proxy.trace)
    calls = of_type(evs, "tool_call")
    assert len(calls) >= len(statuses) - 3  # two operator asks and the refused Host are not calls
    assert sum("[redacted]" in (e.get("response_excerpt") or "") for e in calls) > 40
    filed = [json.loads(line) for line in files["request log"].splitlines()]
    assert {t.split(":", 1)[0] for r in filed for t in r["targets"]} >= {"record", "account"}
    assert all("[redacted]" in t for r in filed for t in r["targets"] if not t.startswith("host:"))
    claims = [o.get("claimed_provenance") for o in of_type(evs, "operator")]
    assert claims == ["[redacted]", "[redacted]"]
    assert "provenance_claim_ignored" in files["stderr"]


def test_ordinary_values_are_not_redacted(tmp_path: Path, confdir: str, upstream: EchoAll) -> None:
    proxy = _proxy(tmp_path, LEDGER, upstream, confdir, "plain", policy="shadow")
    note = "tokens: 5 of 100 used; the secretary confirmed; keyboard=us"
    body = {
        "note": note,
        "host": "crm.acme.test",
        "customer": "customer:4411",
        "invoice": "INV-2024-0042",
        "trace_id": "550e8400-e29b-41d4-a716-446655440000",
        "model": "gpt-4o-mini-2024-07-18",
        "max_tokens": 512,
        "idempotency_key": "refund-4411-1",
    }
    with proxy:
        with httpx.Client(proxy=proxy.proxy_url("plain-1"), timeout=20) as c:
            assert (
                c.post(
                    "http://crm.acme.test/customers/4411?page=2&sort=desc", json=body
                ).status_code
                == 200
            )
            assert (
                c.post(
                    "http://ops.acme.test/ask",
                    json={"question": "ok?"},
                    headers={"X-Offscope-Provenance": "human"},
                ).status_code
                == 200
            )
    (call,) = of_type(events(proxy.trace), "tool_call")
    assert call["call"]["args"] == body
    assert call["call"]["url"] == "http://crm.acme.test/customers/4411?page=2&sort=desc"
    assert {(t["kind"], t["value"]) for t in call["call"]["targets"]} == {
        ("host", "crm.acme.test"),
        ("record", "customer:4411"),
    }
    assert "[redacted]" not in call["response_excerpt"]
    (ask,) = of_type(events(proxy.trace), "operator")
    assert ask["claimed_provenance"] == "human"


def test_argument_values_are_kept_only_where_the_ledger_says(
    tmp_path: Path, confdir: str, upstream: EchoAll
) -> None:
    proxy = _proxy(tmp_path, MINIMAL_LEDGER, upstream, confdir, "min", policy="shadow")
    body = {
        "customer_id": "customer:4411",
        "email": "ana.lima@example.test",
        "phone": "+351 912 345 678",
        "refund": {"amount": 30, "reason": "duplicate charge"},
        "password": "hunter2-Zz",
    }
    with proxy:
        with httpx.Client(proxy=proxy.proxy_url("min-1"), timeout=20) as c:
            assert c.post("http://crm.acme.test/refunds", json=body).status_code == 200
    (call,) = of_type(events(proxy.trace), "tool_call")
    args = call["call"]["args"]
    assert args["customer_id"] == "customer:4411" and args["refund"]["reason"] == "duplicate charge"
    assert (
        args["password"] == "[redacted]"
    )  # never a digest: a short secret can be guessed from one
    for name in ("email", "phone"):
        assert args[name].startswith("sha256:") and len(args[name]) == len("sha256:") + 16
    assert args["refund"]["amount"].startswith("sha256:")
    stored = json.dumps(call["call"])  # (the upstream's echo is an excerpt, not the call)
    assert "ana.lima" not in stored and "912 345" not in stored and "hunter2" not in stored
    # Equal values, equal digests: the trace can still say "the same email twice".
    from offscope.trace.redact import digest

    assert args["email"] == digest("ana.lima@example.test")
