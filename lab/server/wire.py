"""The canonical request: strict parsing and validation of request bodies and queries.

Each operation has a closed set of body fields (`BODY_FIELDS`); an unknown
field, a wrong type, an out-of-range value, oversized or secret-looking
metadata, or a missing deadline is a 400 `invalid_lease_request` whose message
names the field. Validation is hand-written (not a schema library) because the
messages, the identity normalization of C2 and the digest of C16 must follow
the contract exactly, and because this runs on every request.

The idempotency digest (C16) is SHA-256 over the canonical JSON (sorted keys,
compact) of `{"op", "lease_id", <every normalized body field except
deadline_at>}`, defaults filled in, so equal requests give equal digests
however they were spelled. A commit's `lock_key` (derived from the identity,
C24) and `expires_at` (informational: backend time decides, C25) stay out of
its digest; its `doc` and `body` are in.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from lab.server.auth import bearer_key
from lab.server.errors import invalid
from lab.server.identity import IDENTITY_FIELDS, Identity, IdentityError, normalize_identity
from lab.server.settings import JSON_SAFE_MAX, Settings

_ID_RE = re.compile(r"[A-Za-z0-9._:@+-]{1,128}\Z")
LEASE_ID_RE = re.compile(r"[A-Za-z0-9-]{1,64}\Z")
_SECRETISH_RE = re.compile(
    r"secret|passw|api[_-]?key|apikey|authoriz|bearer|credential|private[_-]?key|cookie|access[_-]?token"
    r"|refresh[_-]?token|session[_-]?token|auth[_-]?token", re.IGNORECASE)
_SECRET_VALUE_RE = re.compile(r"^(bearer\s|flk\.)", re.IGNORECASE)

_COMMON = set(IDENTITY_FIELDS) | {"request_id", "deadline_at", "service_instance_id", "trace_id", "execution_id",
                                   "job_id"}
BODY_FIELDS: dict[str, frozenset[str]] = {
    "acquire": frozenset(_COMMON | {"ttl_ms", "maximum_lifetime_ms", "metadata", "client_id", "wait_ms"}),
    "renew": frozenset(_COMMON | {"fencing_token", "ttl_ms"}),
    "release": frozenset(_COMMON | {"fencing_token"}),
    "force_release": frozenset(_COMMON | {"fencing_token", "reason"}),
    "revoke": frozenset(_COMMON | {"fencing_token", "reason", "incident_id"}),
    "commit": frozenset(_COMMON | {"fencing_token", "lease_id", "lock_key", "expires_at", "doc", "body"}),
}
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "acquire": ("request_id", "deadline_at", "service_instance_id", "ttl_ms"),
    "renew": ("request_id", "deadline_at", "service_instance_id", "fencing_token"),
    "release": ("request_id", "deadline_at", "service_instance_id", "fencing_token"),
    "force_release": ("request_id", "deadline_at", "service_instance_id", "fencing_token", "reason"),
    "revoke": ("request_id", "deadline_at", "service_instance_id", "fencing_token", "reason"),
    "commit": ("request_id", "deadline_at", "service_instance_id", "fencing_token", "lease_id", "doc", "body"),
}
DOC_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}\Z")
_SET_FIELD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}\Z")
# document fields the server owns: the fence record (C28) and the appended entries
RESERVED_DOC_FIELDS = frozenset({"entries"})
RESERVED_DOC_PREFIXES = ("_", "fence_")
LIST_QUERY_FIELDS = frozenset({"owner", "target", "program", "limit", "cursor", "deadline_at"})
INSPECT_QUERY_FIELDS = frozenset(set(IDENTITY_FIELDS) | {"deadline_at"})


@dataclass(frozen=True)
class MutationRequest:
    """A validated, normalized mutation body."""

    op: str
    identity: Identity
    lease_id: str                 # from the path ("" for acquire)
    request_id: str
    deadline_ms: int
    service_instance_id: str
    fields: dict[str, Any]        # the other normalized fields, defaults filled in
    metadata_json: str            # canonical metadata ("{}" when absent)
    digest: str                   # C16

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


def parse_json_object(raw: bytes, max_depth: int = 32) -> dict[str, Any]:
    """The body as a JSON object nested at most `max_depth` levels, or 400.

    The depth bound keeps every later step (the digest's `orjson.dumps`, whose
    recursion limit is 254, the store write) from failing on what parsed.
    """
    if not raw:
        raise invalid("body", "must be a JSON object (the body is empty)")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise invalid("body", f"is not valid JSON ({str(e).split(':')[0]})") from None
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    if json_depth(body, max_depth) > max_depth:
        raise invalid("body", f"nests deeper than {max_depth} levels")
    return body


def json_depth(value: Any, stop_after: int) -> int:
    """The nesting depth of a decoded JSON value (a scalar is 0), counted up to `stop_after` + 1.

    Iterative, so no input can exhaust the Python stack; only containers are pushed.
    """
    if not isinstance(value, (dict, list)):
        return 0
    deepest, stack = 1, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > stop_after:
                break
        for x in (v.values() if type(v) is dict else v):
            if type(x) is dict or type(x) is list:
                stack.append((x, depth + 1))
    return deepest


def json_strings(value: Any) -> list[str]:
    """Every string of a decoded JSON value, object keys included (after `parse_json_object` bounded its depth)."""
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is dict:
            out.extend(v)
            items = v.values()
        elif type(v) is list:
            items = v
        else:
            if type(v) is str:
                out.append(v)
            continue
        for x in items:
            if type(x) is str:
                out.append(x)
            elif type(x) is dict or type(x) is list:
                stack.append(x)
    return out


def parse_identity(source: dict[str, Any]) -> Identity:
    """The normalized identity of a body or query, or 400 naming the component (C2)."""
    try:
        return normalize_identity(source)
    except IdentityError as e:
        raise invalid(e.field, e.problem) from None


def check_fields(op: str, body: dict[str, Any]) -> None:
    """Reject unknown top-level fields and missing required ones (C8)."""
    allowed = BODY_FIELDS[op]
    for name in body:
        if name not in allowed:
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise invalid(shown, "unknown field")
    for name in REQUIRED_FIELDS[op]:
        if body.get(name) is None:
            raise invalid(name, "is required")


def parse_mutation(op: str, body: dict[str, Any], identity: Identity, lease_id: str, settings: Settings) -> MutationRequest:
    """Validate the non-identity fields of a mutation body (after `check_fields`)."""
    request_id = text_id(body, "request_id")
    service_instance_id = text_id(body, "service_instance_id")
    deadline_ms = parse_deadline(body["deadline_at"])
    fields: dict[str, Any] = {
        "trace_id": text_id(body, "trace_id", required=False),
        "execution_id": text_id(body, "execution_id", required=False),
        "job_id": text_id(body, "job_id", required=False),
    }
    metadata_json = "{}"
    if op == "acquire":
        ttl = integer(body, "ttl_ms", settings.min_ttl_ms, settings.max_ttl_ms)
        life = integer(body, "maximum_lifetime_ms", 1, settings.max_lifetime_ms, required=False)
        if life is None:
            life = settings.max_lifetime_ms
        if life < ttl:
            raise invalid("maximum_lifetime_ms", f"must be >= ttl_ms ({ttl})")
        fields.update(ttl_ms=ttl, maximum_lifetime_ms=life, client_id=text_id(body, "client_id", required=False),
                      wait_ms=integer(body, "wait_ms", 0, settings.max_acquire_wait_ms, required=False) or 0)
        metadata = body.get("metadata")
        fields["metadata"] = parse_metadata(metadata, settings) if metadata is not None else {}
        metadata_json = orjson.dumps(fields["metadata"], option=orjson.OPT_SORT_KEYS).decode()
    else:
        fields["fencing_token"] = integer(body, "fencing_token", 1, JSON_SAFE_MAX)
        if op == "commit":
            lease_id = commit_target(body, identity, fields)
        if op == "renew":
            fields["ttl_ms"] = integer(body, "ttl_ms", settings.min_ttl_ms, settings.max_ttl_ms, required=False)
        if op in ("force_release", "revoke"):
            fields["reason"] = reason_text(body.get("reason"))
        if op == "revoke":
            fields["incident_id"] = text_id(body, "incident_id", required=False)
    doc = {"op": op, "lease_id": lease_id, "request_id": request_id, "service_instance_id": service_instance_id,
           **identity.as_dict(), **fields}
    digest = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return MutationRequest(op, identity, lease_id, request_id, deadline_ms, service_instance_id, fields,
                           metadata_json, digest)


def commit_target(body: dict[str, Any], identity: Identity, fields: dict[str, Any]) -> str:
    """A commit's lease_id, checked lock_key and expires_at, and its `doc` and `body` into `fields` (C24)."""
    lease_id = body["lease_id"]
    if not isinstance(lease_id, str) or not LEASE_ID_RE.match(lease_id):
        raise invalid("lease_id", "must be 1-64 characters of A-Z a-z 0-9 -")
    lock_key = body.get("lock_key")
    if lock_key is not None and lock_key != identity.lock_key():
        raise invalid("lock_key", "does not match the lock key the identity derives (C3, C24)")
    if body.get("expires_at") is not None:
        parse_deadline(body["expires_at"], "expires_at")  # validated, then ignored: backend time decides (C25)
    doc = body["doc"]
    if not isinstance(doc, str) or not DOC_ID_RE.match(doc):
        raise invalid("doc", "must be 1-200 characters of A-Z a-z 0-9 . _ : @ + = -, not starting with . _ : @ + = -")
    fields["doc"] = doc
    fields["body"] = commit_body(body["body"])
    return lease_id


