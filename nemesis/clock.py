"""Clock faults: bump, strobe and reset the wall clocks of the stack's processes and of the lab's clients.

Two kinds of clock, one nemesis:

- Stack processes (Valkey and the lease servers) run under libfaketime when
  the stack is started with `fake_clocks=True`; each reads its offset from its
  own file (`stack.info["clocks"]`: process name -> file), which
  `lab.stack.faketime.FakeClock` rewrites. libfaketime notices a rewritten file a
  few milliseconds later, not at the very next time call.
- Client processes are asyncio tasks inside the lab process, so their clock is
  the lease client's injectable wall clock (`LeaseClient(..., clock_ms=...)`).
  `ClientClocks` keeps one offset per client thread (`client-<thread>`);
  workload clients read `client_clocks.now_ms(process)` or pass
  `client_clocks.clock_for(process)` as `clock_ms`.

The nemesis handles `bump-clock` (one step of +/- N seconds on one or more
targets: phase start), `strobe-clock` (flip chosen targets between offset 0
and +/- N seconds every `period_ms` for `duration_s`, as a background task:
phase start) and `reset-clock` (every offset back to 0, any strobe stopped:
phase end). Teardown does what reset does, always.

What the contract says each target should do with a moved clock:
- lease servers must not care: backend time is authoritative (C20). Their own
  clock only bounds deadlines (`deadline_at` is absolute Unix ms), so a server
  ahead by more than a call's deadline budget refuses calls as
  `deadline_exceeded` before doing anything (fail closed), and one behind
  waits longer than the caller does (the caller sees `timeout`, `info`).
- Valkey's clock is backend time: moving it forward expires leases early
  (and TTL'd keys), moving it back extends them; the lease state follows it
  by design, and the fence must still protect every commit (C25, C26, C29).
- clients' clocks never extend a lease (C20); a client whose clock runs
  behind believes its lease lives longer, which the fence must catch.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lab.stack.faketime import FakeClock
from nemesis.core import NemesisUnavailable, as_rng, completion
from nemesis.process_faults import client_target, client_thread
from lab.testmap import Test

__all__ = ["ClientClocks", "ClockNemesis", "clock", "clock_replay", "lease_skews"]

MAX_OFFSET_S = 10 * 365 * 86400  # FakeClock's own bound
MIN_STROBE_PERIOD_MS = 10  # libfaketime needs a few ms to notice a rewritten offset file


def _number(param: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] (or (lo, hi]), or ValueError naming `param`."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > lo if lo_open else value >= lo) and value <= hi)
    if not ok:
        raise ValueError(f"{param} must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _range(param: str, value: Any) -> tuple[float, float]:
    """A (min, max) range of step sizes in seconds, 0 < min <= max <= 10 years, or ValueError naming `param`."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise ValueError(f"{param} must be (min, max) seconds, got {value!r}")
    lo = _number(f"{param} min", value[0], 0.0, MAX_OFFSET_S, lo_open=True)
    return lo, _number(f"{param} max", value[1], lo, MAX_OFFSET_S)


def _delta(param: str, value: Any) -> float:
    """A non-zero clock step in seconds, |step| <= 10 years, rounded to the millisecond."""
    v = _number(param, value, -MAX_OFFSET_S, MAX_OFFSET_S)
    if round(v, 3) == 0:
        raise ValueError(f"{param} must be a non-zero number of seconds, got {value!r}")
    return round(v, 3)


