"""Valkey's durability faults: crash-and-recover from its own files, and restore from an older snapshot.

Both can roll the lease store back, and with it every identity's fencing
counter: exactly what contract rule C5 ("a durable fencing counter ... never
reset or reused") and the restore row of the races table (section 8: "the
counter never goes below any token accepted downstream; otherwise a higher
epoch and all restored leases invalid") forbid. The lab must be able to show
that a server without a recovery rule issues the same token twice.

- `valkey-crash` (`start-valkey-crash` / `stop-valkey-crash`): SIGKILL Valkey
  (phase start), restart it from its own data directory at the stop op or
  `restart_after_s` later (phase end). What survives is set by the stack's
  persistence: `none` loses everything, `everysec` up to about a second of
  acknowledged writes, `always` nothing acknowledged.
- `valkey-restore` (`start-valkey-restore` / `stop-valkey-restore`): the
  start op takes a consistent snapshot (`SAVE`, an RDB file moved out of the
  data directory) and opens the window; the stop op kills Valkey, replaces
  its files with the snapshot and restarts it, so everything done inside the
  window is lost. Under AOF persistence the snapshot becomes the base file of
  a fresh multi-part AOF (`appendonlydir/<name>.1.base.rdb` plus a manifest),
  because Valkey ignores `dump.rdb` when AOF is on; without AOF it becomes
  `dump.rdb`. A stop op with value `{"discard": true}` closes the window
  without restoring.

Completion values record the persistence mode, the pids, the number of keys
before and after, and the files Valkey restarted from.

`valkey-crash` takes any `ValkeyOwner`: the local stack's `ValkeyProcess` or
the Compose stack's Valkey `ContainerProcess` (kill is `container.kill`, the
restart `container.start`, the files are read with `container.get_archive`).
`valkey-restore` rewrites Valkey's data directory while it is dead: on the
host for a `ValkeyProcess`; in the container (`take_file`: the snapshot is
copied to the host and removed from the volume; `put_files`: the restored
files are written with `put_archive` into the stopped container's volume) for
a Compose `ContainerProcess`. A volume cannot be emptied through the archive
API, so in a container the AOF manifest names the restored base and a fresh,
empty incr file, overwriting both (files it no longer names are never read).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted, with a warning each time
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from lab.stack.process import ProcessError
from lab.stack.valkey import PERSISTENCE_MODES, ValkeyProcess
from nemesis.core import NemesisUnavailable, completion
from nemesis.process_faults import (RESTART_TIMEOUT_S, _seconds, heal_processes, kill_process, restart_process,
                             wait_ready)
from lab.testmap import Test

__all__ = ["ValkeyCrashNemesis", "ValkeyOwner", "ValkeyRestoreNemesis", "crash_replay", "data_files",
           "restore_replay", "valkey_crash", "valkey_restore"]

_snapshots = itertools.count(1)


@runtime_checkable
class ValkeyOwner(Protocol):
    """What valkey-crash needs of the stack's Valkey (a ValkeyProcess, a compose ContainerProcess).

    Beyond the brief's surface, `pid`, `healthy()` and `stop()` are listed
    because nemesis.process_faults's kill / restart / readiness helpers call them.
    """

    persistence: str
    host: str
    pid: int | None

    @property
    def port(self) -> int | None: ...

    def alive(self) -> bool: ...

    def healthy(self) -> bool: ...

    def kill(self) -> None: ...

    def start(self, timeout: float = ..., *, wait: bool = ...) -> Any: ...

    def stop(self, timeout: float = ...) -> None: ...


def _check_valkey(valkey: Any) -> ValkeyOwner:
    """The stack's Valkey (a ValkeyOwner with a known persistence mode), or ValueError."""
    if not isinstance(valkey, ValkeyOwner):
        raise ValueError("valkey must be the stack's Valkey (persistence, host, port, pid, alive(), healthy(), "
                         f"kill(), start(), stop()), got {type(valkey).__name__}")
    if valkey.persistence not in PERSISTENCE_MODES:
        raise ValueError(f"valkey.persistence must be one of {', '.join(PERSISTENCE_MODES)}, got "
                         f"{valkey.persistence!r} (is {getattr(valkey, 'name', valkey)!r} the stack's Valkey?)")
    return valkey


