"""etcd as a system under test (`--sut etcd`): a real 3-member cluster the lab runs, its leases and its lock.

The lab runs the cluster itself (`lab.sut.processes`): members `etcd-1..3`
on loopback, each with a client and a peer port, built by `scripts/install.sh
etcd` into `.tools/bin/etcd` (etcd 3.6.16 from the Go module proxy). Every
client group dials every member through its own Toxiproxy proxy
(`c<g>_etcd-<i>`), and every member dials every other member's peer port
through its own proxy (`etcd-1_etcd-2`, `etcd-2_etcd-1`, ...: one per
direction of each pair), so a grudge cuts raft traffic per pair: `isolate-server`
of `etcd-2` cuts everything it sends and receives, and `etcd-1_etcd-2` with
`etcd-2_etcd-1` alone leave etcd-3 talking to both. The cluster advertises one
peer URL per member that all agree on (`http://etcd-2.fencelab.test:<P>`: etcd
derives member IDs from `--initial-cluster`), and each member resolves that
name through its own /etc/hosts to its own proxy (`lab.sut.processes.MEMBERS`);
where the lab cannot give a member its own /etc/hosts (not root, no unshare),
one proxy per receiver (`members_etcd-2`) and `info["peer_links"]` says why.

The lock is etcd's own recipe (what `etcdctl lock` and the concurrency
package do, without the waiting queue):

- acquire = `LeaseGrant(TTL)` then one transaction: if the lock key's
  `create_revision == 0` (absent), put it attached to the lease; else read it.
  The fencing token is the key's create revision (the transaction's header
  revision): what etcd's lock hands out, strictly increasing cluster-wide.
  A lost race revokes the fresh lease and is `lease_conflict`.
- renew = one `LeaseKeepAlive` (the reply's TTL 0 means the lease is gone:
  `lease_lost`); release = `LeaseRevoke` (the key goes with it; NotFound:
  `lease_lost`); inspect = a range read of the lock key.
- commit (capability `commit`): a write into the lab's CouchDB-API store.
  `fenced` (the default): a linearizable read of the lock key first (it must
  still carry this lease's create revision: the comparison etcd's own
  `Mutex.IsOwner` puts in a transaction; a lost lock is `lease_lost`, nothing
  written), then the write through the store's token guard (the document
  carries the token as `fence_token`, and `lab.couch.FENCE_VALIDATE`, the same
  `validate_doc_update` rule the reference server's commit boundary relies
  on, refuses a lower one). So, like the contract's boundary (C25 then C27), a
  holder that stalls after the check may still land its write after expiry
  (C29) but never over a successor's. `unfenced` (`--commit-mode unfenced`):
  on belief alone, no check, read-append-PUT with `_rev` into a database
  without a guard. The store write itself is `lab.sut.valkey_lock`'s, shared
  so both third-party systems write the same way.

The client is etcd's v3 JSON gateway (grpc-gateway, served on each member's
client port) over httpx, one member per worker, no retries, not a Python etcd
client. Why: the gRPC clients (aetcd, the unmaintained python-etcd3) bring
grpcio, whose channel retries transparently and sends HTTP/2 keep-alive pings
from a background thread, and whose lease helpers keep leases alive in the
background. The lab must see every request a worker sends (retries would hide
what etcd did) and a paused worker must send nothing at all, keep-alives
included (issue 11: a client pause must be real). Here a worker's only
traffic is the requests of the op it is running: a keep-alive is sent only by
`renew`, and every request first awaits the worker's client-pause gate
(`pause_gate`), so a paused worker sends nothing while its lease runs out on
etcd, and stops where a SIGSTOPped process would, mid-op included (between
the grant and the lock transaction; between the fenced commit's ownership
read and its write: Kleppmann's pause). tests/test_sut_etcd.py shows both.

Outcomes: `fail` only when the op definitely did not take effect (nothing was
sent; etcd answered NotFound; the lock was taken; a grant whose transaction
never left); `info` when it may have (a timeout or a dropped connection after
the transaction, the keep-alive or the revoke was sent, or any other etcd error
then: `etcdserver: request timed out` may still commit).

What etcd does not claim, so the lab neither runs nor judges it (`NOT_CLAIMED`):
idempotent retries by request id (etcd never sees a request id: a retried grant
is a new lease), and exclusion in backend wall-clock time: etcd reports no
wall-clock time for a lease (its expiry runs on the leader's monotonic clock
and is extended on a leader change), so the leases carry no acquired/expires
times and the `mutual-exclusion` checker has nothing it could compare. Its
lock's order is the revision order: the tokens, which the `fencing` checker
judges (unique, increasing in real-time order), and the stale-commit checks
judge what the store accepted. Its processes are Go binaries, which read the
clock through the vDSO and not libc, so libfaketime cannot move their clocks:
the `clock` nemesis is refused for etcd, and `client-clock` too (this client
reads no clock).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import quote

import httpx

from lab import paths
from lab.client.lease import _SendProbe
from lab.client.results import CONNECT_ERROR, CONNECTION_LOST, TIMEOUT, Identity, Lease, Result
from lab.sut.processes import (CLIENTS, MEMBERS, LinkSpec, ProcessSpec, SystemProcesses, member_processes_of,
                               store_url_for)
from lab.sut.protocol import SutError
from lab.sut.valkey_lock import COMMIT_MODES, ValkeyLockSystem, commit_mode_of
from lab.testmap import Test

ETCD_VERSION = "3.6.16"
MEMBER_COUNT = 3
LOCK_PREFIX = "fencelab/lock/"
NOT_FOUND = 5  # gRPC NotFound (a lease that does not exist any more)
HEARTBEAT_MS = 100
ELECTION_MS = 1000
NOT_CLAIMED = {
    "idempotency": "etcd never sees a request id: retries by request id are not a feature it claims (a retried "
                   "grant is a new lease)",
    "mutual-exclusion": "etcd reports no wall-clock time for a lease (its expiry runs on the leader's monotonic "
                        "clock and is extended on a leader change), so exclusion in backend time has nothing to "
                        "compare; its lock's order is the revision order, judged through the tokens (fencing) "
                        "and the store's accepted writes (stale-commit)",
    "linearizable": "the lease model judges expiry in the backend's wall-clock lease times and merges retries by "
                    "request id; etcd has neither",
}
CLOCK_NOTE = ("etcd is a Go binary: it reads the clock through the vDSO, not libc, so libfaketime cannot move it")


def etcd_binary() -> Path:
    """`.tools/bin/etcd` (or $FENCELAB_ETCD); MissingTool naming the install step when absent."""
    override = os.environ.get("FENCELAB_ETCD")
    path = Path(override) if override else paths.TOOLS / "bin" / "etcd"
    if not path.exists():
        raise paths.MissingTool(f"etcd not found at {path}: run `scripts/install.sh etcd` (or `make install`), "
                                f"which builds etcd {ETCD_VERSION} with Go")
    return path


def lock_key(identity: Identity) -> str:
    """The etcd key of an identity's lock: the seven fields, percent-quoted, joined by `/`."""
    return LOCK_PREFIX + "/".join(quote(v, safe="") for v in identity.as_dict().values())


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- the cluster the lab runs ------------------------------------------------------------------------------------
def member_names(n: int = MEMBER_COUNT) -> list[str]:
    return [f"etcd-{i}" for i in range(1, n + 1)]


