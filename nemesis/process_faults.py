"""Process faults: crash (SIGKILL + restart) and pause (SIGSTOP / SIGCONT) the lab's own processes.

Targets are the system under test's processes that a `LocalStack` owns: the
lease servers (`lease-1`, ...), Valkey (`valkey`) and the store (`store`);
Toxiproxy is the lab's instrument, never a target. Each target is the stack's
`ManagedProcess`, so a restart runs the same argv, environment (a fake clock
stays on) and data directory, on the same port.

- `kill` (`start-kill` / `stop-kill`): SIGKILL the chosen targets; they are
  restarted at the stop op, or by a timer `restart_after_s` after the kill.
  Valkey comes back from its own files, so what survives depends on its
  persistence (`none`: nothing, `everysec`: up to ~1 s lost, `always`:
  every acknowledged write).
- `pause` (`start-pause` / `stop-pause`): SIGSTOP the chosen targets, SIGCONT
  at the stop op: a process that is alive, holds its sockets, and answers
  nothing (a long GC pause, a VM freeze).
- `client-pause` (`start-client-pause` / `stop-client-pause`): the lab's
  clients are asyncio tasks in the lab process, so they cannot be SIGSTOPped;
  instead workload clients call `await pauses.wait(process)` at the points
  where a real worker could stall (before sending a request, between
  validating and writing a fenced commit), and this nemesis holds one client
  thread there: the classic GC-paused lease holder that wakes up stale. What
  the worker's system runs on its own between calls (a heartbeat thread) is
  stopped by the system's `freeze()` / `thaw()` hooks, which the pause calls;
  a system that declares neither the hooks nor `background = False` is
  refused the fault (lab.sut.registry.freeze_problem).

Every op completes as an `info` op whose value has `fault` and `phase`
(`start` / `end` / `none`, see docs/nemesis.md) plus exactly what was done:
targets, pids, signals, who restarted what. The heal (teardown) resumes every
stopped target and restarts every dead one, backends first, and raises unless
all targets are running, not stopped, and answering afterwards.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx
import psutil

from lab.stack.process import Process, ProcessError
from nemesis.core import NemesisUnavailable, Rounds, as_rng, completion
from lab.stack.topology import role
from lab.testmap import Test

__all__ = [
    "ClientPauseNemesis",
    "ClientPauses",
    "KillNemesis",
    "PauseNemesis",
    "ProcessHealError",
    "client_target",
    "client_thread",
    "heal_order",
    "heal_processes",
    "is_stopped",
    "kill",
    "kill_process",
    "pause",
    "client_pause",
    "client_pause_replay",
    "kill_replay",
    "pause_replay",
    "restart_process",
    "stack_targets",
    "wait_ready",
]

TARGET_ROLES = ("valkey", "store", "lease server")
RESTART_TIMEOUT_S = 15.0
MAX_CLIENT_PAUSE_S = 600.0
# how long an armed client pause (`"holding": true`) waits for a thread to act on a held lease: a busy workload
# has one within milliseconds; a run where none comes says so instead of pausing nobody in silence
HOLDING_WAIT_S = 5.0


class ProcessHealError(RuntimeError):
    """A process could not be brought back (dead, still stopped, or not answering) by the heal."""


# -- validation helpers -------------------------------------------------------
def _seconds(param: str, value: Any, *, allow_none: bool = False, maximum: float = 3600.0) -> float | None:
    """A number of seconds in (0, maximum] (or None when allowed), or ValueError naming `param`."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= maximum:
        raise ValueError(f"{param} must be a number of seconds in (0, {maximum:g}]"
                         f"{' or null' if allow_none else ''}, got {value!r}")
    return float(value)


def _role(name: str) -> str | None:
    """The target role of a stack process name, or None when it is not a target."""
    if name in ("valkey", "store"):
        return name
    if name.startswith("lease-"):
        return "lease server"
    if role(name) == "server":  # a member of a system that brings its own processes (lab.sut.processes)
        return "member"
    return None


def heal_order(names: Iterable[str]) -> list[str]:
    """Names in the order a heal brings them back: Valkey, the store, then the lease servers."""
    rank = {"valkey": 0, "store": 1}
    return sorted(names, key=lambda n: (rank.get(n, 2), len(n), n))


