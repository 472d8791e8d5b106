"""Headless Chromium over the DevTools protocol on a pipe (stdlib only), for the
tests that check a page as a person sees it: report.html, runs.html. The
network is switched off in every page it opens."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import pytest


def _chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CI") != "true",
    reason="headless Chromium not installed (the test is mandatory when CI=true)",
)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
    # No network at all: every host name fails to resolve (file:// is unaffected).
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def console_errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors in a list of DevTools events: uncaught exceptions,
    console.error/assert calls, and browser-side error log entries (CSP
    violations, failed loads)."""
    found = []
    for e in events:
        method, params = e.get("method"), e.get("params") or {}
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails") or {}
            desc = (d.get("exception") or {}).get("description") or d.get("text", "exception")
            found.append(f"uncaught: {desc}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(
                str(a.get("value", a.get("description", ""))) for a in params.get("args") or []
            )
            found.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            found.append(f"log {entry.get('source', '')}: {entry.get('text', '')}")
    return found


def _above(fd: int, low: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return moved


class Browser:
    """Headless Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe:
    the browser reads NUL-terminated JSON on fd 3 and writes on fd 4)."""

    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="offscope-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Move the child's ends above fd 4 so that dup2 onto 3/4 cannot clobber one with the other.
        to_child_r, from_child_w = (_above(fd, 10) for fd in (to_child_r, from_child_w))
        argv = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        # Put the pipe ends on fd 3/4 and exec the browser (its launcher may be a shell script);
        # a tiny Python trampoline, since dash cannot redirect fds above 9.
        trampoline = (
            f"import os, sys; os.dup2({to_child_r}, 3); os.dup2({from_child_w}, 4); "
            "os.execv(sys.argv[1], sys.argv[1:])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, *argv],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: bool = True,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = None
            # Keep every message of the chunk: events can arrive in the same read as the reply.
            for m in self._read(0.5):
                if m.get("id") == self._id:
                    reply = m
                else:
                    self.events.append(m)
            if reply is not None:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result") or {}
        raise TimeoutError(method)

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        ready, _, _ = select.select([self._from_child], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(self._from_child, 1 << 20)
        if not chunk:
            raise EOFError("chromium closed the DevTools pipe")
        self._buf += chunk
        out = []
        while b"\0" in self._buf:
            raw, self._buf = self._buf.split(b"\0", 1)
            out.append(json.loads(raw))
        return out

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("method") == method for e in self.events):
                return
            self.events.extend(self._read(0.5))
        raise TimeoutError(method)

    def open(self, url: str, width: int = 1280, height: int = 2000) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.send(
            "Target.attachToTarget",
            {"targetId": target["targetId"], "flatten": True},
            session=False,
        )["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
            self.send(domain)
        self.send(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")

    def eval(self, expression: str) -> Any:
        res = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in res:
            raise RuntimeError(res["exceptionDetails"])
        return res.get("result", {}).get("value")

    def screenshot(self, path: Path, scale: float = 1.0) -> Path:
        w, h = self.eval("[innerWidth, innerHeight]")
        data = self.send(
            "Page.captureScreenshot",
            {"format": "png", "clip": {"x": 0, "y": 0, "width": w, "height": h, "scale": scale}},
        )["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def network_requests(self) -> list[str]:
        urls = [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]
        return [u for u in urls if not u.startswith(("file:", "data:", "about:"))]

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=5)
            self.proc.wait(timeout=10)
        except Exception:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the session this test started
                self.proc.wait(timeout=10)
        finally:
            os.close(self._to_child)
            os.close(self._from_child)
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_browser() -> Browser:
    if CHROMIUM is None:
        pytest.fail("CI=true but no chromium executable found (set CHROMIUM=/path/to/chromium)")
    return Browser(CHROMIUM)


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) with zlib: (w, h, rows)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    w, h, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    assert len(raw) == h * (stride + 1)
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ftype, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line[j] for j in range(stride) if j % bpp < 3))  # drop alpha
        prev = line
    return w, h, rows