def etcd_processes(test: Test):
    """Three etcd members on loopback; clients dial each member's client port, members each other's peer port
    (one link per sender and receiver)."""
    names = member_names()
    token = f"fencelab-{secrets.token_hex(4)}"  # a fresh cluster per run

    def argv(name: str):
        def build(p) -> list[str]:
            cluster = ",".join(f"{n}={p.url(MEMBERS, n, 'peer')}" for n in names)
            return [str(etcd_binary()), "--name", name, "--data-dir", str(p.data_dir(name) / "data"),
                    "--listen-client-urls", f"http://127.0.0.1:{p.port(name, 'client')}",
                    "--advertise-client-urls", f"http://127.0.0.1:{p.port(name, 'client')}",
                    "--listen-peer-urls", f"http://127.0.0.1:{p.port(name, 'peer')}",
                    "--initial-advertise-peer-urls", p.url(MEMBERS, name, "peer"),
                    "--initial-cluster", cluster, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token,
                    "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
                    "--log-level", "warn"]
        return build

    return SystemProcesses(
        system="etcd",
        # keep_data=False: each member preallocates 64 MB WAL files; a run keeps the logs, not the cluster's data
        processes=tuple(ProcessSpec(n, argv=argv(n), ports=("client", "peer"), health=_answers,
                                    fake_clock=False, clock_note=CLOCK_NOTE, keep_data=False) for n in names),
        # every member dials every other's peer port by its agreed name: a link per (sender, receiver) pair
        links=tuple(LinkSpec(CLIENTS, n, "client") for n in names) + tuple(LinkSpec(MEMBERS, n, "peer")
                                                                           for n in names),
        client_url=lambda address: f"http://{address}",
        install="run `scripts/install.sh etcd` (or `make install`)",
        check_installed=etcd_binary,
        ready=_cluster_ready,
        leader=leader_of,
        client_clock=False,
        client_clock_note="the etcd client reads no clock (etcd keeps every lease time itself)")


