"""The search: Wing-Gong-Lowe with just-in-time linearization, a state cache, and safe pruning.

This is the algorithm of Lowe's "Testing for linearizability" (2017) as used by
Porcupine's checker.go, written for CPython. Operations of one partition are
kept in doubly linked lists in event order; a configuration is (set of
linearized ops, model state). From a configuration the candidates are the
unlinearized ops invoked before the earliest pending return (the
"just-in-time" rule: an op must be linearized before anything invoked after
it returned). Linearizing a candidate "lifts" it out of the lists; backtracking
"unlifts" it (dancing links, undone in LIFO order). A cache of visited
configurations -- the linearized set as a Python int bitset plus the state --
stops the search from exploring one configuration twice. The bitset is kept
relative to the lowest unlinearized op (everything below it is linearized),
so its size follows the history's concurrency, not its length, and hashing a
cache key costs the same at op 10 and at op 100,000.

Indeterminate ops (`info`, or never completed) have no return: they never
block, may be linearized at any point after their call, and need not be
linearized at all. The search succeeds once every determinate op is
linearized.

Rules beyond plain WGL. Each is sound: it never changes the verdict. The
argument is one induction for all of them. Call a configuration *good* if
some sequence of steps (a *completion*) takes it to success, and let m(C) be
the length of C's shortest completion. Call C *plain* if it is the initial
configuration or was reached by a determinate op. Claim: if the search ends
without success, no visited plain configuration is good. Suppose C is, with
the smallest m(C), and let c be a shortest completion of C. The search tried
C's children (it only stops early on success). If c starts with a determinate
op, the rules below show that some child C' with m(C') = m(C) - 1 was tried;
if c starts with indeterminate ops X1..Xk and then a determinate D, the
search followed that chain one step at a time (R6 shows each step is tried)
to C' = C+X1..Xk+D with m(C') = m(C) - k - 1. Either way C' (or a
configuration that dominates it, see R3, with no larger m) is plain and was
visited, contradicting minimality (m = 0 is success itself). The rules:

R0 (WGL cache) Configurations are compared by (linearized set, state);
   equal configurations have the same completions. A configuration reached
   by an R1-forced read is not cached (it is its parent's only child, and
   the cache only ever skips work: a configuration met again is searched
   again, its children still meet the cache); that halves the cache of a
   read-heavy history and the work per read.

R1 (read-only ops are forced) If a determinate op R never changes the
   state when legal (the model's `read_only`) and R is a legal candidate,
   C's only child is C+R. Proof: take a shortest completion c of C; R is in
   it (every determinate op is). Moving R to the front keeps c valid: R is
   legal now and leaves the state unchanged, so every other op sees the
   same states; R is a candidate, so everything that must precede it is
   already linearized; moving it earlier only satisfies more "after R"
   constraints. So C+R has a completion of length m(C) - 1.

R2 (info ops that change nothing are skipped) An indeterminate op whose
   step leaves the state unchanged here is never tried. Proof: a shortest
   completion never contains such a step -- deleting it gives a shorter
   valid completion (the state is unchanged, and an indeterminate op
   constrains nobody: its return is at infinity). Indeterminate ops that
   are read-only everywhere are dropped before the search for the same
   reason.

R3 (dominance over info sets) The cache is keyed by (determinate set,
   state) and keeps, per key, the sets of indeterminate ops linearized. A
   configuration (L, I, S) is dominated by a visited (L, I', S) with I' a
   subset of I: every completion of the former is one of the latter (it
   uses ops outside L and I, all still available; indeterminate ops impose
   no real-time order on others, so L alone fixes which ops are
   candidates). R0 is the special case I' = I. Only the first few sets per
   key are compared by subset (a long list would cost more than it saves);
   later ones are matched exactly, which is R0.

R4 (symmetry of identical info ops) Two indeterminate ops with equal
   input and output are interchangeable once both are invoked. An
   indeterminate op is not tried while an identical one invoked earlier is
   still unlinearized (that one is a candidate too). Proof: in a shortest
   completion using the later one X but not the earlier one Y, put Y in
   X's place; if both appear, swap them. Same steps, same states, same
   length, and Y may stand wherever X may (it was invoked first, and
   neither has a return).

R5 (earliest deadline among identical ops) Of two determinate candidates
   X, Y with equal input and output, Y is not tried while X, which returns
   first, is an unlinearized candidate. Proof: in a shortest completion with Y before X, swap them.
   Same steps, same states, same length. X may move earlier (it is a
   candidate). Y may move later to X's place: any op Z between the two
   places that was invoked after Y returned was also invoked after X
   returned (X returns first), so Z followed X already, and still follows Y.

R6 (info ops must matter at once) Right after an indeterminate op X took
   the state from P to S, a child Y is tried only if its step from S differs
   from its step from P (legality or next state). Proof: in a shortest
   completion the op after X always differs so -- otherwise deleting X
   leaves every later state unchanged (Y reaches the same state from P) and
   gives a shorter completion (X constrains nobody); the same holds for
   each op of a chain X1..Xk, D. Such a configuration is cached with P in
   its key, since its set of children depends on P (so a dominating one has
   the same children), and R1 is not applied there (the moved read might
   not depend on X).

Sequential partitions: with no indeterminate op and no two ops overlapping
in time, call order is the only order real time allows, so a legal replay in
that order is the verdict valid (an illegal one goes to the search, which
finds the counterexample).

Candidate order (never affects the verdict): read-only ops first (R1), then
other determinate ops in call order, then indeterminate ops -- so a valid
history is usually linearized without touching its crashed ops.

Budgets: `deadline` (a time.monotonic() value) and `max_cache_entries` end
the search with "unknown" instead of running forever or exhausting memory.
"""

