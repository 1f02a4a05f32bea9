"""Planted bugs (mutants) of the reference lease server: each a small, named, deliberate violation of the contract.

A mutant exists to prove the lab's checkers work: run the server with a bug
planted, and the scenario that exposes it must be judged invalid, while the
unmodified server passes the very same run (`fencelab mutants`,
docs/mutants.md).

    python -m lab.server ... --allow-mutants --mutant nonatomic-acquire

A mutant is refused unless the server runs with `--allow-mutants`, which only
lab runs pass (`fencelab test --mutant NAME`, campaign specs, `fencelab
mutants`). The default server never imports anything here: `Settings.validate`
reads this registry only when `mutant` is set, and `LeaseServer` asks for the
mutant's parts only then, so the unmodified path is the same code, at the same
speed, as without this package.

Each mutant is at most three things, all visible in `MUTANTS` below:
- `settings`: Settings it changes (`commit_mode: unfenced`, `recovery: off`);
- `patches`: exact-text replacements in the built-in Lua (lab/server/lua): the
  replaced text must occur exactly once in the part it names (a script's own body,
  or `common` for the helpers every script starts with), so a change to the
  built-in scripts makes the mutant fail loudly instead of silently planting
  nothing; every replacement carries a `-- MUTANT(<name>)` comment;
- `variants`: Python classes of `lab.server.mutants.variants` that replace the
  backend, the lease service or the commit service (a GET-then-SET acquire, the
  server's clock passed to the scripts).

This module is data only (no server imports), so `Settings` can validate a name cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["GENERAL_MUTANT_NAMES", "MUTANTS", "MUTANT_NAMES", "LuaPatch", "Mutant", "get_mutant"]


@dataclass(frozen=True)
class LuaPatch:
    """Replace `old` (exactly once) by `new` in one part of the Lua: an operation's body, or `common`."""

    part: str  # an operation name (lab.server.scripts.OPERATIONS) or "common"
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """One planted bug: what it breaks, and how it is planted."""

    name: str
    bug: str  # what the planted server does wrong, in one sentence
    rules: tuple[str, ...]  # the contract rules it breaks
    settings: Mapping[str, Any] = field(default_factory=dict)
    patches: tuple[LuaPatch, ...] = ()
    variants: tuple[str, ...] = ()  # class names in lab.server.mutants.variants
    # the fault that exposes it (campaigns/faults.toml, docs/nemesis.md "Every fault exposes a bug"): a bug that
    # only shows under that fault, so `fencelab mutants`' general workloads (no fault) cannot be asked to catch it
    fault: str = ""


# The one line of renew.lua and release.lua that decides whether the caller holds the lease (C12, C13).
_OWNERSHIP = "local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], ARGV[6], now)\n"
_REFUSE = "if problem then return {'lease_lost', int(now), problem} end\n"
_CLEANUP = """if problem then
  -- MUTANT(stale-cleanup-deletes-successor): "clean up" the caller's stale lease by key, not conditional on its
  -- lease_id and token: when the lease was superseded, the record deleted is the successor's
  if r then
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[5], KEYS[1])
  end
  return {'lease_lost', int(now), problem}
end
"""

MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant(
        "unfenced-commit",
        "a commit is validated against the lease, then written without any token condition (check, then "
        "unconditional write into a database without the fence guard): a paused holder's late write lands over "
        "its successor's",
        ("C27", "C29"),
        settings={"commit_mode": "unfenced"},
    ),
    Mutant(
        "late-unguarded-commit",
        "a commit validated with less than a fifth of its lease's TTL left is written a fifth of the TTL later, "
        "conditional on the document's revision only (the write keeps a newer holder's fence fields, so the "
        "store's token guard never sees it): a successor that takes the key at expiry and commits at once lands "
        "first, and the late write appends the older token after it",
        ("C27", "C29"),
        variants=("LateUnguardedCommits",),
    ),
    Mutant(
        "nonatomic-acquire",
        "acquire is two round trips from the server: read the record (free?), then increment the counter and "
        "write the record; two acquires that both read 'free' both win",
        ("C11", "C5"),
        patches=(LuaPatch(
            "acquire",
            "if r and tonumber(r.expires_at) > now then\n"
            "  return {'lease_conflict', int(now), int(tonumber(r.expires_at) - now)}\nend\n",
            "-- MUTANT(nonatomic-acquire): no free-check in the write step: the server read the record in an\n"
            "-- earlier round trip (NonatomicAcquireService) and this step trusts what it saw then\n"),),
        variants=("NonatomicAcquireService",),
    ),
    Mutant(
        "volatile-counter",
        "the fencing counter key gets the lease's expiry (PEXPIREAT counter expires_at): once a lease expires "
        "and the identity is idle, the counter is gone and the next acquisition re-issues token 1",
        ("C5",),
        patches=(LuaPatch(
            "acquire",
            "redis.call('PEXPIREAT', KEYS[1], int(expires + tonumber(ARGV[20])))\n",
            "redis.call('PEXPIREAT', KEYS[1], int(expires + tonumber(ARGV[20])))\n"
            "redis.call('PEXPIREAT', KEYS[2], int(expires))  -- MUTANT(volatile-counter): the counter expires "
            "with the lease\n"),),
    ),
    Mutant(
        "local-clock",
        "every lease decision uses the calling server's own wall clock (passed into the scripts) instead of "
        "Valkey's TIME: servers whose clocks disagree disagree about acquisition order and expiry",
        ("C20", "C10"),
        patches=(LuaPatch(
            "common",
            "  local t = redis.call('TIME')\n"
            "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n",
            "  -- MUTANT(local-clock): the calling server's wall clock (its last argument), not Valkey's TIME\n"
            "  return tonumber(ARGV[#ARGV])\n"),),
        variants=("LocalClockBackend",),
    ),
    Mutant(
        "no-idempotency",
        "request_id is ignored: no idempotency record is read or written, so a retry executes again (a second "
        "acquire conflicts with the first, a changed body is accepted)",
        ("C16", "C17", "C18"),
        patches=(
            LuaPatch("common", "local function read_idempotency(key)\n",
                     "local function read_idempotency(key)\n"
                     "  do return nil end  -- MUTANT(no-idempotency): request_id ignored: no record is read\n"),
            LuaPatch("common", "local function store_idempotency(key, digest, code, flat, ttl_ms, encoded)\n",
                     "local function store_idempotency(key, digest, code, flat, ttl_ms, encoded)\n"
                     "  do return end  -- MUTANT(no-idempotency): ... and none is written\n"),
        ),
        variants=("NoIdempotencyCommits",),
    ),
    Mutant(
        "renew-revives-expired",
        "renew does not check expiry: a renew of an expired record that Valkey has not deleted yet (it is kept "
        "for expired_record_retention_ms) succeeds and makes the dead lease active again",
        ("C10", "C12"),
        patches=(LuaPatch(
            "renew", _OWNERSHIP,
            "-- MUTANT(renew-revives-expired): expiry is not checked (time 0 is before every expires_at)\n"
            "local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], ARGV[6], 0)\n"),),
    ),
    Mutant(
        "release-any-owner",
        "release does not compare who holds the lease (lease_id, owner, service instance, token): any caller's "
        "release ends whatever lease currently holds the identity, e.g. a stale holder ends its successor's",
        ("C13", "C9"),
        patches=(LuaPatch(
            "release", _OWNERSHIP,
            "-- MUTANT(release-any-owner): the holder is not compared; only 'is there an unexpired lease?'\n"
            "local problem = nil\n"
            "if not r then problem = 'not_found' elseif tonumber(r.expires_at) <= now then problem = 'expired' end\n"),),
    ),
    Mutant(
        "stale-cleanup-deletes-successor",
        "a refused release / force-release / revoke 'cleans up' by deleting the record by key, not conditional "
        "on lease_id + token: a stale ending answers lease_lost, and silently deletes the successor's lease",
        ("C13", "C15", "C9"),
        patches=(LuaPatch("release", _REFUSE, _CLEANUP), LuaPatch("common", _REFUSE, _CLEANUP)),
    ),
    Mutant(
        "renew-without-backend",
        "a circuit breaker around Valkey: a renew that Valkey refuses (down) is answered lease_renewed from the "
        "server's memory of the lease, and once Valkey has been slow or silent for a while (calls pending past "
        "120 ms, sustained over 0.2 s) renewals are answered from memory without Valkey for 5 s: holders believe "
        "in expiries Valkey never recorded, and successors take the identities at the real ones",
        ("C12", "C20"),
        variants=("RenewWithoutBackendService",),
        fault="partition",
    ),
    Mutant(
        "restart-drops-leases",
        "at start-up a server instance deletes every unexpired lease record, taking the holders for clients of "
        "its previous life: after one server restarts, every held identity is free again although its holder "
        "still holds it, and the next acquirer gets it",
        ("C9", "C11"),
        variants=("RestartDropsLeasesBackend",),
        fault="kill",
    ),
    Mutant(
        "idle-holder-refenced",
        "a holder that renews or releases after a second of silence is taken for a reconnecting client and its "
        "lease gets a fresh fencing token (the counter incremented, the record rewritten): one lease, two tokens",
        ("C7", "C12", "C13"),
        variants=("IdleHolderRefencedService",),
        fault="client-pause",
    ),
    Mutant(
        "counter-from-snapshot",
        "no recovery rule: after Valkey restarts from an older snapshot the server trusts the restored fencing "
        "counters and re-issues tokens already used downstream",
        ("C5",),
        settings={"recovery": "off"},
    ),
)}

MUTANT_NAMES = tuple(MUTANTS)
# the planted bugs the general workloads must catch without a fault (campaigns/mutants.toml); the others are
# the fault table's (campaigns/faults.toml)
GENERAL_MUTANT_NAMES = tuple(m for m in MUTANT_NAMES if not MUTANTS[m].fault)


def get_mutant(name: str) -> Mutant:
    """The mutant called `name`; ValueError listing the known ones."""
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")
    return MUTANTS[name]
