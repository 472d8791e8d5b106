"""The proxy's CA certificate (mitmproxy's own certificate store)."""

from __future__ import annotations

from pathlib import Path


def ensure_ca(confdir: str | Path) -> Path:
    """Create the CA if missing (mitmproxy's own certificate store) and return the cert path."""
    from mitmproxy.certs import CertStore

    confdir = Path(confdir).resolve()  # absolute: the agent may run from another directory
    confdir.mkdir(parents=True, exist_ok=True)
    CertStore.from_store(str(confdir), "mitmproxy", 2048)
    return confdir / "mitmproxy-ca-cert.pem"