def _answers(proc) -> bool:
    """The member serves HTTP on its client port (`/health` says 200, or 503 while it has no leader)."""
    r = httpx.get(f"http://127.0.0.1:{proc.ports['client']}/health", timeout=0.5)
    return r.status_code in (200, 503)


def _cluster_ready(stack) -> bool:
    """Every member reports itself healthy (it has a leader and serves reads)."""
    for proc in member_processes_of(stack).values():
        r = httpx.get(f"http://127.0.0.1:{proc.ports['client']}/health", timeout=1.0)
        if r.status_code != 200 or r.json().get("health") != "true":
            return False
    return True


def leader_of(stack) -> str | None:
    """The member that leads now, by its own report (`Maintenance.Status` on its real client port, the lab's
    instrument: never through a faulted link); None when no answering member names a leader it also is."""
    for name, proc in member_processes_of(stack).items():
        if not proc.alive():
            continue
        try:
            r = httpx.post(f"http://127.0.0.1:{proc.ports['client']}/v3/maintenance/status", json={}, timeout=0.5)
            body = r.json()
        except (httpx.HTTPError, ValueError):
            continue
        if r.status_code == 200 and body.get("leader") and body.get("leader") == body.get("header", {}).get(
                "member_id"):
            return name
    return None


# -- the client ----------------------------------------------------------------------------------------------------
class _Reply:
    """An etcd gateway answer: HTTP status and JSON body."""

    __slots__ = ("status", "body")

    def __init__(self, status: int, body: Any):
        self.status, self.body = status, body

    @property
    def grpc_code(self) -> int | None:
        return self.body.get("code") if isinstance(self.body, dict) else None

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else str(self.body)[:200]


class _Unsent(Exception):
    """Nothing of the request left this client (connection refused, or the deadline passed first)."""


class _Broken(Exception):
    """The request left; its answer did not arrive (timeout, dropped connection, unreadable reply)."""

    def __init__(self, code: str, msg: str):
        super().__init__(msg)
        self.code = code


