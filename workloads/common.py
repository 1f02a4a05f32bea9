"""What every lease-API workload shares: identities per key, credentials, and op completions.

A workload key is a short name (`k0`, `k1`, ...) for one lock identity; the
full identity lives in `test.json` so histories stay small.
"""

from __future__ import annotations

import itertools
from typing import Any

import lab.generator as gen
from lab.client import Result
from lab.sut import WorkloadNeeds, open_system
from lab.sut.principal import (  # noqa: F401 - re-exported: the workloads' principal lives in the SUT layer
    WORKLOAD_ACTOR, WORKLOAD_PROGRAM, WORKLOAD_TENANT, identity_for, pick_credential)
from lab.testmap import Test

_instances = itertools.count(1)


def key_names(n: int) -> list[str]:
    """`k0` .. `k{n-1}`."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"keys must be a positive integer, not {n!r}")
    return [f"k{i}" for i in range(n)]


def salted(test, ident: str) -> str:
    """`ident` made this run's own with the Test's `run_salt`: a server that remembers another run's request ids
    (idempotency records) or owners must not answer this run from them."""
    salt = test.run_salt if test is not None else ""
    return f"{salt}-{ident}" if salt else ident


def seeded_request_id(test, ctx) -> str:
    """A request id from the generator's seeded rng, salted per run (a replay with the same salt sends the same ids)."""
    return salted(test, f"{ctx.rng.getrandbits(64):016x}")


def new_instance_id(prefix: str = "worker", test=None) -> str:
    """A fresh service_instance_id: each opened client is its own worker (owner = principal + instance)."""
    return salted(test, f"{prefix}-{next(_instances)}")


def completion(result: Result, value: Any, **extra: Any) -> dict[str, Any]:
    """The completion op for a lease API result: ok/fail/info, the value, and the contract code as error."""
    op: dict[str, Any] = {"type": result.outcome, "value": value}
    if result.outcome != "ok":
        op["error"] = result.code
    op.update(extra)
    return op


def lease_client(test, node: str, *, needs: WorkloadNeeds, instance: str | None = None, timeout_s: float = 5.0):
    """The system under test's client for one worker against `node` (a `lab.sut.LeaseSystem`).

    The system is `test.sut` (default `reference`: a LeaseClient with the
    stack's credentials); `needs` is what the calling workload declares (its `NEEDS`): a system lacking one
    of them is refused here.
    """
    return open_system(test, node, instance or new_instance_id(test=test), needs=needs, timeout_s=timeout_s)


# -- what the client sent (docs/history-format.md: `value.sent`) ------------------------------------------

def sent(request_id: str, lease: Any = None) -> dict[str, Any]:
    """What a request put on the wire: its request_id and, for an op on a lease, that lease's id and token."""
    out: dict[str, Any] = {"request_id": request_id}
    if lease is not None:
        out["lease_id"] = lease.lease_id
        out["fencing_token"] = lease.fencing_token
    return out


# -- the default exercise: stalls past the TTL, bursts on one free key, sessions that outlive their lease ---
#
# Every general workload runs, at its defaults, the same three kinds of trouble (issue 10: a default run must
# exercise every row of the races table, not only what a scenario scripts):
# - a holder stalls longer than its lease's TTL between two steps and then carries on (renew, commit,
#   release) with the lease it still believes it holds, on a contended key (a successor takes over) or on a
#   key of its own (nobody does: only expiry stands between it and a revived lease);
# - every few seconds all threads acquire one free key in the same instant (a burst);
# - retries by request_id, some after a stall, from the same service instance.
# Stalls are generator sleeps drawn from the seeded rng (the client never sleeps).

TAKEOVER_STALL = (1.15, 1.6)  # x TTL: past expiry, long enough for a successor to acquire and act
SOLO_STALL = (1.05, 1.5)      # x TTL: on a key nobody else uses: the renews after it land after the expiry
BURST_EVERY_S = 1.0           # seconds of sessions between two bursts
SMALL_RUN_WINDOW_TTLS = 3.0   # with 1 or 2 threads, TTLs of sessions between two bursts (a takeover fits in one)
POLL_TTLS = 3.0               # x TTL: how long a holder polls for a busy key (its holder's lease ends within a
                              # TTL of its last renew, and a stalled holder renews right after it acquires)


def pick_kind(test: Test, ctx: Any) -> str:
    """A session's kind when a thread does everything (fewer than 3 threads): `plain`, `stalled` (past the TTL
    on the takeover key) or `solo` (on a key of its own)."""
    return ctx.rng.choices(("plain", "stalled", "solo"), weights=(5, 3, 2))[0]