def stack_targets(stack: Any, targets: Sequence[str] | None = None) -> dict[str, Process]:
    """The stack's target processes (lease servers, Valkey, the store), or the named subset of them."""
    procs = {p.name: p for p in getattr(stack, "processes", []) if _role(p.name)}
    if not procs:
        raise ValueError("the stack has no lease server, Valkey or store process (is it up?)")
    if targets is None:
        return {n: procs[n] for n in heal_order(procs)}
    unknown = [t for t in targets if t not in procs]
    if unknown:
        raise ValueError(f"unknown process targets {unknown}; the stack has {', '.join(heal_order(procs))}")
    return {n: procs[n] for n in heal_order(dict.fromkeys(targets))}


def _check_processes(processes: Any) -> dict[str, Process]:
    """A non-empty name -> Process mapping (lab.stack.process.Process: a host pid, a remote one, a container)."""
    if not isinstance(processes, Mapping) or not processes:
        raise ValueError(f"processes must be a non-empty mapping of name -> Process, got {processes!r}")
    bad = [n for n, p in processes.items() if not isinstance(p, Process)]
    if bad:
        raise ValueError(f"processes {bad} are not lab.stack.process.Process handles")
    return {n: processes[n] for n in heal_order(processes)}


def _check_targets(param: str, targets: Any, known: Sequence[str]) -> list[str]:
    """A non-empty list of known names (deduplicated, heal order), or ValueError naming `param`."""
    if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets:
        raise ValueError(f"{param} must be a non-empty list of {', '.join(known)}, got {targets!r}")
    unknown = [t for t in targets if t not in known]
    if unknown:
        raise ValueError(f"{param}: unknown targets {unknown}; known: {', '.join(known)}")
    return heal_order(dict.fromkeys(targets))


