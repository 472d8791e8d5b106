"""The strict JSON reader every transport reads messages with (no sockets):
what it refuses to read, what it reads two ways, and that the HTTP body path
and the stdio line path decide the same bytes the same way."""

from __future__ import annotations

import json

import pytest

from offscope.proxy.extract.http import read_json_body
from offscope.proxy.extract.strict_json import MAX_DEPTH, read_json

CALL = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "tools/call",
    "params": {"name": "git_add", "arguments": {"repo_path": "/srv/other", "files": ["a"]}},
}


def _with(field: bytes) -> bytes:
    """CALL with one more member in params, spelled as raw bytes."""
    text = json.dumps(CALL).encode()
    return text[:-2] + b', "_meta": ' + field + b"}}"


def test_a_plain_message_is_read_one_way():
    read = read_json(json.dumps(CALL).encode())
    assert read.readable and read.value == CALL and read.other_readings == ()


@pytest.mark.parametrize(
    "bad",
    [b'"caf\xe9"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xff"'],
    ids=["latin-1 byte", "encoded surrogate", "overlong slash", "stray 0xff"],
)
def test_invalid_utf8_anywhere_is_uninspectable_with_a_lenient_reading_for_the_record(bad):
    read = read_json(_with(bad))
    assert read.value is None and read.error is not None and "UTF-8" in read.error
    # What a server that replaces bad bytes (Node, the Python SDK) reads: the call.
    assert read.lenient["params"]["name"] == "git_add"


def test_depth_over_the_limit_is_uninspectable_and_the_limit_itself_is_read():
    at_limit = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert read_json(at_limit).readable
    over = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    assert "nested deeper" in (read_json(over).error or "")
    deep = _with(b"[" * 5000 + b"]" * 5000)
    assert "nested deeper" in (read_json(deep).error or "")


def test_objects_and_arrays_count_alike_toward_the_depth():
    def alternating(levels: int) -> bytes:
        return b'{"a":[' * (levels // 2) + b"1" + b"]}" * (levels // 2)

    assert read_json(alternating(MAX_DEPTH)).readable
    assert "nested deeper" in (read_json(alternating(MAX_DEPTH + 2)).error or "")


def test_brackets_inside_strings_do_not_count_as_depth():
    text = json.dumps({"s": "[" * 5000, "t": 'a\\"[[[' * 100, "u": "\\" * 9}).encode()
    read = read_json(text)
    assert read.readable and read.value["s"] == "[" * 5000


def test_many_shallow_objects_are_not_deep():
    text = json.dumps([{"a": [1, {"b": 2}]} for _ in range(5000)]).encode()
    assert read_json(text).readable


def test_size_over_the_limit_is_uninspectable():
    text = json.dumps(CALL).encode()
    assert "over the" in (read_json(text, max_bytes=len(text) - 1).error or "")
    assert read_json(text, max_bytes=len(text)).readable


@pytest.mark.parametrize("text", [b'{"a": NaN}', b"[Infinity]", b'{"a": 1,}', b"{", b"nul"])
def test_what_servers_do_not_parse_is_not_json(text):
    read = read_json(text)
    assert read.value is None and (read.error or "").startswith("not valid JSON")


def test_a_repeated_key_is_two_readings():
    text = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
        b'{"name":"git_status","arguments":{"repo_path":"/srv/other"},"name":"git_add"}}'
    )
    read = read_json(text)
    assert read.error is None and "'name'" in (read.ambiguity or "")
    assert read.value["params"]["name"] == "git_add"  # Python's json: the last wins
    assert [r["params"]["name"] for r in read.other_readings] == ["git_status"]  # first wins


def test_a_key_repeated_with_the_same_value_is_one_reading():
    read = read_json(b'{"a": {"b": 1}, "a": {"b": 1}}')
    assert read.readable and read.value == {"a": {"b": 1}}


def test_text_input_is_read_like_its_utf8_bytes():
    text = json.dumps(CALL, ensure_ascii=False)
    assert read_json(text).value == read_json(text.encode()).value == CALL
    assert read_json("[" * 300 + "]" * 300).error == read_json(b"[" * 300 + b"]" * 300).error


def test_utf16_with_a_bom_is_json_as_the_rfc_allows():
    text = json.dumps(CALL).encode("utf-16")
    assert read_json(text).value == CALL


@pytest.mark.parametrize(
    "raw",
    [
        _with(b'"caf\xe9"'),
        _with(b"[" * 5000 + b"]" * 5000),
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}',
        json.dumps(CALL).encode(),
        b"not json at all",
    ],
    ids=["invalid utf-8", "deep", "repeated key", "plain", "garbage"],
)
def test_an_http_body_and_a_stdio_line_are_read_the_same_way(raw):
    """The HTTP JSON body path is the strict reader: same bytes, same decision."""
    body = read_json_body(raw, {"content-type": "application/json"})
    line = read_json(raw + b"\n")
    assert (body.error is None) == (line.error is None)
    assert body.ambiguity == line.ambiguity
    assert body.value == (line.value if line.error is None else line.lenient)
    assert body.other_readings == line.other_readings