def request_id(test: Test, ctx: Any) -> str:
    """A request id for one op, drawn from the run's seeded rng (so a replay sends the same ids)."""
    return salted(test, f"{ctx.rng.getrandbits(64):016x}")  # salted: this run's own (test.json run_salt)


def session_id(test: Test, ctx: Any) -> str:
    """A session's id: its leases and service instance are shared by every client of the run (see `Sessions`)."""
    return salted(test, f"{ctx.rng.getrandbits(48):012x}")  # salted: its service instance is this run's own


def remaining_s(test: Test, ctx: Any, end_ns: int | None = None) -> float:
    """Seconds left in the main phase: until `end_ns` (`exercise` passes the time its time limit ends: the
    limit starts with the main phase's first op, which may be seconds after the test's clock started)."""
    if end_ns is None:
        end_ns = int(float(test.time_limit) * 1e9)
    return (end_ns - ctx.time) / 1e9


def time_for(test: Test, ctx: Any, span: tuple[float, float], end_ns: int | None) -> bool:
    """Is there time for a stall of up to `span` x the TTL and a few ops after it?"""
    return remaining_s(test, ctx, end_ns) >= int(test.ttl_ms) * span[1] / 1000 + 0.5


def stall_s(test: Test, ctx: Any, span: tuple[float, float]) -> float:
    """A stall of `span` x the TTL, in seconds, from the seeded rng."""
    return int(test.ttl_ms) * ctx.rng.uniform(*span) / 1000.0


def stall(span: tuple[float, float], end_ns: int | None = None) -> Any:
    """A holder's stall of `span` x the TTL between two steps (a GC pause, a slow disk): the thread idles. Drawn
    when reached, and cut to the main phase's time left, so the run ends on time. The sleep itself is not
    recorded: the thread's next invocation carries `mechanism: "stall"` and `stall_ms` (its mark), so a stale
    holder it makes says where it came from (docs/history-format.md)."""
    def pause(test, ctx):
        s = min(stall_s(test, ctx, span), remaining_s(test, ctx, end_ns) - 0.2)
        return dict(gen.sleep(s), mark={"mechanism": "stall", "stall_ms": round(s * 1000)}) if s > 0 else None

    return gen.bind(pause)


def acquire_until_held(key: str, value: Any, poll_ttls: float = POLL_TTLS) -> Any:
    """Acquire `key` until one attempt succeeds, for at most `poll_ttls` x the TTL: a holder polling for a busy
    key, so it takes over the moment the key is free. `value(test, ctx)` gives each attempt's invoke value.
    Bounded by time, not attempts: a poll counted in attempts ended before its holder's lease did whenever the
    ops came fast (50 attempts were 2.5 s at the defaults, the lease 2.2 s: no takeover, and no stale op)."""
    def poll(test, ctx):
        attempt = lambda test, ctx: {"f": "acquire", "key": key, "value": value(test, ctx)}  # noqa: E731
        return gen.until_ok(gen.time_limit(int(test.ttl_ms) * poll_ttls / 1000.0, attempt))

    return gen.bind(poll)


def session_key(test: Test, ctx: Any, kind: str, keys: list[str]) -> str:
    """The key a session works on: stalled sessions all take the first key (the takeover key: each stalled
    holder's successor is the next one polling for it, so its stale ops meet a live successor), solo sessions a
    fresh one, plain sessions any of `keys`."""
    if kind == "stalled":
        return keys[0]
    return solo_key(test, ctx) if kind == "solo" else ctx.rng.choice(keys)


def session_start(test: Test, ctx: Any, keys: list[str], kind: str | None = None, end_ns: int | None = None):
    """How every session begins: (its key, its kind, its stall span, `v(**kw)` making an op value with a fresh
    request id and the session's id). A stalled or solo session with no time left to act after its stall is a
    plain one."""
    sid = session_id(test, ctx)
    salt, bits = (test.run_salt if test is not None else ""), ctx.rng.getrandbits

    def v(**kw: Any) -> dict[str, Any]:
        # request_id(test, ctx), inlined (the same draw and text): each thread's generator calls this per op
        rid = f"{bits(64):016x}"
        value = {"request_id": f"{salt}-{rid}" if salt else rid, "session": sid}
        if kw:
            value.update(kw)
        return value

    kind = unstalled(test, kind or pick_kind(test, ctx))
    span = TAKEOVER_STALL if kind == "stalled" else SOLO_STALL
    if kind != "plain" and not time_for(test, ctx, span, end_ns):
        kind = "plain"
    return session_key(test, ctx, kind, keys), kind, span, v


def unstalled(test: Test, kind: str) -> str:
    """`kind`, or `plain` under `--stalls off` (the kind is still drawn, so the rest of the run draws the same)."""
    return "plain" if getattr(test, "stalls", None) == "off" else kind


