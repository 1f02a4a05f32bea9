"""`fencelab shrink RUN_DIR` (issue 21 items 2-3): the search (lab.shrink.search) with a fake trial, the driver
(lab.shrink.run) with a fake runner (its log, resume, shrink.json and the page), and the CLI's refusals. No real
run here: tests/test_shrink_live.py shrinks a planted bug on the real stack.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from lab.shrink import Candidate, Space, search, shrink_run
from lab.shrink.run import LOG, RESULT, ShrinkError, candidate_test, load_origin
from lab.shrink.search import BUDGET, DONE, HOLDER, INTERRUPTED, UNREPRODUCED
from lab.testmap import Test

ORIGINAL = Candidate(concurrency=8, keys=4, servers=3, time_limit=16.0, rate=40.0, windows=(0, 1, 2, 3))
# four recorded windows: 1-2 s, 3-4 s, 5-6 s, 9-10.5 s; window 2 names lease-3
SPACE = Space(spans=((1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (9.0, 10.5)), servers_needed=(0, 0, 3, 0))


def needs(cand: Candidate) -> bool:
    """The fake bug: it shows with window 2 kept for at least 0.5 s, at least 3 clients and 4 s."""
    return 2 in cand.windows and cand.end(2, 6.0) >= 5.5 and cand.concurrency >= 3 and cand.time_limit >= 4


class Recorder:
    """A fake trial: `rate_of(candidate)` convicted runs in 5 (reps 0..k-1 convicted); every call recorded."""

    def __init__(self, rate_of=lambda c: 5 if needs(c) else 0, runs: int = 5, stop_at: int | None = None):
        self.rate_of, self.runs, self.stop_at = rate_of, runs, stop_at
        self.calls: list[tuple[Candidate, int]] = []

    def __call__(self, cand: Candidate, rep: int) -> bool:
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        self.calls.append((cand, rep))
        return rep % self.runs < self.rate_of(cand) * self.runs // 5  # a re-measured edge candidate: reps N..2N-1


def test_shrinks_every_dimension_to_what_the_bug_needs():
    trial = Recorder()
    out = search(ORIGINAL, trial, SPACE, runs=5)
    assert out.stopped == DONE and out.original_step.rate == 1.0
    # window 2 alone; 3 clients (8 -> 4 accepted, 4 -> 2 rejected, the midpoint 3 accepted); 1 key; 3 servers
    # (window 2 names lease-3); time 16 -> 8 -> 6 (window 2 is 5-6 s: it must end by the limit); window 2 cut
    # from 1 s to 0.5 s (0.25 and the midpoint 0.38 do not reproduce), then time 6 -> 5.5 in the next round
    assert out.best == Candidate(concurrency=3, keys=1, servers=3, time_limit=5.5, rate=1.0, windows=(2,),
                                 cuts=((2, 5.5),))
    assert [s.change for s in out.steps if s.pass_name == "time_limit"] == [
        "time_limit 16 -> 8", "time_limit 8 -> 6", "time_limit 6 -> 5.5"]
    assert [s.change for s in out.steps if s.pass_name == "cut"][:3] == [
        "window 2 length 1 -> 0.5", "window 2 length 0.5 -> 0.25", "window 2 length 0.5 -> 0.38"]
    # each later round tries 2 again: the other dimensions shrank since (a new candidate), and it still fails
    assert [s.candidate.concurrency for s in out.steps if s.pass_name == "concurrency"] == [4, 2, 3, 2, 2]
    # keys and clients are judged at the original's 16 s, before the time limit shrinks
    order = [s.pass_name for s in out.steps]
    assert order.index("keys") < order.index("concurrency") < order.index("time_limit")
    first_round = [s for s in out.steps if s.pass_name in ("keys", "concurrency")][:5]
    assert [s.candidate.time_limit for s in first_round] == [16.0] * 5
    assert out.best_step.rate == 1.0 and out.best.smaller_than(ORIGINAL)


def test_every_candidate_is_smaller_than_the_best_before_it():
    best = ORIGINAL
    seen = []

    def on_step(step):
        nonlocal best
        seen.append(step)
        if step.pass_name == "trade":  # a dropped window back for fewer clients: lower in the rank order
            assert step.candidate.rank() < best.rank() and step.candidate.concurrency < best.concurrency
            assert len(step.candidate.windows) == len(best.windows) + 1
        elif step.pass_name != "original":
            assert step.candidate.smaller_than(best)
            changed = [k for k, v in step.candidate.dims().items() if v != best.dims()[k]]
            kept_cuts = tuple(c for c in best.cuts if c[0] in step.candidate.windows)
            changed += ["cuts"] if step.candidate.cuts != kept_cuts else []  # a dropped window takes its cut
            assert len(changed) == 1, changed  # one dimension at a time
        if step.accepted:
            best = step.candidate

    out = search(ORIGINAL, Recorder(), SPACE, runs=5, on_step=on_step)
    assert len(seen) == len(out.steps) + 1 and best == out.best and len(out.steps) > 5


def test_acceptance_is_the_rate_against_the_threshold_and_a_hopeless_candidate_stops_early():
    # the original reproduces 5/5; without faults 3/5 (accepted at 0.6), below 4 clients 1/5 (rejected)
    def rate_of(c: Candidate) -> int:
        return 1 if c.concurrency < 4 else 3 if not c.windows else 5

    trial = Recorder(rate_of)
    out = search(ORIGINAL, trial, SPACE, runs=5, threshold=0.6, passes=("faults", "concurrency"))
    steps = {s.change: s for s in out.steps}
    nofault = steps["no fault (was 4 windows)"]
    # 3/5 is the edge (the fewest that pass) below the original's 5/5: measured again, 6/10
    assert nofault.accepted and (nofault.convicted, nofault.runs) == (6, 10) and nofault.rate == 0.6
    halved = steps["concurrency 8 -> 4"]
    assert halved.accepted
    two = steps["concurrency 4 -> 2"]
    # convicted, missed, missed, missed: 3 out of 5 is out of reach after 4 runs, the 5th is not made
    assert not two.accepted and (two.convicted, two.runs) == (1, 4) and two.rate == 0.25
    assert out.best.concurrency == 4 and out.best.windows == ()


def test_a_candidate_that_drops_to_the_edge_is_measured_again_and_judged_on_all_its_runs():
    # local-clock's miss: a window subset passed at 3/5 (exactly 0.6) where two windows had reproduced 5/5, and
    # every candidate after it failed; its true rate was below the threshold
    lucky = Recorder(lambda c: 0 if c.concurrency < 8 else 5)
    lucky_first = lambda c, rep: (rep < 3) if not c.windows else lucky(c, rep)  # 3 of its first 5, none after
    out = search(ORIGINAL, lucky_first, SPACE, runs=5, threshold=0.6, passes=("faults",))
    first = out.steps[0]
    assert first.change == "no fault (was 4 windows)" and (first.convicted, first.runs, first.accepted) == (3, 8, False)
    assert out.best.windows != ()  # rejected: after 3 of 8, 6 of 10 is out of reach
    # without the runs for another candidate after it, an edge candidate is judged on its 5 runs as before
    out = search(ORIGINAL, lucky_first, SPACE, runs=5, threshold=0.6, passes=("faults",), max_runs=14)
    assert (out.steps[0].runs, out.steps[0].accepted) == (5, True)
    # 4/5 (above the edge) and a candidate at the best's own rate are judged on their 5 runs as before
    for rate_of, runs in ((lambda c: 4 if not c.windows else 5, 5), (lambda c: 3, 5)):
        out = search(ORIGINAL, Recorder(rate_of), SPACE, runs=5, threshold=0.6, passes=("faults",))
        assert out.steps[0].runs == runs and out.steps[0].accepted


def test_a_lower_original_rate_is_the_threshold():
    trial = Recorder(lambda c: 2 if c.concurrency >= 4 else 1)  # 2/5 = 0.4 at 4 clients or more
    out = search(ORIGINAL, trial, SPACE, runs=5, threshold=0.6, passes=("concurrency",))
    assert out.original_step.rate == 0.4 and out.threshold == 0.4
    assert out.best.concurrency == 4 and out.best_step.rate == 0.4


def test_an_original_that_does_not_reproduce_stops_the_search():
    trial = Recorder(lambda c: 0)
    out = search(ORIGINAL, trial, SPACE, runs=3)
    assert out.stopped == UNREPRODUCED and out.best == ORIGINAL and out.runs_used == 3 and not out.steps


def test_the_run_budget_keeps_the_best_so_far():
    trial = Recorder()
    out = search(ORIGINAL, trial, SPACE, runs=2, max_runs=9)
    assert out.stopped == BUDGET and out.runs_used == 9 == len(trial.calls)
    accepted = [s for s in out.steps if s.accepted]
    assert out.best == accepted[-1].candidate and out.best.smaller_than(ORIGINAL)


def test_the_time_budget_is_checked_before_each_run():
    now = [0.0]

    def trial(c, rep):
        now[0] += 10.0  # every run takes 10 s of the fake clock
        return needs(c)

    out = search(ORIGINAL, trial, SPACE, runs=2, time_budget_s=35.0, clock=lambda: now[0])
    assert out.stopped == BUDGET and out.runs_used == 4  # runs start at 0, 10, 20 and 30 s; none at 40


@pytest.mark.parametrize("stop_at", [1, 3, 6])
def test_ctrl_c_keeps_the_best_so_far(stop_at):
    # 1: during the original's runs; 3: in the faults pass (no fault); 6: inside ddmin over the windows
    trial = Recorder(stop_at=stop_at)
    out = search(ORIGINAL, trial, SPACE, runs=2)
    assert out.stopped == INTERRUPTED and len(trial.calls) == stop_at
    if stop_at == 1:  # the original was not measured whole: nothing accepted
        assert out.original_step is None and out.best == ORIGINAL
    else:
        assert out.original_step.rate == 1.0
        assert out.best == (ORIGINAL if stop_at == 3 else out.steps[-2].candidate if out.steps[-2].accepted
                            else out.best)
        assert all(s.accepted == (s.candidate == out.best or s.candidate.smaller_than(out.best) is False)
                   for s in out.steps if s.accepted)


def test_resume_answers_finished_runs_from_the_record_and_ends_where_one_search_ends():
    record: dict[tuple[Candidate, int], bool] = {}
    fresh: list[tuple[Candidate, int]] = []

    def trial(c, rep):
        if (c, rep) not in record:
            fresh.append((c, rep))
            record[(c, rep)] = needs(c)
        return record[(c, rep)]

    whole = search(ORIGINAL, Recorder(), SPACE, runs=2)
    first = search(ORIGINAL, trial, SPACE, runs=2, max_runs=7)
    assert first.stopped == BUDGET and len(fresh) == 7
    fresh.clear()
    second = search(ORIGINAL, trial, SPACE, runs=2, max_runs=1000)
    assert second.stopped == DONE and second.best == whole.best
    assert len(fresh) == whole.runs_used - 7  # none of the 7 finished runs was made again


def test_time_limit_never_goes_below_what_the_kept_windows_need():
    out = search(ORIGINAL, lambda c, rep: 3 in c.windows, SPACE, runs=1)
    # window 3 is 9-10.5 s: the time limit must be over 9 s (its start) and >= 8.5 s (its end less 2 s)
    assert out.best.windows == (3,) and out.best.time_limit == 9.1
    assert all(s.candidate.time_limit >= SPACE.time_floor(s.candidate) for s in out.steps)


def test_a_system_without_servers_has_no_servers_pass():
    orig = Candidate(concurrency=4, keys=2, servers=None, time_limit=4.0, rate=10.0)
    out = search(orig, lambda c, rep: True, Space(), runs=1)
    assert out.best.servers is None and not any(s.pass_name == "servers" for s in out.steps)
    assert out.best == Candidate(concurrency=2, keys=1, servers=None, time_limit=1.0, rate=1.0)


def test_bad_search_options_are_refused():
    with pytest.raises(ValueError, match="runs"):
        search(ORIGINAL, lambda c, r: True, SPACE, runs=0)
    with pytest.raises(ValueError, match="threshold"):
        search(ORIGINAL, lambda c, r: True, SPACE, threshold=1.5)


# -- the driver, with a fake runner ------------------------------------------------------------------------------


def make_run(tmp_path: Path, *, valid=False, nemesis=(), windows=(), **opts) -> Path:
    """A run directory as `fencelab test` leaves it (test.json, results.json, fault-schedule.json), made by hand."""
    run = tmp_path / "store" / "lease" / "20261204T000000.000000Z"
    run.mkdir(parents=True)
    test = Test(workload="lease", time_limit=8.0, concurrency=5, keys=3, mutant="nonatomic-acquire",
                nemesis=list(nemesis), run_dir=run, **opts)
    (run / "test.json").write_text(json.dumps({**test.to_json(), "replay": "fencelab test --workload lease"}))
    me = {"valid": True} if valid is not False else {
        "valid": False, "violations": [{"type": "overlap", "msg": "two holders", "ops": [1, 2]}]}
    (run / "results.json").write_text(json.dumps({"valid": valid, "results": {"mutual-exclusion": me}}))
    (run / "fault-schedule.json").write_text(json.dumps(
        {"format": 1, "time_origin": "history", "nemeses": list(nemesis), "windows": list(windows)}))
    (run / "history.jsonl").write_text("")
    return run


class FakeRunner:
    """`run_test`'s stand-in: a run dir with test.json (its replay command) and the verdict `needs(test)` says."""

    def __init__(self, needs=lambda t: t.concurrency >= 2):
        self.needs, self.tests = needs, []

    def __call__(self, test: Test, store: Path) -> dict:
        self.tests.append(test)
        test.run_dir = store / test.name / f"r{len(self.tests):04d}"
        test.run_dir.mkdir(parents=True)
        (test.run_dir / "test.json").write_text(json.dumps({"replay": f"fencelab test --name {test.name}"}))
        bad = self.needs(test)
        me = {"valid": not bad, "violations": [{"type": "overlap", "ops": [0]}] if bad else []}
        return {"valid": not bad, "results": {"mutual-exclusion": me}}


