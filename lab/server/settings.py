"""Server settings: one dataclass with documented defaults, loadable from a JSON file.

Every field can be set in the `--config` JSON object (same names). Loading is
eager and strict, Hypothesis-style: an unknown key, a wrong type or an
inconsistent combination fails with one message naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSON_SAFE_MAX = 2**53 - 1
COMMIT_MODES = ("fenced", "unfenced")
RECOVERY_MODES = ("on", "off")
# CouchDB database names start with a lowercase letter; '/' is left out so a name is one URL segment
_DB_NAME_RE = re.compile(r"[a-z][a-z0-9_$()+-]{0,199}\Z")
CLI_ONLY = frozenset({"allow_mutants"})  # settings no config file may set


class SettingsError(ValueError):
    """A settings value is invalid; the message names the field."""


@dataclass(frozen=True)
class Settings:
    """Reference lease server configuration (all times in milliseconds)."""

    # -- where things are (normally from the command line) ---------------
    valkey_url: str = "redis://127.0.0.1:6379/0"
    principals_file: str = ""
    instance_id: str = "lease-1"
    audit_log: str = ""                      # JSONL audit file; "" = no file

    # -- TTLs and lifetime (C6, C21) --------------------------------------
    min_ttl_ms: int = 100
    max_ttl_ms: int = 300_000
    max_lifetime_ms: int = 3_600_000         # the server maximum, and the default lifetime
    # -- idempotency and retention (C18) ----------------------------------
    idempotency_retry_window_ms: int = 600_000   # records live max_lifetime_ms + this
    expired_record_retention_ms: int = 600_000   # an expired record is physically kept this long
    history_max_entries: int = 32                # terminal evidence kept per identity
    history_retention_ms: int = 86_400_000
    # -- deadlines and waiting (C22, C23) ----------------------------------
    max_backend_timeout_ms: int = 5_000      # cap on any single backend wait, whatever the deadline
    max_acquire_wait_ms: int = 5_000         # cap on the optional acquire `wait_ms`
    acquire_retry_base_ms: int = 10          # first retry backoff; doubles, full jitter
    acquire_retry_max_ms: int = 200
    max_waiters: int = 256                   # concurrent waiting acquires per instance
    max_waiters_per_tenant: int = 64         # ... of which one tenant may hold at most this many
    max_waiters_per_principal: int = 64      # ... and one principal at most this many
    # -- request limits (C8, C14) -------------------------------------------
    max_body_bytes: int = 16_384
    max_body_depth: int = 32                 # JSON nesting levels of a request body
    header_timeout_ms: int = 10_000          # a request's line and headers must arrive within this (slow senders)
    max_header_bytes: int = 16_384           # a request's line and header block at most this many bytes, else 431
    max_header_fields: int = 100             # and at most this many header fields, else 431
    body_timeout_ms: int = 10_000            # and its body within this, once the headers are in
    max_metadata_bytes: int = 1_024
    max_metadata_depth: int = 4
    default_page_size: int = 50
    max_page_size: int = 100
    list_scan_budget: int = 2_000            # index entries examined per list request at most
    # -- abuse limits (section 10); 0 disables ------------------------------
    rate_per_principal_target: float = 1_000.0   # acquire+renew tokens/s per (principal, identity)
    burst_per_principal_target: int = 200
    rate_per_principal: float = 20_000.0         # acquire+renew tokens/s per principal
    burst_per_principal: int = 5_000
    active_lease_quota: int = 10_000             # active leases per principal
    # -- fencing (C5) -----------------------------------------------------------
    fence_max: int = JSON_SAFE_MAX           # acquisition refused once the counter would pass this
    # -- audit (section 11) -------------------------------------------------------
    audit_stream_maxlen: int = 100_000
    audit_queue_max: int = 10_000
    # -- backend connections ------------------------------------------------------
    valkey_max_connections: int = 64
    valkey_connect_timeout_ms: int = 1_000
    # -- the fenced-write boundary (C24-C29): a CouchDB-API document store ------
    store_url: str = ""                      # "" = none: commits 503, mutations fail closed after a Valkey restart
    store_db: str = "fencelab"               # the fenced database (its _design/fence guard is installed at start)
    commit_max_attempts: int = 8             # conditional writes per commit (re-read after a _rev conflict)
    commit_applied_max: int = 64             # request ids of recent commits kept in each document
    commit_delay_ms: int = 0                 # lab hook: a pause between validation and the store write
    # -- recovery after a Valkey restart or restore (C5, section 8) -------------
    recovery_check_interval_ms: int = 1_000  # how often the Valkey run_id is compared (also on every new connection)
    # -- planted bugs: a directory whose <operation>.lua files replace the built-in scripts
    script_dir: str = ""
    commit_mode: str = "fenced"              # "unfenced" = check-then-write without a token guard (a mutant)
    recovery: str = "on"                     # "off" = trust restored counters (the counter-from-snapshot mutant)
    allow_mutants: bool = False              # only the --allow-mutants command-line flag sets it
    mutant: str = ""                         # a named planted bug (lab/server/mutants, docs/mutants.md); "" = none

    @property
    def idempotency_ttl_ms(self) -> int:
        """How long idempotency records and lease-id index entries live (C18)."""
        return self.max_lifetime_ms + self.idempotency_retry_window_ms

    def validate(self) -> "Settings":
        """Check types, ranges and cross-field consistency; raise SettingsError naming the field."""
        # hand-written on purpose: the server starts without a schema library (pydantic costs ~0.1 s CPU per
        # start); the loop reads the dataclass's own declared types, so a new setting is checked with no new code
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            expected = f.type
            if expected == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise SettingsError(f"{f.name}: must be an integer, not {value!r}")
            if expected == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise SettingsError(f"{f.name}: must be a number, not {value!r}")
            if expected == "str" and not isinstance(value, str):
                raise SettingsError(f"{f.name}: must be a string, not {value!r}")
            if expected == "bool" and not isinstance(value, bool):
                raise SettingsError(f"{f.name}: must be true or false, not {value!r}")
            if expected in ("int", "float") and value < 0:
                raise SettingsError(f"{f.name}: must be >= 0, not {value!r}")
        positive = ("min_ttl_ms", "max_ttl_ms", "max_lifetime_ms", "max_backend_timeout_ms", "max_body_bytes",
                    "max_metadata_bytes", "max_metadata_depth", "default_page_size", "max_page_size",
                    "list_scan_budget", "history_max_entries", "fence_max", "audit_stream_maxlen",
                    "audit_queue_max", "valkey_max_connections", "valkey_connect_timeout_ms",
                    "acquire_retry_base_ms", "acquire_retry_max_ms", "history_retention_ms",
                    "commit_max_attempts", "commit_applied_max", "recovery_check_interval_ms",
                    "max_body_depth", "header_timeout_ms", "body_timeout_ms", "max_header_bytes",
                    "max_header_fields", "max_waiters_per_tenant",
                    "max_waiters_per_principal")
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name}: must be > 0")
        if self.min_ttl_ms > self.max_ttl_ms:
            raise SettingsError(f"min_ttl_ms: must be <= max_ttl_ms ({self.max_ttl_ms})")
        if self.max_ttl_ms > self.max_lifetime_ms:
            raise SettingsError(f"max_ttl_ms: must be <= max_lifetime_ms ({self.max_lifetime_ms})")
        if self.default_page_size > self.max_page_size:
            raise SettingsError(f"default_page_size: must be <= max_page_size ({self.max_page_size})")
        if self.fence_max > JSON_SAFE_MAX:
            raise SettingsError("fence_max: must be <= 2**53-1 (tokens must stay exact in JSON)")
        if self.acquire_retry_base_ms > self.acquire_retry_max_ms:
            raise SettingsError("acquire_retry_base_ms: must be <= acquire_retry_max_ms")
        if self.rate_per_principal_target and not self.burst_per_principal_target:
            raise SettingsError("burst_per_principal_target: must be > 0 when rate_per_principal_target is set")
        if self.rate_per_principal and not self.burst_per_principal:
            raise SettingsError("burst_per_principal: must be > 0 when rate_per_principal is set")
        if not self.valkey_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(f"valkey_url: must be a redis://, rediss:// or unix:// URL, not {self.valkey_url!r}")
        if self.script_dir and not Path(self.script_dir).is_dir():
            raise SettingsError(f"script_dir: {self.script_dir!r} is not a directory")
        if self.store_url and not self.store_url.startswith(("http://", "https://")):
            raise SettingsError(f"store_url: must be an http:// or https:// URL, not {self.store_url!r}")
        if not _DB_NAME_RE.match(self.store_db):
            raise SettingsError("store_db: must be a CouchDB database name: a lowercase letter, then up to 199 "
                                "of a-z 0-9 _ $ ( ) + -")
        self._check_mutant("commit_mode", COMMIT_MODES, "unfenced")
        self._check_mutant("recovery", RECOVERY_MODES, "off")
        if self.mutant:
            self._check_named_mutant()
        return self

    def _check_named_mutant(self) -> None:
        """`mutant` names a planted bug of lab/server/mutants, and only lab runs (--allow-mutants) may plant it."""
        from lab.server.mutants import MUTANT_NAMES  # only when a mutant is named (docs/mutants.md)

        if self.mutant not in MUTANT_NAMES:
            raise SettingsError(f"mutant: unknown mutant {self.mutant!r}; known: {', '.join(MUTANT_NAMES)}")
        if not self.allow_mutants:
            raise SettingsError(f"mutant: {self.mutant!r} is a planted bug for lab runs; start the server with "
                                "--allow-mutants to use it")

    def _check_mutant(self, name: str, allowed: tuple[str, ...], planted: str) -> None:
        """A closed choice whose `planted` value is a deliberate bug, refused without --allow-mutants."""
        value = getattr(self, name)
        if value not in allowed:
            raise SettingsError(f"{name}: must be one of {', '.join(allowed)}, not {value!r}")
        if value == planted and not self.allow_mutants:
            raise SettingsError(f"{name}: {planted!r} is a planted bug for lab runs; start the server with "
                                "--allow-mutants to use it")

    def replace(self, **changes: Any) -> "Settings":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes).validate()


SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))


def settings_from_dict(data: dict[str, Any], base: Settings | None = None) -> Settings:
    """Settings from a JSON object: unknown keys are errors; missing keys keep defaults."""
    if not isinstance(data, dict):
        raise SettingsError("config: must be a JSON object")
    unknown = sorted(set(data) - SETTING_NAMES)
    if unknown:
        raise SettingsError(f"{unknown[0]}: unknown setting (known: {', '.join(sorted(SETTING_NAMES - CLI_ONLY))})")
    for name in sorted(CLI_ONLY & set(data)):
        raise SettingsError(f"{name}: cannot be set in a config file (use the --{name.replace('_', '-')} flag)")
    base = base or Settings()
    values = dict(data)
    for f in dataclasses.fields(Settings):
        if f.type == "float" and isinstance(values.get(f.name), int) and not isinstance(values.get(f.name), bool):
            values[f.name] = float(values[f.name])
    try:
        return dataclasses.replace(base, **values).validate()
    except TypeError as e:  # pragma: no cover - dataclasses.replace only raises for unknown names
        raise SettingsError(str(e)) from None


def load_settings(path: str | Path, base: Settings | None = None) -> Settings:
    """Settings from a `--config` JSON file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SettingsError(f"config: cannot read {p}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SettingsError(f"config: {p} is not valid JSON: {e}") from None
    return settings_from_dict(data, base)


def settings_as_dict(settings: Settings) -> dict[str, Any]:
    """A JSON-able copy of the settings (for run records)."""
    return dataclasses.asdict(settings)