def solo_key(test: Test, ctx: Any) -> str:
    """A fresh key nobody else acquires (a stalled holder there is taken over only by expiry)."""
    return f"solo-{salted(test, f'{ctx.rng.getrandbits(32):08x}')}"  # salted: free in every run


def burst_key(test: Test, ctx: Any) -> str:
    """A fresh key for one burst: free when every thread acquires it in the same instant."""
    return f"burst-{salted(test, f'{ctx.rng.getrandbits(32):08x}')}"  # salted: free in every run


class Session:
    """What one session (a holder) knows, shared by every client of the run: a retry after an `info` is made by
    the next process of the thread, from the same service instance, with the same lease and body."""

    __slots__ = ("instance", "lease", "entries")

    def __init__(self, instance: str):
        self.instance = instance
        self.lease: Any = None          # the lease this session believes it holds (kept after a lease_lost:
        self.entries: dict[str, Any] = {}  # a stale holder carries on); commit entries by request_id


class Sessions(dict):
    """session id -> Session, one table per workload instance (shared by every opened client)."""

    def get_session(self, test: Test, sid: str) -> Session:
        s = self.get(sid)
        if s is None:
            s = self[sid] = Session(session_instance(test, sid))
        return s


def session_instance(test: Test, sid: str) -> str:
    """The service_instance_id a session acts as (the owner is the principal plus this)."""
    return f"session-{sid}"


def exercise(test: Test, session: Any, burst: Any, *, burst_every_s: float = BURST_EVERY_S) -> Any:
    """The main-phase generator of a lease workload, at `test.rate` ops/s over all threads, in lanes of threads.

    With 5 or more threads (the default is 5):
    - the burst lane (all but 3 threads): every `burst_every_s` s they all acquire one fresh key in the same
      instant (`burst(test, ctx, key)`: one thread's ops), and between bursts they run plain sessions;
    - the takeover lane (2 threads): stalled sessions on the takeover key, one after the other, so each stalled
      holder's successor is the other thread, which has been polling for the key since before it expired;
    - the solo lane (1 thread): solo sessions, each on a key of its own.
    With 3 or 4 threads the takeover lane's threads also run solo sessions (every third one); with fewer, every
    thread does everything (sessions of a kind drawn from the rng) and a burst waits for the stalled threads, so
    the sessions between two bursts last 3 TTLs (SMALL_RUN_WINDOW_TTLS): a stalled or paused holder's key can
    expire and pass to the other thread in between.
    `session(test, ctx, kind, end_ns)` returns one session's ops (kind: plain, stalled, solo, or None: draw
    one; end_ns: when the main phase ends, on the generator's clock).
    """
    return gen.bind(lambda test, ctx: _lanes(test, session, burst, burst_every_s,
                                             ctx.time + int(float(test.time_limit) * 1e9)))


def _lanes(test: Test, session: Any, burst: Any, burst_every_s: float, end_ns: int) -> Any:
    """`exercise`'s lanes, once the main phase's first op is asked for (its time limit starts then)."""
    def one_burst(test, ctx):
        key = burst_key(test, ctx)
        # each thread draws its own request ids and session: only the key is shared
        return gen.each_thread(gen.bind(lambda test, ctx: burst(test, ctx, key)))

    def sessions(*kinds: str | None) -> Any:
        """One thread's sessions, of `kinds` in turn."""
        return gen.cycle([gen.bind(lambda test, ctx, kind=kind: session(test, ctx, kind, end_ns)) for kind in kinds])

    def paced(threads: int, g: Any) -> Any:
        """`g` on `threads` threads at their share of the rate."""
        return gen.stagger(test.concurrency / (test.rate * threads), g)

    def bursts(threads: int, between: Any, every_s: float = burst_every_s) -> Any:
        return gen.cycle([gen.synchronize(gen.bind(one_burst)),
                          gen.time_limit(every_s, paced(threads, gen.each_thread(between)))])

    c = int(test.concurrency)
    if c < 3:
        # every thread's sessions run between bursts, and a burst waits for every thread: a stalled (or paused)
        # holder's lease must expire and be taken by the other thread before that, so the sessions between two
        # bursts last SMALL_RUN_WINDOW_TTLS TTLs (with 1 s at a 1 s TTL a successor never took over)
        return bursts(c, sessions(None), max(burst_every_s, SMALL_RUN_WINDOW_TTLS * int(test.ttl_ms) / 1000))
    if c < 5:
        takeover = gen.each_thread(sessions("stalled", "stalled", "solo"))
        return gen.reserve(c - 2, bursts(c - 2, sessions("plain")), paced(2, takeover))
    return gen.reserve(c - 3, bursts(c - 3, sessions("plain")),
                       2, paced(2, gen.each_thread(sessions("stalled"))),
                       paced(1, sessions("solo")))
