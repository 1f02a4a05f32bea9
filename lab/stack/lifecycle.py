"""The one lifecycle of a stack that owns processes: start and record them, the store, the topology, down.

`ProcessStack` is what `LocalStack` (lab/stack/local.py), `SshStack`
(lab/stack/ssh.py), `ComposeStack` (lab/stack/compose.py) and a system's
own `SutStack` (lab/sut/processes.py) share:

- `up(opts)`: check the options, refuse a stack that is already up, start
  everything (`_start_all`, the backend's own part), and on any failure stop
  what was started (`_cleanup_after`) before the error goes on; returns
  `status()`.
- `_start(proc)`: start one process and record it in `state.json` at once,
  so that `down` (possibly from another command, much later) always finds it.
- `_start_store(wanted, url)`: the store choice: none, the user's own
  (`--store-url`, an `ExternalStore`: only its URL) or the lab's
  pouchdb-server.
- `_start_proxies(links)`: Toxiproxy and one proxy per link (the topology
  the network nemeses read from `info`).
- `down()`: stop every recorded process in reverse start order (tier by
  tier, `_stop_tiers`: a tier's processes asked to exit together), then the
  backend's own clean-up (`_after_stop`: namespaces, remote run
  directories, scratch data), then remove `state.json`.
- `status()`: the typed `StackStatus`, from `info` and one `ProcessRow` per
  process.

A backend says only where a process runs: its handles (`_process_from_state`:
a local pid, a container, a process on an SSH node), how one is placed before
it starts (`_place`: into a network namespace), how a row reads
(`_row`), and its extras in the status (`_status_extras`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, ClassVar

from lab.secrets import redact_url
from lab.stack.base import ProcessRow, StackFiles, StackStatus, rows_up
from lab.stack.errors import StackError
from lab.stack.process import ManagedProcess, ProcessError
from lab.stack.store import ExternalStore, PouchDBProcess
from lab.stack.topology import Link, Topology
from lab.stack.toxiproxy import ToxiproxyProcess
from lab.stack.toxiproxy_api import ToxiproxyClient

__all__ = ["ProcessStack"]


class ProcessStack(StackFiles):
    """A stack whose processes the lab starts, records in state.json and stops (see the module docstring)."""

    backend: ClassVar[str] = "local"
    stop_errors: ClassVar[tuple[type[BaseException], ...]] = (ProcessError,)  # what a failed stop raises
    die_with_parent: bool = False
    processes: list
    info: dict[str, Any]

    # -- up -----------------------------------------------------------------------------
    def up(self, opts: Any) -> StackStatus:
        """Check `opts`, start everything; on any failure stop what was started and re-raise."""
        self._check(opts)
        if self.load_state() and any(self._alive(p) for p in self.processes):
            raise StackError(f"stack {self.name!r} is already up; run `fencelab down --name {self.name}` first")
        self.processes = []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.info = self._initial_info(opts)
        try:
            self._start_all(opts)
        except BaseException as e:
            self._cleanup_after(e)
            raise
        return self.status()

    def _check(self, opts: Any) -> None:
        """Validate the options before anything starts (StackError naming the bad one)."""
        opts.validate()

    def _initial_info(self, opts: Any) -> dict[str, Any]:
        """What state.json says before the first process starts."""
        return {"name": self.name, "dir": str(self.dir), "options": vars(opts),
                "credentials": str(self.credentials_file)}

    def _start_all(self, opts: Any) -> None:
        """The backend's own start-up: every process, through `_start`."""
        raise NotImplementedError

    def _cleanup_after(self, error: BaseException) -> None:
        """`down()` after a failed `up`."""
        self.down()

    def _start(self, proc: Any, *, wait: bool = True, timeout: float | None = None) -> Any:
        """Start one process (until healthy, unless `wait=False`; within `timeout` s, else the process's default)
        and record it in state.json at once (so `down` can always find it)."""
        if isinstance(proc, ManagedProcess):
            proc.die_with_parent = self.die_with_parent
        self._place(proc)
        self.processes.append(proc)
        try:
            proc.start(wait=wait, **({} if timeout is None else {"timeout": timeout}))
        finally:
            self.save_state()
        return proc

    def _place(self, proc: Any) -> None:
        """Where a process not yet started runs (the local stack moves it into a network namespace)."""

    def _start_store(self, wanted: bool, url: str | None, *, wait: bool = True) -> ExternalStore | PouchDBProcess | None:
        """The store choice: none, the user's own at `url` (only its URL), or the lab's pouchdb-server (until
        healthy, unless `wait=False`: the caller waits, having started other processes meanwhile)."""
        if not wanted:
            return None
        if url:
            self.info["store"] = redact_url(url)
            return ExternalStore(url)
        store = self._start(PouchDBProcess(self.dir), wait=wait)
        self.info["store"] = store.url
        return store

    def _start_proxies(self, links: Iterable[Link], toxiproxy: ToxiproxyProcess | None = None) -> Topology:
        """Start Toxiproxy (or wait for `toxiproxy`, started earlier without waiting) and one proxy per link
        (`listen` port 0: a free one); the topology's description goes into `info["topology"]` (and state.json),
        where the network nemeses read it."""
        if toxiproxy is None:
            tp = self._start(ToxiproxyProcess(self.dir))
        else:
            tp = toxiproxy
            tp.wait_healthy()
        self.info["toxiproxy"] = tp.url

        async def create() -> dict[str, Any]:
            async with ToxiproxyClient(tp.url) as client:
                return (await Topology.create(client, links)).describe()

        self.info["topology"] = asyncio.run(create())
        self.save_state()
        return Topology.from_description(None, self.info["topology"])

    # -- state --------------------------------------------------------------------------
    def load_state(self) -> dict[str, Any] | None:
        """Read state.json (if any) into handles that can stop the recorded processes."""
        data = self.read_state_file()
        if data is None:
            return None
        self.info = {k: v for k, v in data.items() if k != "processes"}
        self.processes = [self._process_from_state(d) for d in data.get("processes", [])]
        return data

    def _process_from_state(self, d: dict[str, Any]) -> Any:
        """A handle on a recorded process (a local pid by default)."""
        return ManagedProcess.from_state(d)

    # -- status -------------------------------------------------------------------------
    def _alive(self, p: Any) -> bool:
        """Is `p` alive (a backend whose check can fail over the network says False then)?"""
        return p.alive()

    def _row(self, p: Any) -> ProcessRow:
        """One process in `status()`."""
        return ProcessRow(name=p.name, pid=p.pid, alive=self._alive(p), ports=p.ports, log=str(p.log_path))

    def _status_extras(self) -> dict[str, Any]:
        """The backend's own fields of `StackStatus` (or values that differ from the common reading of `info`)."""
        return {}

    def status(self) -> StackStatus:
        """What runs and where it answers (what `fencelab status --json` prints)."""
        return self._status([self._row(p) for p in self.processes])

    def _status(self, rows: list[ProcessRow], **extra: Any) -> StackStatus:
        """The status of a stack whose processes read as `rows`, from `info`, the backend's extras, `extra`."""
        fields: dict[str, Any] = {
            "name": self.name, "backend": self.backend, "dir": str(self.dir), "up": rows_up(rows),
            "lease_servers": self.info.get("lease_servers", []), "valkey": self.info.get("valkey"),
            "store": self.info.get("store"), "toxiproxy": self.info.get("toxiproxy"),
            "client_nodes": self.info.get("client_nodes", self.info.get("lease_servers", [])),
            "topology": self.info.get("topology"), "clocks": self.info.get("clocks", {}),
            "credentials": str(self.credentials_file), "processes": rows,
        }
        fields.update(self._status_extras(), **extra)
        return StackStatus(**fields)

    # -- down ---------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop every recorded process (reverse start order), the backend's clean-up, remove state.json;
        returns the names of the processes that were running."""
        if not self.processes:
            self.load_state()
        stopped, errors = [], []
        for tier in self._stop_tiers():
            asked = {id(p) for p in tier if len(tier) > 1 and self._terminate(p)}
            for p in tier:
                try:
                    running = id(p) in asked or p.alive()
                    p.stop()  # also for a dead one: closes its log file
                    if running:
                        stopped.append(p.name)
                except self.stop_errors as e:
                    errors.append(self._stop_error(p, e))
        errors += self._after_stop()
        if errors:
            raise StackError("; ".join(errors))
        self.processes = []
        if self.state_file.exists():
            self.state_file.unlink()
        return stopped

    def _stop_tiers(self) -> list[list[Any]]:
        """The order `down` stops in: tier after tier, the processes of one tier asked to exit together (their
        shutdowns overlap). By default one process per tier, in reverse start order."""
        return [[p] for p in reversed(self.processes)]

    def _terminate(self, p: Any) -> bool:
        """Ask a local process to exit without waiting for it (`ManagedProcess.terminate`), so that `down`'s stops
        overlap; True when it was running. Other handles (a container, an SSH node's process) stop one by one."""
        if not isinstance(p, ManagedProcess) or not p.alive():
            return False
        p.terminate()
        return True

    def _stop_error(self, p: Any, e: BaseException) -> str:
        """How a failed stop reads in down's error."""
        return str(e)

    def _after_stop(self) -> list[str]:
        """The backend's clean-up once its processes are stopped; the errors, one line each."""
        return []
