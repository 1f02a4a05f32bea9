"""Scenario faults: direct writes into Valkey (corrupt a record, a counter near its limit) and the scenario nemesis.

Two rows of the races table need the backend itself in a state no API call
produces: "malformed / corrupt record" and "counter near its numeric limit".
`ValkeyPoke` is a nemesis (process `"nemesis"`, `info` ops with `fault` and
`phase`, a heal at teardown) that writes those states straight into the run's
own Valkey, so the faults are in the history like any other and the evidence
lists them.

The Valkey keys are derived here from the contract's formula (C3) with the
standard library, not from the server's code: the probes use the same
function as an independent check of the server's key derivation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from typing import Any

import redis.asyncio as aioredis

from lab.sut.target import target_of
from nemesis import process_faults
from nemesis.core import NemesisUnavailable, completion, compose
from nemesis.registry import build
from lab.testmap import Test

KEY_PREFIX = "starintel:target-lease:v1:"
IDENTITY_ORDER = ("tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name",
                  "operation_class")
CORRUPTIONS = ("token", "identity", "version", "missing-field", "garbage", "counter")


def contract_lock_key(values: dict[str, str] | Any) -> str:
    """C3 from the contract's text: prefix + base64url_nopad(sha256(utf8(compact JSON array of the tuple)))."""
    d = values if isinstance(values, dict) else values.as_dict()
    tuple_json = json.dumps([d[n] for n in IDENTITY_ORDER], separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(tuple_json.encode("utf-8")).digest()
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def valkey_keys(identity: Any) -> dict[str, str]:
    """The Valkey keys of one identity on the reference server (docs/server.md, key layout)."""
    lock_key = contract_lock_key(identity)
    return {"record": lock_key, "fence": lock_key + ":fence", "hwm": lock_key + ":hwm"}


class ValkeyPoke:
    """A nemesis writing states into Valkey that the lease API never writes (see the module docstring).

    f `corrupt-record` (value `{key, how}`, how one of CORRUPTIONS) / `repair-record`;
    f `set-counter` (value `{key, value}`) / `end-counter-fault` (closes the window, changes nothing:
    lowering a counter would itself break C5). Teardown repairs every corruption still in place.
    """

    name = "valkey-poke"
    fs = frozenset({"corrupt-record", "repair-record", "set-counter", "end-counter-fault"})

    def __init__(self, identity_for):
        self.identity_for = identity_for  # script key -> lab.client.Identity
        self.client = None
        self.saved: dict[str, dict[str, Any]] = {}  # key -> what to put back at repair

    async def setup(self, test: Test) -> None:
        """Connect to the run's own Valkey (test.live.valkey)."""
        if not test.live.valkey:
            raise NemesisUnavailable("the valkey-poke fault writes into the lab's own Valkey: the run has none")
        self.client = aioredis.Redis.from_url(test.live.valkey, socket_timeout=3.0)

    async def invoke(self, test: Test, op: dict) -> dict:
        """Perform one poke; the completion records exactly what was written."""
        value = dict(op.get("value") or {})
        key = value.get("key")
        if not isinstance(key, str) or not key:
            raise ValueError(f"{op['f']}: value needs a script key, e.g. {{'key': 'k0'}}, not {value!r}")
        k = valkey_keys(self.identity_for(key))
        if op["f"] == "corrupt-record":
            return completion(op, await self._corrupt(key, k, value.get("how", "token")))
        if op["f"] == "repair-record":
            return completion(op, await self._repair(key, k))
        if op["f"] == "set-counter":
            n = value.get("value")
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"set-counter: value must be an integer >= 0, not {n!r}")
            before = await self.client.get(k["fence"])
            await self.client.set(k["fence"], str(n))
            return completion(op, {"fault": "counter-near-limit", "phase": "start", "key": key, "value": n,
                                   "before": _text(before)})
        return completion(op, {"fault": "counter-near-limit", "phase": "end", "key": key})

    async def _corrupt(self, key: str, k: dict[str, str], how: str) -> dict[str, Any]:
        """Write one kind of corruption; remember what repairs it."""
        if how not in CORRUPTIONS:
            raise ValueError(f"corrupt-record: how must be one of {', '.join(CORRUPTIONS)}, not {how!r}")
        c = self.client
        if how == "counter":
            self.saved[key] = {"counter": await c.get(k["fence"])}
            await c.set(k["fence"], "not-a-number")
        else:
            self.saved[key] = {"record": True}
            if how == "token":
                await c.hset(k["record"], "fencing_token", "12abc")
            elif how == "identity":
                other = dict(self.identity_for(key).as_dict(), target_id=key + "-someone-else")
                await c.hset(k["record"], "identity", json.dumps([other[n] for n in IDENTITY_ORDER],
                                                                 separators=(",", ":")))
            elif how == "version":
                await c.hset(k["record"], "record_version", "9")
            elif how == "missing-field":
                await c.hdel(k["record"], "owner_principal_id")
            else:
                await c.delete(k["record"])
                await c.hset(k["record"], mapping={"junk": "\x00not a lease", "state": "active"})
        exists = bool(await c.exists(k["record"]))
        return {"fault": "corrupt-record", "phase": "start", "key": key, "how": how, "record_exists": exists}

    async def _repair(self, key: str, k: dict[str, str]) -> dict[str, Any]:
        """Undo a corruption: drop the damaged record (its lease is gone), or put the counter back."""
        saved = self.saved.pop(key, None)
        if saved is None:
            return {"fault": "corrupt-record", "phase": "end", "key": key, "repaired": None}
        if "counter" in saved:
            if saved["counter"] is None:
                await self.client.delete(k["fence"])
            else:
                await self.client.set(k["fence"], saved["counter"])
            return {"fault": "corrupt-record", "phase": "end", "key": key, "repaired": "counter"}
        await self.client.delete(k["record"])
        return {"fault": "corrupt-record", "phase": "end", "key": key, "repaired": "record deleted"}

    async def teardown(self, test: Test) -> None:
        """Repair what is still corrupted, then disconnect."""
        if self.client is None:
            return
        try:
            for key in list(self.saved):
                await self._repair(key, valkey_keys(self.identity_for(key)))
        finally:
            client, self.client = self.client, None
            await client.aclose()


def _text(raw: bytes | None) -> str | None:
    """A Valkey reply as text (None stays None)."""
    return None if raw is None else raw.decode(errors="replace")


def build_nemesis(test: Test, scenario: Any, identity_for) -> Any:
    """The scenario's composed nemesis: registry nemeses over the stack, client pauses, Valkey pokes.

    Always a nemesis (possibly with no member), so scripts can time steps on the nemesis thread.
    """
    members: list[Any] = []
    target = target_of(test)
    if scenario.nemeses and target.lab_runs:
        registered, _random_lane = build(test, list(scenario.nemeses), interval_s=1.0, seed=test.seed,
                                         builders=target.fault_builders())
        members.append(registered)
    if scenario.client_pause:
        if test.live.client_pauses is None:
            test.live.client_pauses = process_faults.ClientPauses(test.concurrency)
        pauses = test.live.client_pauses
        members.append(process_faults.client_pause(pauses, rng=random.Random(f"{test.seed}:client-pause"),
                                            max_duration_s=30))
    if scenario.pokes:
        members.append(ValkeyPoke(identity_for))
    return compose(members)