# -- process primitives -------------------------------------------------------
def is_stopped(proc: Process) -> bool:
    """Is the process alive but stopped (SIGSTOP; for a container, paused)?"""
    paused = getattr(proc, "paused", None)
    if callable(paused):  # a compose ContainerProcess knows it through the Docker API
        return paused()
    stopped = getattr(proc, "stopped", None)
    if callable(stopped):  # a remote process (SSH backend) knows it from the remote host
        return stopped()
    if not proc.alive():
        return False
    try:
        return psutil.Process(proc.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _answers(proc: Process) -> bool:
    """Is the process serving? Its health probe; for a lease server any /healthz answer
    (it says 503 while its Valkey is down, and that is the backend's fault, not the server's)."""
    if getattr(proc, "serves_leases", False):  # LeaseServerProcess, RemoteLeaseServer
        try:
            return httpx.get(proc.url + "/healthz", timeout=0.5).status_code in (200, 503)
        except httpx.HTTPError:
            return False
    return proc.healthy()


async def wait_ready(proc: Process, timeout_s: float = RESTART_TIMEOUT_S) -> bool:
    """Poll (off the event loop) until `proc` answers; False if it dies or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            return False
        if await asyncio.to_thread(_answers, proc):
            return True
        await asyncio.sleep(0.05)
    return False


def _spawn(proc: Process) -> None:
    """Start `proc` without ManagedProcess.start's blocking health wait (`wait_ready` polls it instead).

    The spawn must run on the event loop's own (long-lived) thread: a run's
    processes get PR_SET_PDEATHSIG, which Linux fires when the *thread* that
    forked them exits, so a process started from `asyncio.to_thread` would be
    SIGKILLed when that worker thread goes away.
    """
    proc.start(wait=False)


async def kill_process(proc: Process) -> int | None:
    """SIGKILL `proc` (stopped or not) and reap it; its old pid, or None if it was not running."""
    if not proc.alive():
        return None
    pid = proc.pid
    await asyncio.to_thread(proc.kill)
    proc.stop()  # the process is gone: this only closes its log file, so a restart does not leak it
    return pid


async def restart_process(proc: Process, timeout_s: float = RESTART_TIMEOUT_S) -> dict[str, Any]:
    """Start a dead `proc` again and wait until it answers: `{"pid", "ready"}` (an alive one is left alone)."""
    if proc.alive():
        return {"pid": proc.pid, "ready": await wait_ready(proc, timeout_s), "already_running": True}
    try:
        _spawn(proc)
    except ProcessError as e:
        return {"pid": None, "ready": False, "error": str(e)}
    return {"pid": proc.pid, "ready": await wait_ready(proc, timeout_s)}


async def _stop_signal(proc: Process) -> bool:
    """SIGSTOP `proc` and wait (briefly) until the kernel reports it stopped."""
    proc.pause()
    for _ in range(100):
        if is_stopped(proc):
            return True
        await asyncio.sleep(0.01)
    return is_stopped(proc)


async def heal_processes(processes: Mapping[str, Process], *,
                         timeout_s: float = RESTART_TIMEOUT_S) -> dict[str, str]:
    """Resume every stopped and restart every dead process (backends first); raise unless all answer.

    Returns what was done per name (`resumed`, `restarted`, `ok`).
    """
    actions: dict[str, str] = {}
    for name in heal_order(processes):  # resume first: a restarted server needs its Valkey answering
        proc = processes[name]
        if is_stopped(proc):
            proc.resume()
            actions[name] = "resumed"
    for name in heal_order(processes):
        proc = processes[name]
        if not proc.alive():
            await restart_process(proc, timeout_s)
            actions[name] = "restarted"
    problems = []
    for name in heal_order(processes):
        proc = processes[name]
        actions.setdefault(name, "ok")
        if not proc.alive():
            problems.append(f"{name} is not running (log {proc.log_path})")
        elif is_stopped(proc):
            problems.append(f"{name} (pid {proc.pid}) is still stopped")
        elif not await wait_ready(proc, timeout_s):
            problems.append(f"{name} (pid {proc.pid}) does not answer")
    if problems:
        raise ProcessHealError("heal failed: " + "; ".join(problems))
    return actions


def _persistence(proc: Process) -> dict[str, Any]:
    """Valkey's persistence mode, for the record (what a crash can lose)."""
    mode = getattr(proc, "persistence", None)
    return {"persistence": mode} if mode is not None else {}


# -- kill and pause ---------------------------------------------------------------
class _ProcessFault:
    """Shared parts of kill and pause: targets, drawing them, the heal."""

    fault = "process"
    value_keys = frozenset({"targets"})

    def __init__(self, processes: Mapping[str, Process], *, rng: Any, targets: Sequence[str] | None = None,
                 restart_timeout_s: float = RESTART_TIMEOUT_S, leader: Callable[[], str | None] | None = None):
        self.processes = _check_processes(processes)
        self.leader = leader  # who leads, where the system can say (etcd): recorded at each start and stop
        self.name = self.fault
        self.rng = as_rng(rng)
        self.rounds = Rounds(self.rng)  # every target once per round
        self.targets = (_check_targets("targets", targets, list(self.processes)) if targets is not None
                        else list(self.processes))
        self.restart_timeout_s = _seconds("restart_timeout_s", restart_timeout_s, maximum=600)
        self._active: list[str] = []  # the targets this fault currently holds down

    @property
    def fs(self) -> frozenset[str]:
        """`start-<fault>` and `stop-<fault>`."""
        return frozenset({f"start-{self.fault}", f"stop-{self.fault}"})

    async def setup(self, test: Test) -> None:
        """Every target must be running now (a fault on a dead process would prove nothing)."""
        dead = [n for n in self.targets if not self.processes[n].alive()]
        if dead:
            raise NemesisUnavailable(f"{self.fault}: target processes {', '.join(dead)} are not running")

    async def invoke(self, test: Test, op: dict) -> dict:
        """Start or stop the fault; the completion records exactly what was done."""
        f = op.get("f")
        if f == f"start-{self.fault}":
            return await self._start(op, self._value(op.get("value")))
        if f == f"stop-{self.fault}":
            return await self._stop(op)
        raise ValueError(f"{self.fault} nemesis does not handle f {f!r}; it handles {', '.join(sorted(self.fs))}")

    async def teardown(self, test: Test) -> None:
        """Resume and restart every target; raise unless all of them answer afterwards."""
        await self._cancel_timer()
        await heal_processes({n: self.processes[n] for n in self.targets}, timeout_s=self.restart_timeout_s)
        self._active = []

    def _value(self, value: Any) -> dict[str, Any]:
        """A start op's value: null or an object with known keys."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError(f"start-{self.fault} value must be null or an object, got {value!r}")
        unknown = set(value) - self.value_keys
        if unknown:
            raise ValueError(f"start-{self.fault}: unknown value key(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(sorted(self.value_keys))}")
        return value

    def _choose(self, value: dict[str, Any]) -> list[str]:
        """The targets of one start: given, or one drawn from the configured targets."""
        if "targets" in value:
            return _check_targets("targets", value["targets"], self.targets)
        return [self.rounds.pick("target", self.targets)]

    async def _cancel_timer(self) -> None:
        """Stop a pending timed restart, if this fault has one."""

    async def _leader(self) -> dict[str, Any]:
        """`{"leader": name or None}` by the system's own report, when it can say who leads; else nothing."""
        if self.leader is None:
            return {}
        try:
            return {"leader": await asyncio.to_thread(self.leader)}
        except Exception as e:  # the fault goes on; the completion says the leader could not be read
            return {"leader": None, "leader_error": f"{type(e).__name__}: {e}"[:200]}

    async def _start(self, op: dict, value: dict[str, Any]) -> dict:
        raise NotImplementedError

    async def _stop(self, op: dict) -> dict:
        raise NotImplementedError


class KillNemesis(_ProcessFault):
    """SIGKILL chosen targets; restart them at the stop op or `restart_after_s` later."""

    fault = "kill"
    value_keys = frozenset({"targets", "restart_after_s"})

    def __init__(self, processes: Mapping[str, Process], *, rng: Any, targets: Sequence[str] | None = None,
                 restart_after_s: float | None = None, restart_timeout_s: float = RESTART_TIMEOUT_S,
                 leader: Callable[[], str | None] | None = None):
        super().__init__(processes, rng=rng, targets=targets, restart_timeout_s=restart_timeout_s, leader=leader)
        self.restart_after_s = _seconds("restart_after_s", restart_after_s, allow_none=True)
        self._timer: asyncio.Task | None = None
        self._timer_restarts: dict[str, Any] = {}

    async def _start(self, op: dict, value: dict[str, Any]) -> dict:
        """Kill the targets (phase start), unless a kill is already active (phase none)."""
        if self._active:
            return completion(op, {"fault": self.fault, "phase": "none", "active": list(self._active)},
                              error=f"{self.fault} is already active on {', '.join(self._active)}; stop it first")
        targets = self._choose(value)
        after = _seconds("restart_after_s", value.get("restart_after_s", self.restart_after_s), allow_none=True)
        leader = await self._leader()  # before the kill: who led when the fault hit
        killed, skipped = {}, []
        for name in targets:
            proc = self.processes[name]
            pid = await kill_process(proc)
            if pid is None:
                skipped.append(name)
            else:
                killed[name] = {"pid": pid, **_persistence(proc)}
        record = {"fault": self.fault, "targets": targets, "signal": "SIGKILL", "killed": killed,
                  "restart_after_s": after, **leader}
        if skipped:
            record["not_running"] = skipped
        if not killed:
            return completion(op, {**record, "phase": "none"}, error=f"no target was running: {', '.join(skipped)}")
        self._active = list(killed)
        self._timer_restarts = {}
        if after is not None:
            self._timer = asyncio.create_task(self._restart_later(list(killed), after), name="kill restart timer")
        return completion(op, {**record, "phase": "start"})

    async def _restart_later(self, names: list[str], after_s: float) -> None:
        """The timed restart: sleep, then bring the killed targets back (recorded for the stop op)."""
        await asyncio.sleep(after_s)
        for name in names:
            record = self._timer_restarts[name] = {"by": "timer", "after_s": after_s}
            record.update(await restart_process(self.processes[name], self.restart_timeout_s))

    async def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            try:
                await self._timer
            except (asyncio.CancelledError, Exception):  # a failed timed restart is redone by the caller
                pass
            self._timer = None

    async def _stop(self, op: dict) -> dict:
        """Restart what this kill took down (phase end); nothing active is phase none."""
        if not self._active:
            return completion(op, {"fault": self.fault, "phase": "none", "restarted": {}})
        await self._cancel_timer()
        restarted: dict[str, Any] = {}
        for name in heal_order(self._active):
            proc = self.processes[name]
            if name in self._timer_restarts and proc.alive():
                restarted[name] = self._timer_restarts[name]
                if "ready" not in restarted[name]:  # the stop came while the timer's restart was waiting
                    restarted[name].update(pid=proc.pid, ready=await wait_ready(proc, self.restart_timeout_s))
            else:
                restarted[name] = {**await restart_process(self.processes[name], self.restart_timeout_s), "by": "stop"}
        self._active = []
        value = {"fault": self.fault, "phase": "end", "restarted": restarted, **await self._leader()}  # who leads after
        not_ready = [n for n, r in restarted.items() if not r.get("ready")]
        return completion(op, value, error=f"not answering after restart: {', '.join(not_ready)}" if not_ready else None)


class PauseNemesis(_ProcessFault):
    """SIGSTOP chosen targets; SIGCONT them at the stop op."""

    fault = "pause"

    async def _start(self, op: dict, value: dict[str, Any]) -> dict:
        """Stop the targets (phase start), unless a pause is already active (phase none)."""
        if self._active:
            return completion(op, {"fault": self.fault, "phase": "none", "active": list(self._active)},
                              error=f"{self.fault} is already active on {', '.join(self._active)}; stop it first")
        targets = self._choose(value)
        leader = await self._leader()  # before the pause: who led when the fault hit
        paused, skipped = {}, []
        for name in targets:
            proc = self.processes[name]
            if not proc.alive():
                skipped.append(name)
                continue
            stopped = await _stop_signal(proc)
            paused[name] = {"pid": proc.pid, "stopped": stopped}
        record = {"fault": self.fault, "targets": targets, "signal": "SIGSTOP", "paused": paused, **leader}
        if skipped:
            record["not_running"] = skipped
        if not paused:
            return completion(op, {**record, "phase": "none"}, error=f"no target was running: {', '.join(skipped)}")
        self._active = list(paused)
        return completion(op, {**record, "phase": "start"})

    async def _stop(self, op: dict) -> dict:
        """SIGCONT what this pause stopped (phase end)."""
        if not self._active:
            return completion(op, {"fault": self.fault, "phase": "none", "resumed": {}})
        resumed, gone = {}, []
        for name in heal_order(self._active):
            proc = self.processes[name]
            if proc.alive():
                proc.resume()
                resumed[name] = {"pid": proc.pid, "signal": "SIGCONT"}
            else:
                gone.append(name)  # killed meanwhile (by another nemesis): its own heal restarts it
        self._active = []
        value = {"fault": self.fault, "phase": "end", "resumed": resumed, **await self._leader()}  # who leads after
        if gone:
            value["not_running"] = gone
        return completion(op, value)


# -- client processes ---------------------------------------------------------------
def client_thread(process: Any, concurrency: int) -> int:
    """The interpreter thread that runs client `process` (process mod concurrency, as in Jepsen)."""
    if isinstance(process, bool) or not isinstance(process, int) or process < 0:
        raise ValueError(f"a client process is an int >= 0, got {process!r}")
    return process % concurrency


def client_target(thread: int) -> str:
    """The target name of client thread `thread` in nemesis op values (`client-<thread>`)."""
    return f"client-{thread}"


def _check_concurrency(concurrency: Any) -> int:
    """An int >= 1, or ValueError."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    return concurrency


class ClientPauses:
    """A gate per client thread: `await pauses.wait(process, system)` blocks while that thread is paused.

    The lab's clients are asyncio tasks, so a "paused client process" is one
    that stops at its next gate and stays there until resumed. A thread (not a
    process id) is the unit: a process that crashes continues on the same
    thread under a new id (process + concurrency) and stays paused.

    The gate holds the worker's requests; what its system's client runs on its
    own between calls (a heartbeat thread, a keep-alive ping) is stopped by the
    system's `freeze()` and restarted by its `thaw()` (sync or async; either
    may be absent): a worker names its open system at each gate, `freeze` calls
    the hooks of a paused thread's systems, `thaw` calls them again on resume,
    and a hook that raises is returned as one line for the nemesis op's value.
    """

    def __init__(self, concurrency: int):
        self.concurrency = _check_concurrency(concurrency)
        self._gates: dict[int, asyncio.Event] = {}  # only paused threads; the event is set on resume
        self._systems: dict[int, tuple[Any, ...]] = {}  # thread -> the systems its worker has open
        self._frozen: dict[int, list[Any]] = {}  # thread -> the systems frozen by its current pause
        self._late_errors: dict[int, list[str]] = {}  # hooks that raised outside a nemesis op (gate, timer)
        self._armed: tuple[frozenset[int], asyncio.Future] | None = None  # a pause waiting for a holder (`arm`)

    def _thread(self, thread: Any) -> int:
        """A valid thread index, or ValueError."""
        if isinstance(thread, bool) or not isinstance(thread, int) or not 0 <= thread < self.concurrency:
            raise ValueError(f"client thread must be an int in [0, {self.concurrency}), got {thread!r}")
        return thread

    async def wait(self, process: Any, *systems: Any, holding: bool = False) -> None:
        """Return at once unless `process`'s thread is paused; then block until it is resumed.

        `systems`: the systems the worker has open now (they replace the ones it named before); one opened
        while its thread is paused is frozen here before the gate holds it. `holding`: the request about to go
        acts on a lease the worker believes it holds (a commit, renew or release); an armed pause (`arm`) closes
        this thread's gate here, before that request is sent."""
        thread = client_thread(process, self.concurrency)
        if systems:
            self._systems[thread] = systems
        if holding and self._armed is not None and thread in self._armed[0]:
            waiter = self._armed[1]
            self._armed = None
            if not waiter.done():
                self.pause(thread)  # closed before this request goes: the holder stops with its lease in hand
                waiter.set_result(thread)
        gate = self._gates.get(thread)
        if gate is not None:
            if systems:
                self._late_errors.setdefault(thread, []).extend(await self.freeze(thread))
            await gate.wait()

    def arm(self, threads: Iterable[int]) -> "asyncio.Future[int]":
        """Pause the first of `threads` to reach a gate while acting on a lease it holds (`wait(..., holding=True)`):
        the future is that thread, its gate already closed. Jepsen's nemeses target a role (the primary); this
        targets the holder, which a pause drawn at a random moment meets only by chance. `disarm` cancels it."""
        if self._armed is not None:
            raise ValueError("a client pause is already armed")
        chosen = frozenset(self._thread(t) for t in threads)
        if not chosen:
            raise ValueError("arm needs at least one client thread")
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._armed = (chosen, waiter)
        return waiter

    def disarm(self) -> None:
        """Cancel an armed pause that no holder has met yet."""
        if self._armed is not None:
            self._armed[1].cancel()
            self._armed = None

    def is_paused(self, process: Any) -> bool:
        """Is `process`'s thread paused?"""
        return client_thread(process, self.concurrency) in self._gates

    def pause(self, thread: int) -> None:
        """Close `thread`'s gate (its next `wait` blocks)."""
        thread = self._thread(thread)
        self._gates.setdefault(thread, asyncio.Event())

    def resume(self, thread: int) -> bool:
        """Open `thread`'s gate, releasing whoever waits there; False if it was not paused."""
        gate = self._gates.pop(self._thread(thread), None)
        if gate is None:
            return False
        gate.set()
        return True

    def resume_all(self) -> list[int]:
        """Open every gate; the threads that were paused."""
        threads = sorted(self._gates)
        for t in threads:
            self.resume(t)
        return threads

    async def freeze(self, thread: int) -> list[str]:
        """Call `freeze()` on each system `thread`'s worker has open and that is not frozen yet; what raised."""
        frozen = self._frozen.setdefault(self._thread(thread), [])
        todo = [s for s in self._systems.get(thread, ()) if not any(s is f for f in frozen)]
        frozen.extend(todo)
        return await _call_hooks(todo, "freeze")

    async def thaw(self, thread: int) -> list[str]:
        """Call `thaw()` on every system frozen on `thread`, plus what raised earlier off a nemesis op."""
        thawed = self._frozen.pop(self._thread(thread), [])
        return self._late_errors.pop(thread, []) + await _call_hooks(thawed, "thaw")

    async def thaw_all(self) -> list[str]:
        """Thaw every frozen thread; what raised."""
        errors: list[str] = []
        for t in sorted(set(self._frozen) | set(self._late_errors)):
            errors += await self.thaw(t)
        return errors

    @property
    def paused(self) -> list[int]:
        """The paused threads."""
        return sorted(self._gates)


