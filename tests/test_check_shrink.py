"""`fencelab check FILE --shrink` (issue 21 item 4): the smallest sub-history of whole operations that the same
checker still convicts with the same kind, written as JSONL and EDN (docs/shrinking.md); `lab.ddmin` under it.

The lab-made history (tests/data/lease-release-any-owner-history.jsonl) is a real `fencelab test --workload
lease --mutant release-any-owner --nemesis pause --nemesis-interval 1 --time-limit 6` run: 450 ops, two pause
faults, convicted by mutual-exclusion (overlap), lease-state (lease-mismatch) and the lease model. One test
makes such a run live (the real stack, 8 s) and shrinks its history with the command a user types.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from checkers import core
from checkers.core import compose, get_checker
from checkers.linear.testing import mutate, simulate
from checkers.shrink import Kind, Target, convicts, history_units, shrink_history, sub_history
from checkers.windows import nemesis_windows
from lab.cli import main
from lab.ddmin import ddmin
from lab.history import pair, read_history, write_edn, write_jsonl
from test_checker_core import LeaseHistory

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "lease-release-any-owner-history.jsonl"


def invoke(*args: str):
    return CliRunner().invoke(main, ["check", *args], catch_exceptions=False)


def whole_ops(history: list[dict]) -> list[tuple[int, ...]]:
    """Every whole operation by the one pairing (strict: the history is well-formed): a client invocation with
    its completion, a nemesis operation with its end; each as its positions."""
    pairs = pair(history, strict=True, nemesis=True).pairs
    return [(i,) if c is None else (i, c) for _, _, i, c in pairs]


def without(history: list[dict], drop: tuple[int, ...]) -> list[dict]:
    """`history` less the ops at positions `drop`, renumbered."""
    return [{**op, "index": i} for i, op in enumerate(op for p, op in enumerate(history) if p not in drop)]


def verdict(history: list[dict], checker: str, **kw) -> dict:
    return compose({checker: get_checker(checker, **kw)}).check({}, history, {})


@pytest.fixture(scope="module")
def shrunk_lab_run(tmp_path_factory):
    """The lab-made history shrunk by the CLI (default checkers), its paths and JSON line."""
    d = tmp_path_factory.mktemp("shrink")
    src = d / "history.jsonl"
    src.write_bytes(DATA.read_bytes())
    res = invoke(str(src), "--shrink", "--json")
    assert res.exit_code == 1, res.output
    return src, json.loads(res.stdout)


# --------------------------------------------------------------------------- (a) a lab-made history


def test_a_lab_made_history_shrinks_to_a_few_whole_operations_convicted_of_the_same_kind(shrunk_lab_run):
    src, line = shrunk_lab_run
    original = read_history(src)
    assert line["checker"] == "mutual-exclusion" and line["kind"] == "overlap"  # the first failing checker's first
    assert line["ops_before"] == len(original) == 450 and line["operations_before"] == 223
    assert line["ops_after"] <= 10 and line["minimal"] is True and line["stopped"] == "done"
    shrunk = read_history(src.with_name("history.shrunk.jsonl"))
    assert len(shrunk) == line["ops_after"] and [op["index"] for op in shrunk] == list(range(len(shrunk)))
    kind = Kind("mutual-exclusion", "overlap")
    assert convicts(verdict(shrunk, "mutual-exclusion"), kind)
    assert line["shrunk_valid"] is False and line["shrunk_checkers"]["mutual-exclusion"] is False
    # pairs whole: every invocation has its completion (the original's), and every op is one of the original's
    ops = whole_ops(shrunk)
    assert all(len(u) == 2 for u in ops) and 2 * len(ops) == len(shrunk)
    assert all({k: v for k, v in op.items() if k != "index"} in
               [{k: v for k, v in o.items() if k != "index"} for o in original] for op in shrunk)


def test_removing_any_one_more_whole_operation_clears_the_conviction(shrunk_lab_run):
    """The issue's "Done when": 1-minimal, shown by removing each whole operation in turn."""
    src, _ = shrunk_lab_run
    shrunk = read_history(src.with_name("history.shrunk.jsonl"))
    kind = Kind("mutual-exclusion", "overlap")
    ops = whole_ops(shrunk)
    assert len(ops) >= 2
    for unit in ops:
        smaller = without(shrunk, unit)
        result = verdict(smaller, "mutual-exclusion")
        assert not convicts(result, kind), f"still convicted without ops {unit}: {result}"
        assert result["valid"] in (True, "unknown")  # here even the letter: valid or unknown


