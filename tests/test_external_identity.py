"""`scenario:identity-probe` holds a system to the contract (C1-C4), never to our server's canonical form.

Three small in-memory lease systems (plugged in as SUTs, as a user's own
would be) each document their own case rule, all different from ours (ours
lowercases the identifier fields, keeps `target_id`'s case, NFC, refuses
surrounding spaces):

- `keep-case`: every component keeps its case; surrounding spaces are trimmed;
  NFC. Consistent: the probe must judge it valid.
- `fold-all`: every component, `target_id` too, is NFKC-casefolded and
  trimmed. Consistent: valid.
- `merge-workflows`: like `fold-all`, but its lease table ignores
  `workflow_name`, so two identities that differ only there share one lease
  (C3 broken): the probe must judge it invalid (`collision`).
"""

from __future__ import annotations

import itertools
import time
import unicodedata
import uuid

import pytest

from lab.client import Identity, Lease, Result
from lab.runner import run_test
from lab.scenarios import apply_scenario
from lab.scenarios.faults import IDENTITY_ORDER, contract_lock_key
from lab.sut import register_sut, unregister_sut
from lab.testmap import Test

OPERATION_CLASSES = ("default", "scan", "enrich", "exploit", "report", "maintenance")
MAX_COMPONENT = 1024  # this toy's documented bound


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ToyStore:
    """One run's lease table, shared by every worker (the 'server')."""

    def __init__(self, rule: str):
        self.rule = rule
        self.records: dict[tuple, Lease] = {}
        self.by_id: dict[str, Lease] = {}
        self.counters: dict[tuple, int] = {}

    def canonical(self, ident: Identity) -> dict[str, str] | None:
        """The toy's documented rule; None when the identity is invalid (C2)."""
        out = {}
        for name in IDENTITY_ORDER:
            raw = getattr(ident, name)
            if self.rule == "keep-case":
                value = unicodedata.normalize("NFC", raw).strip()
            else:
                value = unicodedata.normalize("NFKC", raw).strip().casefold()
            if (not value or len(value) > MAX_COMPONENT or "/" in value or ".." in value
                    or any(unicodedata.category(c) == "Cc" for c in value)):
                return None
            out[name] = value
        if out["operation_class"] not in OPERATION_CLASSES:
            return None
        return out

    def table_key(self, canon: dict[str, str]) -> tuple:
        names = [n for n in IDENTITY_ORDER if not (self.rule == "merge-workflows" and n == "workflow_name")]
        return tuple(canon[n] for n in names)

    def lease_for(self, canon: dict[str, str], ttl_ms: int, key: tuple) -> Lease:
        self.counters[key] = self.counters.get(key, 0) + 1
        t = now_ms()
        lease = Lease(lease_id=str(uuid.uuid4()), fencing_token=self.counters[key], state="active",
                      acquired_at_ms=t, renewed_at_ms=t, expires_at_ms=t + ttl_ms, ttl_ms=ttl_ms, record_version=1,
                      lock_key=contract_lock_key(canon), **canon)
        self.records[key] = lease
        self.by_id[lease.lease_id] = lease
        return lease


def _shown(lease: Lease) -> Lease:
    """The record as of now (C10: past expires_at it is expired)."""
    import dataclasses

    if lease.state == "active" and lease.expires_at_ms <= now_ms():
        return dataclasses.replace(lease, state="expired")
    return dataclasses.replace(lease)


