"""The races table (contract section 8): one named scenario per row, each a script, its faults and its checker.

Every script runs its race in rounds on fresh identities (`k0`, `k1`, ...,
unique to the run), so one run repeats the race several times; the number of
rounds follows the test's time limit. Threads map to servers as the lab's
stack lays them out: thread 0 talks to lease-1 and thread 1 to lease-2 (with
Toxiproxy, through client group c1; thread 2 is group c2 to lease-1).
See docs/scenarios.md for the table of what each one sets up and checks.
"""

from __future__ import annotations

from typing import Any, Mapping

import lab.generator as gen
from checkers.core import Violations
from lab.client.results import nothing_sent
from lab.scenarios.scenario import Scenario, Script, Tagged, code, describe, idx, ok, val

# the reference server's largest token on a fresh stack: its recovery gate issues epoch 0's tokens, up to
# ((0 + 1) << 32) - 1, and refuses acquisitions past them (fence_max, 2^53-1, bounds only the last epoch)
LIMIT = 2**32 - 1
UNAVAILABLE = frozenset({"lease_backend_unavailable", "lease_outcome_unknown", "deadline_exceeded", "timeout",
                         "connection_lost", "connect_error"})
LOST = "lease_lost"


def _rounds(t: Tagged, prefix: str) -> list[str]:
    """The round suffixes of ops tagged `<prefix><suffix>`, in history order."""
    return [tag[len(prefix):] for tag, _ in t.starting(prefix)]


def _lease_id(p) -> Any:
    """The lease an op is about (its completion's, else its invocation's)."""
    return val(p, "lease_id")


def _active_as(p, lease_id: Any) -> bool:
    """Does an ok inspect show `lease_id` as the active lease?"""
    r = p.result if ok(p) else None
    return isinstance(r, dict) and r.get("lease_id") == lease_id and r.get("state") in (None, "active")


def _stale_ok(v: Violations, p, what: str) -> None:
    """A stale op must not succeed; a definite refusal must be lease_lost."""
    if ok(p):
        v.add("stale-op-succeeded", idx(p), f"{what} succeeded: {describe(p)}")
    elif p is not None and p.type == "fail" and code(p) not in (LOST, "stale_token"):
        v.add("wrong-code", idx(p), f"{what} was refused with {code(p)}, not lease_lost")


# -- 1. concurrent acquires ---------------------------------------------------------------------------


def concurrent_script(s: Script) -> Any:
    """Rounds: counter read, every thread acquires one fresh identity at the same instant, inspect and read."""
    parts = []
    for r in range(s.rounds(0.3, minimum=3)):
        k = f"k{r}"
        if s.local:
            parts.append(s.on(0, s.op("observe-backend", k, f"before-{r}")))
        parts.append(s.burst({t: s.op("acquire", k, f"burst-{r}", slot=f"r{r}t{t}", owner=f"w{t}", ttl_ms=5000)
                              for t in range(s.test.concurrency)}))
        parts.append(s.together(s.on(0, s.op("inspect", k, f"inspect-{r}")),
                                s.on(1, s.op("observe-backend", k, f"after-{r}")) if s.local else None))
    return s.steps(*parts)


