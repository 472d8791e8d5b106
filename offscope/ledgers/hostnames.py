"""One spelling per host name: lower case, no trailing dot, no port, IDNA (punycode).

Clients put internationalised names on the wire as punycode (`xn--bcher-kva.test`),
while a person writes `bücher.test` in a ledger; both sides go through `ascii_host`
so they compare equal. Host targets name a host on any port: a port written in
a ledger is dropped (and `offscope validate` warns about it).
"""

from __future__ import annotations

import idna


class HostError(ValueError):
    pass


def split_port(host: str) -> tuple[str, str | None]:
    """'api.test:8080' -> ('api.test', '8080'); '[::1]:80' -> ('[::1]', '80'); '::1' is left alone."""
    if host.startswith("["):
        end = host.find("]")
        if end != -1:
            rest = host[end + 1 :]
            return host[: end + 1], rest[1:] if rest.startswith(":") else None
        return host, None
    if host.count(":") == 1:
        name, _, port = host.partition(":")
        return name, port
    return host, None


def _label(label: str, strict: bool) -> str:
    try:
        return idna.encode(label, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        if strict:
            raise HostError(
                f"label {label!r} is not a valid international domain name label ({exc})"
            ) from None
        return label


def ascii_host(host: str, *, strict: bool = False) -> str:
    """The canonical spelling of a host (or of a host glob: wildcard labels stay as
    they are). strict=True raises HostError on a label IDNA cannot encode (ledger
    side); otherwise such a label is kept, lower-cased, and simply matches nothing
    that is spelled correctly."""
    host = host.strip().lower()
    name, _ = split_port(host)
    name = name.rstrip(".")
    if name.isascii():
        return name
    try:
        name = idna.uts46_remap(name, std3_rules=False, transitional=False).rstrip(".")
    except (idna.IDNAError, UnicodeError) as exc:
        if strict:
            raise HostError(f"{name!r} is not a valid international domain name ({exc})") from None
        return name
    labels = []
    for label in name.split("."):
        if label.isascii():
            labels.append(label)
        elif any(c in label for c in "*?[]"):
            if strict:
                raise HostError(
                    f"label {label!r} mixes a wildcard with non-ASCII letters; "
                    "write that label in punycode (xn--...)"
                )
            labels.append(label)
        else:
            labels.append(_label(label, strict))
    return ".".join(labels)