def commit_body(value: Any) -> dict[str, Any]:
    """`{"append": <any JSON value>}` or `{"set": {<field>: <value>, ...}}` (fields the server does not own)."""
    shape = 'must be {"append": <value>} or {"set": {<field>: <value>, ...}}'
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in ("append", "set"):
        raise invalid("body", shape)
    if "set" in value:
        fields = value["set"]
        if not isinstance(fields, dict) or not fields:
            raise invalid("body.set", "must be a non-empty JSON object")
        for name in fields:
            if not _SET_FIELD_RE.match(name):
                raise invalid("body.set", "field names must be 1-64 characters of A-Z a-z 0-9 . _ : @ + -")
            if name in RESERVED_DOC_FIELDS or name.startswith(RESERVED_DOC_PREFIXES):
                raise invalid(f"body.set.{name}", "is owned by the server (entries and fence_* record the commits)")
    elif value["append"] is None:
        raise invalid("body.append", "must not be null")
    return value


# -- field validators ------------------------------------------------------------

def text_id(body: dict[str, Any], name: str, *, required: bool = True) -> str:
    """An opaque ASCII id (request, instance, trace, ...): 1-128 chars of A-Z a-z 0-9 . _ : @ + -."""
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(name, "is required")
        return ""
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    if not _ID_RE.match(value):
        raise invalid(name, "must be 1-128 characters of A-Z a-z 0-9 . _ : @ + -")
    return value


