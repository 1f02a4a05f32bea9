"""client-pause stops a client whole: a heartbeat thread of its own no longer keeps its session alive (issue 18.1).

The system here is a lock recipe in the style of a coordination service's: the lock is held by a session with a
short TTL on the server, and the client keeps that session alive from a real `threading.Thread` heartbeat, between
calls, whatever the worker does. The lab's gate holds the worker's requests; only the system's `freeze()` stops the
heartbeat. Run through the lease workload's own driver and the client-pause nemesis:

- with freeze()/thaw() declared, a pause longer than the session TTL loses the session: the renew the worker sent
  into the pause fails with `lease_lost` after the resume;
- the same client with the gate alone (no hooks) keeps its session through the same pause, and its renew is
  ok: the fault did nothing (today's gate-only pause, the contrast that makes the first case fail without freeze);
- a system that declares background activity and no hooks is refused client-pause before anything starts.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest

from lab.client import Lease, Result
from lab.runner import RunError, run_test
from lab.sut.registry import register_sut, unregister_sut
from lab.testmap import Test
from nemesis.core import invocation as op
from nemesis.process_faults import ClientPauses, client_pause
from workloads.lease import LeaseDriver

SESSION_TTL_S = 1.0  # the server ends a session this long after its last heartbeat
HEARTBEAT_S = 0.05   # the client's heartbeat thread beats this often (20 beats per TTL: slack for a busy machine)


class SessionServer:
    """A tiny in-process coordination service: sessions with a TTL, and locks owned by a live session."""

    def __init__(self, ttl_s: float = SESSION_TTL_S):
        self.ttl_s = ttl_s
        self._mutex = threading.Lock()  # the heartbeat thread and the event loop both call in
        self._deadline: dict[int, float] = {}  # session -> monotonic time it ends (absent: ended, for good)
        self._locks: dict[str, tuple[int, str, int]] = {}  # key -> (session, lease_id, token)
        self._ids = itertools.count(1)
        self.beats = 0

    def _alive(self, session: int) -> bool:
        end = self._deadline.get(session)
        if end is not None and end <= time.monotonic():
            del self._deadline[session]  # an expired session never comes back
            return False
        return end is not None

    def open_session(self) -> int:
        with self._mutex:
            session = next(self._ids)
            self._deadline[session] = time.monotonic() + self.ttl_s
            return session

    def keepalive(self, session: int) -> bool:
        """Extend a live session; False once it has ended."""
        with self._mutex:
            if not self._alive(session):
                return False
            self._deadline[session] = time.monotonic() + self.ttl_s
            self.beats += 1
            return True

    def session_alive(self, session: int) -> bool:
        with self._mutex:
            return self._alive(session)

    def lock(self, session: int, key: str) -> tuple[str, int] | None:
        """Take `key` for the session: (lease_id, token), or None when a live session holds it."""
        with self._mutex:
            if not self._alive(session):
                return None
            held = self._locks.get(key)
            if held is not None and self._alive(held[0]):
                return None
            n = next(self._ids)
            self._locks[key] = (session, f"lock-{n}", n)
            return self._locks[key][1:]

    def holds(self, session: int, key: str, lease_id: str) -> bool:
        with self._mutex:
            held = self._locks.get(key)
            return held is not None and held[:2] == (session, lease_id) and self._alive(session)

    def unlock(self, session: int, key: str, lease_id: str) -> bool:
        with self._mutex:
            held = self._locks.get(key)
            if held is None or held[:2] != (session, lease_id) or not self._alive(session):
                return False
            del self._locks[key]
            return True


def _now_ms() -> int:
    return int(time.time() * 1000)


class HeartbeatLockSystem:
    """A worker's client: one session, kept alive by a heartbeat thread; its locks live as long as the session."""

    background = True
    opened = 0  # how many clients were opened (the refusal must come before any)

    def __init__(self, test, node, service_instance_id):
        type(self).opened += 1
        self.server: SessionServer = test.live["session_server"]
        self.service_instance_id = service_instance_id
        self.session = self.server.open_session()
        self._keys: dict[str, str] = {}  # lease_id -> key
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(self._stop,), daemon=True, name="heartbeat")
        self._thread.start()

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_S):
            if not self.server.keepalive(self.session):
                return

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def freeze(self) -> None:
        """Stop the heartbeat thread (what SIGSTOP would do to it)."""
        self._stop_heartbeat()

    def thaw(self) -> None:
        """Start beating again (a session that ended meanwhile stays ended)."""
        self._start_heartbeat()

    def _lease(self, lease_id: str, token: int, state: str = "active") -> Lease:
        now = _now_ms()
        return Lease(lease_id=lease_id, fencing_token=token, state=state, acquired_at_ms=now,
                     expires_at_ms=now + int(self.server.ttl_s * 1000), service_instance_id=self.service_instance_id)

    async def acquire(self, identity, *, ttl_ms, request_id=None, deadline_s=None) -> Result:
        key = repr(identity)
        won = self.server.lock(self.session, key)
        if won is None:
            return Result("fail", "lease_conflict")
        self._keys[won[0]] = key
        return Result("ok", "lease_acquired", lease=self._lease(*won))

    async def renew(self, lease, *, identity=None, request_id=None, deadline_s=None) -> Result:
        key = self._keys.get(lease.lease_id)
        if key is None or not self.server.holds(self.session, key, lease.lease_id):
            return Result("fail", "lease_lost")
        return Result("ok", "lease_renewed", lease=self._lease(lease.lease_id, lease.fencing_token))

    async def release(self, lease, *, identity=None, request_id=None, deadline_s=None) -> Result:
        key = self._keys.pop(lease.lease_id, None)
        if key is None or not self.server.unlock(self.session, key, lease.lease_id):
            return Result("fail", "lease_lost")
        return Result("ok", "lease_released", lease=self._lease(lease.lease_id, lease.fencing_token, "released"))

    async def inspect(self, target, *, deadline_s=None) -> Result:
        return Result("fail", "lease_not_found")

    async def aclose(self) -> None:
        self._stop_heartbeat()


