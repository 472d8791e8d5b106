"""A stand-in for a pipe between `offscope mcp` and a real stdio MCP server:
every line the server is sent is recorded raw (base64, one JSON line each)
before it is passed on, so a test can tell byte for byte what the server
received. Stdlib only: it starts fast and adds nothing to what it relays.

    python stdio_tee.py [--linger SECONDS] RECORD -- COMMAND [ARGS...]

`--linger`: after the client closes stdin, wait this long before closing the
server's (a server slow to stop: the client's SIGTERM comes first).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    linger = 0.0
    if argv[0] == "--linger":
        linger, argv = float(argv[1]), argv[2:]
    record, command = argv[0], argv[2:] if argv[1] == "--" else argv[1:]
    child = subprocess.Popen(command, stdin=subprocess.PIPE)
    assert child.stdin is not None
    with open(record, "ab") as out:
        for line in iter(sys.stdin.buffer.readline, b""):
            out.write(json.dumps({"raw": base64.b64encode(line).decode()}).encode() + b"\n")
            out.flush()
            child.stdin.write(line)
            child.stdin.flush()
    if linger:
        time.sleep(linger)
    child.stdin.close()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