PAUSE = {"nemesis": "pause", "start_f": "start-pause", "stop_f": "stop-pause", "value": {"targets": ["lease-2"]},
         "start_s": 1.0, "end_s": 2.0}


def test_shrink_run_writes_the_runs_the_log_shrink_json_and_the_page(tmp_path):
    run = make_run(tmp_path, nemesis=["pause"], windows=[PAUSE, {**PAUSE, "start_s": 3.0, "end_s": 4.0}])
    runner = FakeRunner(lambda t: t.fault_schedule is not None and t.concurrency >= 2)
    report = shrink_run(run, runs=2, out=tmp_path / "out", runner=runner)
    d = json.loads((tmp_path / "out" / RESULT).read_text())
    assert d["target"] == {"checker": "mutual-exclusion", "type": "overlap"} and d["stopped"] == "done"
    m = d["minimal"]
    # one pause window kept, and it names lease-2: two servers stay
    assert (m["config"]["concurrency"], m["config"]["keys"], m["config"]["servers"]) == (2, 1, 2)
    assert len(m["config"]["faults"]) == 1 and m["rate"] == 1.0 and set(m["changed"]) >= {"faults", "concurrency"}
    assert m["replay"].startswith("fencelab test") and (tmp_path / "out" / m["report"]).parent.is_dir()
    # the replayed schedule is a file under out/schedules with that one window
    test = next(t for t in runner.tests if t.name == m["config"]["label"])
    sched = json.loads(Path(test.fault_schedule).read_text())
    assert sched["nemeses"] == ["pause"] and len(sched["windows"]) == 1 and test.nemesis == []
    # the kept window cut to 0.1 s (the fake needs only that it is there): its start stays, its end comes earlier
    (fault,) = m["config"]["faults"]
    assert sched["windows"][0]["start_s"] == fault["start_s"] and sched["windows"][0]["end_s"] == fault["end_s"]
    assert round(fault["end_s"] - fault["start_s"], 6) == 0.1 and fault["recorded_end_s"] - fault["start_s"] == 1.0
    assert "fault windows cut" in m["changed"]
    assert test.run_salt == "" and test.live is not runner.tests[0].live  # a fresh run context for every run
    page = (tmp_path / "out" / "shrink.html").read_text()
    assert "mutual-exclusion: overlap" in page and m["report"] in page and m["replay"] in page
    assert f"(cut; recorded {fault['recorded_end_s']})" in page
    lines = (tmp_path / "out" / LOG).read_text().splitlines()
    assert len(lines) == 1 + d["runs_used"] == 1 + len(runner.tests) and report.new_runs == len(runner.tests)


