"""Idempotent retries: same request_id and body, same result; changed body, idempotency_conflict.

Ops are grouped by idempotency key, approximated from the history as
(f, key, request_id) (contract C16; the owner principal is not in the op record).
The "body" of a request is `value.body` when the workload recorded it, else the
invocation value without per-attempt fields (deadlines, the lab's session
tag) plus the lease and token the client sent (`value.sent`), as canonical
JSON. The result that must repeat is (lease_id, fencing_token) for lease
operations and (doc, rev, accepted_token) for commits (C17, C18). Violations, each naming the ops:

- `replay-different-result`: two ok ops with the same body returned different results.
- `changed-body-accepted`: two ok ops with different bodies (only one body can be recorded).
- `replay-not-idempotent`: a same-body retry invoked after an ok completed failed
  with a definite code (e.g. `lease_conflict`, `idempotency_conflict`) instead of
  returning the original result.
- `changed-body-not-conflict`: a changed-body request invoked after an ok completed
  failed with a definite code other than `idempotency_conflict`.
- `false-conflict`: `idempotency_conflict` although no op with that idempotency key
  carried a different body.

Codes that say nothing about the idempotency record (timeouts, unavailability,
rate limits, auth, validation: `NOT_RESULTS`) and info ops never violate, nor
does an attempt that sent nothing (`NOTHING_SENT`: the client could not
connect, or held no lease; in a history that records what was sent, a
completion without `value.sent`): it is not a replay, the server never saw it.

The checker judges a request_id when it was retried after an answer (two ok
attempts, or a definite answer from the server after an ok), or when a server
answered `idempotency_conflict`. With no such request_id the verdict is
"unknown" with the reason: the rules need retries of answered requests.
"""

from __future__ import annotations

import bisect

import json
from typing import Callable, Mapping

from checkers.core import ViewCheck, Violations
from checkers.models import replay_outcome
from checkers.pairs import Pair, error_code, sent
from checkers.view import LeaseView

__all__ = ["IdempotencyChecker"]

IDEMPOTENT_FS = frozenset(("acquire", "renew", "release", "force-release", "revoke", "commit"))
CONFLICT = "idempotency_conflict"
NOT_RESULTS = frozenset((
    "timeout", "outcome_unknown", "lease_outcome_unknown", "backend_unavailable", "lease_backend_unavailable",
    "deadline_exceeded", "lease_rate_limited", "invalid_credential", "access_denied", "invalid_lease_request",
))
# Codes the client assigns when nothing reached the server (lab.client.results.CONNECT_ERROR; the workloads'
# `not_held`): the server never saw such an attempt, so it is no replay.
NOTHING_SENT = frozenset(("connect_error", "not_held"))
# Invocation fields of one attempt, not of the request: deadlines (each retry has its own) and the lab's
# session tag. C16's digest covers what affects behaviour; a retry differing only here is the same request.
PER_ATTEMPT = frozenset(("deadline_ms", "deadline_at_ms", "session"))


