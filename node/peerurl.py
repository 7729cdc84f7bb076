"""What makes a URL one a peer can have: shared by the commands that take one (``peers
add``, ``sync``, ``init --join``) and by the check of a hand-edited ``[peers]`` entry in
config.toml, so that every way of naming a peer refuses the same URLs."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

_SCHEME = re.compile(r"(?i)(https?)://")


def with_lower_scheme(url: str) -> str:
    """``url`` with an ``HTTP://`` or ``Https://`` scheme in lower case (schemes are
    case-insensitive, RFC 3986 §3.1: QA's ``HTTP://host`` was called an unknown peer),
    anything else as it is."""
    found = _SCHEME.match(url)
    return found.group(1).lower() + url[found.end(1) :] if found else url


def peer_url_problem(url: object) -> str | None:
    """What is wrong with ``url`` as a peer's URL, or None when it can name a peer:
    http(s), a host, a port from 1 to 65535 if given, no ``user:password@``, query or
    fragment, no spaces or control characters. A peer proves who it is by its node key,
    and URL credentials would be kept in ``peersync.json`` and shown in ``/v1/status``
    to every reader."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return f"peer URL must start with http:// or https://, got {url!r}"
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"peer URL {url!r} holds a space or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", …
        return f"peer URL {url!r} is not a valid URL: {exc}"
    if parts.username is not None or parts.password is not None:
        shown = f"{parts.scheme}://…@{parts.netloc.rpartition('@')[2]}"
        return (
            f"peer URL {shown} holds a user name or password: give {parts.scheme}://HOST:PORT"
            " (a peer is known by its node key; the URL would be stored and shown in status)"
        )
    if not parts.hostname:
        return f"peer URL {url!r} names no host: give http://HOST:PORT"
    if re.fullmatch(r"[0-9.]+", parts.hostname):  # QA: 256.1.1.1 was tried, then "unreachable"
        try:
            ipaddress.IPv4Address(parts.hostname)
        except ValueError:
            return f"peer URL {url!r}: {parts.hostname} is not a valid IPv4 address"
    if port == 0:
        return f"peer URL {url!r}: port 0 is no port a peer listens on"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return f"peer URL {url!r} has a query or fragment: give http://HOST:PORT"
    return None