def integer(body: dict[str, Any], name: str, lo: int, hi: int, *, required: bool = True) -> int | None:
    """An integer in [lo, hi] (JSON booleans and floats are not integers)."""
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(name, "is required")
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(name, "must be an integer")
    if not lo <= value <= hi:
        raise invalid(name, f"must be between {lo} and {hi} (got {value})")
    return value


def reason_text(value: Any) -> str:
    """An admin reason or incident text: 1-256 printable characters."""
    if not isinstance(value, str):
        raise invalid("reason", "must be a string")
    value = value.strip()
    if not value:
        raise invalid("reason", "must not be empty")
    if len(value) > 256:
        raise invalid("reason", "must be at most 256 characters")
    if any(ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0 or ch in "\u2028\u2029" for ch in value):
        raise invalid("reason", "must not contain control characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid("reason", "must be valid UTF-8") from None
    return value


def parse_deadline(value: Any, field: str = "deadline_at") -> int:
    """`deadline_at` as Unix ms: an integer of ms, or an RFC 3339 timestamp with a zone (C22)."""
    if value is None:
        raise invalid(field, "is required (RFC 3339 or integer Unix milliseconds)")
    if isinstance(value, bool):
        raise invalid(field, "must be an RFC 3339 timestamp or integer Unix milliseconds")
    if isinstance(value, int):
        if not 0 < value <= JSON_SAFE_MAX:
            raise invalid(field, "must be a positive integer of Unix milliseconds")
        return value
    if isinstance(value, str):
        return rfc3339_ms(value, field)
    raise invalid(field, "must be an RFC 3339 timestamp or integer Unix milliseconds")


# RFC 3339 section 5.6 `date-time`, ASCII digits only: written out because datetime.fromisoformat (and
# pyRFC3339, which wraps it) also takes ISO 8601 forms RFC 3339 does not (week dates, basic format, no seconds).
_RFC3339_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
                         r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))\Z")