def concurrent_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Exactly one ok acquire per burst, the inspect shows it, and the counter moved by exactly one."""
    rounds = contested = 0
    for r in sorted({x for x in _rounds(t, "burst-")}, key=lambda x: int(x)):
        burst = t.all(f"burst-{r}")
        rounds += 1
        first_done = min((p.t1 for p in burst if p.t1 is not None), default=None)
        if first_done is not None and sum(1 for p in burst if p.t0 < first_done) >= 2:
            contested += 1
        winners = [p for p in burst if ok(p)]
        undecided = [p for p in burst if p.type == "info"]
        if len(winners) > 1:
            v.add("two-winners", idx(*winners), f"round {r}: {len(winners)} acquires of one free identity succeeded",
                  leases=[_lease_id(p) for p in winners])
        if not winners and not undecided:
            v.add("no-winner", idx(*burst), f"round {r}: every acquire of a free identity was refused "
                  f"({sorted({code(p) for p in burst})})")
        ins = t.one(f"inspect-{r}")
        if len(winners) == 1 and ok(ins) and not _active_as(ins, _lease_id(winners[0])):
            v.add("inspect-mismatch", idx(winners[0], ins), f"round {r}: the backend shows {ins.result!r}, not the "
                  f"winner's lease {_lease_id(winners[0])!r}")
        before, after = t.one(f"before-{r}"), t.one(f"after-{r}")
        if ok(before) and ok(after) and not undecided:
            allocated = (val(after, "counter") or 0) - (val(before, "counter") or 0)
            if allocated != len(winners):
                v.add("tokens-allocated", idx(before, *burst, after), f"round {r}: the fencing counter moved by "
                      f"{allocated} for {len(winners)} successful acquire(s)", allocated=allocated)
    return {"rounds": rounds, "contested_rounds": contested, "exercised": contested > 0,
            "why_not": "no burst had two acquires in flight at once"}


CONCURRENT = Scenario(
    name="concurrent-acquires", race="concurrent acquires", requires="exactly one active lease, one token allocated",
    tags=("after", "before", "burst", "inspect"),
    rules=("C11", "C5"),
    setup="Rounds on fresh identities: every client thread (8) sends an acquire of the same identity in the same "
          "event-loop turn (a synchronized burst across both lease servers); the fencing counter is read straight "
          "from Valkey before and after, and the identity inspected.",
    checks="Per burst: at most one ok acquire (none only if some were indeterminate), the rest refused; the inspect "
           "shows the winner's lease; the counter moved by exactly the number of winners (one token allocated). "
           "Unknown when no burst had two acquires in flight at once.",
    script=concurrent_script, check=concurrent_check,
    options={"concurrency": 8, "time_limit": 3.0, "ttl_ms": 2000},
    domain=("fencing", "mutual-exclusion", "lease-state", "idempotency", "deadlines"), min_concurrency=2,
)


# -- 2. acquire response lost -------------------------------------------------------------------------

DEADLINES_MS = (1, 2, 3, 5, 8, 13)


def response_lost_script(s: Script) -> Any:
    """Originals with tiny deadlines (and, on the lab's stack, a reply dropped by Toxiproxy), then retries."""
    parts = []
    rounds = [(str(r), DEADLINES_MS[r % len(DEADLINES_MS)]) for r in range(s.rounds(0.4, minimum=4))]
    for r, deadline in rounds:
        k = f"k{r}"
        orig = s.op("acquire", k, f"orig-{r}", slot=f"a{r}", ttl_ms=5000, deadline_ms=deadline)
        parts += [s.on(0, orig), s.on(1, s.again(orig, f"retry-{r}", deadline_ms=2000)),
                  s.on(0, s.again(orig, f"retry2-{r}", deadline_ms=2000))]
        if s.local:
            parts.append(s.on(0, s.op("observe-backend", k, f"counter-{r}")))
    if s.local:  # the request arrives, its reply is lost on the wire (c1 -> lease-1 downstream blackholed)
        orig = s.op("acquire", "kp", "orig-p", slot="ap", ttl_ms=5000, deadline_ms=700)
        parts += [s.fault(s.nem("start-partition", {"links": ["c1_lease-1"], "direction": "downstream"})),
                  s.on(0, orig), s.fault(s.nem("stop-partition")),
                  s.on(1, s.again(orig, "retry-p", deadline_ms=2000)),
                  s.on(0, s.again(orig, "retry2-p", deadline_ms=2000)),
                  s.on(0, s.op("observe-backend", "kp", "counter-p"))]
    return s.steps(*parts)


def response_lost_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """A retry of a lost acquire returns the lease (never lease_conflict), the same one every time, one token."""
    lost = 0
    for r in _rounds(t, "orig-"):
        orig, retry, retry2 = t.one(f"orig-{r}"), t.one(f"retry-{r}"), t.one(f"retry2-{r}")
        if orig.type == "info":
            lost += 1
        for p in (retry, retry2):
            if p is not None and p.type == "fail" and code(p) in ("lease_conflict", "idempotency_conflict"):
                v.add("retry-not-resolved", idx(orig, p), f"round {r}: a retry with the original request_id "
                      f"failed with {code(p)} after the original was {orig.type}: it must return the lease")
        leases = {(_lease_id(p), val(p, "fencing_token")) for p in (orig, retry, retry2) if ok(p)}
        if len(leases) > 1:
            v.add("retry-different-lease", idx(orig, retry, retry2), f"round {r}: one request_id returned "
                  f"different leases {sorted(leases, key=str)}")
        counter = t.one(f"counter-{r}")
        if ok(counter) and leases and val(counter, "counter") != 1:
            v.add("tokens-allocated", idx(orig, retry, retry2, counter), f"round {r}: {val(counter, 'counter')} "
                  "tokens allocated for one request_id")
    return {"lost_responses": lost, "exercised": lost > 0,
            "why_not": "no original acquire lost its response (all completed ok or failed definitely)"}


RESPONSE_LOST = Scenario(
    name="acquire-response-lost", race="acquire response lost",
    tags=("counter", "orig", "retry", "retry2"),
    requires="retry by request_id returns the same lease and token", rules=("C17", "C19"),
    setup="Rounds: an acquire with a tiny deadline (1-13 ms: the reply is usually lost, the request often "
          "executed), then the same request (same request_id and body) retried through the other server and "
          "again; on the lab's stack one more round where Toxiproxy blackholes the reply of c1 -> lease-1 "
          "(the request arrives, the response never does). The counter is read from Valkey after each round.",
    checks="A retry of a lost acquire is never lease_conflict / idempotency_conflict; every ok of one request_id "
           "carries the same lease_id and token; the counter shows one token per request_id. Unknown when no "
           "response was lost.",
    script=response_lost_script, check=response_lost_check, nemeses=("partition",),
    options={"concurrency": 2, "time_limit": 3.0, "ttl_ms": 2000}, min_concurrency=2,
)


# -- 3. renew vs expiry -----------------------------------------------------------------------------

EDGE_OFFSETS_MS = (-30, -15, -8, -4, -2, 0, 2, 4, 8, 15)


def renew_expiry_script(s: Script) -> Any:
    """Rounds: acquire with a short TTL, renew at expires_at + offset (sweeping -30..+15 ms), inspect, renew late."""
    parts = []
    for r in range(s.rounds(0.7, minimum=6)):
        k, slot = f"k{r}", f"a{r}"
        off = EDGE_OFFSETS_MS[r % len(EDGE_OFFSETS_MS)]
        parts += [s.on(0, s.op("acquire", k, f"acq-{r}", slot=slot, ttl_ms=s.ttl)),
                  s.on(0, s.op("renew", k, f"edge-{r}", slot=slot, at={"slot": slot, "offset_ms": off})),
                  s.on(0, s.op("inspect", k, f"inspect-{r}")),
                  s.on(0, s.op("renew", k, f"late-{r}", slot=slot, at={"slot": slot, "offset_ms": 60})),
                  s.on(0, s.op("inspect", k, f"final-{r}"))]
    return s.steps(*parts)


def renew_expiry_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """An ok renew happened before expiry by backend time; a lost one is lease_lost and never revived."""
    renewed = lost = near = 0
    for r in _rounds(t, "acq-"):
        acq, edge = t.one(f"acq-{r}"), t.one(f"edge-{r}")
        if not ok(acq) or edge is None:
            continue
        lease, expires = _lease_id(acq), val(acq, "expires_at_ms")
        sent = val(edge, "sent_at_ms")
        if sent is not None and expires is not None and abs(sent - expires) <= 25:
            near += 1
        if ok(edge):
            renewed += 1
            at = val(edge, "renewed_at_ms")
            if at is not None and expires is not None and at >= expires:
                v.add("renewed-after-expiry", idx(acq, edge), f"round {r}: renewed at {at} ms, at or after the "
                      f"lease's expiry {expires} ms by backend time", lease=lease)
        elif edge.type == "fail":
            lost += 1
            if code(edge) != LOST:
                v.add("wrong-code", idx(edge), f"round {r}: a renew at the TTL boundary failed with {code(edge)}, "
                      "not lease_lost")
            if _active_as(t.one(f"inspect-{r}"), lease):
                v.add("revived", idx(edge, t.one(f"inspect-{r}")), f"round {r}: the lease is active again after its "
                      "renew was refused as expired", lease=lease)
        late = t.one(f"late-{r}")
        _stale_ok(v, late, f"round {r}: a renew well after expiry")
        if _active_as(t.one(f"final-{r}"), lease):
            v.add("revived", idx(late, t.one(f"final-{r}")), f"round {r}: the backend shows the expired lease "
                  "active", lease=lease)
    return {"boundary_renews_ok": renewed, "boundary_renews_lost": lost, "sent_within_25ms_of_expiry": near,
            "exercised": near > 0, "why_not": "no renew reached the server within 25 ms of the lease's expiry"}


RENEW_EXPIRY = Scenario(
    name="renew-vs-expiry", race="renew vs expiry", requires="backend decides; an expired lease is never revived",
    tags=("acq", "edge", "final", "inspect", "late"),
    rules=("C10", "C12", "C20"),
    setup="Rounds: acquire with a 300 ms TTL, then a renew held back until the lease's expires_at plus an offset "
          "swept over -30..+15 ms (the client sleeps until then: the renew lands on the TTL boundary), an "
          "inspect, a renew 60 ms after expiry, and a final inspect.",
    checks="An ok renew's backend renewed_at is before the expiry it extended; a refused one is lease_lost and the "
           "inspect never shows that lease active again; the late renew is lease_lost. Unknown when no renew was "
           "sent within 25 ms of expiry.",
    script=renew_expiry_script, check=renew_expiry_check,
    options={"concurrency": 1, "time_limit": 5.0, "ttl_ms": 300},
)


# -- 4. renew vs release / revoke ---------------------------------------------------------------------


def renew_release_script(s: Script) -> Any:
    """Rounds: acquire, then the holder's renew and its release (or an admin revoke) in one burst."""
    parts = []
    for r in range(s.rounds(0.35, minimum=6)):
        k, slot = f"k{r}", f"a{r}"
        end = "revoke" if s.local and r % 2 else "release"
        extra = {"reason": "scenario renew-vs-revoke"} if end == "revoke" else {}
        parts += [s.on(0, s.op("acquire", k, f"acq-{r}", slot=slot, ttl_ms=3000)),
                  s.burst({0: s.op("renew", k, f"renew-{r}", slot=slot),
                           1: s.op(end, k, f"end-{r}", slot=slot, **extra)}),
                  s.on(0, s.op("inspect", k, f"inspect-{r}")),
                  s.on(1, s.op("renew", k, f"after-{r}", slot=slot))]
    return s.steps(*parts)


def renew_release_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """One of renew and release/revoke wins atomically; the loser (a renew) gets lease_lost; nothing revives."""
    renew_first = end_first = contested = 0
    for r in _rounds(t, "acq-"):
        acq, renew, end = t.one(f"acq-{r}"), t.one(f"renew-{r}"), t.one(f"end-{r}")
        if not ok(acq) or renew is None or end is None:
            continue
        lease = _lease_id(acq)
        if renew.t1 is not None and end.t1 is not None and max(renew.t0, end.t0) < min(renew.t1, end.t1):
            contested += 1
        if end.type == "fail":
            v.add("end-refused", idx(renew, end), f"round {r}: the holder's {end.f} failed with {code(end)} racing "
                  "a renew (a renew keeps the token, so the end must still match)")
        if ok(end):
            ended = val(end, "end_backend_ms")
            if ok(renew):
                renew_first += 1
                at = val(renew, "renewed_at_ms")
                if ended is not None and at is not None and at > ended:  # one ms may hold both, renew first
                    v.add("renew-after-end", idx(renew, end), f"round {r}: renewed at {at} ms, after the "
                          f"{end.f} at {ended} ms", lease=lease)
            elif renew.type == "fail":
                end_first += 1
                if code(renew) != LOST:
                    v.add("wrong-code", idx(renew), f"round {r}: the renew that lost to {end.f} got {code(renew)}, "
                          "not lease_lost")
        ins = t.one(f"inspect-{r}")
        if ok(end) and _active_as(ins, lease):
            v.add("revived", idx(end, ins), f"round {r}: the lease is active after its {end.f}", lease=lease)
        if ok(end):
            _stale_ok(v, t.one(f"after-{r}"), f"round {r}: a renew after the {end.f}")
    return {"renew_first": renew_first, "end_first": end_first, "contested_rounds": contested,
            "exercised": contested > 0, "why_not": "the renew and the end were never in flight together"}


RENEW_RELEASE = Scenario(
    name="renew-vs-release", race="renew vs release/revoke", requires="one wins atomically, the other gets lease_lost",
    tags=("acq", "after", "end", "inspect", "renew"),
    rules=("C9", "C12", "C13", "C15"),
    setup="Rounds: the holder acquires, then its renew (thread 0, lease-1) and its release (thread 1, lease-2; on "
          "the lab's stack every other round an admin revoke instead) are sent in one burst; an inspect and one "
          "more renew follow.",
    checks="The release/revoke always succeeds (a renew never changes the token); when the renew also succeeded it "
           "was linearized first (renewed_at < ended_at), otherwise it got lease_lost; the lease is never active "
           "after its end and the renew after it is lease_lost. Counts which side won.",
    script=renew_release_script, check=renew_release_check,
    options={"concurrency": 2, "time_limit": 3.0, "ttl_ms": 2000}, min_concurrency=2,
)


# -- 5. stale release after reacquire -----------------------------------------------------------------


def stale_release_script(s: Script) -> Any:
    """Rounds: a successor after expiry, then the old holder's release; a worker reacquiring, then its old release."""
    parts = []
    wait = s.ttl / 1000 + 0.15
    for r in range(s.rounds(1.2, minimum=2)):
        k, a, b = f"k{r}", f"a{r}", f"b{r}"
        parts += [s.on(0, s.op("acquire", k, f"acq-a-{r}", slot=a, ttl_ms=s.ttl)), s.wait(wait),
                  s.on(1, s.op("acquire", k, f"acq-b-{r}", slot=b, ttl_ms=5000)),
                  s.on(0, s.op("release", k, f"stale-release-{r}", slot=a)),
                  s.on(0, s.op("renew", k, f"stale-renew-{r}", slot=a)),
                  s.together(s.on(0, s.op("inspect", k, f"inspect-{r}")),
                             s.on(1, s.op("observe-backend", k, f"backend-{r}")) if s.local else None),
                  s.on(1, s.op("renew", k, f"succ-renew-{r}", slot=b)),
                  s.on(1, s.op("release", k, f"rel-b-{r}", slot=b)),
                  # the same worker releases, reacquires, and its delayed duplicate release (a new request) arrives
                  s.on(0, s.op("acquire", k, f"acq-a2-{r}", slot=f"a2{r}", owner=a, ttl_ms=5000)),
                  s.on(0, s.op("release", k, f"rel-a2-{r}", slot=f"a2{r}", owner=a)),
                  s.on(0, s.op("acquire", k, f"acq-a3-{r}", slot=f"a3{r}", owner=a, ttl_ms=5000)),
                  s.on(1, s.op("release", k, f"stale-release2-{r}", slot=f"a2{r}", owner=a)),
                  s.on(0, s.op("inspect", k, f"inspect2-{r}")),
                  s.on(0, s.op("renew", k, f"succ-renew2-{r}", slot=f"a3{r}", owner=a))]
    return s.steps(*parts)


def _successor_check(t: Tagged, v: Violations, r: str, succ: Any, inspect_tag: str, renew_tag: str,
                     backend_tag: str | None = None) -> None:
    """The successor is the active lease after the stale ops, in the API and in Valkey, and still renews."""
    if not ok(succ):
        return
    lease = _lease_id(succ)
    ins = t.one(inspect_tag)
    if ins is not None and ins.type == "ok" and not _active_as(ins, lease):
        v.add("successor-not-active", idx(succ, ins), f"round {r}: after the stale ops the backend shows "
              f"{ins.result!r}, not the successor {lease!r}", lease=lease)
    backend = t.one(backend_tag) if backend_tag else None
    if ok(backend) and val(backend, "record_lease_id") != lease:
        v.add("successor-not-active", idx(succ, backend), f"round {r}: Valkey holds lease "
              f"{val(backend, 'record_lease_id')!r}, not the successor {lease!r}", lease=lease)
    renew = t.one(renew_tag)
    if renew is not None and renew.type == "fail":
        v.add("successor-disturbed", idx(succ, renew), f"round {r}: the successor's own renew failed with "
              f"{code(renew)}", lease=lease)


def stale_release_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Stale releases and renews are lease_lost; the successor stays active (API and Valkey) and renews."""
    stale = 0
    for r in _rounds(t, "acq-a-"):
        for tag in (f"stale-release-{r}", f"stale-renew-{r}", f"stale-release2-{r}"):
            p = t.one(tag)
            if p is not None:
                stale += 1
                _stale_ok(v, p, f"round {r}: {tag.rsplit('-', 1)[0]}")
        _successor_check(t, v, r, t.one(f"acq-b-{r}"), f"inspect-{r}", f"succ-renew-{r}", f"backend-{r}")
        _successor_check(t, v, r, t.one(f"acq-a3-{r}"), f"inspect2-{r}", f"succ-renew2-{r}")
    return {"stale_ops": stale, "exercised": stale > 0, "why_not": "no stale op was sent"}


STALE_RELEASE = Scenario(
    name="stale-release-after-reacquire", race="stale release after reacquire", requires="successor stays active",
    tags=("acq-a", "acq-a2", "acq-a3", "acq-b", "backend", "inspect", "inspect2", "rel-a2", "rel-b", "stale-release", "stale-release2", "stale-renew", "succ-renew", "succ-renew2"),
    rules=("C9", "C13", "C12"),
    setup="Rounds: A acquires (300 ms TTL) and expires, B acquires, then A's release and renew arrive; later the "
          "same worker A releases, reacquires, and a duplicate of its old release (a new request id) arrives "
          "through the other server. Inspects, a direct Valkey read and the successor's renew follow.",
    checks="Every stale release/renew is lease_lost (never ok); after them the successor is the active lease by "
           "inspect and in Valkey, and its own renew succeeds.",
    script=stale_release_script, check=stale_release_check,
    options={"concurrency": 2, "time_limit": 3.0, "ttl_ms": 300}, min_concurrency=2,
)


# -- 6. delayed expiry cleanup vs successor -----------------------------------------------------------


def delayed_cleanup_script(s: Script) -> Any:
    """Rounds: A's release held at a client pause past expiry while B acquires; then stale admin cleanups."""
    parts = []
    ttl_s = s.ttl / 1000
    for r in range(s.rounds(1.5, minimum=2)):
        k, a, b = f"k{r}", f"a{r}", f"b{r}"
        parts += [s.on(0, s.op("acquire", k, f"acq-a-{r}", slot=a, ttl_ms=s.ttl)),
                  s.fault(s.nem("start-client-pause", {"thread": 0})),
                  s.together(s.on(0, s.op("release", k, f"delayed-release-{r}", slot=a)),
                             s.on(1, s.sleep(ttl_s + 0.15), s.op("acquire", k, f"acq-b-{r}", slot=b, ttl_ms=5000)),
                             s.fault(s.sleep(ttl_s + 0.45), s.nem("stop-client-pause")))]
        if s.local:  # an operator's cleanup of the expired lease it observed earlier, arriving late
            parts += [s.on(1, s.op("force-release", k, f"cleanup-force-{r}", slot=a, reason="expired lease cleanup")),
                      s.on(1, s.op("revoke", k, f"cleanup-revoke-{r}", slot=a, reason="expired lease cleanup"))]
        parts += [s.on(1, s.op("renew", k, f"stale-renew-{r}", slot=a)),
                  s.together(s.on(0, s.op("inspect", k, f"inspect-{r}")),
                             s.on(1, s.op("observe-backend", k, f"backend-{r}")) if s.local else None),
                  s.on(1, s.op("renew", k, f"succ-renew-{r}", slot=b))]
    return s.steps(*parts)


def delayed_cleanup_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """The delayed release and the stale cleanups are lease_lost; the successor stays active and renews."""
    delayed = 0
    for r in _rounds(t, "acq-a-"):
        rel, succ = t.one(f"delayed-release-{r}"), t.one(f"acq-b-{r}")
        if rel is not None and ok(succ) and (val(rel, "sent_at_ms") or 0) >= (val(succ, "acquired_at_ms") or 1 << 62):
            delayed += 1
        for tag in (f"delayed-release-{r}", f"cleanup-force-{r}", f"cleanup-revoke-{r}", f"stale-renew-{r}"):
            p = t.one(tag)
            if p is not None:
                _stale_ok(v, p, f"round {r}: {tag.rsplit('-', 1)[0]}")
        _successor_check(t, v, r, succ, f"inspect-{r}", f"succ-renew-{r}", f"backend-{r}")
    return {"delayed_after_successor": delayed, "exercised": delayed > 0,
            "why_not": "no delayed release reached the server after the successor's acquisition"}


DELAYED_CLEANUP = Scenario(
    name="delayed-cleanup-vs-successor", race="delayed expiry cleanup vs successor", requires="successor stays active",
    tags=("acq-a", "acq-b", "backend", "cleanup-force", "cleanup-revoke", "delayed-release", "inspect", "stale-renew", "succ-renew"),
    rules=("C9", "C10", "C13", "C15"),
    setup="Rounds: A acquires (300 ms TTL); a client-pause holds A's thread while its release is pending; B "
          "acquires once A expired; the pause ends and A's release goes out late. On the lab's stack an "
          "operator's cleanup (force-release and revoke of A's observed lease) arrives after that; then A's "
          "renew, an inspect, a direct Valkey read and B's renew.",
    checks="The delayed release (sent after B's backend acquisition time), the stale admin cleanups and A's renew "
           "are all lease_lost; B stays the active lease (inspect and Valkey) and renews. Unknown when the "
           "delayed release did not arrive after B's acquisition.",
    script=delayed_cleanup_script, check=delayed_cleanup_check, client_pause=True,
    options={"concurrency": 2, "time_limit": 3.0, "ttl_ms": 300}, min_concurrency=2,
)


# -- 7. commit after expiry -------------------------------------------------------------------------


def commit_expiry_script(s: Script) -> Any:
    """Rounds: acquire and commit; a client pause longer than the TTL; the paused holder's commit."""
    parts = []
    ttl_s = s.ttl / 1000
    for r in range(s.rounds(1.2, minimum=2)):
        k, a = f"k{r}", f"a{r}"
        parts += [s.on(0, s.op("acquire", k, f"acq-{r}", slot=a, ttl_ms=s.ttl)),
                  s.on(0, s.op("commit", k, f"commit-ok-{r}", slot=a)),
                  s.fault(s.nem("start-client-pause", {"thread": 0})),
                  s.together(s.on(0, s.op("commit", k, f"late-commit-{r}", slot=a)),
                             s.fault(s.sleep(ttl_s + 0.3), s.nem("stop-client-pause"))),
                  s.on(0, s.op("inspect", k, f"inspect-{r}"))]
    return s.steps(*parts)


def commit_expiry_final(s: Script) -> Any:
    """Read every round's document back."""
    return [s.op("read", f"k{r}", f"read-{r}") for r in range(s.rounds(1.2, minimum=2))]


def _entries(t: Tagged, key_tag: str) -> list | None:
    """The entries of the document a final read tagged `key_tag` returned (None when it failed)."""
    read = t.one(key_tag)
    return val(read, "entries") if ok(read) else None


def commit_expiry_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """A commit sent after the lease's expiry is lease_lost and its entry is never in the document."""
    late_sent = working = 0
    for r in _rounds(t, "acq-"):
        acq, good, late = t.one(f"acq-{r}"), t.one(f"commit-ok-{r}"), t.one(f"late-commit-{r}")
        if not ok(acq) or late is None:
            continue
        expires = val(acq, "expires_at_ms")
        if (val(late, "sent_at_ms") or 0) >= expires:
            late_sent += 1
            if ok(late):
                v.add("commit-after-expiry", idx(acq, late), f"round {r}: a commit sent at {val(late, 'sent_at_ms')} "
                      f"ms, after the lease expired at {expires} ms, was accepted")
            elif late.type == "fail" and code(late) != LOST:
                v.add("wrong-code", idx(late), f"round {r}: the late commit was refused with {code(late)}, not "
                      "lease_lost")
        entries = _entries(t, f"read-{r}")
        if entries is not None and late.type == "fail" and val(late, "entry") in entries:
            v.add("rejected-commit-visible", idx(late, t.one(f"read-{r}")), f"round {r}: the rejected commit's entry "
                  f"{val(late, 'entry')} is in the document")
        if ok(good):
            working += 1
    return {"commits_after_expiry": late_sent, "holder_commits_accepted": working,
            "exercised": late_sent > 0 and working > 0,
            "why_not": "no commit was sent after its lease's expiry, or the holder's own commit before expiry "
                       "never succeeded (the commit path does not work here)"}


COMMIT_EXPIRY = Scenario(
    name="commit-after-expiry", race="commit after expiry", requires="rejected, lease_lost", rules=("C25", "C29"),
    tags=("acq", "commit-ok", "inspect", "late-commit", "read"),
    setup="Rounds: the holder acquires (300 ms TTL) and commits once; a client-pause holds its thread longer than "
          "the TTL while its next commit is pending (the GC-paused holder); the commit goes out after expiry. The "
          "final phase reads every document back from the store.",
    checks="Every commit sent after its lease's backend expiry is refused with lease_lost and its entry is not in "
           "the final document. Unknown when no commit left after expiry, or when the holder's own commit before "
           "expiry never succeeded (the commit path does not work: nothing is shown).",
    script=commit_expiry_script, check=commit_expiry_check, final=commit_expiry_final, workload="fenced-append",
    client_pause=True, domain=("stale-commit", "fencing", "mutual-exclusion", "lease-state", "idempotency"),
    options={"concurrency": 1, "time_limit": 2.5, "ttl_ms": 300},
)


# -- 8. commit by an older holder after a new acquisition ---------------------------------------------


def older_holder_script(s: Script) -> Any:
    """The paused old holder commits after a successor committed; on the lab's stack also through a slow store link."""
    parts = []
    ttl_s = s.ttl / 1000
    for r in range(s.rounds(1.5, minimum=2)):
        k, a, b = f"k{r}", f"a{r}", f"b{r}"
        parts += [s.on(0, s.op("acquire", k, f"acq-a-{r}", slot=a, ttl_ms=s.ttl)),
                  s.on(0, s.op("commit", k, f"commit-a-{r}", slot=a)),
                  s.fault(s.nem("start-client-pause", {"thread": 0})),
                  s.together(s.on(0, s.op("commit", k, f"stale-commit-{r}", slot=a)),
                             s.on(1, s.sleep(ttl_s + 0.15), s.op("acquire", k, f"acq-b-{r}", slot=b, ttl_ms=5000),
                                  s.op("commit", k, f"commit-b-{r}", slot=b)),
                             s.fault(s.sleep(ttl_s + 0.7), s.nem("stop-client-pause")))]
    if s.local:  # validated in time, held on a slow store link while the successor writes: the store's guard decides
        k = "kg"
        parts += [s.on(0, s.op("acquire", k, "acq-a-g", slot="ag", ttl_ms=s.ttl)),
                  s.fault(s.nem("start-latency", {"links": ["lease-1_store"], "direction": "downstream",
                                                  "latency_ms": 900, "jitter_ms": 0})),
                  s.together(s.on(0, s.op("commit", k, "stale-commit-g", slot="ag", deadline_ms=9000)),
                             s.on(1, s.sleep(ttl_s + 0.1), s.op("acquire", k, "acq-b-g", slot="bg", ttl_ms=5000),
                                  s.op("commit", k, "commit-b-g", slot="bg"))),
                  s.fault(s.nem("stop-latency"))]
    return s.steps(*parts)


def older_holder_final(s: Script) -> Any:
    """Read every round's document back (and the store-guard round's)."""
    keys = [f"k{r}" for r in range(s.rounds(1.5, minimum=2))] + (["kg"] if s.local else [])
    return [s.op("read", k, f"read-{k}") for k in keys]


def _msg(p) -> str | None:
    """The message of a completed op's error object (the driver records errors as {"code", "msg"})."""
    err = p.comp.get("error") if p is not None and p.comp else None
    return err.get("msg") if isinstance(err, dict) else None


def enforcement_point(p) -> str:
    """Which part of the fenced-write boundary refused a commit, from its message (docs/server.md)."""
    msg = _msg(p) or ""
    if "document already holds" in msg:
        return "store-guard"
    if "high-water mark" in msg:
        return "high-water-mark"
    return "lease-validation"


def older_holder_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Once a successor committed, the old holder's commit is refused (lower token) and never lands."""
    points: dict[str, int] = {}
    stale_after_successor = 0
    for r in _rounds(t, "acq-a-"):
        stale, succ_commit, succ = t.one(f"stale-commit-{r}"), t.one(f"commit-b-{r}"), t.one(f"acq-b-{r}")
        if stale is None or not ok(succ):
            continue
        if ok(succ_commit) and stale.t1 is not None and stale.t1 > (succ_commit.t1 or stale.t1):
            stale_after_successor += 1
            if ok(stale):
                v.add("older-holder-committed", idx(succ_commit, stale), f"round {r}: the old holder's commit (token "
                      f"{val(stale, 'fencing_token')}) was accepted after the successor's (token "
                      f"{val(succ_commit, 'fencing_token')})")
        if stale.type == "fail":
            if code(stale) not in (LOST, "stale_token"):
                v.add("wrong-code", idx(stale), f"round {r}: the old holder's commit was refused with {code(stale)}, "
                      "not lease_lost")
            else:
                points[enforcement_point(stale)] = points.get(enforcement_point(stale), 0) + 1
        key = "kg" if r == "g" else f"k{r}"
        entries = _entries(t, f"read-{key}")
        if entries:
            tokens = [e[1] for e in entries if isinstance(e, list) and len(e) == 3]
            if any(b < a for a, b in zip(tokens, tokens[1:])):
                v.add("token-regression", idx(t.one(f"read-{key}")), f"round {r}: the document's entries carry "
                      f"tokens {tokens}: a lower token landed after a higher one")
            if stale.type == "fail" and val(stale, "entry") in entries:
                v.add("rejected-commit-visible", idx(stale), f"round {r}: the refused commit's entry is in the "
                      "document")
    wanted = {"lease-validation", "store-guard"} if t.one("stale-commit-g") is not None else {"lease-validation"}
    missing = sorted(wanted - set(points))
    return {"enforcement_points": points, "stale_commits_after_successor": stale_after_successor,
            "exercised": not missing and stale_after_successor > 0,
            "why_not": f"enforcement point(s) not reached: {', '.join(missing)}" if missing else
                       "no old holder's commit completed after its successor's commit"}


OLDER_HOLDER = Scenario(
    name="older-holder-commit", race="commit by older holder after new acquisition", requires="rejected, lower token",
    tags=("acq-a", "acq-b", "commit-a", "commit-b", "read", "read-kg", "stale-commit"),
    rules=("C25", "C26", "C27", "C29"),
    setup="Rounds: A acquires (300 ms TTL) and commits; a client-pause holds A while its next commit is pending; B "
          "acquires after A's expiry and commits; A's commit goes out. On the lab's stack one more round reaches "
          "the store's guard: A's commit is validated in time but Toxiproxy delays the lease-1 -> store link by "
          "900 ms, so B (through lease-2) writes first. Every document is read back at the end.",
    checks="The old holder's commit, finishing after the successor's, is refused with lease_lost and its entry "
           "never lands; the documents' entries never go down in token; which enforcement point refused "
           "(lease validation, high-water mark, store guard) is reported. Unknown unless every enforcement point "
           "the run aims at (lease validation; on the lab's stack also the store guard) refused a commit.",
    script=older_holder_script, check=older_holder_check, final=older_holder_final, workload="fenced-append",
    client_pause=True, nemeses=("latency",), domain=("stale-commit", "fencing", "mutual-exclusion", "lease-state",
                                                     "idempotency"),
    options={"concurrency": 2, "time_limit": 3.0, "ttl_ms": 300}, min_concurrency=2,
)


# -- 9. same request_id, changed body -----------------------------------------------------------------


def changed_body_script(s: Script) -> Any:
    """Rounds: acquire / renew / release, each followed by its request_id reused with a changed body."""
    parts = []
    for r in range(s.rounds(0.5, minimum=3)):
        k, a = f"k{r}", f"a{r}"
        acq = s.op("acquire", k, f"acq-{r}", slot=a, ttl_ms=3000)
        ren = s.op("renew", k, f"renew-{r}", slot=a, ttl_ms=3000)
        rel = s.op("release", k, f"release-{r}", slot=a)
        parts += [s.on(0, acq), s.on(1, s.again(acq, f"changed-acquire-{r}", ttl_ms=3001)),
                  s.on(0, s.op("inspect", k, f"inspect-acquire-{r}")),
                  s.on(0, ren), s.on(1, s.again(ren, f"changed-renew-{r}", ttl_ms=2500)),
                  s.on(0, s.op("inspect", k, f"inspect-renew-{r}")),
                  s.on(0, rel), s.on(1, s.again(rel, f"changed-release-{r}", owner=f"x{r}")),
                  s.on(0, s.op("inspect", k, f"inspect-release-{r}"))]
        if s.local:
            parts.append(s.on(0, s.op("observe-backend", k, f"counter-{r}")))
    return s.steps(*parts)


def changed_body_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """A reused request_id with a changed body is idempotency_conflict and changes nothing."""
    conflicts = 0
    for r in _rounds(t, "acq-"):
        for what, base in (("acquire", f"acq-{r}"), ("renew", f"renew-{r}"), ("release", f"release-{r}")):
            orig, changed = t.one(base), t.one(f"changed-{what}-{r}")
            if not ok(orig) or changed is None:
                continue
            if ok(changed):
                v.add("changed-body-accepted", idx(orig, changed), f"round {r}: a {what} reusing a request_id with "
                      "a changed body succeeded")
            elif changed.type == "fail":
                if code(changed) == "idempotency_conflict":
                    conflicts += 1
                else:
                    v.add("wrong-code", idx(changed), f"round {r}: a {what} with a reused request_id and a changed "
                          f"body got {code(changed)}, not idempotency_conflict")
            ins = t.one(f"inspect-{what}-{r}")
            if ok(ins) and isinstance(ins.result, dict):
                same = all(ins.result.get(f) == val(orig, f) for f in ("lease_id", "fencing_token", "expires_at_ms"))
                if not same:
                    v.add("mutated", idx(orig, changed, ins), f"round {r}: after the refused {what} the lease is "
                          f"{ins.result!r}, not the original result")
        counter = t.one(f"counter-{r}")
        if ok(counter) and val(counter, "counter") != 1:
            v.add("tokens-allocated", idx(counter), f"round {r}: the counter is {val(counter, 'counter')} after one "
                  "acquisition")
    return {"idempotency_conflicts": conflicts, "exercised": conflicts > 0,
            "why_not": "no changed-body request was refused as idempotency_conflict"}


CHANGED_BODY = Scenario(
    name="changed-body-same-request-id", race="same request_id, changed body",
    tags=("acq", "changed-acquire", "changed-release", "changed-renew", "counter", "inspect-acquire", "inspect-renew",
          "inspect-release", "release", "renew"),
    requires="idempotency_conflict, nothing mutated", rules=("C16", "C17"),
    setup="Rounds: acquire, renew and release each succeed, and each request_id is then sent again through the "
          "other server with a changed body (another ttl_ms; for the release another worker); inspects after the "
          "acquire, the renew and the release, and the counter from Valkey.",
    checks="Every changed-body request is refused with idempotency_conflict; the inspect after it shows exactly the "
           "original result (lease_id, token, expires_at); the counter shows one token per acquisition.",
    script=changed_body_script, check=changed_body_check,
    options={"concurrency": 2, "time_limit": 2.0, "ttl_ms": 2000}, min_concurrency=2,
)


# -- 10, 11. server crash after / before the backend commit -------------------------------------------


def _crash_script(direction: str):
    """The original acquire to lease-1 whose Valkey link loses replies (after) or requests (before), then a kill."""

    def script(s: Script) -> Any:
        """Rounds of: partition, the original acquire cut off by a kill, heal, retry elsewhere, observe, restart."""
        parts = []
        for r in range(s.rounds(1.2, minimum=2, maximum=6)):
            k = f"k{r}"
            orig = s.op("acquire", k, f"orig-{r}", slot=f"a{r}", ttl_ms=8000, deadline_ms=4000)
            parts += [s.fault(s.nem("start-partition", {"links": ["lease-1_valkey"], "direction": direction})),
                      s.together(s.on(0, orig), s.fault(s.sleep(0.6), s.nem("start-kill", {"targets": ["lease-1"]}))),
                      s.fault(s.nem("stop-partition")),
                      s.on(1, s.again(orig, f"retry-{r}", deadline_ms=3000)),
                      s.on(1, s.op("inspect", k, f"inspect-{r}"), s.op("observe-backend", k, f"counter-{r}")),
                      s.fault(s.nem("stop-kill"))]
        return s.steps(*parts)

    return script


def _crash_check(after: bool):
    """after: the retry resolves from the idempotency record; before: it performs the acquire once."""

    def check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
        """Judge every round (see the scenario's `checks`)."""
        kills = [w for w in t.windows if w["fault"] == "kill"]
        hit = 0
        for r in _rounds(t, "orig-"):
            orig, retry, counter = t.one(f"orig-{r}"), t.one(f"retry-{r}"), t.one(f"counter-{r}")
            crashed = orig.type == "info" and any(orig.t0 <= w["start"] <= (orig.t1 or w["start"]) for w in kills)
            if retry is not None and retry.type == "fail" and code(retry) in ("lease_conflict", "idempotency_conflict"):
                v.add("retry-not-resolved", idx(orig, retry), f"round {r}: the retry through another server failed "
                      f"with {code(retry)}")
            if ok(counter) and ok(retry) and val(counter, "counter") != 1:
                v.add("tokens-allocated", idx(orig, retry, counter), f"round {r}: {val(counter, 'counter')} tokens "
                      "allocated for one request_id")
            ins = t.one(f"inspect-{r}")
            if ok(retry) and ok(ins) and not _active_as(ins, _lease_id(retry)):
                v.add("inspect-mismatch", idx(retry, ins), f"round {r}: the backend shows {ins.result!r}, not the "
                      "retry's lease")
            if not (crashed and ok(retry)):
                continue
            created, sent = val(retry, "acquired_at_ms"), val(retry, "sent_at_ms")
            predates = created is not None and sent is not None and created < sent - 20  # made by the original
            resolved = bool(val(retry, "replayed")) or predates
            if resolved == after:
                hit += 1
        what = "executed before the crash" if after else "lost before it reached Valkey"
        return {"rounds_hit": hit, "exercised": hit > 0,
                "why_not": f"no original was both {what} and cut off by the server's crash"}

    return check


_CRASH_COMMON = dict(tags=("counter", "inspect", "orig", "retry"), nemeses=("partition", "kill"), min_concurrency=2, min_servers=2,
                     stack_only="it kills a lease server of the lab's stack and partitions its link to Valkey",
                     options={"concurrency": 2, "time_limit": 3.0, "ttl_ms": 2000})

CRASH_AFTER = Scenario(
    name="server-crash-after-commit", race="server crash after backend commit",
    requires="retry resolves from the idempotency record", rules=("C17", "C18", "C19"),
    setup="Rounds: Toxiproxy drops Valkey's replies to lease-1 (downstream blackhole), an acquire is sent to "
          "lease-1 (the script runs, the reply never comes back), 0.6 s later lease-1 is SIGKILLed; the link is "
          "healed and the same request (same request_id and body) is retried through lease-2; inspect and the "
          "counter from Valkey; lease-1 restarts.",
    checks="The retry succeeds (never lease_conflict), its lease predates the retry (resolved from the idempotency "
           "record: replayed), the inspect shows it and the counter shows one token. Unknown unless an original "
           "was executed and cut off by the crash.",
    script=_crash_script("downstream"), check=_crash_check(after=True), **_CRASH_COMMON,
)

CRASH_BEFORE = Scenario(
    name="server-crash-before-commit", race="server crash before backend commit",
    requires="retry performs the operation once", rules=("C11", "C17", "C19"),
    setup="As server-crash-after-commit, but Toxiproxy drops lease-1's requests to Valkey (upstream blackhole): "
          "the original never reaches the backend before lease-1 is SIGKILLed; the retry goes through lease-2.",
    checks="The retry succeeds with a fresh lease (created after it was sent: performed by the retry), the counter "
           "shows exactly one token and the inspect shows the lease. Unknown unless an original was lost before "
           "the backend and cut off by the crash.",
    script=_crash_script("upstream"), check=_crash_check(after=False), **_CRASH_COMMON,
)


# -- 12. backend unavailable ----------------------------------------------------------------------

WINDOWS = (1, 2)  # 1: Valkey killed, 2: both servers partitioned from it
DOWN_OPS = ("acquire-new", "renew", "inspect", "release", "acquire-held")  # tried while the backend is away


def backend_down_script(s: Script) -> Any:
    """A held lease; Valkey killed, then (later) both servers partitioned from it; every operation tried meanwhile."""
    parts = []
    for w, (start, stop) in zip(WINDOWS, ((("start-kill", {"targets": ["valkey"]}), ("stop-kill", None)),
                                         (("start-partition", {"links": ["lease-1_valkey", "lease-2_valkey"]}),
                                          ("stop-partition", None)))):
        new, held, a = f"k{w}", f"h{w}", f"A{w}"  # each window its own held lease (the last may have been revoked)
        # the holder holds before the window opens: after window 1 the server's recovery rule (C5) refuses
        # acquisitions for a moment (lease_backend_unavailable, "retry shortly"), so it retries, fresh request ids
        held_acquire = (lambda held, a, w: lambda test, ctx: s.op("acquire", held, f"held{w}", slot=a,
                                                                   ttl_ms=10000))(held, a, w)
        parts += [s.on(0, gen.until_ok(gen.limit(40, gen.delay(0.1, gen.repeat(held_acquire))))),
                  s.fault(s.nem(*start)),
                  s.together(s.on(0, s.op("acquire", new, f"down{w}-acquire-new", slot=f"n{w}", deadline_ms=800)),
                             s.on(1, s.op("renew", held, f"down{w}-renew", slot=a, deadline_ms=800))),
                  s.together(s.on(0, s.op("inspect", held, f"down{w}-inspect", deadline_ms=800)),
                             s.on(1, s.op("release", held, f"down{w}-release", slot=a, deadline_ms=800))),
                  s.on(1, s.op("acquire", held, f"down{w}-acquire-held", slot=f"b{w}", deadline_ms=800)),
                  s.fault(s.nem(*stop)),
                  s.on(0, s.op("inspect", new, f"after{w}-new"), s.op("observe-backend", new, f"after{w}-counter"),
                       s.op("inspect", held, f"after{w}-held"), s.op("renew", held, f"after{w}-renew", slot=a))]
    return s.steps(*parts)


def backend_down_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """No op succeeds while the backend is away, each answers a typed unavailability, and none took effect."""
    during = 0
    for tag, p in t.starting("down"):
        during += 1
        if ok(p):
            v.add("assumed-success", idx(p), f"{tag}: {p.f} succeeded while the backend was unavailable")
        elif p.comp is not None and code(p) not in UNAVAILABLE:
            v.add("untyped-failure", idx(p), f"{tag}: {p.f} answered {code(p)} while the backend was unavailable "
                  "(expected lease_backend_unavailable or lease_outcome_unknown)")
    for w in WINDOWS:
        acquire = t.one(f"down{w}-acquire-new")
        new, counter = t.one(f"after{w}-new"), t.one(f"after{w}-counter")
        if acquire is not None and acquire.type == "fail" and ok(new) and new.result is not None:
            v.add("failed-op-took-effect", idx(acquire, new), f"window {w}: an acquire answered {code(acquire)} (it "
                  "did not happen) yet the identity holds a lease afterwards")
        if acquire is not None and acquire.type == "fail" and ok(counter) and val(counter, "counter"):
            v.add("failed-op-took-effect", idx(acquire, counter), f"window {w}: a refused acquire allocated a token")
        # a definitely refused release must not have ended the lease; the server's recovery rule may end it
        # (revoked by lease-server:recovery after a Valkey restart: C5), which is not the release taking effect
        release, held = t.one(f"down{w}-release"), t.one(f"after{w}-held")
        if release is not None and release.type == "fail" and ok(held) and isinstance(held.result, dict) \
                and held.result.get("state") == "released":
            v.add("failed-op-took-effect", idx(release, held), f"window {w}: the holder's lease is released after "
                  f"the backend came back although its release answered {code(release)}")
    windows = [w for w in t.windows if w["fault"] in ("kill", "partition")]
    return {"ops_while_unavailable": during, "fault_windows": len(windows), "exercised": during > 0 and windows != [],
            "why_not": "no operation ran while the backend was unavailable"}


BACKEND_DOWN = Scenario(
    name="backend-unavailable", race="backend unavailable", requires="backend_unavailable, no assumed success",
    tags=(*(f"held{w}" for w in WINDOWS), *(f"down{w}-{x}" for w in WINDOWS for x in DOWN_OPS),
          *(f"after{w}-{x}" for w in WINDOWS for x in ("new", "counter", "held", "renew"))),
    rules=("C19", "C22", "C23"),
    setup="A lease is held; Valkey is SIGKILLed and, while it is down, an acquire of a new identity, the holder's "
          "renew, an inspect, the holder's release and a competing acquire are sent through both servers; Valkey "
          "restarts (AOF always: nothing lost). Then the same, with a newly held lease, with both servers "
          "partitioned from Valkey (Toxiproxy blackhole; its holder retries its acquire while the server's recovery "
          "rule still refuses after the restart). After each window: the new identity is inspected, its "
          "counter read, the held lease inspected, the holder renews.",
    checks="No operation succeeds while the backend is away; each answers lease_backend_unavailable / "
           "lease_outcome_unknown (or a client timeout), never another code; an acquire refused definitely left "
           "no lease and no token, a release refused definitely did not release the holder's lease (the server's "
           "recovery rule may revoke it after the restart: that is not the release).",
    script=backend_down_script, check=backend_down_check, nemeses=("kill", "partition"),
    stack_only="it kills and partitions the lab's own Valkey", min_concurrency=2, min_servers=2,
    options={"concurrency": 2, "time_limit": 4.0, "ttl_ms": 2000},
)


# -- 13. timeout after submission -------------------------------------------------------------------


def timeout_script(s: Script) -> Any:
    """Replies from Valkey to lease-1 delayed past the deadline; an acquire and a renew; then retries by request_id."""
    slow = ("start-latency", {"links": ["lease-1_valkey"], "direction": "downstream", "latency_ms": 1500,
                              "jitter_ms": 0})
    parts = []
    for r in range(s.rounds(2.0, minimum=2, maximum=6)):
        k, a = f"k{r}", f"a{r}"
        acq = s.op("acquire", k, f"orig-acquire-{r}", slot=a, ttl_ms=8000, deadline_ms=600)
        ren = s.op("renew", k, f"orig-renew-{r}", slot=a, ttl_ms=8000, deadline_ms=600)
        parts += [s.fault(s.nem(*slow)), s.on(0, acq), s.fault(s.nem("stop-latency")),
                  s.on(0, s.again(acq, f"retry-acquire-{r}", deadline_ms=2000)),
                  s.on(1, s.again(acq, f"retry2-acquire-{r}", deadline_ms=2000)),
                  s.on(1, s.op("observe-backend", k, f"counter-{r}")),
                  s.fault(s.nem(*slow)), s.on(0, ren), s.fault(s.nem("stop-latency")),
                  s.on(0, s.again(ren, f"retry-renew-{r}", deadline_ms=2000)),
                  s.on(1, s.again(ren, f"retry2-renew-{r}", deadline_ms=2000))]
    return s.steps(*parts)


def timeout_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """A mutation that timed out after submission is outcome_unknown, and its retry returns the original result."""
    unknown = resolved = 0
    for what in ("acquire", "renew"):
        for r in _rounds(t, f"orig-{what}-"):
            orig, retry, retry2 = (t.one(f"{x}-{what}-{r}") for x in ("orig", "retry", "retry2"))
            if orig.type == "ok" or orig.comp is None:
                continue
            if orig.type == "fail" and nothing_sent(code(orig), _msg(orig)):
                continue  # the client's own deadline or connection refused it before sending: never submitted
            counter = t.one(f"counter-{r}")
            if what == "acquire" and ok(counter) and val(counter, "counter") != 1:
                v.add("tokens-allocated", idx(counter), f"round {r}: {val(counter, 'counter')} tokens for one acquire")
            at_field = "acquired_at_ms" if what == "acquire" else "renewed_at_ms"
            at, sent = val(retry, at_field), val(retry, "sent_at_ms") or 0
            made_before = ok(retry) and at is not None and at < sent - 20  # the original's result, by request_id
            results = {(_lease_id(p), val(p, "fencing_token"), val(p, "expires_at_ms")) for p in (retry, retry2)
                       if ok(p)}
            if len(results) > 1:
                v.add("retry-different-result", idx(orig, retry, retry2), f"round {r}: retries of one {what} "
                      f"returned {sorted(results, key=str)}")
            for p in (retry, retry2):
                if p is not None and p.type == "fail" and code(p) in ("lease_conflict", "idempotency_conflict",
                                                                       LOST):
                    v.add("retry-not-resolved", idx(orig, p), f"round {r}: the retry of the timed-out {what} got "
                          f"{code(p)}: the request_id must settle it")
            if orig.type == "fail":
                # C23: a request not started before its deadline is answered deadline_exceeded, and the delay may
                # have held up more than the reply (a connection opened in the window waits for its handshake):
                # a definite failure is a violation when the operation did happen, i.e. its first retry by
                # request_id returned a result made before that retry was sent; else this round set nothing up
                if made_before:
                    v.add("definite-after-submission", idx(orig, retry), f"round {r}: a {what} whose reply was "
                          f"delayed past its deadline answered {code(orig)} as a definite failure, yet it happened: "
                          f"its retry by request_id returned the result made at {at} ms, before the retry was sent "
                          f"at {sent} ms")
                continue
            unknown += 1
            if made_before:
                resolved += 1  # the result predates the retry: the original's, found by request_id
    return {"outcome_unknown": unknown, "resolved_by_request_id": resolved, "exercised": resolved > 0,
            "why_not": "no mutation both timed out after it was submitted and was settled by its retry"}


TIMEOUT = Scenario(
    name="timeout-after-submission", race="timeout after submission",
    tags=("counter", "orig-acquire", "orig-renew", "retry-acquire", "retry-renew", "retry2-acquire", "retry2-renew"),
    requires="outcome_unknown, resolved by request_id",
    rules=("C19", "C23", "C17"),
    setup="Rounds: Toxiproxy delays Valkey's replies to lease-1 by 1.5 s (downstream latency) while an acquire with "
          "a 600 ms deadline goes to lease-1 (the script runs; the reply misses the deadline); the latency is "
          "removed and the request retried twice by request_id; the counter is read. Then the same for a renew.",
    checks="The timed-out original is indeterminate (lease_outcome_unknown or a client timeout), or a definite "
           "failure only if it did not happen (C23: not started before its deadline; a retry result made before the "
           "retry was sent shows it did); its retries succeed with one and the same result, created before the "
           "retry was sent (the original's, resolved by request_id); one token per acquisition.",
    script=timeout_script, check=timeout_check, nemeses=("latency",), min_concurrency=2,
    stack_only="it delays the lab's own lease-server-to-Valkey link",
    options={"concurrency": 2, "time_limit": 4.0, "ttl_ms": 2000},
)


# -- 14. malformed / corrupt record -------------------------------------------------------------------

CORRUPTION_KINDS = ("token", "identity", "version", "missing-field", "garbage")


def corrupt_script(s: Script) -> Any:
    """Per kind of damage: a held lease's record corrupted in Valkey; every operation tried; repaired; acquire."""
    parts = []
    for i, how in enumerate(CORRUPTION_KINDS):
        k = f"k{i}"
        parts += [s.on(0, s.op("acquire", k, f"acq-{i}", slot=f"a{i}", ttl_ms=10000)),
                  s.fault(s.nem("corrupt-record", {"key": k, "how": how})),
                  s.on(1, s.op("acquire", k, f"c-acquire-{i}", slot=f"b{i}")),
                  s.on(0, s.op("renew", k, f"c-renew-{i}", slot=f"a{i}"), s.op("inspect", k, f"c-inspect-{i}"),
                       s.op("release", k, f"c-release-{i}", slot=f"a{i}")),
                  s.fault(s.nem("repair-record", {"key": k})),
                  s.on(1, s.op("acquire", k, f"after-{i}", slot=f"c{i}"))]
    parts += [s.fault(s.nem("corrupt-record", {"key": "kc", "how": "counter"})),
              s.on(0, s.op("acquire", "kc", "c-acquire-counter", slot="ac")),
              s.fault(s.nem("repair-record", {"key": "kc"})),
              s.on(0, s.op("acquire", "kc", "after-counter", slot="cc"))]
    return s.steps(*parts)


def corrupt_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """While a record or counter is corrupt every operation on it fails closed with lease_backend_unavailable."""
    refused = 0
    for tag, p in t.starting("c-"):
        if ok(p):
            kind = "acquired-over-corruption" if p.f == "acquire" else "not-fail-closed"
            v.add(kind, idx(p), f"{tag}: {p.f} succeeded over a corrupt record")
        elif p.comp is not None:
            refused += 1
            if code(p) != "lease_backend_unavailable":
                v.add("untyped-failure", idx(p), f"{tag}: {p.f} over a corrupt record answered {code(p)}, not the "
                      "fail-closed lease_backend_unavailable")
    for tag, p in t.starting("after-"):
        before = t.one("acq-" + tag[len("after-"):])
        if ok(p) and ok(before) and val(p, "fencing_token") <= val(before, "fencing_token"):
            v.add("token-reused", idx(before, p), f"{tag}: after the repair a token {val(p, 'fencing_token')} not "
                  f"above the corrupted lease's {val(before, 'fencing_token')} was issued")
    return {"refused_over_corruption": refused, "exercised": refused > 0,
            "why_not": "no operation ran over a corrupt record"}


CORRUPT = Scenario(
    name="malformed-record", race="malformed / corrupt record", requires="fail closed, no acquisition over ambiguity",
    tags=("acq", "after", "after-counter", "c-acquire", "c-acquire-counter", "c-inspect", "c-release", "c-renew"),
    rules=("C4", "C5", "C8"),
    setup="For each kind of damage (a non-integer token, another identity's tuple, an unknown record_version, a "
          "missing owner field, a record of garbage) a held lease's record is rewritten directly in Valkey; "
          "another worker's acquire, the holder's renew, an inspect and the holder's release follow; the record "
          "is deleted (repair) and the identity acquired again. Last, the fencing counter itself is made "
          "non-numeric and an acquire tried.",
    checks="While the damage is in place no operation on the identity succeeds and every answer is "
           "lease_backend_unavailable (fail closed, typed); after the repair a new acquisition gets a token above "
           "the damaged lease's.",
    script=corrupt_script, check=corrupt_check, pokes=True, min_concurrency=2,
    stack_only="it writes corrupt records straight into the lab's own Valkey",
    options={"concurrency": 2, "time_limit": 2.0, "ttl_ms": 2000},
)


# -- 15. partition isolates a worker ---------------------------------------------------------------


def isolate_script(s: Script) -> Any:
    """Worker A (client group c1) holds a lease and is cut off; B (group c2) takes over; A comes back."""
    return s.steps(
        s.on(0, s.op("acquire", "k0", "acq-a", slot="A", ttl_ms=600), s.op("commit", "k0", "commit-a", slot="A")),
        s.fault(s.nem("start-partition", {"grudge": "isolate-client", "target": "c1"})),
        s.together(s.on(0, s.op("renew", "k0", "part-renew", slot="A", deadline_ms=400),
                        s.op("commit", "k0", "part-commit", slot="A", deadline_ms=400),
                        s.op("renew", "k0", "part-renew2", slot="A", deadline_ms=400)),
                   s.on(2, s.sleep(0.8), s.op("acquire", "k0", "acq-b", slot="B", ttl_ms=5000),
                        s.op("commit", "k0", "commit-b", slot="B"))),
        s.fault(s.nem("stop-partition")),
        s.on(0, s.op("renew", "k0", "told-renew", slot="A"), s.op("commit", "k0", "told-commit", slot="A")),
        s.on(2, s.op("renew", "k0", "succ-renew", slot="B"), s.op("inspect", "k0", "inspect")))


def isolate_final(s: Script) -> Any:
    """Read the document back."""
    return [s.op("read", "k0", "read-k0")]


def isolate_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """A's renew and commit fail closed while cut off; back, A is told lease_lost; B stays; no A entry after B."""
    cut = [p for _, p in t.starting("part-")]
    for p in cut:
        if ok(p):
            v.add("succeeded-while-isolated", idx(p), f"{p.f} of the isolated worker succeeded")
    told = [t.one("told-renew"), t.one("told-commit")]
    for p in told:
        if ok(p):
            v.add("stale-holder-succeeded", idx(p), f"the isolated worker's {p.f} succeeded after its lease was taken")
        elif p is not None and p.type == "fail" and code(p) not in (LOST, "stale_token"):
            v.add("not-told", idx(p), f"the isolated worker's {p.f} answered {code(p)}, not lease_lost: it is not "
                  "told it lost the lease")
    _successor_check(t, v, "0", t.one("acq-b"), "inspect", "succ-renew")
    entries = _entries(t, "read-k0") or []
    b = t.one("acq-b")
    if ok(b):
        tokens = [e[1] for e in entries if isinstance(e, list) and len(e) == 3]
        if any(y < x for x, y in zip(tokens, tokens[1:])):
            v.add("token-regression", idx(t.one("read-k0")), f"the document's entries go down in token: {tokens}")
    told_lost = sum(1 for p in told if p is not None and p.type == "fail" and code(p) == LOST)
    return {"ops_while_isolated": len(cut), "told_lease_lost": told_lost,
            "exercised": bool(cut) and not any(ok(p) for p in cut) and told_lost > 0,
            "why_not": "the worker was not cut off, or never heard lease_lost back"}


ISOLATE = Scenario(
    name="partition-isolates-worker", race="partition isolates a worker",
    tags=("acq", "commit", "inspect", "part-commit", "part-renew", "part-renew2", "read", "succ-renew", "told-commit", "told-renew"),
    requires="its renew and commit fail closed; it is told it lost the lease", rules=("C12", "C25", "C23"),
    setup="Worker A (thread 0, client group c1) acquires (600 ms TTL) and commits; Toxiproxy cuts every link of "
          "c1; A's renews and commit (400 ms deadlines) go nowhere while worker B (thread 2, group c2) acquires "
          "after A's expiry and commits; the partition heals and A renews and commits again. B renews and "
          "inspects; the document is read back.",
    checks="Nothing A sends while isolated succeeds; after the heal A's renew and commit are refused with "
           "lease_lost (it is told it lost the lease: its cancellation path runs); B stays the active lease and "
           "renews; the document's entries never go down in token.",
    script=isolate_script, check=isolate_check, final=isolate_final, workload="fenced-append", nemeses=("partition",),
    domain=("stale-commit", "fencing", "mutual-exclusion", "lease-state", "idempotency"),
    stack_only="it partitions the lab's own client-to-server links", min_concurrency=3,
    options={"concurrency": 3, "time_limit": 2.5, "ttl_ms": 600},
)


# -- 16. counter near its numeric limit -------------------------------------------------------------


def limit_script(s: Script) -> Any:
    """The counter set two below the limit in Valkey; acquire to the limit; acquire past it; another identity."""
    return s.steps(
        s.fault(s.nem("set-counter", {"key": "k0", "value": LIMIT - 2})),
        s.on(0, s.op("acquire", "k0", "near-1", slot="A"), s.op("release", "k0", "rel-1", slot="A")),
        s.on(0, s.op("acquire", "k0", "near-2", slot="B"), s.op("release", "k0", "rel-2", slot="B")),
        s.on(0, s.op("acquire", "k0", "limit-1", slot="C")),
        s.on(1, s.op("acquire", "k0", "limit-2", slot="D")),
        s.on(0, s.op("inspect", "k0", "inspect"), s.op("observe-backend", "k0", "counter")),
        s.on(1, s.op("acquire", "k1", "other", slot="E")),
        s.fault(s.nem("end-counter-fault", {"key": "k0"})))


def limit_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Tokens stop at the limit: no token above it, none lower than before (no wrap), acquisitions refused there."""
    granted = [(tag, p) for tag, p in t.starting("") if p.f == "acquire" and p.key == "k0" and ok(p)]
    tokens = [val(p, "fencing_token") for _, p in granted]
    for (tag, p), token in zip(granted, tokens):
        if token > LIMIT:
            v.add("beyond-limit", idx(p), f"{tag}: token {token} is above the limit {LIMIT}")
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        v.add("wrapped", idx(*(p for _, p in granted)), f"tokens went {tokens}: not strictly increasing (wrapped)")
    at_limit = LIMIT in tokens
    refused = 0
    for tag in ("limit-1", "limit-2"):
        p = t.one(tag)
        if p is None:
            continue
        if ok(p) and at_limit:
            v.add("acquired-past-limit", idx(p), f"{tag}: acquired with token {val(p, 'fencing_token')} after the "
                  "counter reached its limit")
        elif p.comp is not None:  # the reference server's refusal is 503 without `submitted: false`: an info op
            if code(p) == "lease_backend_unavailable":
                refused += 1
            elif p.type == "fail":
                v.add("untyped-refusal", idx(p), f"{tag}: refused with {code(p)}, not lease_backend_unavailable")
    ins = t.one("inspect")
    if ok(ins) and isinstance(ins.result, dict) and ins.result.get("state") in (None, "active") and at_limit:
        v.add("acquired-past-limit", idx(ins), f"an active lease {ins.result.get('lease_id')!r} exists after the "
              "acquisitions at the limit (every one was released)")
    counter = t.one("counter")
    if ok(counter) and at_limit and val(counter, "counter") != LIMIT:
        v.add("counter-changed", idx(counter), f"the counter reads {val(counter, 'counter')} after reaching {LIMIT}")
    other = t.one("other")
    if other is not None and other.type == "fail":
        v.add("refusal-not-scoped", idx(other), f"another identity's acquire failed with {code(other)}")
    return {"tokens": tokens, "refused_at_limit": refused, "exercised": at_limit and refused > 0,
            "why_not": "the counter never reached the limit, or no acquisition was tried there"}


LIMIT_SCENARIO = Scenario(
    name="counter-near-limit", race="counter near its numeric limit", requires="acquisition refused, never wraps",
    tags=("counter", "inspect", "limit", "near", "other", "rel"),
    rules=("C5",),
    setup=f"The identity's fencing counter is set to {LIMIT - 2} (2^32-3) directly in Valkey; two acquisitions "
          "(each released) take it to the limit 2^32-1 (the end of the reference server's first recovery epoch); "
          "two more acquisitions are tried; the identity is "
          "inspected, the counter read, and another identity acquired.",
    checks="No token above 2^32-1, tokens strictly increasing (never wrapped or reset); at the limit every "
           "acquisition is refused with lease_backend_unavailable and the counter stays at the limit; another "
           "identity still acquires. Unknown unless the limit was reached and an acquisition refused there.",
    script=limit_script, check=limit_check, pokes=True, min_concurrency=2,
    stack_only="it sets the fencing counter directly in the lab's own Valkey",
    options={"concurrency": 2, "time_limit": 1.0, "ttl_ms": 2000},
)


# -- 17. backup / restore ---------------------------------------------------------------------------


def restore_script(s: Script) -> Any:
    """A holds and commits; snapshot; A releases, B acquires and commits; restore; C acquires; A and B try again."""
    acquire_c = s.op("acquire", "k0", "acq-c", slot="C", ttl_ms=5000)
    attempts = []
    for _ in range(40):  # the recovery rule refuses mutations until its new epoch is established
        attempts += [acquire_c, s.sleep(0.25)]
    return s.steps(
        s.on(0, s.op("acquire", "k0", "acq-a", slot="A", ttl_ms=4000), s.op("commit", "k0", "commit-a", slot="A")),
        s.fault(s.nem("start-valkey-restore")),
        s.on(0, s.op("release", "k0", "rel-a", slot="A")),
        s.on(1, s.op("acquire", "k0", "acq-b", slot="B", ttl_ms=10000), s.op("commit", "k0", "commit-b", slot="B")),
        s.fault(s.nem("stop-valkey-restore")),
        s.on(2, gen.until_ok(attempts)),
        s.on(0, s.op("renew", "k0", "restored-renew", slot="A"), s.op("commit", "k0", "restored-commit", slot="A")),
        s.on(1, s.op("renew", "k0", "lost-renew", slot="B")),
        s.on(2, s.op("commit", "k0", "commit-c", slot="C")))


def restore_final(s: Script) -> Any:
    """Read the document back."""
    return [s.op("read", "k0", "read-k0")]


def restore_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """After the restore every token is above every token issued or accepted before it; restored leases are dead."""
    restores = [w for w in t.windows if w["fault"] == "valkey-restore" and not w["open"]]
    if not restores:
        return {"exercised": False, "why_not": "no restore completed"}
    end = restores[-1]["end"]
    before = [val(p, "fencing_token") for p in t.pairs if ok(p) and p.f in ("acquire", "commit") and p.t1 is not None
              and p.t1 <= end and val(p, "fencing_token") is not None]
    high = max(before, default=0)
    after = [p for p in t.all("acq-c") if ok(p)]
    for p in after:
        if val(p, "fencing_token") <= high:
            v.add("token-regressed", idx(p), f"after the restore token {val(p, 'fencing_token')} was issued, not above "
                  f"{high} already issued or accepted downstream before it")
    for tag in ("restored-renew", "restored-commit", "lost-renew"):
        p = t.one(tag)
        if ok(p):
            v.add("restored-lease-valid", idx(p), f"{tag}: a lease from before the restore still works ({p.f} ok)")
    return {"high_water_before_restore": high, "tokens_after": [val(p, "fencing_token") for p in after],
            "exercised": bool(after), "why_not": "no acquisition succeeded after the restore"}


RESTORE = Scenario(
    name="backup-restore", race="backup / restore, failover",
    tags=("acq", "commit", "lost-renew", "read", "rel", "restored-commit", "restored-renew"),
    requires="the counter never goes below any token accepted downstream; otherwise a higher epoch and all "
             "restored leases invalid", rules=("C5", "C26"),
    setup="A acquires and commits; Valkey is snapshotted (valkey-restore start); A releases, B acquires (a higher "
          "token) and commits downstream; Valkey is restarted from the older snapshot (counter and A's lease "
          "rolled back); C acquires (retrying while the recovery rule establishes its epoch); A renews and "
          "commits, B renews, C commits; the document is read back.",
    checks="Every token issued after the restore is above every token issued or accepted before it (no reuse); "
           "the restored lease A and the lost lease B can neither renew nor commit. Unknown unless a restore "
           "completed and an acquisition succeeded after it.",
    script=restore_script, check=restore_check, final=restore_final, workload="fenced-append",
    nemeses=("valkey-restore",), domain=("stale-commit", "fencing", "lease-state", "idempotency"),
    stack_only="it restores the lab's own Valkey from an older snapshot", min_concurrency=3,
    options={"concurrency": 3, "time_limit": 3.0, "ttl_ms": 2000},
)

RACES = (CONCURRENT, RESPONSE_LOST, RENEW_EXPIRY, RENEW_RELEASE, STALE_RELEASE, DELAYED_CLEANUP, COMMIT_EXPIRY,
         OLDER_HOLDER, CHANGED_BODY, CRASH_AFTER, CRASH_BEFORE, BACKEND_DOWN, TIMEOUT, CORRUPT, ISOLATE,
         LIMIT_SCENARIO, RESTORE)