async def _call_hooks(systems: Sequence[Any], hook: str) -> list[str]:
    """Call `hook` (sync or async) on each system that has it; one line per hook that raised."""
    errors = []
    for system in systems:
        fn = getattr(system, hook, None)
        if not callable(fn):
            continue
        try:
            result = fn()
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # noqa: BLE001 - a plug-in's hook: recorded in the nemesis op's value, not raised
            errors.append(f"{hook}(): {type(e).__name__}: {e}")
    return errors


class ClientPauseNemesis:
    """Pause one client thread at its gates until the stop op (or at most `max_duration_s`)."""

    fault = "client-pause"

    def __init__(self, pauses: ClientPauses, *, rng: Any, threads: Sequence[int] | None = None,
                 duration_s: float | None = None, max_duration_s: float = 60.0):
        if not isinstance(pauses, ClientPauses):
            raise ValueError(f"pauses must be a nemesis.process_faults.ClientPauses, got {type(pauses).__name__}")
        self.pauses = pauses
        self.name = self.fault
        self.rng = as_rng(rng)
        self.rounds = Rounds(self.rng)  # every client thread once per round
        all_threads = list(range(pauses.concurrency))
        if threads is None:
            self.threads = all_threads
        else:
            if isinstance(threads, (str, int)) or not threads:
                raise ValueError(f"threads must be a non-empty list of client threads, got {threads!r}")
            self.threads = sorted({pauses._thread(t) for t in threads})
        self.max_duration_s = _seconds("max_duration_s", max_duration_s, maximum=MAX_CLIENT_PAUSE_S)
        self.duration_s = _seconds("duration_s", duration_s, allow_none=True, maximum=self.max_duration_s)
        self._active: int | None = None
        self._timer: asyncio.Task | None = None
        self._late_thaw_errors: list[str] = []  # what the timer's thaw raised, for the stop op's value

    @property
    def fs(self) -> frozenset[str]:
        """`start-client-pause` and `stop-client-pause`."""
        return frozenset({"start-client-pause", "stop-client-pause"})

    async def setup(self, test: Test) -> None:
        """Nothing to prepare: the gates are in the workload clients."""

    async def invoke(self, test: Test, op: dict) -> dict:
        """Pause one client thread, or resume it."""
        f = op.get("f")
        if f == "start-client-pause":
            return await self._start(op, op.get("value"))
        if f == "stop-client-pause":
            return await self._stop(op)
        raise ValueError(f"client-pause nemesis does not handle f {f!r}; it handles {', '.join(sorted(self.fs))}")

    async def teardown(self, test: Test) -> None:
        """Resume every client thread (thawing its systems); raise if a thaw hook raised."""
        self.pauses.disarm()
        await self._cancel_timer()
        errors = await self.pauses.thaw_all()
        self.pauses.resume_all()
        self._active = None
        if errors:
            raise RuntimeError("client-pause heal: " + "; ".join(errors))

    async def _start(self, op: dict, value: Any) -> dict:
        """Close one thread's gate (given as `thread`, or drawn) and freeze its systems; auto-resume after the
        duration. A freeze hook that raised is in the value (`freeze_errors`).

        With `"holding": true` the pause is armed instead (`ClientPauses.arm`): it closes the gate of the first
        thread (`thread`, else any) to send a request on a lease it holds, and this op completes then; none
        within `wait_s` (default HOLDING_WAIT_S) completes it with phase `none`, saying so."""
        if value is None:
            value = {}
        if not isinstance(value, dict) or set(value) - {"thread", "duration_s", "holding", "wait_s"}:
            raise ValueError("start-client-pause value must be null or an object with thread, duration_s, holding, "
                             f"wait_s; got {value!r}")
        if self._active is not None:
            return completion(op, {"fault": self.fault, "phase": "none", "active": client_target(self._active)},
                              error=f"client-pause is already active on {client_target(self._active)}; stop it first")
        holding = value.get("holding", False)
        if not isinstance(holding, bool):
            raise ValueError(f"start-client-pause: holding must be true or false, got {holding!r}")
        if "thread" in value:
            thread = value["thread"]
            if thread not in self.threads:
                raise ValueError(f"start-client-pause: thread must be one of {self.threads}, got {thread!r}")
        else:
            thread = None if holding else self.rounds.pick("thread", self.threads)
        duration = _seconds("duration_s", value.get("duration_s", self.duration_s), allow_none=True,
                            maximum=self.max_duration_s)
        extra: dict[str, Any] = {}
        if holding:
            armed = [thread] if thread is not None else list(self.threads)
            wait_s = _seconds("wait_s", value.get("wait_s", HOLDING_WAIT_S), maximum=MAX_CLIENT_PAUSE_S)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            waiter = self.pauses.arm(armed)
            try:
                thread = await asyncio.wait_for(waiter, wait_s)
            except asyncio.TimeoutError:
                return completion(op, {"fault": self.fault, "phase": "none", "holding": True, "armed": armed,
                                       "wait_s": wait_s},
                                  error=f"no client thread of {armed} sent a request on a lease it holds within "
                                        f"{wait_s:g} s; nothing was paused")
            finally:
                self.pauses.disarm()
            extra = {"holding": True, "armed": armed, "waited_s": round(loop.time() - t0, 6)}
        else:
            self.pauses.pause(thread)
        self._active = thread
        errors = await self.pauses.freeze(thread)
        until = duration if duration is not None else self.max_duration_s
        self._timer = asyncio.create_task(self._resume_later(thread, until), name="client-pause timer")
        value = {"fault": self.fault, "phase": "start", "target": client_target(thread), "thread": thread,
                 "duration_s": duration, "max_duration_s": self.max_duration_s, **extra}
        if errors:
            value["freeze_errors"] = errors
        return completion(op, value)

    async def _resume_later(self, thread: int, after_s: float) -> None:
        """Thaw and reopen the gate after `after_s` (the stop op may come first; it reports what raised)."""
        await asyncio.sleep(after_s)
        self._late_thaw_errors = await self.pauses.thaw(thread)
        self.pauses.resume(thread)

    async def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            try:
                await self._timer
            except asyncio.CancelledError:
                pass
            self._timer = None

    async def _stop(self, op: dict) -> dict:
        """Reopen the paused thread's gate (phase end)."""
        if self._active is None:
            return completion(op, {"fault": self.fault, "phase": "none"})
        thread, self._active = self._active, None
        timer_done = self._timer is not None and self._timer.done()
        await self._cancel_timer()
        errors, self._late_thaw_errors = self._late_thaw_errors + await self.pauses.thaw(thread), []
        was_paused = self.pauses.resume(thread)
        value = {"fault": self.fault, "phase": "end", "target": client_target(thread), "thread": thread,
                 "resumed_by": "stop" if was_paused else ("timer" if timer_done else "none")}
        if errors:
            value["thaw_errors"] = errors
        return completion(op, value)