class ToyLeaseSystem:
    """A worker's client of the toy server (lab.sut.LeaseSystem)."""

    def __init__(self, store: ToyStore, instance: str):
        self.store, self.instance = store, instance

    async def acquire(self, identity, *, ttl_ms, request_id=None, deadline_s=None) -> Result:
        canon = self.store.canonical(identity)
        if canon is None:
            return Result("fail", "invalid_lease_request", msg="identity not canonical")
        key = self.store.table_key(canon)
        held = self.store.records.get(key)
        if held is not None and _shown(held).state == "active":
            return Result("fail", "lease_conflict")
        return Result("ok", "lease_acquired", lease=_shown(self.store.lease_for(canon, ttl_ms, key)))

    async def _own(self, lease: Lease) -> Lease | None:
        cur = self.store.by_id.get(lease.lease_id)
        if cur is None or cur.fencing_token != lease.fencing_token or _shown(cur).state != "active":
            return None
        return cur

    async def renew(self, lease, *, identity=None, request_id=None, deadline_s=None) -> Result:
        cur = await self._own(lease)
        if cur is None:
            return Result("fail", "lease_lost")
        cur.renewed_at_ms, cur.expires_at_ms = now_ms(), now_ms() + cur.ttl_ms
        return Result("ok", "lease_renewed", lease=_shown(cur))

    async def release(self, lease, *, identity=None, request_id=None, deadline_s=None) -> Result:
        cur = await self._own(lease)
        if cur is None:
            return Result("fail", "lease_lost")
        cur.state, cur.ended_at_ms = "released", now_ms()
        return Result("ok", "lease_released", lease=_shown(cur))

    async def inspect(self, target, *, deadline_s=None) -> Result:
        if isinstance(target, str):
            found = self.store.by_id.get(target)
        else:
            canon = self.store.canonical(target)
            if canon is None:
                return Result("fail", "invalid_lease_request", msg="identity not canonical")
            found = self.store.records.get(self.store.table_key(canon))
        if found is None:
            return Result("fail", "lease_not_found")
        return Result("ok", "lease_inspected", lease=_shown(found))

    async def aclose(self) -> None:
        return None


_names = itertools.count(1)


@pytest.fixture
def toy_sut():
    """Register a toy system with a rule; unregistered at the end."""
    registered = []

    def make(rule: str) -> str:
        store = ToyStore(rule)
        name = f"toy-{rule}-{next(_names)}"
        register_sut(name, lambda test, node, instance: ToyLeaseSystem(store, instance), capabilities=())
        registered.append(name)
        return name

    yield make
    for name in registered:
        unregister_sut(name)


def probe_run(tmp_path, sut: str) -> dict:
    test = Test(extra={"scenario": "identity-probe", "sut": sut})
    test = apply_scenario(test, {"time_limit"})
    test.time_limit = 1.0
    return run_test(test, tmp_path / "store")


@pytest.mark.parametrize("rule", ["keep-case", "fold-all"])
def test_a_server_with_another_consistent_case_rule_is_valid(tmp_path, toy_sut, rule):
    results = probe_run(tmp_path, toy_sut(rule))
    mine = results["results"]["scenario:identity-probe"]
    assert mine["valid"] is True, mine.get("violations", [])[:3]
    # the probe judged something: spellings of the held identity, refusals, distinct keys checked against C3
    assert mine["spellings_same_lease"] + mine["spellings_other_identity"] >= 6, mine
    assert mine["non_canonical_refused"] >= 6 and mine["distinct_acquired"] == 5, mine
    assert mine["keys_checked_against_c3"] >= 5, mine
    if rule == "keep-case":  # ours folds Tenant-A into tenant-a; this one keeps it apart, and is still right
        assert mine["spellings_other_identity"] >= 4, mine
    else:  # this one folds target_id's case, which ours keeps
        assert mine["spellings_same_lease"] >= 7, mine


def test_a_server_that_maps_two_identities_to_one_lease_is_invalid(tmp_path, toy_sut):
    results = probe_run(tmp_path, toy_sut("merge-workflows"))
    mine = results["results"]["scenario:identity-probe"]
    assert results["valid"] is False and mine["valid"] is False, mine
    assert "collision" in mine["violation_counts"], mine
    # the two that collide are the base and the one differing in workflow_name (whichever came second loses)
    assert all(v["msg"].startswith(("distinct-base", "distinct-workflow_name")) for v in mine["violations"]), \
        mine["violations"][:3]
