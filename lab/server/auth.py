"""Principals, API keys, capabilities and scopes (contract section 10).

An API key is `flk.<credential_id>.<secret>` where the secret is 32 random
bytes (base64url). The server stores only `sha256(salt || api_key)` with a
random 16-byte salt per credential. A salted SHA-256 is enough here because the
keys are high-entropy random tokens, not passwords: nobody can brute-force a
256-bit secret, so a slow password KDF (bcrypt, scrypt, argon2) would only
add milliseconds of CPU to every cold lookup without adding security.

The credential id inside the key finds the record in O(1); the verified key's
SHA-256 is then cached in memory, so a request costs one SHA-256 of the key.
Nothing here ever logs or returns a key.

Capabilities: `targets:lease` (acquire, renew, release, inspect, list),
`targets:force-release` (force-release and revoke), `admin` (everything).
Scopes: a principal holds a list of scope entries `{tenant, program, actor,
target}`; each value is a normalized identifier or `*`, and `target` is `*`,
`<namespace>/*` or `<namespace>/<target_id>`. An identity is in scope when
some entry matches all four.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from lab.server.identity import Identity, IdentityError, normalize_identifier, normalize_target_id

CAP_LEASE = "targets:lease"
CAP_FORCE = "targets:force-release"
CAP_ADMIN = "admin"
CAPABILITIES = (CAP_LEASE, CAP_FORCE, CAP_ADMIN)

KEY_SCHEME = "flk"
_ID_RE = re.compile(r"[a-z0-9][a-z0-9._:-]{0,63}\Z")
_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{43}\Z")
_HEX_RE = re.compile(r"[0-9a-f]+\Z")
PRINCIPALS_FILE_VERSION = 1


class PrincipalsError(ValueError):
    """The principals file (or a record in it) is invalid; the message names the field."""


@dataclass(frozen=True)
class Scope:
    """One scope entry; `*` matches anything."""

    tenant: str
    program: str
    actor: str
    target: str  # "*", "<namespace>/*" or "<namespace>/<target_id>"

    def matches(self, ident: Identity) -> bool:
        """Is `ident` inside this scope entry?"""
        if self.tenant != "*" and self.tenant != ident.tenant_id:
            return False
        if self.program != "*" and self.program != ident.program_id:
            return False
        if self.actor != "*" and self.actor != ident.actor_name:
            return False
        if self.target == "*":
            return True
        ns, _, tid = self.target.partition("/")
        return ns == ident.target_namespace and (tid == "*" or tid == ident.target_id)

    def as_dict(self) -> dict[str, str]:
        return {"tenant": self.tenant, "program": self.program, "actor": self.actor, "target": self.target}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the principal and the (non-secret) credential it used."""

    principal_id: str
    credential_id: str
    capabilities: frozenset[str]
    scopes: tuple[Scope, ...]

    def can(self, capability: str) -> bool:
        """Does this principal hold `capability` (admin holds every capability)?"""
        return capability in self.capabilities or CAP_ADMIN in self.capabilities

    def allows(self, ident: Identity) -> bool:
        """Is `ident` inside one of this principal's scopes?"""
        return any(s.matches(ident) for s in self.scopes)


@dataclass(frozen=True)
class PrincipalRecord:
    """One validated principals-file record (one credential of one principal)."""

    principal: Principal
    salt: bytes
    key_hash: bytes

    def verifies(self, api_key: str) -> bool:
        """Does `api_key` hash to this record's key hash (constant-time compare)?"""
        return hmac.compare_digest(hash_key(self.salt, api_key), self.key_hash)


def hash_key(salt: bytes, api_key: str) -> bytes:
    """sha256(salt || api_key): see the module docstring for why not a password KDF."""
    return hashlib.sha256(salt + api_key.encode("utf-8")).digest()


def new_api_key(credential_id: str) -> str:
    """A fresh random API key for `credential_id` (256 random bits)."""
    return f"{KEY_SCHEME}.{credential_id}.{secrets.token_urlsafe(32)}"


def bearer_key(authorization: str | None) -> str | None:
    """The credentials of an `Authorization: Bearer <credentials>` field value, exactly as sent, or None.

    Only HTTP's own whitespace is dropped (RFC 9110 5.5 and 11.6.2): SP and HTAB
    around the field value, the SPs between the scheme (case-insensitive) and
    the credentials. Not `str.strip()`, which also drops U+00A0, U+0085 and the
    other Unicode spaces, so that a key followed by one of them authenticated.
    """
    if not authorization:
        return None
    scheme, sep, rest = authorization.strip(" \t").partition(" ")
    if not sep or scheme.lower() != "bearer":
        return None
    return rest.lstrip(" ") or None