from __future__ import annotations

import bisect
import operator
import time
from collections.abc import Callable
from typing import Any

from checkers.models import ILLEGAL, Model, ModelError

__all__ = ["PartitionResult", "SearchInput", "prepare_partition", "search"]

_INF = 1 << 62  # a position later than any event
_CHECK_EVERY = 4096  # pushes between budget checks
_DOMINANCE_SCAN = 8  # info sets per cache key compared by subset (R3); more are compared exactly (R0)

# Per-entry cache cost estimate (dict slot, key tuple, window bitset, info set) for the memory budget.
_ENTRY_BYTES = 200


class _Keyed:
    """A state wrapped so that the model's own `equal` / `hash` govern the cache."""

    __slots__ = ("s", "h", "eq")

    def __init__(self, s: Any, model: Model):
        self.s, self.h, self.eq = s, model.hash(s), model.equal

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and self.eq(self.s, other.s)


class SearchInput:
    """One partition compiled for the search: determinate ops (by call) and indeterminate ops."""

    __slots__ = ("ops", "iops", "calls", "rets", "icalls", "fns", "ro", "classes", "ifns", "isym", "init", "model",
                 "dropped")

    def __init__(self) -> None:
        self.ops: list = []  # determinate ops, in call order
        self.iops: list = []  # indeterminate ops, in call order
        # Their call and return positions, read once by prepare_partition (the search and R5 read these
        # plain int lists rather than every op object again)
        self.calls: list[int] = []
        self.rets: list[int] = []
        self.icalls: list[int] = []
        self.fns: list[Callable] = []
        self.ro: list[bool] = []
        self.classes: list[int] = []  # each determinate op's class (equal input and output), -1: none (R5's twins)
        self.ifns: list[Callable] = []
        self.isym: list[int] = []  # previous identical indeterminate op, or -1 (R4)
        self.init: Any = None
        self.model: Model | None = None
        self.dropped = 0  # ops the model's prepare / prune, or R2, removed


class PartitionResult:
    """What the search found for one partition."""

    __slots__ = ("valid", "reason", "cache_entries", "prefix", "window", "elapsed_s")

    def __init__(self, valid: Any, reason: str | None, cache_entries: int, prefix: list, window: list,
                 elapsed_s: float):
        self.valid = valid  # True, False or "unknown"
        self.reason = reason  # why "unknown"
        self.cache_entries = cache_entries
        self.prefix = prefix  # longest linearizable prefix: ops in linearization order (False only)
        self.window = window  # the ops that could not be linearized next after it (False only)
        self.elapsed_s = elapsed_s


