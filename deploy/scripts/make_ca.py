"""Create the mitmproxy CA that the offscope sidecar signs with.

    python deploy/scripts/make_ca.py deploy/k8s/ca

Writes, into DIR (created, mode 0700):
  mitmproxy-ca.pem       CA key + certificate  -> SECRET: only the sidecar mounts it
  mitmproxy-ca-cert.pem  CA certificate        -> public: the agent trusts it
  mitmproxy-dhparam.pem  DH parameters         -> needed because the sidecar's
                                                  confdir is mounted read-only
(plus .p12/.cer variants mitmproxy always writes). Generate one CA per
environment, never commit it, rotate it by regenerating and re-applying.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mitmproxy.certs import CertStore

REQUIRED = ("mitmproxy-ca.pem", "mitmproxy-ca-cert.pem", "mitmproxy-dhparam.pem")


def make_ca(directory: Path, key_size: int = 2048) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (directory / "mitmproxy-ca.pem").exists():
        raise FileExistsError(f"{directory}/mitmproxy-ca.pem exists; remove it to rotate the CA")
    CertStore.create_store(directory, "mitmproxy", key_size)
    (directory / "mitmproxy-ca.pem").chmod(0o600)
    return [directory / name for name in REQUIRED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Create the offscope sidecar's mitmproxy CA.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--key-size", type=int, default=2048)
    args = parser.parse_args(argv)
    try:
        for path in make_ca(args.directory, args.key_size):
            print(path)
    except FileExistsError as exc:
        print(f"make_ca: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