@runtime_checkable
class ContainerFiles(Protocol):
    """What valkey-restore needs of a Valkey whose data directory is inside a container."""

    def take_file(self, path: str, dest: Path) -> int: ...

    def put_files(self, directory: str, files: dict[str, bytes]) -> list[str]: ...


def _check_restorable_valkey(valkey: Any) -> ValkeyOwner:
    """The local stack's ValkeyProcess (its data directory on the host) or a Valkey container whose files
    the lab can move (ContainerFiles), or ValueError."""
    if not isinstance(valkey, ValkeyProcess) and not isinstance(valkey, ContainerFiles):
        raise ValueError("valkey-restore needs Valkey's data directory: the local stack's "
                         "lab.stack.valkey.ValkeyProcess or a compose Valkey container (take_file, put_files), "
                         f"got {type(valkey).__name__}")
    return _check_valkey(valkey)


def _conn(valkey: ValkeyOwner) -> aioredis.Redis:
    """A short-timeout, no-retry connection to Valkey (a retry could hide what the fault did)."""
    return aioredis.Redis(host=valkey.host, port=valkey.port, socket_timeout=2.0, socket_connect_timeout=1.0,
                          retry=Retry(NoBackoff(), 0), decode_responses=True)


async def _keys(valkey: ValkeyOwner) -> int | None:
    """DBSIZE, or None when Valkey does not answer."""
    if not valkey.alive():
        return None
    conn = _conn(valkey)
    try:
        return int(await conn.dbsize())
    except (RedisError, OSError):
        return None
    finally:
        await conn.aclose()


def data_files(valkey: ValkeyOwner) -> dict[str, int]:
    """The files in Valkey's data directory (relative path -> size), for the record."""
    own = getattr(valkey, "data_files", None)
    if callable(own):  # a container's data directory is not on the host: it lists it itself
        return own()
    root = Path(valkey.data_dir)
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


