"""A replayed commit's reported revision is not its write's: no false alarm from the revision order.

Seen in a default fenced-append run against the reference server (seed 1, no faults): a commit that timed out
was retried with the same request_id after a takeover; the boundary found its entry already applied and
answered the original result with `replayed: true`, but with the document's revision at the time of the retry
(lab/server/commit.py `already_applied`). Ordered by that revision, the old token looked accepted after the
successor's. The same history without `replayed` is a real token regression and stays invalid.
"""

from __future__ import annotations

import copy

import pytest

from checkers.core import get_checker
from checkers.stale_write import StaleWriteChecker


def checker(name: str):
    return StaleWriteChecker() if name == "stale-write" else get_checker(name)

L1 = {"lease_id": "l1", "fencing_token": 1, "acquired_at_ms": 1000, "expires_at_ms": 3000}
L2 = {"lease_id": "l2", "fencing_token": 2, "acquired_at_ms": 3500, "expires_at_ms": 5500}


def op(i, t, typ, p, f, value=None, **kw):
    return {"index": i, "time": t * 1_000_000, "type": typ, "process": p, "f": f, "value": value, "key": "k0", **kw}


def history(replayed: bool) -> list[dict]:
    sent1 = {"request_id": "c1", "lease_id": "l1", "fencing_token": 1}
    h = [
        op(0, 0, "invoke", 0, "acquire", {"request_id": "a1"}),
        op(1, 10, "ok", 0, "acquire", dict(L1, request_id="a1", sent={"request_id": "a1"})),
        op(2, 20, "invoke", 0, "commit", {"request_id": "c1", "doc": "doc-k0", "entry": [0, 1, 1]}),
        op(3, 1200, "info", 0, "commit", {"request_id": "c1", "doc": "doc-k0", "entry": [0, 1, 1], "sent": sent1},
           error="timeout"),
        op(4, 3400, "invoke", 1, "acquire", {"request_id": "a2"}),
        op(5, 3500, "ok", 1, "acquire", dict(L2, request_id="a2", sent={"request_id": "a2"})),
        op(6, 3600, "invoke", 1, "commit", {"request_id": "c2", "doc": "doc-k0", "entry": [1, 2, 2]}),
        op(7, 3650, "ok", 1, "commit", {"request_id": "c2", "doc": "doc-k0", "entry": [1, 2, 2], "lease_id": "l2",
                                        "fencing_token": 2, "rev": "3-b", "accepted_token": 2,
                                        "validated_at_ms": 3610,
                                        "sent": {"request_id": "c2", "lease_id": "l2", "fencing_token": 2}}),
        op(8, 3700, "invoke", 2, "commit", {"request_id": "c1", "doc": "doc-k0", "entry": [0, 1, 1]}),
        op(9, 3750, "ok", 2, "commit", {"request_id": "c1", "doc": "doc-k0", "entry": [0, 1, 1], "lease_id": "l1",
                                        "fencing_token": 1, "rev": "4-c", "accepted_token": 1,
                                        "validated_at_ms": 30, "replayed": True, "sent": sent1}),
        op(10, 3800, "invoke", 3, "read", {"doc": "doc-k0"}),
        op(11, 3850, "ok", 3, "read", {"doc": "doc-k0", "entries": [[0, 1, 1], [1, 2, 2]]}),
    ]
    if not replayed:  # the retry is then a fresh write of the old token at a later revision: a real regression
        v = h[9]["value"]
        del v["replayed"]
        v["validated_at_ms"] = 3720
        h[11]["value"]["entries"] = [[1, 2, 2], [0, 1, 1]]
    return h


@pytest.mark.parametrize("name", ["stale-commit", "stale-write"])
def test_a_replayed_commit_is_not_ordered_by_the_revision_it_reports(name):
    res = checker(name).check({}, copy.deepcopy(history(replayed=True)), {})
    assert res["valid"] is True, res


@pytest.mark.parametrize("name", ["stale-commit", "stale-write"])
def test_the_same_write_not_replayed_is_a_violation(name):
    res = checker(name).check({}, history(replayed=False), {})
    assert res["valid"] is False, res
