"""Compressed response bodies, decoded only as far as offscope reads them.

The upstream chooses the compression, so it chooses how much memory a full
decode costs: 1 MiB of gzip on the wire is 1 GiB decoded (1 MiB of brotli,
far more). offscope keeps the first `EXCERPT` bytes of a plain HTTP response
and parses whole only MCP, LLM and operator replies, which it does not parse
beyond `RESPONSE_LIMIT` bytes. So every decoder here is incremental and
stops once it has `limit` bytes: the cost of a bomb is the limit, not its
ratio. The body sent to the agent is never touched (mitmproxy forwards the
compressed bytes as they came).

mitmproxy 11.0.2 decodes gzip, deflate (zlib or raw), br and zstd, in one
call each and without a size bound; these are the same codings, bounded.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import brotli
import zstandard

# The most of a response offscope decodes to parse it whole (an MCP result or an
# LLM reply; a tool result may carry images). A larger one is noted, not parsed.
RESPONSE_LIMIT = 16 * 1024 * 1024
# Brotli 1.1.0 (the newest mitmproxy 11.0.2 allows) has no output bound per
# call, and one byte can finish a meta-block of up to 16 MiB: feeding a few
# bytes at a time bounds what one call can add beyond the limit.
_BROTLI_STEP = 16
# HTTP's zstd coding uses windows of at most 8 MiB (RFC 8878, section 7.2);
# a frame asking for more would make the decoder allocate it.
_ZSTD_MAX_WINDOW = 8 * 1024 * 1024
# An inner coding (the first applied, of two) is decoded up to this much.
_INNER_LIMIT = 4 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class Decoded:
    body: bytes  # at most `limit` bytes of the decoded body (raw bytes if undecodable)
    complete: bool  # False: the decoded body is longer than `limit` (truncated)
    note: str | None = None  # why the body is raw or incomplete, for the record


def codings(content_encoding: str) -> list[str]:
    """The codings applied, in the order applied ('gzip, br' -> ['gzip', 'br'])."""
    return [
        c
        for c in (t.strip().lower() for t in content_encoding.split(","))
        if c and c not in ("identity", "none")
    ]


def decode_body(raw: bytes, content_encoding: str, limit: int) -> Decoded:
    """At most `limit` bytes of `raw` decoded per its Content-Encoding.

    An unknown coding or corrupt data gives the raw bytes (cut to `limit`) and
    a note; a body longer than `limit` once decoded gives its first `limit`
    bytes and `complete=False`."""
    steps = codings(content_encoding)
    if not steps or not raw:
        return Decoded(raw[:limit], len(raw) <= limit)
    body, complete = raw, True
    for i, coding in enumerate(reversed(steps)):
        decoder = _DECODERS.get(coding)
        if decoder is None:
            return Decoded(
                raw[:limit], len(raw) <= limit, f"content-encoding {coding!r} not decoded"
            )
        # An inner coding needs the whole of the outer one's output; both are bounded.
        last = i == len(steps) - 1
        try:
            body, whole = decoder(body, limit if last else max(limit, _INNER_LIMIT))
        except (ValueError, zlib.error, brotli.error, zstandard.ZstdError, EOFError) as exc:
            return Decoded(
                raw[:limit], len(raw) <= limit, f"content-encoding {coding!r} not decoded: {exc}"
            )
        complete = complete and whole
        if not whole and not last:
            break  # the inner coding's input is cut: decode what there is
    if not complete:
        return Decoded(body[:limit], False)
    return Decoded(body, True)


def _zlib(data: bytes, wbits: int, limit: int, members: bool) -> tuple[bytes, bool]:
    out = bytearray()
    decoder = zlib.decompressobj(wbits)
    pending = data
    while True:
        # max_length > 0 always (0 would mean "no limit"): out is at most limit here.
        out += decoder.decompress(pending, limit + 1 - len(out))
        if len(out) > limit:
            return bytes(out[:limit]), False
        pending = decoder.unconsumed_tail
        if decoder.eof:
            rest = decoder.unused_data
            if members and rest.strip(b"\0"):  # gzip: another member follows
                decoder, pending = zlib.decompressobj(wbits), rest
                continue
            return bytes(out), True
        if not pending:  # a truncated stream: what it held is what there is
            return bytes(out), True


def _gzip(data: bytes, limit: int) -> tuple[bytes, bool]:
    return _zlib(data, 16 + zlib.MAX_WBITS, limit, members=True)


def _deflate(data: bytes, limit: int) -> tuple[bytes, bool]:
    # Some servers send raw deflate without the zlib header (as mitmproxy, accept both).
    try:
        return _zlib(data, zlib.MAX_WBITS, limit, members=False)
    except zlib.error:
        return _zlib(data, -zlib.MAX_WBITS, limit, members=False)


def _brotli(data: bytes, limit: int) -> tuple[bytes, bool]:
    out = bytearray()
    decoder = brotli.Decompressor()
    view = memoryview(data)
    for start in range(0, len(view), _BROTLI_STEP):
        out += decoder.process(bytes(view[start : start + _BROTLI_STEP]))
        if len(out) > limit:
            return bytes(out[:limit]), False
    return bytes(out), True


def _zstd(data: bytes, limit: int) -> tuple[bytes, bool]:
    decoder = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    with decoder.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
        out = reader.read(limit + 1)
    return (out[:limit], False) if len(out) > limit else (out, True)


_DECODERS: dict[str, Callable[[bytes, int], tuple[bytes, bool]]] = {
    "gzip": _gzip,
    "x-gzip": _gzip,
    "deflate": _deflate,
    "deflateraw": _deflate,
    "br": _brotli,
    "zstd": _zstd,
}
