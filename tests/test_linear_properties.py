"""Property tests: the engine (with all its pruning) agrees with brute force on thousands of small histories.

Histories come from running a sequential model concurrently (valid by
construction, with crashed and never-completed ops) and from mutating one
result of such a run (invalid with high probability). The reference is
`brute_force_linearizable`, which enumerates linearizations with no pruning.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkers.linear import check_history
from checkers.linear.brute import brute_force_linearizable
from checkers.linear.testing import EXECUTORS, mutate, mutate_lease, simulate, simulate_lease
from checkers.models import get_model

SIMPLE_MODELS = sorted(EXECUTORS)  # register, cas-register, mutex, kv, fenced-register
FAST = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = st.tuples(
    st.integers(1, 8),  # ops
    st.integers(1, 4),  # processes
    st.sampled_from([0.0, 0.15, 0.4]),  # crash probability
    st.sampled_from([1, 1, 2]),  # keys
)


@FAST
@given(model=st.sampled_from(SIMPLE_MODELS), shape=shapes, rnd=st.randoms(use_true_random=False))
def test_simulated_histories_are_linearizable(model, shape, rnd):
    n_ops, n_procs, crash, keys = shape
    h = simulate(model, rnd, n_ops, n_procs, crash=crash, keys=keys)
    m = get_model(model)
    assert check_history(h, m)["valid"] is True
    assert brute_force_linearizable(h, m) is True


@FAST
@given(model=st.sampled_from(SIMPLE_MODELS), shape=shapes, rnd=st.randoms(use_true_random=False))
def test_mutated_histories_agree_with_brute_force(model, shape, rnd):
    n_ops, n_procs, crash, keys = shape
    h = mutate(simulate(model, rnd, n_ops, n_procs, crash=crash, keys=keys), rnd)
    m = get_model(model)
    res = check_history(h, m)
    assert res["valid"] == brute_force_linearizable(h, m), h
    if res["valid"] is False:  # the reported prefix is a real partial linearization
        assert set(res["counterexample"]["prefix"]).isdisjoint(res["counterexample"]["window"])


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.tuples(st.integers(1, 8), st.integers(1, 4), st.sampled_from([0.0, 0.2, 0.4])),
       mutated=st.booleans(), rnd=st.randoms(use_true_random=False))
def test_lease_histories_agree_with_brute_force(shape, mutated, rnd):
    n_ops, n_procs, crash = shape
    h = simulate_lease(rnd, n_ops, n_procs, crash=crash)
    m = get_model("lease")
    if mutated:
        h = mutate_lease(h, rnd)
    else:
        assert check_history(h, m)["valid"] is True
    assert check_history(h, m)["valid"] == brute_force_linearizable(h, m), h


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["cas-register", "register", "mutex"]), seed=st.integers(0, 2**32),
       crash=st.sampled_from([0.2, 0.5]))
def test_crash_heavy_histories_of_twelve_ops_agree(model, seed, crash):
    """Many indeterminate ops exercise rules R2-R4 and M1 (dominance, symmetry, pruning)."""
    rnd = random.Random(seed)
    h = simulate(model, rnd, 12, 4, crash=crash)
    if rnd.random() < 0.7:
        h = mutate(h, rnd)
    m = get_model(model)
    assert check_history(h, m)["valid"] == brute_force_linearizable(h, m), h