class EtcdLockSystem:
    """etcd's lease + create-if-absent lock key, through the v3 JSON gateway of one member (module docstring)."""

    capabilities = frozenset({"commit"})
    FENCING_TOKENS = True

    def __init__(self, node: str, store_url: str | None = None, *, service_instance_id: str = "",
                 timeout_s: float = 5.0, commit_mode: str = "fenced"):
        if commit_mode not in COMMIT_MODES:
            raise ValueError(f"commit_mode must be one of {', '.join(COMMIT_MODES)}, not {commit_mode!r}")
        self.node = node.rstrip("/")
        self.store_url = store_url
        self.service_instance_id = service_instance_id
        self.timeout_s = timeout_s
        self.commit_mode = commit_mode
        # no retries (httpx never retries a request; connection retries are off by default): one op, one request
        self.http = httpx.AsyncClient(base_url=self.node, timeout=timeout_s)
        self._couch = None
        self._dbs_ready: set[str] = set()
        # the last requests this client sent (gateway paths, "store"), oldest first: tests read it (a paused
        # worker sends none); bounded, since a worker lives for the whole run
        self.sent: list[str] = []
        # the client-pause gate (set per op by the workload client, like clock_ms): awaited before every request
        # this client sends, so a paused worker stops at its next request, inside an op too (between the grant
        # and the lock transaction, between the ownership read and the store write), as a SIGSTOPped process
        # would; time spent there is not charged to the op's deadline (a paused process does not notice it)
        self.pause_gate: Callable[[], Awaitable[None]] | None = None
        self._paused_s = 0.0

    # -- the wire ----------------------------------------------------------------------------------------------
    async def _post(self, path: str, body: dict, deadline_s: float | None) -> _Reply:
        """One POST to the gateway under the caller's deadline; _Unsent / _Broken when no answer came."""
        await self._gate()
        probe = _SendProbe()
        req = self.http.build_request("POST", path, content=json.dumps(body).encode(),
                                      headers={"content-type": "application/json"}, extensions={"trace": probe})
        self._record(path)
        try:
            if deadline_s is None:
                r = await self.http.send(req)
            else:
                async with asyncio.timeout(deadline_s):  # not wait_for: 3.11's can swallow a cancellation
                    r = await self.http.send(req)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise _Unsent(f"{path}: {type(e).__name__}: {e}"[:300]) from None
        except (asyncio.TimeoutError, httpx.TimeoutException) as e:
            if not probe.sent:
                raise _Unsent(f"{path}: deadline passed before sending") from None
            raise _Broken(TIMEOUT, f"{path}: {type(e).__name__} after sending") from None
        except httpx.HTTPError as e:
            if not probe.sent:
                raise _Unsent(f"{path}: {type(e).__name__}: {e}"[:300]) from None
            raise _Broken(CONNECTION_LOST, f"{path}: {type(e).__name__}: {e}"[:300]) from None
        try:
            data = r.json() if r.content else {}
        except ValueError:
            raise _Broken("unparseable_response", f"{path}: HTTP {r.status_code}: {r.text[:200]!r}") from None
        return _Reply(r.status_code, data)

    def _record(self, what: str) -> None:
        self.sent.append(what)
        if len(self.sent) > 256:
            del self.sent[:128]

    async def _gate(self) -> None:
        """Wait at the client-pause gate, if any (accounting the time paused)."""
        if self.pause_gate is None:
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.pause_gate()
        self._paused_s += loop.time() - t0

    def _elapsed(self, t0: float, paused0: float) -> float:
        """Seconds since loop time `t0`, less the time paused at the gate since then."""
        return asyncio.get_running_loop().time() - t0 - (self._paused_s - paused0)

    @staticmethod
    def _unsent(e: _Unsent) -> Result:
        code = CONNECT_ERROR if "Connect" in str(e) else "deadline_exceeded"
        return Result("fail", code, msg=str(e))

    def _lease(self, identity: Identity | None, lease_id: int, token: int, ttl_s: int | None,
               state: str = "active") -> Lease:
        d = identity.as_dict() if identity is not None else {}
        return Lease(lease_id=f"{lease_id:x}", fencing_token=token, state=state,
                     ttl_ms=None if ttl_s is None else ttl_s * 1000,
                     lock_key=lock_key(identity) if identity is not None else None,
                     service_instance_id=self.service_instance_id or None, **d)

    # -- the LeaseSystem operations -----------------------------------------------------------------------------
    async def acquire(self, identity: Identity, *, ttl_ms: int, request_id: str | None = None,
                      deadline_s: float | None = None) -> Result:
        """Grant a lease, then create the lock key on it only if absent; the token is the key's create revision."""
        t0, paused0 = asyncio.get_running_loop().time(), self._paused_s
        ttl_s = max(1, math.ceil(ttl_ms / 1000))
        try:
            grant = await self._post("/v3/lease/grant", {"TTL": ttl_s}, deadline_s)
        except _Unsent as e:
            return self._unsent(e)
        except _Broken as e:  # a lease may exist, but no lock key was written: the lock was not taken
            return Result("fail", "lease_backend_unavailable", msg=f"acquire: grant unanswered ({e}); no lock key "
                                                                     "was written")
        if grant.status != 200 or "ID" not in grant.body:
            return Result("fail", "lease_backend_unavailable", msg=f"acquire: grant refused: HTTP {grant.status} "
                                                                     f"{grant.message}")
        lease_id, granted = int(grant.body["ID"]), int(grant.body.get("TTL", ttl_s))
        key = _b64(lock_key(identity))
        owner = json.dumps({"lease": f"{lease_id:x}", "instance": self.service_instance_id})
        txn = {"compare": [{"key": key, "target": "CREATE", "create_revision": "0", "result": "EQUAL"}],
               "success": [{"request_put": {"key": key, "value": _b64(owner), "lease": str(lease_id)}}],
               "failure": [{"request_range": {"key": key}}]}
        rest = None if deadline_s is None else max(0.001, deadline_s - self._elapsed(t0, paused0))
        try:
            r = await self._post("/v3/kv/txn", txn, rest)
        except _Unsent as e:
            return self._unsent(e)
        except _Broken as e:
            return Result("info", e.code, msg=f"acquire: the lock transaction was sent, its answer lost: {e}")
        if r.status == 404 and r.grpc_code == NOT_FOUND:  # the lease expired before the transaction ran
            return Result("fail", "lease_lost", msg=f"acquire: {r.message}")
        if r.status != 200:
            return Result("info", "lease_outcome_unknown", msg=f"acquire: txn HTTP {r.status}: {r.message}")
        if not r.body.get("succeeded"):
            await self._revoke_quietly(lease_id)
            return Result("fail", "lease_conflict", msg="the lock key exists (create_revision != 0)")
        token = int(r.body["header"]["revision"])
        return Result("ok", "lease_acquired", lease=self._lease(identity, lease_id, token, granted))

    async def _revoke_quietly(self, lease_id: int) -> None:
        """Give back a lease that lost the race (best effort: it expires by itself anyway)."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease_id)}, 1.0)
        except (_Unsent, _Broken):
            pass

    @staticmethod
    def _etcd_id(lease: Lease) -> int:
        return int(lease.lease_id, 16)

    async def renew(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                    deadline_s: float | None = None) -> Result:
        """One keep-alive: ok with the TTL etcd granted again; TTL 0 (the lease is gone) is `lease_lost`."""
        try:
            r = await self._post("/v3/lease/keepalive", {"ID": str(self._etcd_id(lease))}, deadline_s)
        except _Unsent as e:
            return self._unsent(e)
        except _Broken as e:
            return Result("info", e.code, msg=f"renew: {e}")
        if r.status == 404 and r.grpc_code == NOT_FOUND:
            return Result("fail", "lease_lost", msg=f"renew: {r.message}")
        result = r.body.get("result") if isinstance(r.body, dict) else None
        if r.status != 200 or not isinstance(result, dict):
            return Result("info", "lease_outcome_unknown", msg=f"renew: HTTP {r.status}: {r.message}")
        ttl = int(result.get("TTL", 0) or 0)
        if ttl <= 0:
            return Result("fail", "lease_lost", msg="renew: etcd says the lease has expired (keep-alive TTL 0)")
        ident = identity or _identity_of(lease)
        return Result("ok", "lease_renewed", lease=self._lease(ident, self._etcd_id(lease), lease.fencing_token, ttl))

    async def release(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                      deadline_s: float | None = None) -> Result:
        """Revoke the lease (the lock key goes with it); NotFound: it had expired already (`lease_lost`)."""
        try:
            r = await self._post("/v3/lease/revoke", {"ID": str(self._etcd_id(lease))}, deadline_s)
        except _Unsent as e:
            return self._unsent(e)
        except _Broken as e:
            return Result("info", e.code, msg=f"release: {e}")
        if r.status == 404 and r.grpc_code == NOT_FOUND:
            return Result("fail", "lease_lost", msg=f"release: {r.message}")
        if r.status != 200:
            return Result("info", "lease_outcome_unknown", msg=f"release: HTTP {r.status}: {r.message}")
        ident = identity or _identity_of(lease)
        return Result("ok", "lease_released",
                      lease=self._lease(ident, self._etcd_id(lease), lease.fencing_token, None, state="released"))

    async def inspect(self, target: Identity | str, *, deadline_s: float | None = None) -> Result:
        """The lock key's holder: its lease and create revision (a read: an error changes nothing)."""
        if not isinstance(target, Identity):
            return Result("fail", "invalid_lease_request", msg="etcd inspects by identity only")
        try:
            r = await self._post("/v3/kv/range", {"key": _b64(lock_key(target))}, deadline_s)
        except (_Unsent, _Broken) as e:
            return Result("fail", "lease_backend_unavailable", msg=f"inspect: {e}")
        if r.status != 200:
            return Result("fail", "lease_backend_unavailable", msg=f"inspect: HTTP {r.status}: {r.message}")
        kvs = r.body.get("kvs") or []
        if not kvs:
            return Result("fail", "lease_not_found")
        kv = kvs[0]
        return Result("ok", "lease_inspected",
                      lease=self._lease(target, int(kv.get("lease", 0)), int(kv["create_revision"]), None))

    # -- commits: the same store writes as the Valkey locks (lab.sut.valkey_lock) ------------------------------
    async def commit(self, lease: Lease, doc: str, body: Any, *, identity: Identity | None = None,
                     request_id: str | None = None, deadline_s: float | None = None) -> Result:
        """Append to `doc` in the store. Fenced: first a linearizable read of the lock key in etcd (this lease's
        key, create revision = our token: etcd's `IsOwner` comparison), then the write through the store's
        token guard. Unfenced: the write alone, on belief."""
        if self.commit_mode == "fenced":
            t0, paused0 = asyncio.get_running_loop().time(), self._paused_s
            lost = await self._still_owner(lease, identity, deadline_s)
            if lost is not None:
                return lost
            if deadline_s is not None:
                deadline_s = max(0.001, deadline_s - self._elapsed(t0, paused0))
        await self._gate()  # a pause here is Kleppmann's: after the check, before the write
        self._record("store")
        return await ValkeyLockSystem.commit(self, lease, doc, body, identity=identity, request_id=request_id,
                                             deadline_s=deadline_s)

    async def _still_owner(self, lease: Lease, identity: Identity | None, deadline_s: float | None) -> Result | None:
        """None when etcd says the lock key still carries this lease's token; else the failed commit's Result
        (nothing was written: a read only)."""
        ident = identity or _identity_of(lease)
        if ident is None:
            return Result("fail", "invalid_lease_request", msg="commit: the lease carries no identity")
        try:
            r = await self._post("/v3/kv/range", {"key": _b64(lock_key(ident))}, deadline_s)
        except _Unsent as e:
            return self._unsent(e)
        except _Broken as e:  # a read that did not answer: nothing was written
            return Result("fail", "lease_backend_unavailable", msg=f"commit: ownership read unanswered ({e})")
        if r.status != 200:
            return Result("fail", "lease_backend_unavailable", msg=f"commit: ownership read HTTP {r.status}: "
                                                                     f"{r.message}")
        kvs = r.body.get("kvs") or []
        if not kvs or int(kvs[0].get("create_revision", 0)) != lease.fencing_token:
            return Result("fail", "lease_lost", msg="commit: the lock key no longer carries this lease's token")
        return None

    async def _write(self, *args: Any, **kw: Any) -> Result:
        return await ValkeyLockSystem._write(self, *args, **kw)

    async def _deadline(self, coro, deadline_s: float | None):
        if deadline_s is None:
            return await coro
        async with asyncio.timeout(deadline_s):  # not wait_for: 3.11's can swallow a Ctrl-C's cancellation
            return await coro

    async def aclose(self) -> None:
        if self._couch is not None:
            await self._couch.close()
            self._couch = None
        await self.http.aclose()


def _identity_of(lease: Lease) -> Identity | None:
    try:
        return lease.identity
    except Exception:  # noqa: BLE001 - a lease without its identity fields
        return None


# -- registry glue ------------------------------------------------------------------------------------------------
def etcd_system(test: Test, node: str, service_instance_id: str, *, timeout_s: float = 5.0) -> EtcdLockSystem:
    """etcd's lease + lock key (3-member cluster the lab runs); fenced commits by default."""
    return EtcdLockSystem(node, store_url_for(test, node), service_instance_id=service_instance_id,
                          timeout_s=timeout_s, commit_mode=commit_mode_of(test, "fenced"))


def check_etcd(test: Test) -> None:
    """Before anything starts: a known commit mode; with --url, http(s) URLs of etcd members."""
    mode = test.commit_mode
    if mode is not None and mode not in COMMIT_MODES:
        raise SutError(f"--commit-mode must be one of {', '.join(COMMIT_MODES)}, not {mode!r}")
    for url in test.urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SutError(f"--url for SUT 'etcd' is an etcd member's client URL (http://host:2379), not {url!r}")
