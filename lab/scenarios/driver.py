"""The scenario driver: one worker of a scripted race, whose ops name leases by slot and owners by name.

A race scenario is a script: "A acquires k0, B acquires k0 at the same
instant, A renews at its expiry, the paused A commits after B took over...".
The workload drivers of `workloads/` pick leases implicitly (the one this
process holds); a script must be explicit, across processes and retries, so
every op here names:

- `slot`: the lease it is about (`"A"`, `"B2"`, ...). An ok acquire stores its
  lease under the slot, shared by every driver of the run (a retry after an
  `info` runs in a fresh process and must find it);
- `owner`: the worker (`service_instance_id`) sending it, default the slot;
  the owner of a lease is the principal plus this instance (C12), so the same
  owner name is the same worker whichever thread or server sends the op;
- `as`: the principal, for the probes that need another one (`peer`, `other-tenant`,
  `force`, `admin`, `nocap`; the lab's demo principals, local stack only).

Completions follow docs/history-format.md (lease fields, `request_id`), plus
`sent_at_ms` (the client's wall clock when the request left: with the
backend's times on the same machine it tells a replayed result from a fresh
one), `replayed` (the server's flag), `lock_key`, `stored_identity` (the
record's identity tuple, C4, when the system reports it), and `end_backend_ms` (the
backend time of a release / revoke) on ends.
Errors are `{"code", "msg"}` objects, so a checker can tell the commit
boundary's enforcement points apart by their message.

Ops only a lab stack allows (`observe-backend`, `observe-audit`, `read`) read
Valkey or the store directly: evidence "against a real backend" (matrix row
15), never part of the system under test's answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from typing import Any

import httpx
import redis.asyncio as aioredis

from lab.client import Identity, Lease, LeaseClient, Result, new_request_id
from lab.client.results import IDENTITY_FIELDS
from lab.couch import CouchClient
from lab.scenarios.faults import valkey_keys
from lab.server.audit import event_from_stream
from lab.server.backend import AUDIT_STREAM
from lab.sut import WorkloadNeeds, open_system
from lab.sut.principal import WORKLOAD_ACTOR, WORKLOAD_PROGRAM, WORKLOAD_TENANT
from lab.sut.probe import lab_owns_store, store_db
from lab.sut.registry import api_key_for

DB = "fencelab"
# the demo principals a probe may act as (lab.server.auth.DEMO_PRINCIPALS), by the role a script names
PRINCIPALS = {"peer": "lease-a1-peer", "other-tenant": "lease-b1", "force": "force-a", "admin": "admin",
              "nocap": "nocap-a", "other-actor": "lease-a1-actor2", "wildcard": "wildcard"}
LEASE_OPS = ("renew", "release", "force-release", "revoke", "commit")


def now_ms() -> int:
    """Wall-clock Unix ms (the same clock Valkey's TIME reads on the local stack)."""
    return time.time_ns() // 1_000_000


class Shared:
    """State every client of one run shares: the leases by slot, workers told they lost a lease, counters."""

    def __init__(self, identity: dict[str, str]):
        self.identity = dict(identity)
        self.slots: dict[str, Lease] = {}
        self.cancelled: set[str] = set()  # slots whose worker was told it lost the lease
        self.entries = itertools.count(1)
        self.store_db = DB  # the database the fenced writes land in (--store-db, or what the commit reply names)

    def identity_for(self, key: str, overrides: dict[str, Any] | None = None) -> Identity:
        """The lock identity behind a script key (`k0`), with a probe's raw overrides."""
        fields = {"tenant_id": WORKLOAD_TENANT, "program_id": WORKLOAD_PROGRAM,
                  "target_namespace": self.identity.get("namespace", "fencelab"), "target_id": key,
                  "actor_name": WORKLOAD_ACTOR, "workflow_name": self.identity.get("workflow", "lab"),
                  "operation_class": "default"}
        fields.update(overrides or {})
        return Identity(**fields)


class ScenarioDriver:
    """A worker bound to one lease server; see the module docstring for the op vocabulary."""

    def __init__(self, shared: Shared, needs: WorkloadNeeds, node: str | None = None, *, needs_store: bool = False,
                 deadline_s: float = 2.0):
        self.shared = shared
        self.needs = needs  # what the scenario's workload asks of the system (passed to open_system)
        self.node = node
        self.needs_store = needs_store
        self.deadline_s = deadline_s
        self.systems: dict[tuple[str, str], Any] = {}

    async def open(self, test, node: str) -> "ScenarioDriver":
        """A client for `node` sharing this run's slots."""
        return ScenarioDriver(self.shared, self.needs, node, needs_store=self.needs_store, deadline_s=self.deadline_s)

    async def setup(self, test) -> None:
        """Create the store database with the lab's fence guard when the scenario commits, in a store the lab owns.

        Never in the system's own store (--store-url without --lab-owns-store): the guard is protection the lab
        would be supplying to the system it tests.
        """
        self.shared.store_db = store_db(test)
        if self.needs_store and _store_url(test) and lab_owns_store(test):
            async with CouchClient(_store_url(test)) as couch:
                await couch.ensure_db(self.shared.store_db)

    async def teardown(self, test) -> None:
        return None

    async def close(self, test) -> None:
        """Close every system this worker opened."""
        for system in self.systems.values():
            await system.aclose()
        self.systems.clear()

    # -- systems ------------------------------------------------------------------------------
    def system(self, test, owner: str, principal: str | None = None):
        """The system client of `owner` (its service instance) acting as `principal` (a role of PRINCIPALS)."""
        key = (owner, principal or "")
        if key not in self.systems:
            instance = f"{owner}-{test.extra.get('key_nonce', 'x')}"
            if principal is None:
                self.systems[key] = open_system(test, self.node, instance, needs=self.needs)
            else:
                self.systems[key] = LeaseClient(self.node, _api_key_of(test, PRINCIPALS[principal]),
                                                service_instance_id=instance, max_connections=8)
        return self.systems[key]

    async def before_request(self, test, op: dict[str, Any]) -> None:
        """A client-paused thread waits here (the GC-paused holder of the races table)."""
        pauses = test.live.client_pauses
        if pauses is not None:  # naming its systems lets the pause freeze them whole
            await pauses.wait(op["process"], *self.systems.values())

    # -- ops ------------------------------------------------------------------------------------
    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        """Run one scripted op; `fail` only when it definitely did not happen."""
        f, value = op["f"], dict(op.get("value") or {})
        handler = _HANDLERS.get(f)
        if handler is None:
            raise ValueError(f"scenario client: unknown f {f!r}; known: {', '.join(sorted(_HANDLERS))}")
        if f not in ("observe-backend", "observe-audit", "read"):
            await self.before_request(test, op)
        return await handler(self, test, op, value)

    async def _wait_until(self, value: dict[str, Any]) -> None:
        """Hold the op until a lease time plus an offset (`at: {slot, field, offset_ms}`): the TTL boundary."""
        at = value.get("at")
        if not at:
            return
        lease = self.shared.slots.get(at["slot"])
        base = getattr(lease, at.get("field", "expires_at_ms"), None) if lease else None
        if base is not None:
            delay = (base + int(at.get("offset_ms", 0)) - now_ms()) / 1000
            if delay > 0:
                await asyncio.sleep(delay)

    def _deadline(self, value: dict[str, Any]) -> float:
        """The op's deadline in seconds (`deadline_ms` in its value, else the client's)."""
        return value.get("deadline_ms", self.deadline_s * 1000) / 1000

    async def _acquire(self, test, op, value) -> dict[str, Any]:
        """Acquire the op's identity as `owner`, storing the lease under `slot` (C11)."""
        slot = value.get("slot", "A")
        owner = value.get("owner", slot)
        rid = value.get("request_id") or new_request_id()
        ident = self.shared.identity_for(op["key"], value.get("identity"))
        api = self.system(test, owner, value.get("as"))
        await self._wait_until(value)
        sent = now_ms()
        kwargs = {"maximum_lifetime_ms": value["max_lifetime_ms"]} if "max_lifetime_ms" in value else {}
        r = await api.acquire(ident, ttl_ms=value.get("ttl_ms", test.ttl_ms), request_id=rid,
                              deadline_s=self._deadline(value), **kwargs)
        base = {"request_id": rid, "slot": slot, "sent_at_ms": sent}
        if r.ok:
            self.shared.slots[slot] = r.lease
            self.shared.cancelled.discard(slot)
        return _completion(r, base)

    async def _lease_op(self, test, op, value) -> dict[str, Any]:
        """renew / release / force-release / revoke of the lease in `slot` (C12, C13, C15)."""
        f = op["f"]
        slot = value.get("slot", "A")
        rid = value.get("request_id") or new_request_id()
        lease = self.shared.slots.get(slot)
        base = {"request_id": rid, "slot": slot}
        if lease is None:
            return {"type": "fail", "value": base, "error": "not_held"}
        lease = _variant(lease, value.get("lease"))
        base.update(lease_id=lease.lease_id, fencing_token=lease.fencing_token)
        ident = self.shared.identity_for(op["key"], value.get("identity"))
        principal = value.get("as", "force" if f in ("force-release", "revoke") else None)
        api = self.system(test, value.get("owner", slot), None if principal == "self" else principal)
        await self._wait_until(value)
        base["sent_at_ms"] = now_ms()
        deadline = self._deadline(value)
        if f == "renew":
            kwargs = {"ttl_ms": value["ttl_ms"]} if "ttl_ms" in value else {}
            r = await api.renew(lease, identity=ident, request_id=rid, deadline_s=deadline, **kwargs)
        elif f == "release":
            r = await api.release(lease, identity=ident, request_id=rid, deadline_s=deadline)
        elif f == "force-release":
            r = await api.force_release(lease, value.get("reason", "scenario"), identity=ident, request_id=rid,
                                        deadline_s=deadline)
        else:
            r = await api.revoke(lease, value.get("reason", "scenario"), identity=ident, request_id=rid,
                                 deadline_s=deadline, incident_id=value.get("incident_id"))
        if r.ok and f == "renew" and value.get("lease") is None:
            self.shared.slots[slot] = r.lease
        return self._told(slot, r, _completion(r, base))

    def _told(self, slot: str, r: Result, done: dict[str, Any]) -> dict[str, Any]:
        """A definite `lease_lost` reaches the worker's cancellation path: the slot is marked, and the op says so."""
        if r.outcome == "fail" and r.code in ("lease_lost", "stale_token"):
            self.shared.cancelled.add(slot)
            done["value"]["cancelled"] = True
        return done

    async def _commit(self, test, op, value) -> dict[str, Any]:
        """A fenced write to the slot's document (section 7) of an entry `[process, token, n]`."""
        slot = value.get("slot", "A")
        rid = value.get("request_id") or new_request_id()
        lease = self.shared.slots.get(slot)
        doc = value.get("doc") or _doc_id(test, op["key"])
        base: dict[str, Any] = {"request_id": rid, "slot": slot, "doc": doc}
        if lease is None:
            return {"type": "fail", "value": base, "error": "not_held"}
        entry = [op["process"], lease.fencing_token, next(self.shared.entries)]
        base.update(entry=entry, lease_id=lease.lease_id, fencing_token=lease.fencing_token)
        api = self.system(test, value.get("owner", slot))
        base["sent_at_ms"] = now_ms()
        r = await api.commit(lease, doc, {"append": entry}, identity=self.shared.identity_for(op["key"]),
                             request_id=rid, deadline_s=self._deadline(value))
        if r.ok:
            data = (r.data or {}).get("commit") or {}
            if data.get("db"):  # where the boundary says it wrote: the final read looks there
                self.shared.store_db = data["db"]
            base.update(rev=data.get("rev"), accepted_token=data.get("accepted_token"),
                        validated_at_ms=data.get("validated_at_ms"))
        return self._told(slot, r, _completion(r, base))

    async def _inspect(self, test, op, value) -> dict[str, Any]:
        """The identity's current lease (or the slot's lease by id): `null` when none is recorded."""
        api = self.system(test, value.get("owner", "inspector"), value.get("as"))
        by_id = value.get("by_id")
        if by_id:
            lease = self.shared.slots.get(by_id)
            if lease is None:
                return {"type": "fail", "value": None, "error": "not_held"}
            r = await api.inspect(lease.lease_id, deadline_s=self._deadline(value))
        else:
            r = await api.inspect(self.shared.identity_for(op["key"], value.get("identity")),
                                  deadline_s=self._deadline(value))
        if r.ok:
            lease = r.lease
            out = dict(lease.history_value(), lock_key=lease.lock_key) if lease else None
            if out is not None and _stored_identity(lease):
                out["stored_identity"] = _stored_identity(lease)
            if out is not None and lease.ended_at_ms is not None:
                out["ended_at_ms"] = lease.ended_at_ms
            return {"type": "ok", "value": out}
        if r.code == "lease_not_found":
            return {"type": "ok", "value": None, "not_found": True}
        return _completion(r, None)

    async def _list(self, test, op, value) -> dict[str, Any]:
        """One page of list (C14) as principal `as`, with raw `params` for the probes."""
        api = self.system(test, value.get("owner", "lister"), value.get("as"))
        r = await api.list(value.get("params") or {}, deadline_s=self._deadline(value))
        if r.ok:
            return {"type": "ok", "value": {"leases": [{"lease_id": x.lease_id, "lock_key": x.lock_key,
                                                        "target_id": x.target_id, "tenant_id": x.tenant_id}
                                                       for x in r.leases or []], "cursor": r.cursor}}
        return _completion(r, None)

    async def _read(self, test, op, value) -> dict[str, Any]:
        """The slot's document straight from the store (final phase; a read: an error is a definite fail)."""
        doc = value.get("doc") or _doc_id(test, op["key"])
        if not _store_url(test):
            return {"type": "fail", "value": {"doc": doc}, "error": {
                "code": "no_store", "msg": "the run has no store to read: give --store-url (the store the server "
                                           "under test writes into)"}}
        try:
            async with CouchClient(_store_url(test)) as couch:
                d = await couch.get(self.shared.store_db, doc)
        except Exception as e:  # noqa: BLE001 - a failed read changed nothing
            return {"type": "fail", "value": {"doc": doc}, "error": f"{type(e).__name__}: {e}"}
        d = d or {}
        return {"type": "ok", "value": {"doc": doc, "entries": d.get("entries", []), "token": d.get("fence_token")}}

    async def _observe_backend(self, test, op, value) -> dict[str, Any]:
        """The identity's fencing counter, high-water mark and record straight from Valkey (lab stack only)."""
        if not test.live.valkey:
            return {"type": "fail", "value": None, "error": "no_backend_access"}

        k = valkey_keys(self.shared.identity_for(op["key"]))
        client = aioredis.Redis.from_url(test.live.valkey, socket_timeout=2.0)
        try:
            counter, hwm, record = await asyncio.gather(client.get(k["fence"]), client.get(k["hwm"]),
                                                        client.hgetall(k["record"]))
        except Exception as e:  # noqa: BLE001 - a read: it changed nothing
            return {"type": "fail", "value": None, "error": f"{type(e).__name__}: {e}"}
        finally:
            await client.aclose()
        rec = {a.decode(): b.decode(errors="replace") for a, b in record.items()}
        return {"type": "ok", "value": {"counter": _int_or_text(counter), "hwm": _int_or_text(hwm),
                                        "record_lease_id": rec.get("lease_id"), "record": bool(rec)}}

    async def _observe_audit(self, test, op, value) -> dict[str, Any]:
        """Audit events of one lease from the Valkey stream (lab stack only): durable audit, C15."""
        lease = self.shared.slots.get(value.get("slot", "A"))
        if not test.live.valkey or lease is None:
            return {"type": "fail", "value": None, "error": "no_backend_access"}

        client = aioredis.Redis.from_url(test.live.valkey, socket_timeout=2.0)
        try:
            entries = await client.xrange(AUDIT_STREAM)  # the force-release event is XADDed by its own script
        except Exception as e:  # noqa: BLE001 - a read: it changed nothing
            return {"type": "fail", "value": None, "error": f"{type(e).__name__}: {e}"}
        finally:
            await client.aclose()
        events = []
        for _id, fields in entries:
            try:
                ev = event_from_stream(fields)
            except Exception:  # noqa: BLE001 - an unreadable entry is not this lease's evidence
                continue
            if ev.get("lease_id") == lease.lease_id:
                events.append({k: ev.get(k) for k in ("event_type", "result_code", "admin_reason", "principal_id",
                                                      "resulting_state", "incident_id")})
        return {"type": "ok", "value": {"lease_id": lease.lease_id, "events": events}}

    async def _raw(self, test, op, value) -> dict[str, Any]:
        """A raw HTTP request for the probes the typed client refuses to send (no reason, a past deadline, ...).

        The body is the identity of `key`, a request id, a service instance, the slot's token
        (`with_lease`), `body`'s fields, and `deadline_at` unless `deadline` is `omit` (or `past`).
        """
        lease = self.shared.slots.get(value.get("slot", "A"))
        body: dict[str, Any] = dict(self.shared.identity_for(op["key"]).as_dict(),
                                    request_id=value.get("request_id") or new_request_id(),
                                    service_instance_id=f"{value.get('owner', 'probe')}-"
                                                        f"{test.extra.get('key_nonce', 'x')}")
        if lease is not None and value.get("with_lease"):
            body["fencing_token"] = lease.fencing_token
        body.update(value.get("fields") or {})
        if value.get("deadline") != "omit":
            body["deadline_at"] = now_ms() + (-5000 if value.get("deadline") == "past" else 2000)
        path = value["path"].replace("{lease_id}", lease.lease_id if lease else "none")
        key = _api_key_of(test, PRINCIPALS[value["as"]]) if value.get("as") else _default_key(test)
        try:
            async with httpx.AsyncClient(timeout=3.0) as http:
                resp = await http.request(value.get("method", "POST"), self.node.rstrip("/") + path, json=body,
                                          headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as e:
            return {"type": "info", "value": None, "error": {"code": "connection_lost", "msg": str(e)}}
        try:
            env = resp.json()
        except ValueError:
            env = {}
        env = env if isinstance(env, dict) else {}
        out = {"http_status": resp.status_code, "code": env.get("code")}
        if 200 <= resp.status_code < 300:
            return {"type": "ok", "value": out}
        return {"type": "fail" if resp.status_code < 500 else "info", "value": out,
                "error": {"code": env.get("code") or f"http_{resp.status_code}", "msg": env.get("msg")}}


def _completion(r: Result, base: dict[str, Any]) -> dict[str, Any]:
    """The completion of a lease API result: the lease fields on ok, the typed error otherwise."""
    value = dict(base) if base is not None else None
    if r.ok and r.lease is not None:
        value = dict(base, **r.lease.history_value(), lock_key=r.lease.lock_key)
        stored = _stored_identity(r.lease)
        if stored:
            value["stored_identity"] = stored
        if r.lease.ended_at_ms is not None:
            # not `ended_at_ms`: checkers.lease_state reads that as the end and counts a renew in the same
            # millisecond as "after" it, although the backend may have ordered the renew first in that ms
            value["end_backend_ms"] = r.lease.ended_at_ms
        if (r.data or {}).get("replayed"):
            value["replayed"] = True
    op: dict[str, Any] = {"type": r.outcome, "value": value}
    if r.outcome != "ok":
        op["error"] = {"code": r.code, "msg": r.msg} if r.msg else r.code
    return op


def _stored_identity(lease: Lease) -> dict[str, str] | None:
    """The identity tuple the record carries (C4), as the system reported it; None when it reports none."""
    got = {n: getattr(lease, n) for n in IDENTITY_FIELDS if getattr(lease, n, None) is not None}
    return got or None


def _variant(lease: Lease, changes: dict[str, Any] | None) -> Lease:
    """The lease as a probe presents it: a wrong token or lease id (C12: every field must match)."""
    if not changes:
        return lease

    changes = dict(changes)
    if "fencing_token_delta" in changes:
        changes["fencing_token"] = lease.fencing_token + int(changes.pop("fencing_token_delta"))
    return dataclasses.replace(lease, **changes)


def _int_or_text(raw: bytes | None) -> int | str | None:
    """A Valkey string as an int when it is one (a counter), else as text (a corrupted one)."""
    if raw is None:
        return None
    text = raw.decode(errors="replace")
    return int(text) if text.isdigit() else text


def _doc_id(test, key: str) -> str:
    """The document a script key's holders write: run-unique, as the identities are (a store outlives a run)."""
    return f"doc-{test.extra.get('key_nonce', 'x')}-{key}"


def _store_url(test) -> str | None:
    """The run's store with its credentials (test.live.store is the redacted form kept in test.json)."""
    return test.live.store_url or test.live.store


def _api_key_of(test, principal_id: str) -> str:
    """The API key of one of the stack's demo principals (local stack only)."""
    for c in test.credentials():
        if c.get("principal_id") == principal_id:
            return c["api_key"]
    raise ValueError(f"the stack has no principal {principal_id!r}")


def _default_key(test) -> str:
    """The run's own API key (the SUT's key file, the stack's credentials, or the environment)."""
    return api_key_for(test)


_HANDLERS = {
    "acquire": ScenarioDriver._acquire, "renew": ScenarioDriver._lease_op, "release": ScenarioDriver._lease_op,
    "force-release": ScenarioDriver._lease_op, "revoke": ScenarioDriver._lease_op, "commit": ScenarioDriver._commit,
    "inspect": ScenarioDriver._inspect, "list": ScenarioDriver._list, "read": ScenarioDriver._read,
    "observe-backend": ScenarioDriver._observe_backend, "observe-audit": ScenarioDriver._observe_audit,
    "raw": ScenarioDriver._raw,
}

__all__ = ["DB", "PRINCIPALS", "ScenarioDriver", "Shared"]