class ClientClocks:
    """Per-client-thread wall-clock offsets for the lab's own clients (which share the lab's real clock).

    A client process runs on thread `process mod concurrency`, so a thread's
    offset follows its processes across crashes.
    """

    def __init__(self, concurrency: int):
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.concurrency = concurrency
        self._offset_ms: dict[int, int] = {}

    @property
    def names(self) -> list[str]:
        """The target names, `client-0` .. `client-<concurrency-1>`."""
        return [client_target(t) for t in range(self.concurrency)]

    def thread_of(self, name: str) -> int:
        """The thread of target name `client-<t>`, or ValueError."""
        if name not in self.names:
            raise ValueError(f"unknown client clock {name!r}; known: client-0 .. client-{self.concurrency - 1}")
        return int(name.rsplit("-", 1)[1])

    def set_offset(self, name: str, seconds: float) -> None:
        """Move client `name`'s clock to real time + `seconds`."""
        ms = round(_number("offset", seconds, -MAX_OFFSET_S, MAX_OFFSET_S) * 1000)
        thread = self.thread_of(name)
        if ms:
            self._offset_ms[thread] = ms
        else:
            self._offset_ms.pop(thread, None)

    def offset(self, name: str) -> float:
        """Client `name`'s offset in seconds."""
        return self._offset_ms.get(self.thread_of(name), 0) / 1000

    def offsets(self) -> dict[str, float]:
        """The non-zero offsets by target name."""
        return {client_target(t): ms / 1000 for t, ms in sorted(self._offset_ms.items())}

    def reset(self) -> None:
        """Every client back to the real clock."""
        self._offset_ms.clear()

    def now_ms(self, process: int) -> int:
        """Client `process`'s wall clock in integer Unix milliseconds."""
        return time.time_ns() // 1_000_000 + self._offset_ms.get(client_thread(process, self.concurrency), 0)

    def clock_for(self, process: int) -> Callable[[], int]:
        """A zero-argument `clock_ms` for `LeaseClient` that reads `process`'s clock (offsets as they change)."""
        client_thread(process, self.concurrency)  # validate now, not at the first call
        return lambda: self.now_ms(process)



# The range of a drawn step, in seconds, drawn log-uniformly: skews smaller than a call's deadline budget (a
# server ahead by more refuses every call as deadline_exceeded, so only a smaller step reaches its lease logic)
# as often as the large ones that stop a process's view of time outright.
BUMP_S = (0.05, 30.0)
DEFAULT_DEADLINE_S = 2.0  # the general workloads' request deadline unless --deadline-s (workloads/lease.py)