class ValkeyCrashNemesis:
    """SIGKILL Valkey, then restart it from its own files."""

    fault = "valkey-crash"

    def __init__(self, valkey: ValkeyOwner, *, restart_after_s: float | None = None,
                 restart_timeout_s: float = RESTART_TIMEOUT_S):
        self.valkey = _check_valkey(valkey)
        self.name = self.fault
        self.restart_after_s = _seconds("restart_after_s", restart_after_s, allow_none=True)
        self.restart_timeout_s = _seconds("restart_timeout_s", restart_timeout_s, maximum=600)
        self._killed: dict[str, Any] | None = None
        self._timer: asyncio.Task | None = None
        self._timer_restart: dict[str, Any] | None = None

    @property
    def fs(self) -> frozenset[str]:
        """`start-valkey-crash` and `stop-valkey-crash`."""
        return frozenset({"start-valkey-crash", "stop-valkey-crash"})

    async def setup(self, test: Test) -> None:
        """Valkey must be running."""
        if not self.valkey.alive():
            raise NemesisUnavailable("valkey-crash: Valkey is not running")

    async def invoke(self, test: Test, op: dict) -> dict:
        """Crash Valkey, or bring it back."""
        f = op.get("f")
        if f == "start-valkey-crash":
            return await self._start(op, op.get("value"))
        if f == "stop-valkey-crash":
            return await self._stop(op)
        raise ValueError(f"valkey-crash nemesis does not handle f {f!r}; it handles {', '.join(sorted(self.fs))}")

    async def teardown(self, test: Test) -> None:
        """Valkey running and answering, whatever happened."""
        await self._cancel_timer()
        await heal_processes({"valkey": self.valkey}, timeout_s=self.restart_timeout_s)
        self._killed = None

    async def _start(self, op: dict, value: Any) -> dict:
        """SIGKILL Valkey (phase start); `restart_after_s` in the value or the constructor schedules the restart."""
        if value is None:
            value = {}
        if not isinstance(value, dict) or set(value) - {"restart_after_s"}:
            raise ValueError(f"start-valkey-crash value must be null or an object with restart_after_s; got {value!r}")
        base = {"fault": self.fault, "target": "valkey", "persistence": self.valkey.persistence}
        if self._killed is not None:
            return completion(op, {**base, "phase": "none"}, error="valkey-crash is already active; stop it first")
        after = _seconds("restart_after_s", value.get("restart_after_s", self.restart_after_s), allow_none=True)
        keys = await _keys(self.valkey)
        pid = await kill_process(self.valkey)
        if pid is None:
            return completion(op, {**base, "phase": "none"}, error="Valkey was not running")
        self._killed = {"pid": pid, "keys_before": keys}
        self._timer_restart = None
        if after is not None:
            self._timer = asyncio.create_task(self._restart_later(after), name="valkey-crash restart timer")
        return completion(op, {**base, "phase": "start", "signal": "SIGKILL", "pid": pid, "keys_before": keys,
                               "restart_after_s": after})

    async def _restart_later(self, after_s: float) -> None:
        """The timed restart."""
        await asyncio.sleep(after_s)
        self._timer_restart = {"by": "timer", "after_s": after_s}
        self._timer_restart.update(await restart_process(self.valkey, self.restart_timeout_s))

    async def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            try:
                await self._timer
            except (asyncio.CancelledError, Exception):  # the caller restarts it anyway
                pass
            self._timer = None

    async def _stop(self, op: dict) -> dict:
        """Restart Valkey from its own files (phase end), recording what it came back with."""
        base = {"fault": self.fault, "target": "valkey", "persistence": self.valkey.persistence}
        if self._killed is None:
            return completion(op, {**base, "phase": "none"})
        await self._cancel_timer()
        try:
            files, files_error = data_files(self.valkey), None
        except ProcessError as e:  # the listing is for the record only: the restart goes ahead
            files, files_error = None, str(e)
        if self._timer_restart is not None and self.valkey.alive():
            restarted = self._timer_restart
            if "ready" not in restarted:  # the stop came while the timer's restart was waiting
                restarted.update(pid=self.valkey.pid, ready=await wait_ready(self.valkey, self.restart_timeout_s))
        else:
            restarted = {**await restart_process(self.valkey, self.restart_timeout_s), "by": "stop"}
        killed, self._killed = self._killed, None
        value = {**base, "phase": "end", "restarted": restarted, "keys_before": killed["keys_before"],
                 "keys_after": await _keys(self.valkey), "files": files}
        if files_error:
            value["files_error"] = files_error
        return completion(op, value, error=None if restarted.get("ready") else "Valkey does not answer after restart")


