"""Lock identities (C1-C3): validation, normalization and the lock key.

A lock identity is the ordered 7-tuple of `IDENTITY_FIELDS`. Every component
is validated and normalized before use, and the normalized tuple alone derives
the backend key:

    lock_key = "starintel:target-lease:v1:" + base64url_nopad(sha256(utf8(json_array(tuple))))

`json_array` is the compact JSON array of the seven normalized strings in
`IDENTITY_FIELDS` order: no whitespace (separators `,` and `:`), UTF-8
output with non-ASCII written raw (no `\\u` escapes). The only escape left is
`\\"` for a quote in `target_id` (validation rejects control characters and
`\\`), so the encoding is unique. Normalization rules (see docs/server.md):

- every component is a JSON string of valid UTF-8 (no lone surrogates),
  normalized to Unicode NFC;
- identifier fields (`tenant_id`, `program_id`, `target_namespace`,
  `actor_name`, `workflow_name`, `operation_class`) are case-insensitive:
  lowercased, then they must match `[a-z0-9][a-z0-9._:@+-]*` (ASCII), at most
  64 characters;
- `target_id` is case-sensitive (targets may be URLs, hashes, names): NFC,
  1..128 characters and at most 256 UTF-8 bytes, no control or format
  characters (Unicode Cc, Cf, Cs, Zl, Zp), no leading or trailing whitespace,
  no `\\`;
- no component contains `/` or `..` (path syntax);
- `operation_class` is the closed enum `OPERATION_CLASSES`; absent means `default`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import unicodedata
from typing import Any, Mapping, NamedTuple

import orjson

KEY_PREFIX = "starintel:target-lease:v1:"

IDENTITY_FIELDS = (
    "tenant_id", "program_id", "target_namespace", "target_id",
    "actor_name", "workflow_name", "operation_class",
)
IDENTIFIER_FIELDS = frozenset(IDENTITY_FIELDS) - {"target_id"}

# The closed operation-class enum (C1). `default` is the value of an absent field.
OPERATION_CLASSES = ("default", "scan", "enrich", "exploit", "report", "maintenance")

MAX_IDENTIFIER_CHARS = 64
MAX_TARGET_CHARS = 128
MAX_TARGET_BYTES = 256

_IDENTIFIER_RE = re.compile(r"[a-z0-9][a-z0-9._:@+-]*\Z")
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class IdentityError(ValueError):
    """An identity component is missing or not canonicalizable; `field` names it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Identity(NamedTuple):
    """A normalized lock identity (C1), in key order."""

    tenant_id: str
    program_id: str
    target_namespace: str
    target_id: str
    actor_name: str
    workflow_name: str
    operation_class: str

    def canonical_json(self) -> bytes:
        """The compact UTF-8 JSON array that the lock key hashes (C3)."""
        return _derived(self)[0]

    def lock_key(self) -> str:
        """The backend key of this identity (C3)."""
        return _derived(self)[1]

    def as_dict(self) -> dict[str, str]:
        return dict(zip(IDENTITY_FIELDS, self))


@functools.lru_cache(maxsize=8192)
def _derived(ident: tuple) -> tuple[bytes, str]:
    """(canonical JSON, lock key) of an identity, cached: a request uses both several times."""
    data = orjson.dumps(list(ident))
    return data, lock_key_of(data)


def lock_key_of(canonical_json: bytes) -> str:
    """`KEY_PREFIX + base64url_nopad(sha256(canonical_json))`."""
    digest = hashlib.sha256(canonical_json).digest()
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _text(field: str, value: Any) -> str:
    """A valid-UTF-8 NFC string, or IdentityError."""
    if not isinstance(value, str):
        raise IdentityError(field, "must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise IdentityError(field, "must be valid UTF-8 (no lone surrogates)") from None
    return unicodedata.normalize("NFC", value)


def _check_no_path(field: str, value: str) -> None:
    if "/" in value or "\\" in value or ".." in value:
        raise IdentityError(field, "must not contain path syntax ('/', '\\\\' or '..')")


def normalize_identifier(field: str, value: Any) -> str:
    """Normalize a case-insensitive ASCII identifier component."""
    text = _text(field, value)
    # (printable ASCII has no forbidden category: the per-character scan is for everything else)
    if not (text.isascii() and text.isprintable()) and \
            any(unicodedata.category(ch) in _FORBIDDEN_CATEGORIES for ch in text):
        raise IdentityError(field, "must not contain control characters")
    _check_no_path(field, text)
    text = text.lower()
    if not text:
        raise IdentityError(field, "must not be empty")
    if len(text) > MAX_IDENTIFIER_CHARS:
        raise IdentityError(field, f"must be at most {MAX_IDENTIFIER_CHARS} characters")
    if not _IDENTIFIER_RE.match(text):
        raise IdentityError(field, "must start with a letter or digit and use only ASCII letters, digits and . _ : @ + -")
    return text


def normalize_target_id(value: Any) -> str:
    """Normalize the case-sensitive Unicode `target_id` component."""
    field = "target_id"
    text = _text(field, value)
    if not text:
        raise IdentityError(field, "must not be empty")
    if not (text.isascii() and text.isprintable()) and \
            any(unicodedata.category(ch) in _FORBIDDEN_CATEGORIES for ch in text):
        raise IdentityError(field, "must not contain control or format characters")
    _check_no_path(field, text)
    if text != text.strip():
        raise IdentityError(field, "must not have leading or trailing whitespace")
    if len(text) > MAX_TARGET_CHARS or len(text.encode("utf-8")) > MAX_TARGET_BYTES:
        raise IdentityError(field, f"must be at most {MAX_TARGET_CHARS} characters and {MAX_TARGET_BYTES} UTF-8 bytes")
    return text


def normalize_identity(fields: Mapping[str, Any]) -> Identity:
    """Validate and normalize the 7 identity fields of a request body or query (C1, C2)."""
    values = []
    for name in IDENTITY_FIELDS:
        raw = fields.get(name)
        if raw is None:
            if name == "operation_class":
                raw = "default"
            else:
                raise IdentityError(name, "is required")
        if name == "target_id":
            values.append(normalize_target_id(raw))
        else:
            values.append(normalize_identifier(name, raw))
    if values[-1] not in OPERATION_CLASSES:
        raise IdentityError("operation_class", f"must be one of {', '.join(OPERATION_CLASSES)}")
    return Identity(*values)


def identity_from_canonical_json(data: bytes | str) -> Identity:
    """Parse a stored canonical identity array; ValueError when it is not one (corruption)."""
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ValueError("stored identity is not JSON") from e
    if not isinstance(items, list) or len(items) != len(IDENTITY_FIELDS) or not all(isinstance(x, str) for x in items):
        raise ValueError("stored identity is not a 7-string array")
    ident = normalize_identity(dict(zip(IDENTITY_FIELDS, items)))
    if list(ident) != items:
        raise ValueError("stored identity is not in canonical form")
    return ident
