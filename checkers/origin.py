"""Where a stale holder came from: the mechanism that made a commit's holder stale (docs/history-format.md).

A holder goes stale in one of four ways the lab makes, each recorded on the op that starts it:

- `stall`: the workload's own stall past the TTL (a generator sleep, not recorded itself): the session's
  next invocation carries `mechanism: "stall"` (and `stall_ms`);
- `crash-and-carry-on`: the process crashed (an `info`), the thread reopened its client (closing a client may
  end its session, and so its lock) and the session carried on with the lease it believed it held: the new
  process's first invocation carries `reopened: true`;
- `client-pause`: the client-pause nemesis held the commit's thread (its start op names the `thread`);
- `partition`: a partition nemesis window (`partition`, `netns`).

A stale commit (or stale write) is attributed to the most recent of them in effect for its session between
its lease's acquisition and the commit: a marked op of the session invoked after the acquisition and no later
than the commit, or a fault window overlapping that span; the latest start wins. None: `unknown` (a history
written before these fields, or a stale holder the lab did not make). A commit the system validated before its
lease's last reported expiry (`validated_at_ms` < `expires_at_ms`, both backend time) is `in-flight`: its holder
was not stale when it was checked; the write landed after its successor's (the system's boundary let it);
unless it is a retry the system continued under its first attempt's validation and a mechanism started between
that first attempt and the retry: that mechanism held the write back, and names it. The
others in that span are named
too (`earlier_mechanisms`): for a system whose lock ends when its client closes, a crash-and-carry-on before
a stall already made the holder stale.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from checkers.pairs import Lease, Pair
from checkers.windows import Faults
from lab.testmap import Test

__all__ = ["IN_FLIGHT", "MECHANISMS", "UNKNOWN", "Origins", "concurrency_of", "name_origins"]

MECHANISMS = ("stall", "client-pause", "crash-and-carry-on", "partition")
UNKNOWN = "unknown"
# not a stale holder at all: the system validated the commit before its lease's last reported expiry (backend
# time, both) and applied it after the successor's write: the boundary, not the holder, let it land late
IN_FLIGHT = "in-flight"
_PARTITIONS = {"partition": "partition", "netns": "partition"}  # fault window -> mechanism
_WINDOWED = frozenset({"partition", "client-pause"})  # the mechanisms a nemesis window makes


def _holder(p: Pair) -> Any:
    """Who carries a lease across ops: the op's session (`value.session`), else its process."""
    v = p.inv.get("value")
    sid = v.get("session") if isinstance(v, dict) else None
    return ("session", sid) if sid is not None else ("process", p.process)