_RFC3339_EXAMPLE = "must be an RFC 3339 timestamp such as 2030-01-01T00:00:00.000Z"


def rfc3339_ms(text: str, field: str = "deadline_at") -> int:
    """An RFC 3339 `date-time` (zone required) as Unix ms, or 400 naming `field`."""
    m = _RFC3339_RE.match(text) if len(text) <= 40 else None
    if m is None:
        raise invalid(field, _RFC3339_EXAMPLE)
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    leap = second == 60  # RFC 3339 allows a leap second; it is read as the next second's start
    try:
        dt = datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=timezone.utc)
        if m.group(9):
            oh, om = int(m.group(10)), int(m.group(11))
            if oh > 23 or om > 59:
                raise ValueError("offset")
            sign = 1 if m.group(9) == "+" else -1
            dt -= sign * timedelta(hours=oh, minutes=om)
    except (ValueError, OverflowError):
        raise invalid(field, _RFC3339_EXAMPLE + " (a real date and time)") from None
    ms = int(dt.timestamp()) * 1000 + (1000 if leap else 0) + int((m.group(7) or ".0")[1:4].ljust(3, "0"))
    return max(ms, 1)  # a time before 1970 is a valid timestamp, merely past: 408, like any past deadline


def ascii_int(text: str, field: str, lo: int, hi: int) -> int:
    """A query-string integer: ASCII digits only (str.isdigit and int() also take '²' and '١'), in [lo, hi]."""
    if not re.fullmatch(r"[0-9]{1,16}", text):
        raise invalid(field, f"must be an integer of ASCII digits between {lo} and {hi}")
    value = int(text)
    if not lo <= value <= hi:
        raise invalid(field, f"must be an integer between {lo} and {hi}")
    return value


def query_deadline(raw: str, field: str = "deadline_at") -> int:
    """A query `deadline_at`: integer Unix ms of ASCII digits, or an RFC 3339 timestamp."""
    if raw[:1].isascii() and raw[:1].isdigit() and "T" not in raw.upper():
        return ascii_int(raw, field, 1, JSON_SAFE_MAX)
    return parse_deadline(raw, field)


def parse_metadata(value: Any, settings: Settings) -> dict[str, Any]:
    """A small, shallow, non-secret JSON object (C8)."""
    if not isinstance(value, dict):
        raise invalid("metadata", "must be a JSON object")
    _check_metadata(value, "metadata", 1, settings.max_metadata_depth)
    size = len(orjson.dumps(value))
    if size > settings.max_metadata_bytes:
        raise invalid("metadata", f"must encode to at most {settings.max_metadata_bytes} bytes (got {size})")
    return value