class IdempotencyChecker(ViewCheck):
    """Checks retries by request_id against their original results (see module docstring)."""

    def __init__(self, max_violations: int = 1000):
        self.max_violations = max_violations

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge every idempotency key that was used more than once, and every conflict."""
        found = _judgeable(view)
        if found is not None:
            n_keys, candidates, records_sent = found
            parts = [self._judge(view, dict([c]), records_sent) for c in candidates]
            violating = [r for r in parts if r[0].counts]
            if len(violating) <= 1:  # the violations come in the order they always had: one group's, or none
                v = violating[0][0] if violating else Violations(self.max_violations)
                return self._result(v, n_keys, sum(r[1] for r in parts), sum(r[2] for r in parts),
                                    sum(r[3] for r in parts), view)
        # idempotency key -> its one op, or the list of them when used more than once: most request_ids are
        # used once, and a list for each would cost more than the rest of the checker (1M-op histories)
        groups: dict[tuple, Pair | list[Pair]] = {}
        fs = IDEMPOTENT_FS
        for p in view.pairs:
            gkey = p.rk  # (f, key, request_id): the invocation's request_id when it has one, which is the rule's
            if gkey is not None and p.vrid and p.f in fs:  # the invocation carries a request_id
                g = groups.get(gkey)
                if g is None:
                    groups[gkey] = p
                elif g.__class__ is list:
                    g.append(p)
                else:
                    groups[gkey] = [g, p]
        records: list[bool] = []  # whether the history records `sent` at all, found out when first needed

        def records_sent() -> bool:
            if not records:
                records.append(any(p.sent is not None for g in groups.values()
                                   for p in (g if g.__class__ is list else (g,))))
            return records[0]

        v, retried, judged, n_excused = self._judge(view, groups, records_sent)
        return self._result(v, len(groups), retried, judged, n_excused, view)

    def _judge(self, view: LeaseView, groups: dict[tuple, Pair | list[Pair]],
               records_sent: Callable[[], bool]) -> tuple[Violations, int, int, int]:
        """The rules for each group (one op, or the list of ops sharing an idempotency key, in invocation
        order): (violations, groups retried, groups judged, retries excused by a Valkey loss)."""
        v = Violations(self.max_violations)
        retried = judged = 0
        losses = sorted(done for _, done in view.faults.valkey_losses)
        excused: list[int] = []
        for gkey, ops in groups.items():
            if ops.__class__ is not list:  # used once: only a conflict can be judged (false-conflict)
                if (ops.type == "fail" and error_code(ops.comp) == CONFLICT
                        and not _nothing_sent(ops, records_sent)):
                    judged += 1
                    _false_conflict(gkey, ops, v)
                continue
            if any(p.type == "fail" for p in ops):
                ops = [p for p in ops if not _nothing_sent(p, records_sent)]
            if len(ops) > 1:
                retried += 1
                judged += _check_group(gkey, ops, v, losses, excused)
            elif ops and ops[0].type == "fail" and error_code(ops[0].comp) == CONFLICT:
                judged += 1
                _false_conflict(gkey, ops[0], v)
        return v, retried, judged, len(excused)

    @staticmethod
    def _result(v: Violations, n_keys: int, retried: int, judged: int, n_excused: int, view: LeaseView) -> dict:
        """The checker's result from what `_judge` found over every group (`n_keys` of them)."""
        losses = view.faults.valkey_losses
        unjudged = None
        if not n_keys:
            unjudged = "no operation carries a request_id"
        elif not judged:
            unjudged = ("no request_id was retried after an answer: the rules need a retry (same request_id, same "
                        "or changed body) of a request that was answered, or an idempotency_conflict")
        extra = {"retries_across_valkey_loss": n_excused,
                 "valkey_loss_rule": "a retry invoked after Valkey lost or rolled back its state (a crash, a kill, a "
                                     "restore from an older snapshot) since the original was answered is not held to "
                                     "that answer: the record may be gone with the state (contract section 8, "
                                     "backup / restore: a higher epoch, the restored leases invalid)"} if losses else {}
        return v.result(request_ids=n_keys, retried=retried, judged=judged, unjudged=unjudged, **extra)


def _judgeable(view: LeaseView) -> tuple[int, list[tuple], Callable[[], bool]] | None:
    """The groups that may break a rule, found from the view's idempotency keys (`LeaseView.starts`, which
    hashed each key once already) instead of grouping every op again: (how many keys, [(key, its op or ops)]
    for each key used more than once or failed with a conflict, `records_sent`). None (group every op) unless
    every op that carries a key is one the rules read (its invocation carries the request_id, its f is one of
    `IDEMPOTENT_FS`)."""
    try:
        firstp, again = view.starts
    except Exception:  # noqa: BLE001 - a history the grouping below judges (or fails on) as it always did
        return None
    fs = IDEMPOTENT_FS
    by_f = view.by_f
    if by_f is None:
        return None
    conflicts = []
    for f, ps in by_f.items():
        if f not in fs:
            if any(p.rk is not None for p in ps):
                return None
            continue
        for p in ps:
            if p.rk is not None and not p.vrid:
                return None
            if p.type == "fail" and p.rk is not None and error_code(p.comp) == CONFLICT:
                conflicts.append(p)
    multi: dict[tuple, list[Pair]] = {}
    for p in again:
        ops = multi.get(p.rk)
        if ops is None:
            multi[p.rk] = [firstp[p.rk], p]
        else:
            ops.append(p)
    candidates: list[tuple] = list(multi.items())
    candidates += [(p.rk, p) for p in conflicts if p.rk not in multi]
    records: list[bool] = []

    def records_sent() -> bool:
        if not records:
            records.append(any(p.sent is not None for p in firstp.values())
                           or any(p.sent is not None for p in again))
        return records[0]

    return len(firstp), candidates, records_sent