def test_shrink_run_resumes_without_redoing_finished_runs(tmp_path):
    run = make_run(tmp_path)
    first = FakeRunner()
    r1 = shrink_run(run, runs=2, max_runs=5, runner=first)
    assert r1.outcome.stopped == BUDGET and len(first.tests) == 5
    second = FakeRunner()
    r2 = shrink_run(run, runs=2, max_runs=100, runner=second)
    assert r2.outcome.stopped == DONE
    done_before = {(t.name) for t in first.tests}
    assert r2.data["runs_used"] == 5 + len(second.tests) and r2.new_runs == len(second.tests)
    # the first shrink's runs of a candidate are not made again (a candidate cut short gets only its missing reps)
    assert len(second.tests) == r2.data["runs_used"] - 5 and done_before
    assert r2.data["minimal"]["config"]["label"] == "c2-k1-s1-t1-r1-wnone"
    assert (run / "shrink" / "shrink.html").exists()


def test_a_log_of_another_shrink_is_refused(tmp_path):
    run = make_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOG).write_text(json.dumps({"original": "/elsewhere", "target": {}, "format": 1}) + "\n")
    with pytest.raises(ShrinkError, match="belongs to another shrink"):
        shrink_run(run, out=out, runner=FakeRunner())


# -- the CLI: one line, exit 2 -----------------------------------------------------------------------------------