class ValkeyRestoreNemesis:
    """Snapshot Valkey at the start op; at the stop op, restart it from that older snapshot."""

    fault = "valkey-restore"

    def __init__(self, valkey: ValkeyOwner, snapshot_dir: Path, *, restart_timeout_s: float = RESTART_TIMEOUT_S):
        self.valkey = _check_restorable_valkey(valkey)
        self.name = self.fault
        self.snapshot_dir = Path(snapshot_dir)
        self.restart_timeout_s = _seconds("restart_timeout_s", restart_timeout_s, maximum=600)
        self._snapshot: dict[str, Any] | None = None

    @property
    def fs(self) -> frozenset[str]:
        """`start-valkey-restore` (snapshot) and `stop-valkey-restore` (restore)."""
        return frozenset({"start-valkey-restore", "stop-valkey-restore"})

    async def setup(self, test: Test) -> None:
        """Valkey must be running and the snapshot directory writable."""
        if not self.valkey.alive():
            raise NemesisUnavailable("valkey-restore: Valkey is not running")
        try:
            self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NemesisUnavailable(f"valkey-restore: cannot create {self.snapshot_dir}: {e.strerror}") from e

    async def invoke(self, test: Test, op: dict) -> dict:
        """Take the snapshot, or restore it."""
        f = op.get("f")
        if f == "start-valkey-restore":
            return await self._start(op, op.get("value"))
        if f == "stop-valkey-restore":
            return await self._stop(op, op.get("value"))
        raise ValueError(f"valkey-restore nemesis does not handle f {f!r}; it handles {', '.join(sorted(self.fs))}")

    async def teardown(self, test: Test) -> None:
        """Valkey running and answering; a snapshot not restored is dropped (a heal never rolls back)."""
        self._snapshot = None
        await heal_processes({"valkey": self.valkey}, timeout_s=self.restart_timeout_s)

    async def _start(self, op: dict, value: Any) -> dict:
        """SAVE, and move the RDB out of the data directory as the snapshot (phase start)."""
        if value is not None and value != {}:
            raise ValueError(f"start-valkey-restore takes no value (null), got {value!r}")
        base = {"fault": self.fault, "target": "valkey", "persistence": self.valkey.persistence}
        if self._snapshot is not None:
            return completion(op, {**base, "phase": "none", "snapshot": self._snapshot["path"]},
                              error="valkey-restore already holds a snapshot; stop it first")
        conn = _conn(self.valkey)
        try:
            cfg = await conn.config_get("dir")
            cfg.update(await conn.config_get("dbfilename"))
            cfg.update(await conn.config_get("appenddirname"))
            cfg.update(await conn.config_get("appendfilename"))
            keys = int(await conn.dbsize())
            await conn.save()  # synchronous: the RDB is complete when SAVE answers
        except (RedisError, OSError) as e:
            return completion(op, {**base, "phase": "none"}, error=f"snapshot failed: {type(e).__name__}: {e}")
        finally:
            await conn.aclose()
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        path = self.snapshot_dir / f"snapshot-{os.getpid()}-{next(_snapshots)}.rdb"
        # moved, not copied: a dump.rdb left behind would be loaded by a later restart without AOF
        if isinstance(self.valkey, ValkeyProcess):
            os.replace(Path(cfg["dir"]) / cfg["dbfilename"], path)
        else:
            try:
                await asyncio.to_thread(self.valkey.take_file, f"{cfg['dir']}/{cfg['dbfilename']}", path)
            except ProcessError as e:
                return completion(op, {**base, "phase": "none"}, error=f"snapshot failed: {e}")
        self._snapshot = {"path": str(path), "keys": keys, "config": cfg}
        return completion(op, {**base, "phase": "start", "snapshot": str(path), "keys": keys,
                               "bytes": path.stat().st_size})

    async def _stop(self, op: dict, value: Any) -> dict:
        """Kill Valkey, swap its files for the snapshot, restart it (phase end); `discard` skips the restore."""
        if value is None:
            value = {}
        if not isinstance(value, dict) or set(value) - {"discard"} or not isinstance(value.get("discard", False), bool):
            raise ValueError(f"stop-valkey-restore value must be null or {{\"discard\": true|false}}, got {value!r}")
        base = {"fault": self.fault, "target": "valkey", "persistence": self.valkey.persistence}
        if self._snapshot is None:
            return completion(op, {**base, "phase": "none", "restored": False})
        snap, self._snapshot = self._snapshot, None
        if value.get("discard"):
            return completion(op, {**base, "phase": "end", "restored": False, "snapshot": snap["path"]})
        keys_before = await _keys(self.valkey)
        pid = await kill_process(self.valkey)
        try:
            installed, failed = await asyncio.to_thread(self._install, snap), None
        except (ProcessError, OSError) as e:  # Valkey restarts from its own files: the window closes unrestored
            installed, failed = [], f"restore failed: {e}"
        restarted = await restart_process(self.valkey, self.restart_timeout_s)
        value = {**base, "phase": "end", "restored": failed is None, "snapshot": snap["path"], "killed_pid": pid,
                 "installed": installed, "restarted": restarted, "keys_before": keys_before,
                 "keys_snapshot": snap["keys"], "keys_after": await _keys(self.valkey)}
        return completion(op, value, error=failed or (None if restarted.get("ready")
                                                      else "Valkey does not answer after restore"))

    def _install(self, snap: dict[str, Any]) -> list[str]:
        """Replace Valkey's files (it is dead) with the snapshot; the files written, relative to its dir."""
        cfg = snap["config"]
        if not isinstance(self.valkey, ValkeyProcess):
            return self.valkey.put_files(cfg["dir"], _container_restore_files(self.valkey.persistence, cfg,
                                                                              Path(snap["path"]).read_bytes()))
        root = Path(cfg["dir"])
        if self.valkey.persistence == "none":
            shutil.copyfile(snap["path"], root / cfg["dbfilename"])
            return [cfg["dbfilename"]]
        # multi-part AOF: a manifest naming one base file, which may be in RDB format (Valkey >= 7)
        aof_dir = root / cfg["appenddirname"]
        shutil.rmtree(aof_dir, ignore_errors=True)
        aof_dir.mkdir()
        base = f"{cfg['appendfilename']}.1.base.rdb"
        shutil.copyfile(snap["path"], aof_dir / base)
        (aof_dir / f"{cfg['appendfilename']}.manifest").write_text(f"file {base} seq 1 type b\n")
        return [f"{cfg['appenddirname']}/{base}", f"{cfg['appenddirname']}/{cfg['appendfilename']}.manifest"]