class GateOnlyLockSystem(HeartbeatLockSystem):
    """The same client without hooks, declared quiet: the pause can only hold its requests at the gate."""

    background = False
    freeze = None
    thaw = None


class UndeclaredFreezeLockSystem(HeartbeatLockSystem):
    """The same client, declaring its heartbeat but no way to stop it."""

    freeze = None
    thaw = None


@pytest.fixture
def suts():
    names = {"frozen": HeartbeatLockSystem, "gate-only": GateOnlyLockSystem, "unfreezable": UndeclaredFreezeLockSystem}
    for name, cls in names.items():
        register_sut(f"heartbeat-{name}", cls, replace=True)
    yield {name: f"heartbeat-{name}" for name in names}
    for name in names:
        unregister_sut(f"heartbeat-{name}")


async def _wait_for(predicate, bound_s: float = 20.0) -> bool:
    """Poll `predicate` until it holds, up to a generous bound."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def pause_past_the_session(sut: str) -> dict:
    """Acquire through the lease workload's driver, pause its thread, send a renew into the pause, hold the pause
    three session TTLs (and until the session is gone, when the client is frozen), resume: what each step saw."""
    test = Test(sut=sut, concurrency=1, ttl_ms=int(SESSION_TTL_S * 1000))
    server = test.live["session_server"] = SessionServer()
    pauses = test.live["client_pauses"] = ClientPauses(1)
    nem = client_pause(pauses, rng=1)
    driver = await LeaseDriver(ttl_ms=test.ttl_ms).open(test, "in-process")
    try:
        acquired = await driver.invoke(test, {"process": 0, "f": "acquire", "key": "k0", "value": {}})
        assert acquired["type"] == "ok", acquired
        session = driver.api.session
        started = await nem.invoke(test, op("start-client-pause", {"thread": 0}))
        renew = asyncio.create_task(driver.invoke(test, {"process": 0, "f": "renew", "key": "k0", "value": {}}))
        beats = server.beats
        await asyncio.sleep(3 * SESSION_TTL_S)
        if sut.endswith("frozen"):
            await _wait_for(lambda: not server.session_alive(session))
        held = not renew.done()  # the gate still holds the worker's request
        alive_in_pause, beats_in_pause = server.session_alive(session), server.beats - beats
        stopped = await nem.invoke(test, op("stop-client-pause"))
        renewed = await asyncio.wait_for(renew, 10)
        await nem.teardown(test)
    finally:
        await driver.close(test)
    return {"started": started["value"], "stopped": stopped["value"], "held": held, "renewed": renewed,
            "alive_in_pause": alive_in_pause, "beats_in_pause": beats_in_pause}


async def test_a_frozen_client_loses_its_session_under_the_pause(suts):
    seen = await pause_past_the_session(suts["frozen"])
    assert seen["held"], "the gate holds the renew the worker sent into the pause"
    assert seen["beats_in_pause"] == 0, "freeze() stopped the heartbeat thread"
    assert not seen["alive_in_pause"], "the session ended while the client was paused"
    assert seen["renewed"]["type"] == "fail" and seen["renewed"]["error"] == "lease_lost", seen["renewed"]
    assert "freeze_errors" not in seen["started"] and "thaw_errors" not in seen["stopped"]


async def test_with_the_gate_alone_the_heartbeat_keeps_the_session_through_the_pause(suts):
    """The contrast: the same client, the same pause, no freeze: the pause did nothing to the lock."""
    seen = await pause_past_the_session(suts["gate-only"])
    assert seen["held"], "the gate holds the renew the worker sent into the pause"
    assert seen["beats_in_pause"] > 0 and seen["alive_in_pause"], "the heartbeat thread kept beating"
    assert seen["renewed"]["type"] == "ok", seen["renewed"]


def test_background_activity_without_hooks_is_refused_before_anything_starts(suts, tmp_path):
    UndeclaredFreezeLockSystem.opened = 0
    test = Test(sut=suts["unfreezable"], nemesis=["client-pause"], time_limit=1.0, concurrency=1)
    with pytest.raises(RunError) as err:
        run_test(test, tmp_path / "store")
    line = str(err.value)
    assert line.startswith("--nemesis client-pause: SUT 'heartbeat-unfreezable'") and "\n" not in line
    assert "declares background activity" in line and "background = False" in line and "freeze()/thaw()" in line
    assert UndeclaredFreezeLockSystem.opened == 0 and not (tmp_path / "store").exists()


class _Raises:
    """Hooks that fail: the pause goes on, and the nemesis op says what raised."""

    def __init__(self):
        self.thawed = 0

    async def freeze(self) -> None:
        raise RuntimeError("cannot stop the watchdog")

    def thaw(self) -> None:
        self.thawed += 1
        raise OSError("socket gone")


async def test_a_hook_that_raises_is_recorded_in_the_nemesis_op():
    pauses = ClientPauses(2)
    nem = client_pause(pauses, rng=1, duration_s=0.05)
    system = _Raises()
    await pauses.wait(1, system)  # the worker on thread 1 names its system at its gate
    started = await nem.invoke(None, op("start-client-pause", {"thread": 1}))
    assert started["value"]["freeze_errors"] == ["freeze(): RuntimeError: cannot stop the watchdog"]
    assert pauses.paused == [1]  # the gate closed all the same
    await asyncio.wait_for(pauses.wait(1), 5)  # the timer resumed it (and thawed)
    stopped = await nem.invoke(None, op("stop-client-pause"))
    assert stopped["value"]["resumed_by"] == "timer"
    assert stopped["value"]["thaw_errors"] == ["thaw(): OSError: socket gone"] and system.thawed == 1
    await nem.invoke(None, op("start-client-pause", {"thread": 1, "duration_s": 30}))
    with pytest.raises(RuntimeError, match="client-pause heal: thaw\\(\\): OSError: socket gone"):
        await nem.teardown(None)
    assert pauses.paused == [] and system.thawed == 2


def test_a_scenario_that_pauses_clients_is_refused_for_a_client_that_cannot_be_frozen(suts):
    from lab.scenarios import SCENARIOS, ScenarioError  # the scenario layer: only this test needs it
    from lab.scenarios.scenario import validate_scenario

    test = Test(sut=suts["unfreezable"], extra={"scenario": "delayed-cleanup-vs-successor"}, concurrency=4)
    with pytest.raises(ScenarioError, match=r"--scenario delayed-cleanup-vs-successor: --nemesis client-pause: SUT "
                                            r"'heartbeat-unfreezable' \(.*\) declares background activity"):
        validate_scenario(test, SCENARIOS)