def shrink_cli(*args: str):
    return CliRunner().invoke(main, ["shrink", *args], catch_exceptions=False)


@pytest.mark.parametrize("what, expected", [
    ("missing", "is not a directory"),
    ("empty", "is not a fencelab run directory: it has no test.json or results.json"),
    ("valid", "the run was valid; shrink starts from an invalid run"),
    ("unknown", 'the run\'s verdict is "unknown"'),
    ("scenario", "a --scenario run scripts its own race"),
    ("no-schedule", "cannot re-run its faults: it has no fault-schedule.json"),
    ("unknown-sut", "cannot re-run it"),
    ("bad-results", "results.json is not a run's results"),
])
def test_cli_refuses_what_it_cannot_shrink_with_one_line(tmp_path, what, expected):
    if what == "missing":
        run = tmp_path / "nope"
    elif what == "empty":
        run = tmp_path / "empty"
        run.mkdir()
    elif what == "valid":
        run = make_run(tmp_path, valid=True)
    elif what == "unknown":
        run = make_run(tmp_path, valid="unknown")
    elif what == "scenario":
        run = make_run(tmp_path, scenario="concurrent-acquires")
    elif what == "no-schedule":
        run = make_run(tmp_path, nemesis=["pause"])
        (run / "fault-schedule.json").unlink()
    elif what == "bad-results":
        run = make_run(tmp_path)
        (run / "results.json").write_text("[]")
    else:
        run = make_run(tmp_path, sut="no-such-system-here")
    result = shrink_cli(str(run))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencelab: error: ") and expected in lines[0], lines
    assert not (run / "shrink").exists()