def _container_restore_files(persistence: str, cfg: dict[str, str], rdb: bytes) -> dict[str, bytes]:
    """The files that restart Valkey from `rdb` in a data directory that cannot be emptied first: `dump.rdb`
    without AOF; with AOF a manifest naming the snapshot as base and a fresh empty incr file (both written
    over whatever had those names; files the manifest does not name are never read)."""
    if persistence == "none":
        return {cfg["dbfilename"]: rdb}
    d, name = cfg["appenddirname"], cfg["appendfilename"]
    base, incr = f"{name}.1.base.rdb", f"{name}.1.incr.aof"
    return {f"{d}/{base}": rdb, f"{d}/{incr}": b"",
            f"{d}/{name}.manifest": f"file {base} seq 1 type b\nfile {incr} seq 1 type i\n".encode()}


def crash_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `start-valkey-crash` value that crashes Valkey again with the start completion `record`'s timed restart
    (null: at the stop)."""
    return {"restart_after_s": record.get("restart_after_s")}


def restore_replay(record: dict[str, Any]) -> None:
    """`start-valkey-restore` takes no value: it snapshots whatever Valkey holds then."""
    return None


def valkey_crash(valkey: ValkeyOwner, *, restart_after_s: float | None = None,
                 restart_timeout_s: float = RESTART_TIMEOUT_S) -> ValkeyCrashNemesis:
    """SIGKILL Valkey and restart it from its own files: `start-valkey-crash` / `stop-valkey-crash`."""
    return ValkeyCrashNemesis(valkey, restart_after_s=restart_after_s, restart_timeout_s=restart_timeout_s)


def valkey_restore(valkey: ValkeyOwner, snapshot_dir: Path, *,
                   restart_timeout_s: float = RESTART_TIMEOUT_S) -> ValkeyRestoreNemesis:
    """Snapshot, then restart Valkey from it: `start-valkey-restore` / `stop-valkey-restore`."""
    return ValkeyRestoreNemesis(valkey, snapshot_dir, restart_timeout_s=restart_timeout_s)