def test_a_chosen_checker_shrinks_for_its_own_kind(tmp_path):
    src = tmp_path / "run.jsonl"
    src.write_bytes(DATA.read_bytes())
    line = json.loads(invoke(str(src), "--shrink", "--checker", "lease-state", "--json").stdout)
    assert (line["checker"], line["kind"]) == ("lease-state", "lease-mismatch")
    shrunk = read_history(tmp_path / "run.shrunk.jsonl")
    assert convicts(verdict(shrunk, "lease-state"), Kind("lease-state", "lease-mismatch"))
    for unit in whole_ops(shrunk):
        assert not convicts(verdict(without(shrunk, unit), "lease-state"), Kind("lease-state", "lease-mismatch"))


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A real planted-bug run on the lab's own stack (the CI subset's row for this mutant: lease, 8 s, seed 0),
    then `fencelab check --shrink` on its history, both as a user types them."""
    store = tmp_path_factory.mktemp("live") / "store"
    run = subprocess.run([sys.executable, "-m", "lab", "test", "--workload", "lease", "--mutant", "release-any-owner",
                          "--time-limit", "8", "--store-dir", str(store)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]  # the planted bug is caught
    history = store / "lease" / "latest" / "history.jsonl"
    shrink = subprocess.run([sys.executable, "-m", "lab", "check", str(history), "--shrink", "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert shrink.returncode == 1, shrink.stdout + shrink.stderr
    return history, json.loads(shrink.stdout)


def test_a_live_planted_bug_run_shrinks_to_a_1_minimal_history(live_run):
    history, line = live_run
    original = read_history(history)
    assert line["ops_before"] == len(original) > 100 and line["minimal"] and line["ops_after"] <= 10
    kind = Kind(line["checker"], line["kind"])
    shrunk = read_history(history.with_name("history.shrunk.jsonl"))
    assert shrunk == read_history(history.with_name("history.shrunk.edn"))
    assert convicts(verdict(shrunk, kind.checker), kind)
    ops = whole_ops(shrunk)
    assert 2 * len(ops) == len(shrunk)  # pairs whole
    for unit in ops:
        assert not convicts(verdict(without(shrunk, unit), kind.checker), kind), unit
    assert [{**op, "index": p} for op, p in zip(shrunk, line["original_ops"])] == [original[p] for p in
                                                                                  line["original_ops"]]


# --------------------------------------------------------------------------- (b) both outputs load alike


def test_the_jsonl_and_edn_outputs_load_and_give_the_same_verdict(shrunk_lab_run):
    src, line = shrunk_lab_run
    assert line["written"] == [str(src.with_name("history.shrunk.jsonl")), str(src.with_name("history.shrunk.edn"))]
    from_jsonl = read_history(line["written"][0])
    from_edn = read_history(line["written"][1])
    assert from_edn == from_jsonl
    verdicts = [json.loads(invoke(p, "--json").stdout) for p in line["written"]]
    assert verdicts[0]["valid"] is verdicts[1]["valid"] is False
    assert verdicts[0]["checkers"] == verdicts[1]["checkers"] == line["shrunk_checkers"]


def test_the_human_output_names_counts_kind_message_and_paths(tmp_path):
    src = tmp_path / "h.jsonl"
    src.write_bytes(DATA.read_bytes())
    res = invoke(str(src), "--shrink", "--checker", "lease-state")
    assert res.exit_code == 1, res.output
    out = res.stdout
    assert "shrinking for lease-state: lease-mismatch, naming one of ops [202, 208]" in out
    assert "shrunk 450 ops (223 operations) to 2 ops (1 operation)" in out and "1-minimal" in out
    assert "still convicted: lease-state: lease-mismatch: release sent for lease" in out
    assert "its ops 0..1 are the original's [202, 208]" in out
    assert f"wrote {tmp_path / 'h.shrunk.jsonl'}" in out and f"wrote {tmp_path / 'h.shrunk.edn'}" in out


# --------------------------------------------------------------------------- a model's EDN history


def test_an_edn_register_history_shrinks_under_the_cas_register_model(tmp_path):
    rng = random.Random(1)
    history = mutate(simulate("cas-register", rng, 200, 5), rng)  # seed 1: the mutation breaks linearizability
    src = tmp_path / "register.edn"
    write_edn(history, src)
    res = invoke(str(src), "--model", "cas-register", "--shrink", "--out", str(tmp_path / "out"), "--json")
    assert res.exit_code == 1, res.output
    line = json.loads(res.stdout)
    assert (line["checker"], line["kind"]) == ("linearizable", "not-linearizable") and line["minimal"]
    assert line["ops_after"] < line["ops_before"] // 10
    shrunk = read_history(tmp_path / "out" / "register.shrunk.edn")
    assert shrunk == read_history(tmp_path / "out" / "register.shrunk.jsonl")
    kind = Kind("linearizable", "not-linearizable")
    assert convicts(verdict(shrunk, "linearizable", model="cas-register"), kind)
    for unit in whole_ops(shrunk):
        assert not convicts(verdict(without(shrunk, unit), "linearizable", model="cas-register"), kind)
    # the planted bug (mutate made the failed `cas 2 -> 2` at index 34 succeed) is what is left
    assert 34 in line["original_ops"] and history[34]["type"] == "ok" and history[34]["f"] == "cas"
    assert [(op["f"], op["type"], op["value"]) for op in shrunk] == [("cas", "invoke", [2, 2]), ("cas", "ok", [2, 2])]


def test_the_anchor_keeps_the_violation_not_just_its_kind(tmp_path):
    """--any-ops takes any conviction of the kind: here a `cas 0 -> 1` that was right after a `write 0` and is
    wrong only alone (an innocent op); the default keeps a violation naming an op the original one named."""
    rng = random.Random(1)
    history = mutate(simulate("cas-register", rng, 200, 5), rng)
    src = tmp_path / "register.edn"
    write_edn(history, src)
    anchored = json.loads(invoke(str(src), "--model", "cas-register", "--shrink", "--json").stdout)
    loose = json.loads(invoke(str(src), "--model", "cas-register", "--shrink", "--any-ops", "--out",
                              str(tmp_path / "any"), "--json").stdout)
    assert anchored["anchor"] and set(anchored["anchor"]) & set(anchored["original_ops"])
    assert loose["anchor"] == [] and 34 not in loose["original_ops"]  # smaller or not, it blames another op
    blamed = [history[p] for p in loose["original_ops"]]
    assert all(op["f"] == "cas" and op["value"] == [0, 1] for op in blamed)
    assert convicts(verdict(read_history(tmp_path / "any" / "register.shrunk.jsonl"), "linearizable",
                            model="cas-register"), Kind("linearizable", "not-linearizable"))


# --------------------------------------------------------------------------- faults are whole units


def test_a_fault_is_kept_or_removed_whole(monkeypatch, tmp_path):
    """A checker that convicts an acquisition inside a pause window: the shrunk history keeps that fault's
    start and stop (both nemesis operations, four ops) and the one acquisition, nothing else."""

    class DuringPause:
        def check(self, test, history, opts):
            windows = [w for w in nemesis_windows(history) if w["fault"] == "pause" and not w["open"]]
            inside = [op["index"] for op in history if op.get("f") == "acquire" and op["type"] == "ok"
                      and any(w["start"] < op["time"] < w["end"] for w in windows)]
            if inside:
                return {"valid": False, "violations": [{"type": "acquired-in-pause", "ops": inside, "msg": "!"}]}
            return {"valid": True}

    monkeypatch.setitem(core.CHECKERS, "during-pause", lambda **kw: DuringPause())
    h = LeaseHistory()
    h.acquire(0, "L0", 1, at=0)
    h.nemesis("start-pause")
    h.nemesis("start-pause", {"fault": "pause", "phase": "start"})
    for p in range(1, 6):
        h.acquire(p, f"L{p}", p + 1, at=10 * p)
    h.nemesis("stop-pause")
    h.nemesis("stop-pause", {"fault": "pause", "phase": "end"})
    h.nemesis("stop-pause")  # a stop with nothing open: a unit of its own
    h.nemesis("stop-pause", {"fault": "pause", "phase": "none"})
    h.acquire(9, "L9", 9, at=500)
    units = history_units(h.ops)
    assert (2, 3, 14, 15) in units and (16, 17) in units
    src = write_jsonl(h.ops, tmp_path / "faults.jsonl")
    line = json.loads(invoke(str(tmp_path / "faults.jsonl"), "--checker", "during-pause", "--shrink",
                             "--json").stdout)
    assert src == 20 and line["kind"] == "acquired-in-pause" and line["operations_after"] == 2
    shrunk = read_history(tmp_path / "faults.shrunk.jsonl")
    assert [(op["process"] == "nemesis", op["type"]) for op in shrunk] == [
        (True, "info"), (True, "info"), (False, "invoke"), (False, "ok"), (True, "info"), (True, "info")]
    assert shrunk[2]["f"] == "acquire" and shrunk[2]["process"] == shrunk[3]["process"] in range(1, 6)


def test_units_never_split_an_operation(shrunk_lab_run):
    history = read_history(DATA)
    units = history_units(history)
    assert sorted(p for u in units for p in u) == list(range(len(history)))
    by_pair = {u for u in whole_ops(history) if history[u[0]]["process"] != "nemesis"}
    assert by_pair <= set(units)  # every client operation is one unit: invocation and completion together
    faults = [u for u in units if history[u[0]]["process"] == "nemesis"]
    assert [len(u) for u in faults] == [4, 4, 2]  # two pauses (start and stop), one stop that stopped nothing
    pair(sub_history(history, units[::3]), strict=True, nemesis=True)  # any subset of units is well-formed


# --------------------------------------------------------------------------- (c) not convicted, (d) bad input


def test_a_valid_history_writes_nothing_and_says_so(tmp_path):
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.acquire(1, "L2", 2, at=200, ttl=100)
    src = write_jsonl(h.ops, tmp_path / "ok.jsonl")
    assert src == 4
    res = invoke(str(tmp_path / "ok.jsonl"), "--shrink", "--checker", "fencing")
    assert res.exit_code == 0
    said = f"{tmp_path / 'ok.jsonl'}: not convicted (valid=true): nothing to shrink, nothing written"
    assert res.stdout.strip() == said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.jsonl"]


@pytest.mark.parametrize("args, needle", [
    (["a.jsonl", "b.jsonl", "--shrink"], "--shrink takes one history file at a time, got 2"),
    (["missing.jsonl", "--shrink"], "missing.jsonl: no such history file"),
    (["a.jsonl", "--shrink", "--max-checks", "0"], "--max-checks must be >= 1, got 0"),
    (["a.jsonl", "--max-checks", "5"], "--max-checks, --force and --any-ops go with --shrink"),
    (["a.jsonl", "--any-ops"], "--max-checks, --force and --any-ops go with --shrink"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(DATA.read_bytes())
    res = CliRunner().invoke(main, ["check", *args], catch_exceptions=False)
    assert res.exit_code == 2
    assert res.stderr.strip() == f"fencelab: error: {needle}"
    assert not list(tmp_path.glob("*.shrunk.*"))


def test_an_existing_output_is_kept_unless_forced(tmp_path):
    src = tmp_path / "h.jsonl"
    src.write_bytes(DATA.read_bytes())
    (tmp_path / "h.shrunk.edn").write_text("mine\n")
    res = invoke(str(src), "--shrink")
    assert res.exit_code == 2 and res.stderr.strip() == (
        f"fencelab: error: {tmp_path / 'h.shrunk.edn'} already exists (pass --force to replace it)")
    assert (tmp_path / "h.shrunk.edn").read_text() == "mine\n" and not (tmp_path / "h.shrunk.jsonl").exists()
    assert invoke(str(src), "--shrink", "--force").exit_code == 1
    assert read_history(tmp_path / "h.shrunk.edn") == read_history(tmp_path / "h.shrunk.jsonl")
    assert src.read_bytes() == DATA.read_bytes()  # the input is never touched


# --------------------------------------------------------------------------- budget and Ctrl-C


def test_the_budget_and_ctrl_c_keep_the_best_so_far(tmp_path, monkeypatch):
    src = tmp_path / "h.jsonl"
    src.write_bytes(DATA.read_bytes())
    line = json.loads(invoke(str(src), "--shrink", "--max-checks", "3", "--json").stdout)
    assert line["stopped"] == "budget" and line["checks"] == 3 and not line["minimal"]
    assert line["ops_after"] < line["ops_before"] and line["shrunk_valid"] is False  # smaller, still convicted
    assert "cut short: --max-checks 3 reached" in invoke(str(src), "--shrink", "--max-checks", "3",
                                                          "--force").stdout

    real = core.Compose.check
    calls = []

    def interrupted(self, test, history, opts):
        calls.append(len(history))
        if len(calls) == 4 and len(self.checkers) == 1:
            raise KeyboardInterrupt
        return real(self, test, history, opts)

    monkeypatch.setattr(core.Compose, "check", interrupted)
    res = invoke(str(src), "--shrink", "--force")
    assert res.exit_code == 1, res.output
    assert "cut short: interrupted (Ctrl-C), not minimal; the best so far" in res.stdout
    shrunk = read_history(tmp_path / "h.shrunk.jsonl")
    assert len(shrunk) < 450 and convicts(verdict(shrunk, "mutual-exclusion"), Kind("mutual-exclusion", "overlap"))


# --------------------------------------------------------------------------- lab.ddmin


def test_ddmin_finds_a_1_minimal_sublist_and_counts_its_tests():
    items = list(range(100))
    res = ddmin(items, lambda xs: {7, 42, 93} <= set(xs))
    assert res.items == [7, 42, 93] and res.kept == (7, 42, 93) and res.minimal and 0 < res.tests < 200
    assert ddmin(items, lambda xs: 50 in xs).items == [50]


def test_ddmin_refuses_a_list_that_does_not_fail_and_a_budget_below_one():
    with pytest.raises(ValueError, match="fails the test to start from"):
        ddmin([1, 2, 3], lambda xs: False)
    with pytest.raises(ValueError, match="max_tests must be >= 1"):
        ddmin([1, 2], lambda xs: True, max_tests=0)


def test_shrink_history_under_a_checker_alone_maps_back_to_the_original():
    history = read_history(DATA)
    target = Target(Kind("lease-state", "lease-mismatch"), frozenset({202, 208}))
    shrunk = shrink_history(history, target, get_checker("lease-state"), max_checks=500)
    assert shrunk.units_before == 223 and shrunk.units_after == 1 and shrunk.search.minimal
    assert shrunk.positions == [202, 208] and shrunk.search.tests <= 50
    assert [{**op, "index": p} for op, p in zip(shrunk.history, shrunk.positions)] == [history[202], history[208]]
    result = verdict(shrunk.history, "lease-state")
    assert convicts(result, target, shrunk.positions)
    assert not convicts(result, Target(target.kind, frozenset({5})), shrunk.positions)  # another violation


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))))
def test_ddmin_keeps_exactly_what_the_test_needs(case):
    """A test that fails whenever a set of items is present: ddmin ends at exactly that set (1-minimal), in order."""
    n, needed = case
    res = ddmin(list(range(n)), lambda xs: needed <= set(xs))
    assert res.items == sorted(needed) and res.minimal


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.data())
def test_every_subset_of_whole_operations_is_a_well_formed_history(seed, data):
    """Crashed (info) and never-completed ops included: any choice of units pairs strictly."""
    history = simulate("cas-register", random.Random(seed), 40, 4, crash=0.3, open_end=0.3)
    units = history_units(history)
    assert sorted(p for u in units for p in u) == list(range(len(history)))
    keep = data.draw(st.lists(st.booleans(), min_size=len(units), max_size=len(units)))
    candidate = sub_history(history, [u for u, k in zip(units, keep) if k])
    pairing = pair(candidate, strict=True, nemesis=True)
    assert sum(1 for _, c, _, _ in pairing.pairs if c is not None) + len(pairing.pairs) == len(candidate)