def _nothing_sent(p: Pair, records_sent: Callable[[], bool]) -> bool:
    """A definite failure that never reached the server: not an attempt of its request_id at all."""
    if p.type != "fail":
        return False
    return error_code(p.comp) in NOTHING_SENT or (sent(p) is None and records_sent())


def _body(p: Pair) -> str:
    """Canonical text of what the request asked: its recorded body, else its invocation value without the
    per-attempt fields no digest can cover (a retry's deadline is always later), with the lease and token the
    client sent (`value.sent`: the invocation of a renew or release names no lease)."""
    val = p.inv.get("value")
    if isinstance(val, dict) and "body" in val:
        body = val["body"]
    elif isinstance(val, dict):
        body = {k: v for k, v in val.items() if k not in PER_ATTEMPT}
        wire = sent(p) or {}
        body.update({k: wire[k] for k in ("lease_id", "fencing_token") if wire.get(k) is not None})
    else:
        body = val
    return json.dumps(body, sort_keys=True, default=str)


def _false_conflict(gkey: tuple, p: Pair, v: Violations) -> None:
    """An idempotency_conflict with nothing it could conflict with."""
    f, key, rid = gkey
    v.add("false-conflict", p.indices, f"{f} {rid!r} on key {key!r}: idempotency_conflict, yet no request "
          f"with this request_id carried another body", key=key, request_id=rid)


def _across_loss(a: Pair, b: Pair, losses: list[int]) -> bool:
    """Did Valkey lose or roll back its state after `a` was answered and before `b` was invoked?"""
    i = bisect.bisect_right(losses, a.t1 if a.t1 is not None else a.t0)
    return i < len(losses) and losses[i] <= b.t0


def _check_group(gkey: tuple, ops: list[Pair], v: Violations, losses: list[int] | None = None,
                 excused: list[int] | None = None) -> bool:
    """All rules for the ops sharing one idempotency key (in invocation order); whether any rule had a subject.

    A pair (answer, later op) with a Valkey loss between them (`losses`: completion times) is not judged; its
    count goes into `excused`."""
    losses = losses or []
    excused = excused if excused is not None else []

    def lost_between(a: Pair, b: Pair) -> bool:
        if losses and _across_loss(a, b, losses):
            excused.append(b.i0)
            return True
        return False

    f, key, rid = gkey
    bodies = [_body(p) for p in ops]
    oks = [(p, b) for p, b in zip(ops, bodies) if p.type == "ok"]
    judged = len(oks) > 1
    for (a, ba), (b, bb) in zip(oks, oks[1:]):
        if ba != bb and not lost_between(a, b):
            v.add("changed-body-accepted", [a.i0, a.i1, b.i0, b.i1], f"{f} {rid!r} on key {key!r}: "
                  f"two different bodies were both accepted", key=key, request_id=rid)
    first_ok: dict[str, Pair] = {}
    for p, b in oks:
        orig = first_ok.setdefault(b, p)
        was, now = replay_outcome(p.f, orig.result), replay_outcome(p.f, p.result)
        if orig is not p and was != now and not lost_between(orig, p):
            v.add("replay-different-result", [orig.i1, p.i0, p.i1], f"{f} {rid!r} on key {key!r}: replay returned "
                  f"{now}, the original returned {was}", key=key, request_id=rid, original=list(was), replay=list(now))
    distinct = set(bodies)
    for p, b in zip(ops, bodies):
        if p.type != "fail":
            continue
        code = error_code(p.comp)
        if code == CONFLICT:
            judged = True
            if len(distinct) == 1:
                _false_conflict(gkey, p, v)
                continue
        if code in NOT_RESULTS:
            continue
        before = next((o for o, _ in oks if o.t1 < p.t0), None)
        if before is None or lost_between(before, p):
            continue
        judged = True
        if _body(before) == b:
            v.add("replay-not-idempotent", [before.i1, p.i0, p.i1], f"{f} {rid!r} on key {key!r}: retry failed "
                  f"with {code} after the original succeeded", key=key, request_id=rid, code=code)
        elif code != CONFLICT:
            v.add("changed-body-not-conflict", [before.i1, p.i0, p.i1], f"{f} {rid!r} on key {key!r}: changed "
                  f"body got {code}, not {CONFLICT}", key=key, request_id=rid, code=code)
    return judged