def _wrap_fn(fn: Callable, model: Model) -> Callable:
    """A compiled step over `_Keyed` states (for models with a custom equal/hash)."""

    def stepper(k: _Keyed) -> Any:
        ns = fn(k.s)
        return ILLEGAL if ns is ILLEGAL else _Keyed(ns, model)

    return stepper


def prepare_partition(ops: list, model: Model, memo: dict | None = None) -> SearchInput:
    """Run the model's prepare and prune, compile every op, and drop ops that can never matter (R2).

    `memo` maps an op's (input, output) to its compiled step; pass one dict for every partition of a
    history to compile each distinct operation once (a register history has a few dozen distinct ops
    among tens of thousands). A model's compile depends on the input and output only.
    """
    si = SearchInput()
    si.model = model
    n_in = len(ops)
    ops = model.prune(model.prepare(list(ops)))
    native = model.native_states
    if memo is None:
        memo = {}
    calls = [op.call for op in ops]
    if calls != sorted(calls):  # prepare may reorder; timsort checks a sorted list in one pass
        ops = sorted(ops, key=lambda o: o.call)
        calls = [op.call for op in ops]
    compile_, read_only = model.compile, model.read_only
    dops, dfns, dro, dcls, dcalls, drets = si.ops, si.fns, si.ro, si.classes, si.calls, si.rets
    iops, ifns, isym, icalls = si.iops, si.ifns, si.isym, si.icalls
    last_info: dict[int, int] = {}  # class -> its latest indeterminate op (R4)
    memo_get = memo.get
    for op, call in zip(ops, calls):
        k = (op.input, op.output)
        try:
            c = memo_get(k)
        except TypeError:  # unhashable input or output: compiled alone, no symmetry rules
            k = None
            c = None
        if c is None:
            try:
                fn = compile_(op.input, op.output)
                ro = read_only(op.input, op.output)
            except ModelError as e:
                raise ModelError(f"{e} at index {op.index}") from None
            if fn is not None and not native:
                fn = _wrap_fn(fn, model)
            c = (fn, bool(ro), -1 if k is None else len(memo))
            if k is not None:
                memo[k] = c
        fn, ro, cls = c
        if fn is None:
            continue  # no effect and no constraint
        ret = op.ret
        if ret is not None:
            dops.append(op)
            dfns.append(fn)
            dro.append(ro)
            dcls.append(cls)
            dcalls.append(call)
            drets.append(ret)
        elif not ro:  # an info op that cannot change the state is dropped (R2)
            if cls < 0:
                isym.append(-1)
            else:
                isym.append(last_info.get(cls, -1))
                last_info[cls] = len(iops)
            iops.append(op)
            ifns.append(fn)
            icalls.append(call)
    init = model.init()
    if native:
        try:
            hash(init)
        except TypeError:
            raise ModelError(f"model {model.name!r}: states must be hashable (got {type(init).__name__}); "
                             "use tuples, or give the model equal and hash") from None
    si.init = init if native else _Keyed(init, model)
    si.dropped = n_in - len(si.ops) - len(si.iops)
    return si


def _twins(si: SearchInput, classes: list[int]) -> list[tuple[int, ...]]:
    """For each mutating determinate op, the identical ops (same class: equal input and output) that return
    before it and overlap it (R5)."""
    twins: list[tuple[int, ...]] = [()] * len(si.ops)
    groups: dict[int, list[int]] = {}
    ro = si.ro
    get = groups.get
    for i, cls in enumerate(classes):
        if cls >= 0 and not ro[i]:  # read-only ops are forced as soon as legal (R1)
            g = get(cls)
            if g is None:
                groups[cls] = [i]
            else:
                g.append(i)
    calls, ret_of = si.calls, si.rets
    bisect_right = bisect.bisect_right
    for members in groups.values():
        if len(members) < 2:
            continue
        # Ordered by (ret, id) (members ascend by id and the sort is stable), x's twins are the members just
        # before it that return after x is invoked: a run ending at x, non-empty iff its predecessor in
        # this order returns after x's call. Most ops have none, so that one comparison is all they cost.
        ys = sorted(members, key=ret_of.__getitem__)
        rs: list[int] | None = None
        prev_ret = ret_of[ys[0]]
        for k in range(1, len(ys)):
            x = ys[k]
            call = calls[x]
            if prev_ret > call:
                if rs is None:
                    rs = [ret_of[y] for y in ys]
                twins[x] = tuple(ys[bisect_right(rs, call, 0, k):k])
            prev_ret = ret_of[x]
    return twins