def _check_metadata(value: Any, path: str, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise invalid(path, f"metadata nests deeper than {max_depth} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not k or len(k) > 64 or any(ord(ch) < 32 for ch in k):
                raise invalid("metadata", "keys must be 1-64 characters without control characters")
            if _SECRETISH_RE.search(k):
                raise invalid(f"{path}.{k}", "looks like a secret; metadata must not carry credentials")
            _check_metadata(v, f"{path}.{k}", depth + 1, max_depth)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_metadata(v, f"{path}[{i}]", depth + 1, max_depth)
    elif isinstance(value, str):
        if _SECRET_VALUE_RE.match(value):
            raise invalid(path, "looks like a credential; metadata must not carry credentials")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(path, "must be valid UTF-8") from None


def now_ms() -> int:
    """The server's wall clock in Unix ms (deadlines only; never lease time, C20)."""
    return time.time_ns() // 1_000_000


def check_lease_id(lease_id: str) -> str:
    """A path lease_id: 1-64 characters of A-Z a-z 0-9 -."""
    if not LEASE_ID_RE.match(lease_id):
        raise invalid("lease_id", "must be 1-64 characters of A-Z a-z 0-9 -")
    return lease_id


def check_query(query: dict[str, str], allowed: frozenset[str]) -> None:
    """Reject unknown query parameters."""
    for name in query:
        if name not in allowed:
            raise invalid(name[:64], "unknown query parameter")


# an API key `flk.<credential_id>.<43 base64url chars>` (lab/server/auth.py), anywhere in a string
KEY_SHAPE_RE = re.compile(r"flk\.[a-z0-9][a-z0-9._:-]{0,63}\.[A-Za-z0-9_-]{43}")
SECRET_CHARS = 43


class KnownSecrets:
    """The secrets of the credentials this instance has verified, kept as SHA-256 digests and 12-char prefixes.

    The principals file holds salted hashes of whole keys, so a bare secret can
    be recognized only once its key has been seen; a whole key is recognized by
    its shape whether or not it is valid. A secret anywhere in a string (even
    inside a longer run of base64url characters) is found by one regex scan for
    the known prefixes (72 of a secret's 256 bits: they reveal nothing usable)
    and a SHA-256 of the 43 characters at each hit, so a 16 KiB body costs
    microseconds, not a hash per byte.
    """

    def __init__(self, max_secrets: int = 4096):
        self._digests: set[bytes] = set()
        self._prefixes: set[str] = set()
        self._scan: re.Pattern | None = None
        self.max_secrets = max_secrets

    def add(self, api_key: str) -> None:
        """Remember the secret of a verified key (given as the key or as its `Bearer` header)."""
        secret = (bearer_key(api_key) or api_key).rsplit(".", 1)[-1]
        if len(secret) != SECRET_CHARS or len(self._digests) >= self.max_secrets:
            return
        digest = hashlib.sha256(secret.encode()).digest()
        if digest in self._digests:
            return
        self._digests.add(digest)
        self._prefixes.add(secret[:12])
        self._scan = re.compile("(?=(?:" + "|".join(map(re.escape, sorted(self._prefixes))) + "))")

    def found_in(self, texts: list[str]) -> bool:
        """Does any text hold an API key (by shape) or a known secret?"""
        scan = self._scan
        for text in texts:
            if len(text) < SECRET_CHARS:
                continue
            if KEY_SHAPE_RE.search(text):
                return True
            if scan is None:
                continue
            for m in scan.finditer(text):
                window = text[m.start():m.start() + SECRET_CHARS]
                if len(window) == SECRET_CHARS and hashlib.sha256(window.encode()).digest() in self._digests:
                    return True
        return False


def ensure_no_credential(raw: bytes, authorization: str | None, texts: list[str] = (),
                         holds_secret: Any = None, where: str = "body") -> None:
    """400 when a credential appears in a request (no credential reaches the backend, the store or the audit).

    `raw` is checked for the caller's own key as sent; `texts` are the decoded
    strings (so a secret split by a JSON or URL escape is still seen) and go to
    `holds_secret` (Authenticator.holds_secret), which knows every key's shape
    and the secrets of every credential this instance has verified.
    """
    if holds_own_key(raw, authorization):
        raise invalid(where, "must not contain the API key")
    if holds_secret is not None and holds_secret(texts):
        raise invalid(where, "must not contain an API key or its secret")


def holds_own_key(raw: bytes, authorization: str | None) -> bool:
    """Does `raw` hold the secret of the key this request presents (valid or not)?"""
    key = bearer_key(authorization)
    secret = key.rsplit(".", 1)[-1].encode("utf-8", "replace") if key else b""
    return len(secret) >= 16 and secret in raw