# -- replaying a start (nemesis.fault_schedule): what it did, as the value that does it again ----------------
def kill_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `start-kill` value that kills again the targets the start completion `record` names, with its timed
    restart (null: at the stop)."""
    return {"targets": list(record["targets"]), "restart_after_s": record.get("restart_after_s")}


def pause_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `start-pause` (or `start-leader-pause`) value that stops again the targets `record` names: the same
    member, which need not lead any more in the replay."""
    return {"targets": list(record["targets"])}


def client_pause_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `start-client-pause` value that holds again the thread `record` names, for its duration (null: until
    the stop); a pause armed for a holder is armed again on the threads it was (the holder may differ)."""
    if record.get("holding"):
        armed = record.get("armed") or []
        out: dict[str, Any] = {"holding": True, "duration_s": record.get("duration_s")}
        if len(armed) == 1:
            out["thread"] = armed[0]
        return out
    return {"thread": record["thread"], "duration_s": record.get("duration_s")}


# -- constructors -------------------------------------------------------------------
def kill(processes: Mapping[str, Process], *, rng: Any, targets: Sequence[str] | None = None,
         restart_after_s: float | None = None, restart_timeout_s: float = RESTART_TIMEOUT_S,
         leader: Callable[[], str | None] | None = None) -> KillNemesis:
    """SIGKILL + restart: `start-kill` / `stop-kill` on lease servers, Valkey, the store (or a system's
    members; `leader` says who leads, recorded at each start and stop)."""
    return KillNemesis(processes, rng=rng, targets=targets, restart_after_s=restart_after_s,
                       restart_timeout_s=restart_timeout_s, leader=leader)


def pause(processes: Mapping[str, Process], *, rng: Any, targets: Sequence[str] | None = None,
          restart_timeout_s: float = RESTART_TIMEOUT_S, leader: Callable[[], str | None] | None = None
          ) -> PauseNemesis:
    """SIGSTOP / SIGCONT: `start-pause` / `stop-pause` on lease servers, Valkey, the store (or a system's
    members; `leader` as for kill)."""
    return PauseNemesis(processes, rng=rng, targets=targets, restart_timeout_s=restart_timeout_s, leader=leader)


def client_pause(pauses: ClientPauses, *, rng: Any, threads: Sequence[int] | None = None,
                 duration_s: float | None = None, max_duration_s: float = 60.0) -> ClientPauseNemesis:
    """A client thread held at its gates: `start-client-pause` / `stop-client-pause`."""
    return ClientPauseNemesis(pauses, rng=rng, threads=threads, duration_s=duration_s, max_duration_s=max_duration_s)
