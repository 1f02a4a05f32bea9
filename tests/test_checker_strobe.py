"""A strobe flips Valkey's clock between its start and its reset with no op of its own: backend times of that
window are not comparable, so mutual exclusion leaves leases with ops inside it out (never a false alarm).

Seen in a default fenced-append run under `--nemesis clock` (seed 0): a renew during the strobe came back with an
expiry 22 s in the past (Valkey's clock at -24.7 s), the lease really ended, and the next acquisition was judged
an overlap against the acquisition's earlier, later-looking expiry. Without the strobe the same ops are a real
overlap and stay convicted.
"""

from __future__ import annotations

import copy

from checkers.core import get_checker

S = 1_000_000_000  # ns


def op(i, t_s, typ, p, f, value=None, **kw):
    return {"index": i, "time": int(t_s * S), "type": typ, "process": p, "f": f, "value": value, **kw}


def lease(lid, token, acq, exp, **kw):
    return {"lease_id": lid, "fencing_token": token, "acquired_at_ms": acq, "renewed_at_ms": acq,
            "expires_at_ms": exp, "ttl_ms": 2000, "state": "active", **kw}


def history(strobe: bool) -> list[dict]:
    h = [
        op(0, 0.7, "invoke", 0, "acquire", {"request_id": "a1"}, key="k"),
        op(1, 0.8, "ok", 0, "acquire", lease("A", 1, 100_000, 102_000, request_id="a1"), key="k"),
        op(4, 1.1, "invoke", 0, "renew", {"request_id": "r1"}, key="k"),
        # the renew ran while Valkey's clock read 24.7 s early: its expiry is in the past
        op(5, 1.2, "ok", 0, "renew", lease("A", 1, 100_000, 77_300, request_id="r1",
                                           sent={"request_id": "r1", "lease_id": "A", "fencing_token": 1}), key="k"),
        op(6, 1.5, "invoke", 1, "acquire", {"request_id": "a2"}, key="k"),
        op(7, 1.6, "ok", 1, "acquire", lease("B", 2, 100_450, 102_450, request_id="a2"), key="k"),
    ]
    if strobe:
        h += [op(2, 0.5, "info", "nemesis", "strobe-clock"),
              op(3, 0.6, "info", "nemesis", "strobe-clock",
                 {"fault": "clock", "phase": "start", "kind": "strobe", "targets": ["lease-1", "valkey"],
                  "delta_s": -24.7, "period_ms": 100, "duration_s": 10.0}),
              op(8, 2.0, "info", "nemesis", "reset-clock"),
              op(9, 2.1, "info", "nemesis", "reset-clock", {"fault": "clock", "phase": "end", "strobe_stopped": True})]
    return sorted(h, key=lambda o: o["time"])


def test_leases_with_ops_inside_a_strobe_are_not_compared():
    res = get_checker("mutual-exclusion").check({}, copy.deepcopy(history(strobe=True)), {})
    assert res["valid"] is not False, res


def test_the_same_ops_without_a_strobe_are_an_overlap():
    res = get_checker("mutual-exclusion").check({}, history(strobe=False), {})
    assert res["valid"] is False, res
