"""The sidecar: mitmproxy addon, extraction, engine, sinks, exporter."""

from pathlib import Path

# Where the proxy keeps its CA (mitmproxy's certificate store). Here rather than
# in server.py so that CLI start-up need not import mitmproxy.
DEFAULT_CONFDIR = Path.home() / ".offscope" / "ca"
