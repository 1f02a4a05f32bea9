"""Keeping secrets out of what the lab writes down (state files, test.json, reports, logs).

A URL's user info (`http://user:password@host`, or a token alone, `https://token@host`) is
a secret wherever it appears: in an option (`--store-url=URL`), a message, or a JSON tree.
"""

from __future__ import annotations

import re
from typing import Any

# scheme://userinfo@ : the user info is everything between `//` and the first `@` before any `/`, space or quote
# the files a run directory may hold that are secrets (a stack's demo API keys, key hashes, the CouchDB admin of a
# compose stack, keys and certificates): `fencelab serve` never serves them, a Dask worker never ships them
SECRET_FILES = ("credentials*.json", "principals*.json", "store-admin*.json", "*.pem", "*.key", "*.crt")

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/@\s'\"]+)@")


def _hide(m: re.Match) -> str:
    """`user:***@` keeps the user name beside a password; a lone user info (often a token) becomes `***@`."""
    user, sep, _ = m.group("info").partition(":")
    return f"{m.group('scheme')}{user}:***@" if sep and user else f"{m.group('scheme')}***@"


def redact_secrets(text: str) -> str:
    """`text` with the user info of every URL in it hidden (idempotent: `***` stays `***`)."""
    return _USERINFO.sub(_hide, text) if "://" in text else text


def redact_url(url: str | None) -> str | None:
    """The URL without its password (for state files, test.json, reports and logs)."""
    if not url:
        return url
    return redact_secrets(url)


def redact_tree(value: Any) -> Any:
    """A JSON-able tree with every string's URL user info hidden (keys and non-strings unchanged)."""
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v) for v in value]
    return value
