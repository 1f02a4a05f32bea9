"""The generator context's thread sets (bitsets) against a plain model of sets, and the memoized thread filters."""

from __future__ import annotations

import random

import pytest

import lab.generator as gen
from lab.generator import PENDING, Context, simulate
from lab.generator.context import NEMESIS_THREAD, ThreadFilter


class Model:
    """The context as plain sets, as it was written before the bitsets: the reference for every query."""

    def __init__(self, concurrency: int, nemesis: bool) -> None:
        self.c = concurrency
        self.all = frozenset(list(range(concurrency)) + ([NEMESIS_THREAD] if nemesis else []))
        self.free = self.all
        self.procs = list(range(concurrency)) + [NEMESIS_THREAD]
        self.next = 0

    def copy(self) -> "Model":
        m = Model.__new__(Model)
        m.c, m.all, m.free, m.procs, m.next = self.c, self.all, self.free, list(self.procs), self.next
        return m

    def index(self, t):
        return self.c if t == NEMESIS_THREAD else t

    def order(self, ts):
        return sorted(ts, key=self.index)

    def some_free_process(self):
        if not self.free:
            return None
        idx = sorted(self.index(t) for t in self.free)
        later = [i for i in idx if i >= self.next]
        return self.procs[later[0] if later else idx[0]]

    def busy(self, t):
        m = self.copy()
        m.free, m.next = self.free - {t}, (self.next + 1) % (self.c + 1)
        return m

    def freed(self, t):
        m = self.copy()
        m.free = self.free | ({t} & self.all)
        return m

    def next_process(self, t):
        m = self.copy()
        if t != NEMESIS_THREAD:
            m.procs[self.index(t)] += self.c
        return m

    def restrict(self, keep):
        m = self.copy()
        m.all = frozenset(t for t in self.all if keep(t))
        m.free = self.free & m.all
        return m


def same(ctx: Context, m: Model) -> None:
    assert ctx.all_threads() == m.order(m.all)
    assert ctx.free_threads() == m.order(m.free)
    assert ctx.all_thread_count() == len(m.all) and ctx.free_thread_count() == len(m.free)
    assert ctx.some_free_process() == m.some_free_process()
    assert ctx.free_processes() == [m.procs[m.index(t)] for t in m.order(m.free)]
    for t in list(range(m.c + 1)) + [NEMESIS_THREAD, "other", -1]:
        assert ctx.is_free(t) == (t in m.free), t
    for t in m.all:
        assert ctx.process_of(t) == m.procs[m.index(t)]


@pytest.mark.parametrize("concurrency,nemesis", [(1, False), (1, True), (3, True), (7, False), (50, True)])
def test_every_query_matches_the_set_model_over_random_steps(concurrency, nemesis):
    rng = random.Random(concurrency * 2 + nemesis)
    for _ in range(30):
        ctx, m = Context.initial(concurrency, nemesis=nemesis, seed=1), Model(concurrency, nemesis)
        same(ctx, m)
        for _ in range(60):
            threads = list(range(concurrency)) + [NEMESIS_THREAD, concurrency + 3]
            t = rng.choice(threads)
            step = rng.randrange(6)
            if step == 0:
                ctx, m = ctx.busy(ctx.time + 1, t), m.busy(t)
            elif step == 1:
                ctx, m = ctx.freed(ctx.time + 1, t), m.freed(t)
            elif step == 2 and t in m.all:
                ctx, m = ctx.with_next_process(t), m.next_process(t)
            elif step == 3:
                keep = frozenset(rng.sample(threads, rng.randrange(len(threads) + 1)))
                as_ = rng.choice([keep, set(keep), list(keep), tuple(keep), keep.__contains__])
                ctx, m = ctx.restrict(as_), m.restrict(keep.__contains__)
            elif step == 4:
                ctx, m = ctx.only(t), m.restrict(lambda x, t=t: x == t)
            else:
                keep = frozenset(rng.sample(threads, rng.randrange(len(threads) + 1)))
                ctx, m = ThreadFilter(keep)(ctx), m.restrict(keep.__contains__)
            same(ctx, m)


def test_a_thread_filter_evaluates_its_predicate_once_per_set_of_threads():
    calls = []

    def odd(t):
        calls.append(t)
        return t != NEMESIS_THREAD and t % 2 == 1

    f = ThreadFilter(odd)
    ctx = Context.initial(6, nemesis=True)
    view = f(ctx)
    assert view.all_threads() == [1, 3, 5] and len(calls) == 7
    again = f(ctx.busy(5, 3).busy(6, 0))  # the same threads, other free ones: the memo answers
    assert again.all_threads() == [1, 3, 5] and again.free_threads() == [1, 5] and len(calls) == 7
    narrower = f(ctx.restrict({0, 1, 2}))  # another set of threads: evaluated for it
    assert narrower.all_threads() == [1] and len(calls) == 10


def test_on_threads_asks_its_predicate_a_bounded_number_of_times_however_long_the_run():
    calls = [0]

    def evens(t):
        calls[0] += 1
        return t != NEMESIS_THREAD and t % 2 == 0

    h = simulate(gen.on_threads(evens, gen.limit(500, gen.repeat({"f": "w"}))), concurrency=4, latency=3)
    assert len(h) == 1000 and {o["process"] % 4 for o in h} == {0, 2}
    # once per thread for the view; the rest is one call per event, to route updates to the right generator
    assert calls[0] <= 4 + len(h)


def test_an_op_map_is_filled_in_with_its_own_fields_in_order():
    ctx = Context.initial(2, nemesis=True, seed=0).with_time(9)
    o, nxt = gen.op({"value": 1, "key": "k", "f": "w", "z": 0}, None, ctx)
    assert nxt is None and list(o.items()) == [("type", "invoke"), ("process", 0), ("time", 9), ("f", "w"),
                                               ("value", 1), ("key", "k"), ("z", 0)]
    o, _ = gen.op({"f": "w", "type": None, "time": 4}, None, ctx)  # an explicit None type is filled in
    assert o == {"type": "invoke", "process": 0, "time": 4, "f": "w", "value": None}
    o, _ = gen.op({"f": "kill", "process": NEMESIS_THREAD}, None, ctx)
    assert o["type"] == "info" and o["process"] == NEMESIS_THREAD
    assert gen.op({"f": "w"}, None, ctx.busy(9, 0).busy(9, 1).busy(9, NEMESIS_THREAD)) is PENDING