def lease_skews(ttl_ms: int, deadline_s: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The (backward, forward) step ranges, in seconds, of a skew the lease servers' leases feel (`server-clock`).

    A skew only matters where two clocks that stamp one lease disagree by about as much as the lease's life:
    a step of a few ms against a 2 s TTL reorders nothing. Backward: 0.5-2 x the TTL (a server that far behind
    stamps its grants before the other server's, and its renewals shorten the leases it stamped earlier).
    Forward: the same, but at most 3/4 of the request deadline (and from half that when it is lower): a server
    ahead by more than the deadline refuses every call as `deadline_exceeded` before its lease logic runs (fail
    closed), so a larger forward step tests nothing of it.
    """
    ttl_s = _number("ttl_ms", ttl_ms, 0.0, MAX_OFFSET_S * 1000, lo_open=True) / 1000
    cap = 0.75 * _number("deadline_s", deadline_s, 0.0, MAX_OFFSET_S, lo_open=True)
    backward = (ttl_s / 2, 2 * ttl_s)
    forward_hi = min(backward[1], cap)
    return backward, (min(backward[0], forward_hi / 2), forward_hi)


class ClockNemesis:
    """bump / strobe / reset of stack processes' fake clocks and of client clocks."""

    fault = "clock"

    def __init__(self, clocks: Mapping[str, Any] | None, *, rng: Any, client_clocks: ClientClocks | None = None,
                 targets: Sequence[str] | None = None, bump_s: tuple[float, float] = BUMP_S,
                 forward_s: tuple[float, float] | None = None, strict_subset: bool = False,
                 strobe_period_ms: int = 100, strobe_duration_s: float = 10.0):
        if clocks is None:
            clocks = {}
        if not isinstance(clocks, Mapping):
            raise ValueError(f"clocks must map process name -> offset file, got {clocks!r}")
        if client_clocks is not None and not isinstance(client_clocks, ClientClocks):
            raise ValueError(f"client_clocks must be a ClientClocks, got {type(client_clocks).__name__}")
        self.name = self.fault
        self.files = {str(n): FakeClock(Path(p)) for n, p in sorted(clocks.items())}
        self.client_clocks = client_clocks
        known = list(self.files) + (client_clocks.names if client_clocks is not None else [])
        if not known:
            raise ValueError("clock: no clocks to move: start the stack with fake_clocks=True, or give client_clocks")
        if targets is None:
            self.targets = known
        else:
            if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets:
                raise ValueError(f"targets must be a non-empty list of {', '.join(known)}, got {targets!r}")
            unknown = [t for t in targets if t not in known]
            if unknown:
                raise ValueError(f"clock targets {unknown} are unknown; known: {', '.join(known)}")
            self.targets = list(dict.fromkeys(targets))
        self.bump_s = _range("bump_s", bump_s)  # backward steps (and forward ones unless forward_s)
        self.forward_s = self.bump_s if forward_s is None else _range("forward_s", forward_s)
        if not isinstance(strict_subset, bool):
            raise ValueError(f"strict_subset must be True or False, got {strict_subset!r}")
        self.strict_subset = strict_subset
        self.strobe_period_ms = int(_number("strobe_period_ms", strobe_period_ms, MIN_STROBE_PERIOD_MS, 3_600_000))
        self.strobe_duration_s = _number("strobe_duration_s", strobe_duration_s, 0.0, 3600.0, lo_open=True)
        self.rng = as_rng(rng)
        self._active = False  # a bump or a strobe happened since the last reset
        self._strobe: asyncio.Task | None = None
        self._strobe_flips = 0

    @property
    def fs(self) -> frozenset[str]:
        """`bump-clock`, `strobe-clock`, `reset-clock`."""
        return frozenset({"bump-clock", "strobe-clock", "reset-clock"})

    async def setup(self, test: Test) -> None:
        """Every offset file must be readable and writable (the stack was started with fake clocks)."""
        for name, fc in self.files.items():
            try:
                fc.offset()
                fc.reset()
            except (OSError, ValueError) as e:
                raise NemesisUnavailable(f"clock: cannot use {name}'s offset file {fc.path}: {e}") from e

    async def invoke(self, test: Test, op: dict) -> dict:
        """bump, strobe or reset."""
        f = op.get("f")
        if f == "bump-clock":
            return self._bump(op, self._value(op, {"targets", "delta_s"}))
        if f == "strobe-clock":
            return self._start_strobe(op, self._value(op, {"targets", "delta_s", "period_ms", "duration_s"}))
        if f == "reset-clock":
            self._value(op, set())
            return await self._reset(op)
        raise ValueError(f"clock nemesis does not handle f {f!r}; it handles {', '.join(sorted(self.fs))}")

    async def teardown(self, test: Test) -> None:
        """Stop any strobe and put every clock back to 0."""
        await self._stop_strobe()
        self._set_all_zero()
        self._active = False

    # -- internals -------------------------------------------------------------
    def _value(self, op: dict, keys: set[str]) -> dict[str, Any]:
        """An op's value: null or an object with only `keys`."""
        value = op.get("value")
        if value is None:
            return {}
        if not isinstance(value, dict) or set(value) - keys:
            raise ValueError(f"{op.get('f')} value must be null or an object with keys {sorted(keys) or 'none'}, "
                             f"got {value!r}")
        return value

    def _choose(self, value: dict[str, Any]) -> tuple[list[str], float]:
        """Targets (given, or a random non-empty subset: a strict one with `strict_subset` and two targets or more)
        and the step (given, or drawn: -bump_s or +forward_s)."""
        if "targets" in value:
            targets = value["targets"]
            if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets:
                raise ValueError(f"targets must be a non-empty list of {', '.join(self.targets)}, got {targets!r}")
            unknown = [t for t in targets if t not in self.targets]
            if unknown:
                raise ValueError(f"clock targets {unknown} are not configured; configured: {', '.join(self.targets)}")
            targets = list(dict.fromkeys(targets))
        else:
            most = len(self.targets) - 1 if self.strict_subset and len(self.targets) > 1 else len(self.targets)
            targets = sorted(self.rng.sample(self.targets, self.rng.randint(1, most)))
        if "delta_s" in value:
            delta = _delta("delta_s", value["delta_s"])
        else:
            sign = self.rng.choice((-1, 1))
            lo, hi = self.forward_s if sign > 0 else self.bump_s
            # log-uniform (Jepsen's bump-time draws 2^(2..18) ms): every scale as often
            delta = max(round(math.exp(self.rng.uniform(math.log(lo), math.log(hi))), 3), 0.001) * sign
        return targets, delta

    def _set(self, name: str, seconds: float) -> None:
        """Set one target's offset (file or client clock)."""
        if name in self.files:
            if seconds:
                self.files[name].set_offset(seconds)
            else:
                self.files[name].reset()
        else:
            self.client_clocks.set_offset(name, seconds)

    def _offsets(self) -> dict[str, float]:
        """Every non-zero offset now, by target."""
        out = {}
        for name, fc in self.files.items():
            try:
                off = fc.offset()
            except (OSError, ValueError):
                continue
            if off:
                out[name] = off
        if self.client_clocks is not None:
            out.update(self.client_clocks.offsets())
        return out

    def _set_all_zero(self) -> None:
        """Every clock back to the real one."""
        for fc in self.files.values():
            fc.reset()
        if self.client_clocks is not None:
            self.client_clocks.reset()

    def _busy(self, op: dict) -> dict | None:
        """The phase-none completion for a bump/strobe while the window is open, else None."""
        if not self._active:
            return None
        return completion(op, {"fault": self.fault, "phase": "none", "offsets": self._offsets(),
                               "strobing": self._strobe is not None and not self._strobe.done()},
                          error="a clock fault is already active; reset-clock first")

    def _bump(self, op: dict, value: dict[str, Any]) -> dict:
        """Move each target's clock by delta_s (phase start)."""
        busy = self._busy(op)
        if busy:
            return busy
        targets, delta = self._choose(value)
        for name in targets:
            self._set(name, delta)
        self._active = True
        return completion(op, {"fault": self.fault, "phase": "start", "kind": "bump", "targets": targets,
                               "delta_s": delta, "offsets": {t: delta for t in targets}})

    def _start_strobe(self, op: dict, value: dict[str, Any]) -> dict:
        """Flip the targets between 0 and delta_s every period_ms for duration_s, in the background (phase start)."""
        busy = self._busy(op)
        if busy:
            return busy
        targets, delta = self._choose(value)
        period = int(_number("period_ms", value.get("period_ms", self.strobe_period_ms), MIN_STROBE_PERIOD_MS,
                             3_600_000))
        duration = _number("duration_s", value.get("duration_s", self.strobe_duration_s), 0.0, 3600.0, lo_open=True)
        self._active = True
        self._strobe_flips = 0
        self._strobe = asyncio.create_task(self._run_strobe(targets, delta, period / 1000, duration),
                                           name="clock strobe")
        return completion(op, {"fault": self.fault, "phase": "start", "kind": "strobe", "targets": targets,
                               "delta_s": delta, "period_ms": period, "duration_s": duration})

    async def _run_strobe(self, targets: list[str], delta: float, period_s: float, duration_s: float) -> None:
        """The strobe: alternate delta and 0 until the duration is over; always end at 0."""
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        on = False
        try:
            while loop.time() < end:
                on = not on
                for name in targets:
                    self._set(name, delta if on else 0.0)
                self._strobe_flips += 1
                await asyncio.sleep(min(period_s, max(0.0, end - loop.time())))
        finally:
            for name in targets:
                self._set(name, 0.0)

    async def _stop_strobe(self) -> int:
        """Cancel a running strobe (its finally puts its targets back to 0); the flips it made."""
        task, self._strobe = self._strobe, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        return self._strobe_flips

    async def _reset(self, op: dict) -> dict:
        """Every offset back to 0, any strobe stopped (phase end; none when nothing was active)."""
        strobing = self._strobe is not None and not self._strobe.done()
        flips = await self._stop_strobe()
        before = self._offsets()
        self._set_all_zero()
        was_active, self._active = self._active, False
        self._strobe_flips = 0
        value = {"fault": self.fault, "phase": "end" if was_active else "none", "offsets_before": before}
        if strobing or flips:
            value.update(strobe_stopped=strobing, strobe_flips=flips)
        return completion(op, value)


def clock_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `bump-clock` / `strobe-clock` value that moves again the clocks the start completion `record` names,
    by its step (a strobe with its period and duration): what nemesis.fault_schedule records for a replay."""
    keys = ("targets", "delta_s", "period_ms", "duration_s") if record.get("kind") == "strobe" else ("targets",
                                                                                                      "delta_s")
    return {k: (list(record[k]) if k == "targets" else record[k]) for k in keys}


def clock(clocks: Mapping[str, Any] | None, *, rng: Any, client_clocks: ClientClocks | None = None,
          targets: Sequence[str] | None = None, bump_s: tuple[float, float] = BUMP_S,
          forward_s: tuple[float, float] | None = None, strict_subset: bool = False,
          strobe_period_ms: int = 100, strobe_duration_s: float = 10.0) -> ClockNemesis:
    """Clock faults on fake-clocked stack processes and client clocks: `bump-clock`, `strobe-clock`, `reset-clock`."""
    return ClockNemesis(clocks, rng=rng, client_clocks=client_clocks, targets=targets, bump_s=bump_s,
                        forward_s=forward_s, strict_subset=strict_subset, strobe_period_ms=strobe_period_ms,
                        strobe_duration_s=strobe_duration_s)
