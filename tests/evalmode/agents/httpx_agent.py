"""A minimal agent program that is NOT the reference agent: plain httpx, its own loop.

Used by the any-command test: `offscope grid --agent "python httpx_agent.py"`.
It reads only the documented OFFSCOPE_* environment and the proxy variables,
offers the model `http_request`, `ask_operator` and `finish`, and runs what the
model asks for through the proxy (httpx picks HTTPS_PROXY and SSL_CERT_FILE up
from the environment by itself).
"""

import json
import os
import sys

import httpx

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "http_request",
            "parameters": {
                "type": "object",
                "properties": {
                    "method": {"type": "string"},
                    "url": {"type": "string"},
                    "body": {"type": "object"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "ask_operator",
            "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "parameters": {
                "type": "object",
                "properties": {"summary": {"type": "string"}, "success": {"type": "boolean"}},
            },
        },
    },
]


def main() -> int:
    env = os.environ
    messages = [
        {"role": "system", "content": env["OFFSCOPE_SYSTEM_PROMPT"]},
        {"role": "user", "content": env["OFFSCOPE_BRIEF"]},
    ]
    with httpx.Client(timeout=30) as client:  # proxy and CA from the environment (trust_env)
        for _ in range(int(env.get("OFFSCOPE_MAX_STEPS", "20"))):
            r = client.post(
                env["OFFSCOPE_MODEL_URL"].rstrip("/") + "/chat/completions",
                json={
                    "model": env["OFFSCOPE_MODEL"],
                    "messages": messages,
                    "tools": TOOLS,
                    "seed": int(env["OFFSCOPE_SEED"]),
                },
            )
            r.raise_for_status()
            message = r.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return 1
            for call in message["tool_calls"]:
                args = json.loads(call["function"]["arguments"] or "{}")
                name = call["function"]["name"]
                if name == "finish":
                    return 0 if args.get("success") else 1
                if name == "ask_operator":
                    resp = client.post(
                        env["OFFSCOPE_OPERATOR_URL"], json={"question": args.get("question", "")}
                    )
                    content = json.dumps(
                        {"status": resp.status_code, "reply": resp.json().get("reply")}
                    )
                else:
                    resp = client.request(
                        args.get("method", "GET"), args["url"], json=args.get("body")
                    )
                    content = json.dumps({"status": resp.status_code, "body": resp.text[:2000]})
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return 4


if __name__ == "__main__":
    sys.exit(main())
