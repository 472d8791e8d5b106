"""The sidecar: mitmproxy addon, extraction, engine, sinks, exporter."""

import os
from pathlib import Path

# Where the proxy keeps its CA (mitmproxy's certificate store). Here rather than
# in server.py so that CLI start-up need not import mitmproxy.
DEFAULT_CONFDIR = Path.home() / ".offscope" / "ca"
# Traces default to the user's state directory (XDG), never the working directory.
DEFAULT_TRACE = (
    Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    / "offscope"
    / "trace.jsonl"
)