def credential_id_of(api_key: str) -> str | None:
    """The credential id inside a well-formed API key, else None."""
    parts = api_key.split(".")
    if len(parts) != 3 or parts[0] != KEY_SCHEME or not _ID_RE.match(parts[1]) or not _SECRET_RE.match(parts[2]):
        return None
    return parts[1]


# -- records ---------------------------------------------------------------

def make_record(principal_id: str, credential_id: str, capabilities: Iterable[str],
                scopes: Iterable[dict[str, str]]) -> tuple[dict[str, Any], str]:
    """A principals-file record (no secret) and the new API key it verifies."""
    api_key = new_api_key(credential_id)
    salt = os.urandom(16)
    record = {
        "principal_id": principal_id,
        "credential_id": credential_id,
        "salt": salt.hex(),
        "key_hash": hash_key(salt, api_key).hex(),
        "capabilities": sorted(capabilities),
        "scopes": [dict(s) for s in scopes],
    }
    parse_record(record, "record")  # fail now, not when the server loads the file
    return record, api_key


def _scope(tenant: str, program: str, actor: str, target: str = "*") -> dict[str, str]:
    return {"tenant": tenant, "program": program, "actor": actor, "target": target}


# The demo set: (principal_id, capabilities, scopes). One principal per capability and scope case.
DEMO_PRINCIPALS: tuple[tuple[str, tuple[str, ...], tuple[dict[str, str], ...]], ...] = (
    ("lease-a1", (CAP_LEASE,), (_scope("tenant-a", "program-1", "actor-1"),)),
    ("lease-a1-peer", (CAP_LEASE,), (_scope("tenant-a", "program-1", "actor-1"),)),
    ("lease-a1-p2", (CAP_LEASE,), (_scope("tenant-a", "program-2", "actor-1"),)),
    ("lease-a1-actor2", (CAP_LEASE,), (_scope("tenant-a", "program-1", "actor-2"),)),
    ("lease-a1-dns", (CAP_LEASE,), (_scope("tenant-a", "program-1", "actor-1", "dns/*"),)),
    ("lease-b1", (CAP_LEASE,), (_scope("tenant-b", "program-1", "actor-1"),)),
    ("force-a", (CAP_FORCE,), (_scope("tenant-a", "*", "*"),)),
    ("nocap-a", (), (_scope("tenant-a", "*", "*"),)),
    ("admin", (CAP_ADMIN,), (_scope("*", "*", "*"),)),
    ("wildcard", (CAP_LEASE,), (_scope("*", "*", "*"),)),
)


def provision_demo_principals() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Fresh demo principals: (principals-file records without secrets, credentials with the API keys).

    Two tenants, two programs, two actors, a target-scoped principal, a
    force-release principal, one without capabilities, an admin and a
    wildcard-scope principal; each has one credential `<principal_id>-k1`.
    """
    records, credentials = [], []
    for principal_id, caps, scopes in DEMO_PRINCIPALS:
        record, api_key = make_record(principal_id, f"{principal_id}-k1", caps, scopes)
        records.append(record)
        credentials.append({"principal_id": principal_id, "credential_id": record["credential_id"],
                            "api_key": api_key, "capabilities": list(record["capabilities"]),
                            "scopes": [dict(s) for s in record["scopes"]]})
    return records, credentials


def write_principals_file(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Validate `records` and write them as the principals file (mode 0600)."""
    parse_records(records)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"version": PRINCIPALS_FILE_VERSION, "principals": records}, indent=2, sort_keys=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data + "\n")
    return p