def _linked(order: list[int], pos: list[int], n: int) -> tuple[list[int], list[int], list[int], int, int]:
    """A doubly linked list over ids `order` with head n and tail n+1: (next, prev, pos, head, tail)."""
    nxt = [0] * (n + 2)
    prv = [0] * (n + 2)
    p = list(pos) + [-1, _INF]
    head, tail = n, n + 1
    last = head
    for x in order:
        nxt[last] = x
        prv[x] = last
        last = x
    nxt[last] = tail
    prv[tail] = last
    nxt[tail] = tail
    prv[head] = head
    return nxt, prv, p, head, tail


def search(si: SearchInput, *, deadline: float | None = None,
           max_cache_entries: int | None = None) -> PartitionResult:
    """Decide whether one partition is linearizable (see the module doc for the algorithm and rules)."""
    t0 = time.monotonic()
    ops, iops = si.ops, si.iops
    n, m = len(ops), len(iops)
    fns, ro, ifns, isym = si.fns, si.ro, si.ifns, si.isym
    if n == 0:
        return PartitionResult(True, None, 0, [], [], time.monotonic() - t0)
    if m == 0 and all(map(operator.lt, si.rets, si.calls[1:])):
        # No two ops overlap and none is indeterminate: real time allows one order only, call order, and
        # the partition is linearizable iff replaying it is legal. (Illegal: the search below finds the
        # counterexample.) Many keys with few clients each make most partitions like this.
        state = si.init
        for fn in fns:
            state = fn(state)
            if state is ILLEGAL:
                break
        else:
            return PartitionResult(True, None, 0, [], [], time.monotonic() - t0)
    twins = _twins(si, si.classes)  # here, not in prepare_partition: a partition replayed above needs none

    # Call list: determinate ops 0..n-1, two sub-lists sharing arrays: mutating (MH..MT), read-only (QH..QT).
    cpos = si.calls + [-1, _INF, -1, _INF]
    cnext = [0] * (n + 4)
    cprev = [0] * (n + 4)
    MH, MT, QH, QT = n, n + 1, n + 2, n + 3
    lm = MH  # the last op of each sub-list so far, both built in one pass
    lq = QH
    for x, r in enumerate(ro):
        if r:
            cnext[lq] = x
            cprev[x] = lq
            lq = x
        else:
            cnext[lm] = x
            cprev[x] = lm
            lm = x
    for last, tail in ((lm, MT), (lq, QT)):
        cnext[last] = tail
        cprev[tail] = last
        cnext[tail] = tail
    # Return list: determinate ops by return position.
    rets = si.rets
    rnext, rprev, rpos, RH, _RT = _linked(sorted(range(n), key=rets.__getitem__), rets, n)
    # Info list: indeterminate ops by call position.
    inext, iprev, ipos, IH, IT = _linked(list(range(m)), si.icalls, m)
    ibits = [1 << j for j in range(m)]

    if max_cache_entries is None:
        max_cache_entries = default_max_cache_entries(n)
    cache: dict = {}  # (lo, w, state[, predecessor state]) -> info set, or a list of up to _DOMINANCE_SCAN of them
    cache_get = cache.get
    overflow: set = set()  # further (key, info set) pairs, matched exactly (R0) rather than by subset (R3)
    state = si.init
    # The linearized determinate set, compactly: every op below `lo` is linearized, and bit i of `w`
    # says whether op lo + i is (bit 0 is always clear). Ops are numbered in call order, and only ops
    # invoked before the earliest pending return are ever linearized, so `w` spans about the
    # concurrency of the history, not its length: the cache key stays small.
    lo = 0
    w = 0
    ilin = 0
    frame: tuple | None = None  # persistent stack: (op, kind, state, lo, w, ilin, parent)
    post = False  # whether the top frame is an info op's (R6)
    depth = 0
    best: tuple | None = None
    best_depth = 0
    remaining = n
    budget = _CHECK_EVERY
    monotonic = time.monotonic
    x = y = xm = 0
    rd = False
    p = 0

    while True:
        # ---- a new configuration
        if remaining == 0:
            return PartitionResult(True, None, len(cache) + len(overflow), [], [], monotonic() - t0)
        p = rpos[rnext[RH]]
        budget -= 1
        if budget <= 0:
            budget = _CHECK_EVERY
            entries = len(cache) + len(overflow)  # cache entries: keys, and (key, info set) pairs beyond them
            if deadline is not None and monotonic() > deadline:
                return PartitionResult("unknown", "time limit", entries, [], [], monotonic() - t0)
            if entries > max_cache_entries:
                return PartitionResult("unknown", f"cache limit ({max_cache_entries} entries)", entries, [], [],
                                       monotonic() - t0)
        if post:
            prev = frame[2]  # type: ignore[index]
            rd = True  # read-only candidates first (R1 does not apply after an info op), then mutating ones
            x = cnext[QH]
            xm = cnext[MH]
        else:
            # R1: a legal read-only candidate is the only child. Linearized here one after another, with a
            # frame each but no cache entry (see R0): reads before x in the list stay illegal (the state
            # is the same), so the scan goes on from x's successor.
            x = cnext[QH]
            while cpos[x] < p:
                if fns[x](state) is not ILLEGAL:
                    depth += 1
                    frame = (x, 0, state, lo, w, ilin, frame)
                    if x == lo:
                        nw = w | 1
                        t = (nw ^ (nw + 1)).bit_length() - 1  # trailing ones
                        lo += t
                        w = nw >> t
                    else:
                        w |= 1 << (x - lo)
                    a = cprev[x]
                    b = cnext[x]
                    cnext[a] = b
                    cprev[b] = a
                    a = rprev[x]
                    b2 = rnext[x]
                    rnext[a] = b2
                    rprev[b2] = a
                    remaining -= 1
                    if remaining == 0:
                        return PartitionResult(True, None, len(cache) + len(overflow), [], [], monotonic() - t0)
                    p = rpos[rnext[RH]]
                    x = b
                    continue
                x = cnext[x]
            rd = False
            x = cnext[MH]
        y = inext[IH]
        # ---- scan candidates (read-only ones only after an info op), then backtrack when exhausted
        while True:
            while cpos[x] < p:
                z = x
                x = cnext[x]
                ns = fns[z](state)
                if ns is ILLEGAL:
                    continue
                if post:  # R6: right after an info op, only dependent children
                    ps = fns[z](prev)
                    if ps is not ILLEGAL and ps == ns:
                        continue  # R6: same outcome without the info op just taken
                tw = twins[z]
                if tw:  # R5: skip z while an identical op that returns earlier is a candidate
                    skip = False
                    for u in tw:
                        if u >= lo and cpos[u] < p and not (w >> (u - lo)) & 1:
                            skip = True
                            break
                    if skip:
                        continue
                if z == lo:
                    nw = w | 1
                    t = (nw ^ (nw + 1)).bit_length() - 1
                    nlo = lo + t
                    nw >>= t
                else:
                    nlo = lo
                    nw = w | (1 << (z - lo))
                key = (nlo, nw, ns)
                old = cache_get(key)
                if old is None:
                    cache[key] = ilin
                elif old.__class__ is int:
                    if old | ilin == ilin:
                        continue
                    cache[key] = [old, ilin]
                elif any(q | ilin == ilin for q in old):
                    continue
                elif len(old) < _DOMINANCE_SCAN:
                    old.append(ilin)
                elif (key, ilin) in overflow:
                    continue
                else:
                    overflow.add((key, ilin))
                depth += 1
                frame = (z, 1, state, lo, w, ilin, frame)
                a = cprev[z]
                b = cnext[z]
                cnext[a] = b
                cprev[b] = a
                a = rprev[z]
                b = rnext[z]
                rnext[a] = b
                rprev[b] = a
                state = ns
                lo = nlo
                w = nw
                remaining -= 1
                post = False
                break  # pushed: a new configuration
            else:
                if rd:  # the read-only candidates are done: on to the mutating ones
                    rd = False
                    x = xm
                    continue
                while ipos[y] < p:
                    u = isym[y]
                    if u < 0 or ilin & ibits[u]:  # R4
                        ns = ifns[y](state)
                        if ns is not ILLEGAL and ns != state:  # R2
                            if post:
                                ps = ifns[y](prev)
                                if ps is not ILLEGAL and ps == ns:  # R6
                                    y = inext[y]
                                    continue
                            nil = ilin | ibits[y]
                            # the dominance check below is the call loop's, written out: a function call would run on every push
                            key = (lo, w, ns, state)  # a post-info configuration: keyed with its predecessor state
                            old = cache_get(key)
                            ok = True
                            if old is None:
                                cache[key] = nil
                            elif old.__class__ is int:
                                if old | nil == nil:
                                    ok = False
                                else:
                                    cache[key] = [old, nil]
                            elif any(q | nil == nil for q in old):
                                ok = False
                            elif len(old) < _DOMINANCE_SCAN:
                                old.append(nil)
                            elif (key, nil) in overflow:
                                ok = False
                            else:
                                overflow.add((key, nil))
                            if ok:
                                depth += 1
                                frame = (y, 2, state, lo, w, ilin, frame)
                                a = iprev[y]
                                b = inext[y]
                                inext[a] = b
                                iprev[b] = a
                                state = ns
                                ilin = nil
                                post = True
                                break  # pushed: a new configuration
                    y = inext[y]
                else:
                    # ---- backtrack (an R1-forced child that failed fails its parent too)
                    while True:
                        if frame is None:
                            return _illegal(si, best, len(cache) + len(overflow), monotonic() - t0)
                        # The longest prefix: every frame is popped before the search fails, the first one
                        # pushed at the greatest depth first (LIFO), so it is kept here rather than at every push.
                        if depth > best_depth:
                            best_depth, best = depth, frame
                        depth -= 1
                        z, kind, state, lo, w, ilin, frame = frame
                        if kind == 2:
                            inext[iprev[z]] = z
                            iprev[inext[z]] = z
                        else:
                            cnext[cprev[z]] = z
                            cprev[cnext[z]] = z
                            rnext[rprev[z]] = z
                            rprev[rnext[z]] = z
                            remaining += 1
                            if kind == 0:
                                continue
                        p = rpos[rnext[RH]]
                        post = frame is not None and frame[1] == 2
                        prev = frame[2] if post else None  # type: ignore[index]
                        rd = False
                        if kind == 2:
                            x = MT
                            y = inext[z]
                        elif ro[z]:  # an unforced read-only child (after an info op): go on with the read-only list
                            rd = True
                            x = cnext[z]
                            xm = cnext[MH]
                            y = inext[IH]
                        else:
                            x = cnext[z]
                            y = inext[IH]
                        break
                    continue  # scan the configuration backtracked to
                break  # an info op pushed
            break  # a determinate op pushed


def default_max_cache_entries(n: int, budget_bytes: int = 2 << 30) -> int:
    """Cache entries allowed for a partition within a memory budget (2 GiB); n is kept for callers."""
    del n  # the compact key makes an entry's size independent of the partition's length
    return max(10_000, budget_bytes // _ENTRY_BYTES)


def _illegal(si: SearchInput, best: tuple | None, entries: int, elapsed: float) -> PartitionResult:
    """The result for an illegal partition: longest linearized prefix and the window that blocks it."""
    chain = []
    f = best
    while f is not None:
        z, kind = f[0], f[1]
        chain.append(si.iops[z] if kind == 2 else si.ops[z])
        f = f[6]
    chain.reverse()
    done = {id(o) for o in chain}
    pending = [o for o in si.ops if id(o) not in done]
    window: list = []
    if pending:
        blocker = min(pending, key=lambda o: o.ret)
        window = [o for o in pending if o.call < blocker.ret]
        window += [o for o in si.iops if id(o) not in done and o.call < blocker.ret]
        window.sort(key=lambda o: o.call)
    return PartitionResult(False, None, entries, chain, window, elapsed)