class Origins:
    """The marked ops per holder and the fault windows of one history, indexed once (`LeaseView.origins`)."""

    def __init__(self, pairs: list[Pair], faults: Faults):
        marks: dict[Any, list[tuple[int, str]]] = defaultdict(list)
        for p in pairs:
            inv = p.inv
            if inv.get("reopened") is True:
                marks[_holder(p)].append((p.t0, "crash-and-carry-on"))
            m = inv.get("mechanism")
            if isinstance(m, str) and m:
                marks[_holder(p)].append((p.t0, m))  # after a reopen on the same op: the later cause
        self.marks = {h: (sorted(ms, key=_time), [t for t, _ in sorted(ms, key=_time)]) for h, ms in marks.items()}
        self.windows = self._windows(faults)

    def _windows(self, faults: Faults) -> list[tuple[int, int, str, Any]]:
        """(start, end, mechanism, thread or None) of every fault window that makes a stale holder."""
        paused = []  # (time, thread) of each client-pause start that names its thread
        for _, op in faults.nemesis:
            v = op.get("value")
            if isinstance(v, dict) and v.get("fault") == "client-pause" and v.get("phase") == "start" \
                    and isinstance(v.get("thread"), int):
                paused.append((op.get("time", 0), v["thread"]))
        out = []
        for w in faults.windows:
            start, end = w["start"], w["end"] if w["end"] is not None else faults.end
            if w["fault"] in _PARTITIONS:
                out.append((start, end, _PARTITIONS[w["fault"]], None))
            elif w["fault"] == "client-pause":
                threads = {th for t, th in paused if start <= t <= end} or {None}
                out.extend((start, end, "client-pause", th) for th in threads)
        return out

    def of(self, p: Pair, lease: Lease | None, concurrency: Any = None) -> str:
        """The mechanism that made the holder of the stale op `p` (a commit on `lease`) stale, or "unknown".

        `concurrency` (the test's) maps a process to its thread, which a client pause names; without it a client
        pause counts for every thread."""
        chain = self.chain(p, lease, concurrency)
        return chain[-1] if chain else UNKNOWN

    def chain(self, p: Pair, lease: Lease | None, concurrency: Any = None, since: int | None = None) -> list[str]:
        """Every mechanism in effect for `p`'s holder between its lease's acquisition (or `since`, a time of the
        history's clock) and `p`, in the order they started (each once, at its latest start): the last one is
        `of`'s answer."""
        lo = since if since is not None else lease.first.t0 if lease is not None and lease.acquires else None
        hi = p.t0
        found: dict[str, int] = {}  # mechanism -> its latest start in the span
        marked = self.marks.get(_holder(p))
        if marked is not None:
            ms, ts = marked
            i = bisect_left(ts, lo) if lo is not None else 0
            while i < len(ts) and ts[i] <= hi:
                if lo is None or ts[i] > lo:  # after the acquisition: a reopen before it carried nothing
                    found[ms[i][1]] = ts[i]
                i += 1
        known = isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency > 0
        thread = p.process % concurrency if known and isinstance(p.process, int) else None
        for start, end, mech, th in self.windows:
            if start > hi or (lo is not None and end < lo):
                continue
            if mech == "client-pause" and th is not None and thread is not None and th != thread:
                continue
            found[mech] = max(start, found.get(mech, start))
        # the latest start last; of one time, a fault window before a mark (the mark is the holder's own act)
        return sorted(found, key=lambda m: (found[m], m not in _WINDOWED))


def name_origins(v: Any, view: Any, commits: list, concurrency: Any, lease_of: Any = None) -> None:
    """Name the mechanism on every kept violation of `v` (a `checkers.core.Violations`) that names a stale commit
    (`stale_commit`: its completion's index) among `commits` (`checkers.commits.Commit`s of `view`, a
    `LeaseView`): the `mechanism` field, and the message's end. `lease_of(commit)`: its lease_id."""
    named = [item for item in v.items if item.get("stale_commit") is not None]
    if not named:
        return
    by_index = {c.p.i1: c for c in commits}
    leases, origins = view.leases, view.origins
    for item in named:
        c = by_index.get(item["stale_commit"])
        if c is None:
            continue
        lid = lease_of(c) if lease_of is not None else c.lease_id
        lease = leases.get(lid)
        chain = origins.chain(c.p, lease, concurrency)
        mech = chain[-1] if chain else UNKNOWN
        if _validated_live(c, lease):
            # validated live, written late: by a mechanism that held up its retry (a stall between the lost
            # first attempt and the retry the system continued under the old validation), else in flight
            late = origins.chain(c.p, lease, concurrency, since=c.start) if c.start < c.p.t0 else []
            if not late:
                chain, mech = chain + [IN_FLIGHT], IN_FLIGHT
        item["mechanism"] = mech
        earlier = ""
        if len(chain) > 1:  # a system whose lock ends with its client may have gone stale at an earlier one
            item["earlier_mechanisms"] = chain[:-1]
            earlier = f"; earlier in its lease: {', '.join(chain[:-1])}"
        item["msg"] = f"{item['msg']} (stale holder made by: {mech}{earlier})"


def _validated_live(c: Any, lease: Any) -> bool:
    """Did the system validate commit `c` (its `validated_at_ms`) before `lease`'s last reported expiry?"""
    validated = getattr(c, "validated", None)
    expires = lease.expires_at_ms if lease is not None else None
    return (isinstance(validated, int) and not isinstance(validated, bool) and isinstance(expires, int)
            and validated < expires)


def concurrency_of(test: Test | Mapping[str, Any] | None) -> Any:
    """The test's `concurrency` (a checker is given a Test or its JSON mapping, `check FILE` none), or None."""
    if isinstance(test, Mapping):
        return test.get("concurrency")
    return test.concurrency if isinstance(test, Test) else None


def _time(m: tuple[int, str]) -> int:
    """A mark's time (a sort key: marks of one time keep their order)."""
    return m[0]