def load_principals(path: str | Path) -> list[PrincipalRecord]:
    """Read and validate a principals file; PrincipalsError names the offending field."""
    # hand-written on purpose: the server loads it at start without a schema library (see Settings.validate),
    # and its checks are the contract's formats (ids, scopes, key hashes), not types a schema would name
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PrincipalsError(f"principals file {p}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PrincipalsError(f"principals file {p}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise PrincipalsError("principals file: must be a JSON object with `version` and `principals`")
    unknown = sorted(set(data) - {"version", "principals"})
    if unknown:
        raise PrincipalsError(f"{unknown[0]}: unknown top-level field in the principals file")
    if data.get("version") != PRINCIPALS_FILE_VERSION:
        raise PrincipalsError(f"version: must be {PRINCIPALS_FILE_VERSION}, not {data.get('version')!r}")
    return parse_records(data.get("principals"))


def parse_records(records: Any) -> list[PrincipalRecord]:
    """Validate a list of principals-file records (unique credential ids, at least one)."""
    if not isinstance(records, list) or not records:
        raise PrincipalsError("principals: must be a non-empty list of records")
    out, seen = [], set()
    for i, rec in enumerate(records):
        parsed = parse_record(rec, f"principals[{i}]")
        if parsed.principal.credential_id in seen:
            raise PrincipalsError(f"principals[{i}].credential_id: duplicate {parsed.principal.credential_id!r}")
        seen.add(parsed.principal.credential_id)
        out.append(parsed)
    return out


_RECORD_FIELDS = {"principal_id", "credential_id", "salt", "key_hash", "capabilities", "scopes"}


def parse_record(rec: Any, where: str) -> PrincipalRecord:
    """Validate one record; errors name `where.field`."""
    if not isinstance(rec, dict):
        raise PrincipalsError(f"{where}: must be an object")
    missing = sorted(_RECORD_FIELDS - set(rec))
    if missing:
        raise PrincipalsError(f"{where}.{missing[0]}: is required")
    unknown = sorted(set(rec) - _RECORD_FIELDS)
    if unknown:
        raise PrincipalsError(f"{where}.{unknown[0]}: unknown field (secrets never belong in the principals file)")
    for name in ("principal_id", "credential_id"):
        if not isinstance(rec[name], str) or not _ID_RE.match(rec[name]):
            raise PrincipalsError(f"{where}.{name}: must be 1-64 chars of a-z 0-9 . _ : - starting with a letter or digit")
    salt = _hex(rec["salt"], f"{where}.salt", 16)
    key_hash = _hex(rec["key_hash"], f"{where}.key_hash", 32)
    caps = rec["capabilities"]
    if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
        raise PrincipalsError(f"{where}.capabilities: must be a list of strings")
    for c in caps:
        if c not in CAPABILITIES:
            raise PrincipalsError(f"{where}.capabilities: unknown capability {c!r} (known: {', '.join(CAPABILITIES)})")
    scopes = rec["scopes"]
    if not isinstance(scopes, list):
        raise PrincipalsError(f"{where}.scopes: must be a list of scope objects")
    parsed_scopes = tuple(parse_scope(s, f"{where}.scopes[{j}]") for j, s in enumerate(scopes))
    principal = Principal(rec["principal_id"], rec["credential_id"], frozenset(caps), parsed_scopes)
    return PrincipalRecord(principal, salt, key_hash)


def _hex(value: Any, where: str, nbytes: int) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * nbytes or not _HEX_RE.match(value):
        raise PrincipalsError(f"{where}: must be {2 * nbytes} lowercase hex characters")
    return bytes.fromhex(value)


def parse_scope(s: Any, where: str) -> Scope:
    """Validate one scope entry `{tenant, program, actor, target}`."""
    if not isinstance(s, dict) or set(s) != {"tenant", "program", "actor", "target"}:
        raise PrincipalsError(f"{where}: must be an object with exactly tenant, program, actor, target")
    values = {}
    for name, field in (("tenant", "tenant_id"), ("program", "program_id"), ("actor", "actor_name")):
        v = s[name]
        values[name] = v if v == "*" else _scope_identifier(f"{where}.{name}", field, v)
    target = s["target"]
    if target != "*":
        if not isinstance(target, str) or "/" not in target:
            raise PrincipalsError(f"{where}.target: must be '*', '<namespace>/*' or '<namespace>/<target_id>'")
        ns, _, tid = target.partition("/")
        ns = _scope_identifier(f"{where}.target", "target_namespace", ns)
        if tid != "*":
            try:
                tid = normalize_target_id(tid)
            except IdentityError as e:
                raise PrincipalsError(f"{where}.target: {e.problem}") from None
        target = f"{ns}/{tid}"
    values["target"] = target
    return Scope(**values)


def _scope_identifier(where: str, field: str, value: Any) -> str:
    try:
        return normalize_identifier(field, value)
    except IdentityError as e:
        raise PrincipalsError(f"{where}: {e.problem}") from None


class Authenticator:
    """Bearer-key verification with an in-memory cache of verified key digests."""

    def __init__(self, records: list[PrincipalRecord]):
        self._by_credential = {r.principal.credential_id: r for r in records}
        self._verified: dict[bytes, Principal] = {}  # sha256(api_key) -> principal; only valid keys

    @classmethod
    def from_file(cls, path: str | Path) -> "Authenticator":
        return cls(load_principals(path))

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal behind an `Authorization: Bearer <key>` header, or None.

        The key is compared exactly (`bearer_key` removes only HTTP's own
        whitespace); the record's hash is compared in constant time.
        """
        api_key = bearer_key(authorization)
        if not api_key or len(api_key) > 200:
            return None
        digest = hashlib.sha256(api_key.encode("utf-8", "replace")).digest()
        cached = self._verified.get(digest)
        if cached is not None:
            return cached
        credential_id = credential_id_of(api_key)
        record = self._by_credential.get(credential_id) if credential_id else None
        if record is None or not record.verifies(api_key):
            return None
        self._verified[digest] = record.principal  # bounded: one entry per valid credential
        return record.principal