@pytest.mark.parametrize("args, expected", [
    (["--runs", "0"], "--runs"),
    (["--threshold", "0"], "--threshold"),
    (["--threshold", "1.5"], "--threshold"),
    (["--runs", "5", "--max-runs", "3"], "--max-runs 3 is less than --runs 5"),
    (["--time-budget", "0"], "--time-budget"),
])
def test_cli_refuses_bad_options_with_one_line(tmp_path, args, expected):
    run = make_run(tmp_path)
    result = shrink_cli(str(run), *args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencelab: error: ") and expected in lines[0], lines


def test_cli_prints_the_minimal_case_and_writes_its_files(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    monkeypatch.setattr("lab.shrink.run.run_test", FakeRunner())
    result = shrink_cli(str(run), "--runs", "2")
    assert result.exit_code == 0, result.output
    assert "minimal  c2-k1-s1-t1-r1-wnone: 2/2 convicted (smaller in" in result.output
    assert "stopped: done: no pass made progress" in result.output
    assert f"wrote {run / 'shrink' / 'shrink.html'}" in result.output
    as_json = shrink_cli(str(run), "--runs", "2", "--json")  # resumed: every run is recorded, none is made
    d = json.loads(as_json.output)
    assert as_json.exit_code == 0 and d["minimal"]["config"]["label"] == "c2-k1-s1-t1-r1-wnone"


def test_cli_ctrl_c_writes_the_best_so_far_and_exits_130(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    fake = FakeRunner()

    def interrupted_at_the_fifth(test, store):
        if len(fake.tests) == 4:
            raise KeyboardInterrupt
        return fake(test, store)

    monkeypatch.setattr("lab.shrink.run.run_test", interrupted_at_the_fifth)
    result = shrink_cli(str(run), "--runs", "2")
    assert result.exit_code == 130, result.output
    assert "interrupted (not minimal): the best so far is kept" in result.output
    d = json.loads((run / "shrink" / RESULT).read_text())
    assert d["stopped"] == "interrupted" and d["minimal"]["config"]["keys"] == 1  # 3 -> 1 was accepted


def test_cli_an_original_that_does_not_reproduce_exits_3(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    monkeypatch.setattr("lab.shrink.run.run_test", FakeRunner(lambda t: False))
    result = shrink_cli(str(run), "--runs", "2")
    assert result.exit_code == 3, result.output
    assert "did not reproduce" in result.output


def test_cli_json_is_the_only_thing_on_stdout(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    fake = FakeRunner()

    def noisy(test, store):  # run_test prints its progress lines on stdout (not a terminal)
        print(f"  [{test.name}]    10s / {test.time_limit:.0f}s  40 history entries", flush=True)
        return fake(test, store)

    monkeypatch.setattr("lab.shrink.run.run_test", noisy)
    result = CliRunner().invoke(main, ["shrink", str(run), "--runs", "2", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["minimal"]["config"]["label"] == "c2-k1-s1-t1-r1-wnone"
    assert "history entries" in result.stderr


def test_clients_stay_as_many_as_the_kept_windows_name(tmp_path):
    # a client pause of thread 3 needs 4 clients; a client-clock window naming client-1 needs 2
    out = search(Candidate(concurrency=8, keys=1, servers=None, time_limit=4.0, rate=1.0, windows=(0,)),
                 lambda c, rep: bool(c.windows), Space(spans=((1.0, 2.0),), clients_needed=(4,)), runs=1)
    assert out.best.concurrency == 4 and out.best.windows == (0,)
    assert all(s.candidate.concurrency >= 4 for s in out.steps)
    pause = {**PAUSE, "nemesis": "client-pause", "start_f": "start-client-pause", "stop_f": "stop-client-pause",
             "value": {"thread": 3, "duration_s": None}}
    clock = {**PAUSE, "nemesis": "client-clock", "start_f": "bump-clock", "stop_f": "reset-clock",
             "value": {"targets": ["client-1"], "delta_s": 1.0}, "start_s": 3.0, "end_s": 4.0}
    run = make_run(tmp_path, nemesis=["client-pause", "client-clock"], windows=[pause, clock])
    assert load_origin(run).space().clients_needed == (4, 2)


# -- a fault for a client: the trade, and a client pause moved to a thread that exists ------------------------------
CLIENT_PAUSE = {"nemesis": "client-pause", "start_f": "start-client-pause", "stop_f": "stop-client-pause",
                "value": {"thread": 4, "duration_s": 3.0}, "start_s": 3.2, "end_s": 6.2}


def stale_holder(cand: Candidate) -> bool:
    """The unfenced Redis lock's shape: a stalled holder and its successor. Three clients make one without a
    fault (the workload's own stall); with the client pause kept, two do."""
    return (cand.concurrency >= 3 and not cand.windows) or (bool(cand.windows) and cand.concurrency >= 2)


def test_a_dropped_pause_comes_back_when_it_lets_a_client_go():
    orig = Candidate(concurrency=5, keys=3, servers=None, time_limit=10.0, rate=50.0, windows=(0,))
    space = Space(spans=((3.2, 6.2),), clients_needed=(5,), client_threads=(4,))
    without = search(orig, Recorder(stale_holder), space, runs=3, trade=False)
    assert (without.best.concurrency, without.best.windows) == (3, ())  # the passes alone: no fault, 3 clients
    out = search(orig, Recorder(stale_holder), space, runs=3)
    assert out.stopped == DONE
    trades = [s for s in out.steps if s.pass_name == "trade"]
    assert [(s.change, s.accepted) for s in trades[:1]] == [
        ("window 0 back, concurrency 3 -> 2 (its client pause armed for the next holder)", True)]
    # the pause held thread 4 of 5; in a 2-client run it is armed for whichever thread next acts on a held lease;
    # the passes then shrink the rest again
    assert (out.best.concurrency, out.best.keys, out.best.windows, out.best.threads) == (2, 1, (0,), ((0, HOLDER),))
    assert out.best.rank() < without.best.rank() and out.best.label().endswith("h")
    # no trade where the clients are at their floor already, or no window was dropped
    assert not [s for s in search(orig, Recorder(lambda c: bool(c.windows)), space, runs=3).steps
                if s.pass_name == "trade"]


def test_the_clients_pass_arms_a_client_pause_whose_thread_would_not_exist():
    orig = Candidate(concurrency=8, keys=1, servers=None, time_limit=8.0, rate=10.0, windows=(0,))
    space = Space(spans=((3.2, 6.2),), clients_needed=(5,), client_threads=(4,))
    out = search(orig, Recorder(lambda c: bool(c.windows) and c.concurrency >= 2), space, runs=1, trade=False)
    # 8 -> 4: thread 4 does not exist there; the pause is armed for whichever thread next holds a lease
    assert [(s.candidate.concurrency, s.candidate.threads) for s in out.steps if s.pass_name == "concurrency"][:1] == \
        [(4, ((0, HOLDER),))]
    assert (out.best.concurrency, out.best.threads) == (2, ((0, HOLDER),))
    # a pause on a thread that still exists stays where it was
    kept = Space(spans=((3.2, 6.2),), clients_needed=(2,), client_threads=(1,)).with_clients(orig, 4)
    assert kept.threads == () and kept.thread(0, 1) == 1


def test_a_client_pause_of_a_smaller_run_is_replayed_armed_or_on_its_new_thread(tmp_path):
    run = make_run(tmp_path, nemesis=["client-pause"], windows=[CLIENT_PAUSE])
    origin = load_origin(run)
    space = origin.space()
    assert space.client_threads == (4,) and space.clients_floor((0,)) == 2  # movable: no floor of 5
    runner = FakeRunner(lambda t: t.fault_schedule is not None and t.concurrency >= 2)
    shrink_run(run, runs=1, out=tmp_path / "out", runner=runner)
    d = json.loads((tmp_path / "out" / RESULT).read_text())
    m = d["minimal"]["config"]
    assert m["concurrency"] == 2 and m["threads"] == [[0, HOLDER]]
    assert [f["value"] for f in m["faults"]] == [{"duration_s": 3.0, "holding": True}]
    replayed = [t for t in runner.tests if t.concurrency == 2 and t.fault_schedule]
    assert replayed
    for t in replayed:
        windows = json.loads(Path(t.fault_schedule).read_text())["windows"]
        assert [w["value"] for w in windows] == [{"duration_s": 3.0, "holding": True}], "armed, no thread named"
    # a trade's pause on a named thread is replayed on that thread
    t = candidate_test(origin, space.with_clients(origin.candidate(), 2).moving(0, 1), tmp_path / "out2")
    assert [w["value"]["thread"] for w in json.loads(Path(t.fault_schedule).read_text())["windows"]] == [1]


def test_a_traded_pause_is_tried_on_each_thread_of_the_smaller_run():
    # the pause makes a stale holder only on the thread that holds the lock when it begins: here thread 0
    orig = Candidate(concurrency=5, keys=1, servers=None, time_limit=10.0, rate=50.0, windows=(0,))
    space = Space(spans=((3.2, 6.2),), clients_needed=(5,), client_threads=(4,))

    def holder_paused(c: Candidate) -> bool:
        return (c.concurrency >= 3 and not c.windows) or (bool(c.windows) and c.thread(0, 4) in (0, 4))

    out = search(orig, Recorder(holder_paused), space, runs=3)
    trades = [(s.change, s.accepted) for s in out.steps if s.pass_name == "trade"]
    assert trades[:3] == [("window 0 back, concurrency 3 -> 2 (its client pause armed for the next holder)", False),
                          ("window 0 back, concurrency 3 -> 2 (its client pause on thread 1)", False),
                          ("window 0 back, concurrency 3 -> 2 (its client pause on thread 0)", True)]
    assert (out.best.concurrency, out.best.windows, out.best.threads) == (2, (0,), ((0, 0),))


def test_a_pause_armed_for_the_holder_is_replayed_armed_on_any_thread(tmp_path):
    run = make_run(tmp_path, nemesis=["client-pause"], windows=[CLIENT_PAUSE])
    origin = load_origin(run)
    cand = origin.candidate()
    cand = origin.space().with_clients(cand, 2).moving(0, HOLDER)
    assert cand.label().endswith("-w0h")
    t = candidate_test(origin, cand, tmp_path / "out")
    windows = json.loads(Path(t.fault_schedule).read_text())["windows"]
    assert [w["value"] for w in windows] == [{"duration_s": 3.0, "holding": True}], "no thread named: any holder"


def test_keys_are_tried_again_in_the_same_round_once_the_clients_shrink():
    # local-clock's miss: 2 keys did not reproduce at 5 clients but would have at 2, and the budget ended before
    # the next round came to `keys`; here fewer than 4 keys reproduce only at 4 clients, and 4 clients are the least
    trial = Recorder(lambda c: 5 if c.concurrency == 4 or (c.keys >= 4 and c.concurrency >= 4) else 0)
    out = search(ORIGINAL, trial, SPACE, runs=5, passes=("keys", "concurrency", "rate"), max_runs=5 + 6 + 5 + 6 + 5)
    # original 5; keys 4 -> 2 0/3, 4 -> 3 0/3; concurrency 8 -> 4 5/5, 4 -> 2 0/3, 4 -> 3 0/3; then keys 4 -> 2
    # at 4 clients 5/5, where `rate` (the next pass) would have used the budget first
    assert [(s.pass_name, s.change, s.accepted) for s in out.steps] == [
        ("keys", "keys 4 -> 2", False), ("keys", "keys 4 -> 3", False), ("concurrency", "concurrency 8 -> 4", True),
        ("concurrency", "concurrency 4 -> 2", False), ("concurrency", "concurrency 4 -> 3", False),
        ("keys", "keys 4 -> 2", True)]
    assert out.stopped == BUDGET and (out.best.concurrency, out.best.keys) == (4, 2)
    # without `keys` among the passes, a shrinking `concurrency` does not bring it in
    out = search(ORIGINAL, Recorder(lambda c: 5), SPACE, runs=5, passes=("concurrency",))
    assert out.best.keys == ORIGINAL.keys and out.best.concurrency == 2


def test_the_time_limit_never_ends_a_run_inside_a_kept_window():
    # local-clock's third measurement: its skew window 1 (3-4 s) kept, 5 -> 3.2 s was accepted at 4/5 with the
    # clients gone for most of the window, and 3 -> 1 keys failed there (0/3); at 4.1 s it reproduced 4/5
    space = Space(spans=((1.0, 2.0), (3.0, 4.0)))
    both = Candidate(concurrency=5, keys=3, servers=2, time_limit=10.0, rate=50.0, windows=(0, 1))
    assert space.time_floor(both) == 4.0
    assert space.time_floor(both.cut(1, 3.5)) == 3.5  # `cut` shortens a window; then the limit can follow it
    assert space.time_floor(both.keeping((0,))) == 2.0
    assert space.time_floor(both.keeping(())) == 1.0
    out = search(both, Recorder(lambda c: 5), space, runs=5, passes=("time_limit",))
    assert [s.candidate.time_limit for s in out.steps] == [5.0, 4.0]
