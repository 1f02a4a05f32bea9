"""Keeping secrets out of what the lab writes down (state files, test.json, reports, logs)."""

from __future__ import annotations


def redact_url(url: str | None) -> str | None:
    """The URL without its password (for state files, test.json, reports and logs)."""
    if not url:
        return url
    from urllib.parse import urlsplit, urlunsplit

    u = urlsplit(url)
    if u.password is None:
        return url
    netloc = f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))
