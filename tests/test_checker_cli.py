"""`fencelab check`: exit codes 0/1/2/3, the JSON line per file, --out, formats, bad input in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkers import core
from checkers.cli import exit_code
from lab.cli import main
from test_checker_core import LeaseHistory
from test_checker_render import Page


def write_jsonl(path, ops: list[dict], tail: str = "") -> str:
    path.write_text("".join(json.dumps(op) + "\n" for op in ops) + tail, encoding="utf-8")
    return str(path)


def register_ops(stale: bool) -> list[dict]:
    """write 1, write 2, read: the read sees 2 (valid) or 1 (stale, not linearizable)."""
    h = LeaseHistory()
    h.call(0, "write", 1, None, key=None)
    h.call(1, "write", 2, None, key=None)
    h.call(0, "read", None, 1 if stale else 2, key=None)
    return h.ops


def lease_ops(duplicate: bool) -> list[dict]:
    """Two leases on one key (ops 1 and 3 the acquisitions), then a replay, a renew and a release of the
    second: every checker `check` runs by default has something to judge."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    token = 1 if duplicate else 2
    h.acquire(1, "L2", token, at=200, ttl=100, rid="a2")
    h.call(2, "acquire", {"request_id": "a2", "ttl_ms": 100}, h.lease("L2", token, at=200, ttl=100))
    h.renew(1, "L2", token, at=200, renewed=250, exp=350)
    h.release(1, "L2", token, at=200)
    return h.ops


APPLICABLE = {"fencing", "mutual-exclusion", "lease-state", "idempotency", "availability"}  # for lease_ops


def invoke(*args: str):
    return CliRunner().invoke(main, ["check", *args], catch_exceptions=False)


def test_valid_invalid_and_unknown_exit_codes(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", register_ops(stale=False))
    bad = write_jsonl(tmp_path / "bad.jsonl", register_ops(stale=True))
    assert invoke(good, "--model", "register").exit_code == 0
    assert invoke(bad, "--model", "register").exit_code == 1
    assert invoke(good, bad, "--model", "register").exit_code == 1
    unknown = invoke(good, "--model", "register", "--time-limit", "0", "--json")
    assert unknown.exit_code == 3
    assert json.loads(unknown.stdout)["valid"] == "unknown"


def test_a_raising_checker_makes_the_run_unknown(tmp_path, monkeypatch):
    class Boom:
        def check(self, test, history, opts):
            raise RuntimeError("kaboom")

    monkeypatch.setitem(core.CHECKERS, "boom", lambda **kw: Boom())
    f = write_jsonl(tmp_path / "h.jsonl", lease_ops(duplicate=False))
    res = invoke(f, "--checker", "boom", "--checker", "fencing", "--json")
    assert res.exit_code == 3
    line = json.loads(res.stdout)
    assert line["checkers"] == {"boom": "unknown", "fencing": True}
    assert line["unknown"] == {"boom": "RuntimeError: kaboom"}
    # an invalid checker next to an unknown one: invalid wins
    bad = write_jsonl(tmp_path / "bad.jsonl", lease_ops(duplicate=True))
    assert invoke(bad, "--checker", "boom", "--checker", "fencing").exit_code == 1


def test_json_lines_shape(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", lease_ops(duplicate=False))
    bad = write_jsonl(tmp_path / "bad.jsonl", lease_ops(duplicate=True))
    res = invoke(good, bad, "--json")
    assert res.exit_code == 1
    first, second = (json.loads(line) for line in res.stdout.splitlines())
    for line, path in ((first, good), (second, bad)):
        assert {"file", "valid", "model", "ops", "elapsed_s", "checkers"} <= set(line)
        assert line["file"] == path and line["ops"] == 10 and line["model"] is None
        assert set(line["checkers"]) == APPLICABLE  # no commit: no stale-commit; deadlines only when asked
        assert isinstance(line["elapsed_s"], float) and line["elapsed_s"] >= 0
    assert first["valid"] is True and "counterexample" not in first
    assert second["valid"] is False
    assert [v["type"] for v in second["counterexample"]["fencing"]] == [
        "duplicate-token", "token-order-realtime", "token-order-backend"]
    assert second["counterexample"]["fencing"][0]["ops"] == [1, 3]


def test_linearizability_counterexample_in_json(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", register_ops(stale=True))
    line = json.loads(invoke(bad, "--model", "register", "--json").stdout)
    ce = line["counterexample"]["linearizable"]
    assert line["model"] == "register" and {"window", "prefix", "states"} <= set(ce)
    assert set(ce["window"]) & {4, 5}


def test_human_summary_names_violations(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", lease_ops(duplicate=True))
    res = invoke(bad, "--checker", "fencing")
    assert res.exit_code == 1
    assert "valid=false" in res.stdout and "duplicate-token" in res.stdout and "[1, 3]" in res.stdout


def test_out_writes_results_and_page_per_file(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    bad = write_jsonl(a / "history.jsonl", lease_ops(duplicate=True))
    b = tmp_path / "b"
    b.mkdir()
    good = write_jsonl(b / "history.jsonl", lease_ops(duplicate=False))
    out = tmp_path / "out"
    res = invoke(bad, good, "--out", str(out))
    assert res.exit_code == 1
    stored = json.loads((out / "history" / "results.json").read_text())
    assert stored["valid"] is False and stored["results"]["fencing"]["violations"][0]["ops"] == [1, 3]
    assert json.loads((out / "history-2" / "results.json").read_text())["valid"] is True
    data = Page((out / "history" / "timeline.html").read_text()).data()
    assert {1, 3} <= set(data["failing"])


def test_edn_histories(tmp_path):
    edn = tmp_path / "history.edn"
    edn.write_text(
        "{:type :invoke, :f :write, :value 1, :process 0, :time 1, :index 0}\n"
        "{:type :ok, :f :write, :value 1, :process 0, :time 2, :index 1}\n"
        "{:type :invoke, :f :read, :value nil, :process 1, :time 3, :index 2}\n"
        "{:type :ok, :f :read, :value 3, :process 1, :time 4, :index 3}\n")
    res = invoke(str(edn), "--model", "register", "--json")
    assert res.exit_code == 1 and json.loads(res.stdout)["ops"] == 4
    copy = tmp_path / "history.txt"  # no telling extension: detected from the content, or forced
    copy.write_text(edn.read_text())
    assert invoke(str(copy), "--model", "register").exit_code == 1
    assert invoke(str(copy), "--model", "register", "--format", "edn").exit_code == 1


def test_torn_last_line_is_reported_and_skipped(tmp_path):
    f = write_jsonl(tmp_path / "h.jsonl", lease_ops(duplicate=False), tail='{"index": 10, "ti')
    res = invoke(f, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ops"] == 10
    assert "torn last line" in res.stderr


@pytest.mark.parametrize("case, expected", [
    ("malformed", ":2: malformed line"),
    ("missing-field", ":1: op is missing required field(s) type"),
    ("unknown-model", "unknown model 'nope'; known models:"),
    ("unknown-checker", "unknown checker 'nope'; known checkers: linearizable, fencing"),
    ("missing-file", "no-such.jsonl: no such history file"),
    ("no-model", "needs --model"),
    ("bad-time-limit", "--time-limit must be >= 0"),
    ("nan-time-limit", "--time-limit must be >= 0 seconds and finite (omit it for no limit), got nan"),
    ("bad-format", "Invalid value for '--format'"),
    ("not-a-number", "Invalid value for '--time-limit'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, case, expected):
    ops = lease_ops(duplicate=False)
    good = write_jsonl(tmp_path / "good.jsonl", ops)
    args = {
        "malformed": [write_jsonl(tmp_path / "m.jsonl", ops[:1], "{not json\n" + json.dumps(ops[1]) + "\n")],
        "missing-field": [write_jsonl(tmp_path / "f.jsonl", [{k: v for k, v in ops[0].items() if k != "type"}])],
        "unknown-model": [good, "--model", "nope"],
        "unknown-checker": [good, "--checker", "nope"],
        "missing-file": [str(tmp_path / "no-such.jsonl")],
        "no-model": [good, "--checker", "linearizable"],
        "bad-time-limit": [good, "--model", "register", "--time-limit", "-1"],
        "nan-time-limit": [good, "--model", "register", "--time-limit", "nan"],
        "bad-format": [good, "--format", "xml"],
        "not-a-number": [good, "--time-limit", "soon"],
    }[case]
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert expected in res.stderr
    assert "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1 and res.stdout == ""  # click's usage errors too
    assert res.stderr.startswith("fencelab: error: ")


def test_unwritable_out_dir_is_bad_input(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", lease_ops(duplicate=False))
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = invoke(good, "--out", str(blocker / "sub"))
    assert res.exit_code == 2 and "cannot write results" in res.stderr and "Traceback" not in res.output


def test_without_a_model_only_the_checkers_whose_operations_appear_run(tmp_path):
    """A register history must not pass lease checkers that had nothing to check: unknown, with the reason."""
    reg = write_jsonl(tmp_path / "register.jsonl", register_ops(stale=False))
    res = invoke(reg, "--json")
    assert res.exit_code == exit_code(["unknown"]), res.output
    line = json.loads(res.stdout)
    assert line["valid"] == "unknown" and line["checkers"] == {}
    assert "no checker applies" in line["reason"] and "read, write" in line["reason"] and "--model" in line["reason"]
    human = invoke(reg)
    assert "valid=\"unknown\"" in human.stdout and "no checker applies" in human.stdout
    # with a model the same file is judged (valid); naming a checker runs it, whatever it finds
    assert invoke(reg, "--model", "register").exit_code == 0
    named = json.loads(invoke(reg, "--checker", "fencing", "--json").stdout)
    assert named["checkers"] == {"fencing": "unknown"} and "no successful acquisition" in named["unknown"]["fencing"]
    # a commit history gets stale-commit and idempotency; deadlines (it times the caller's client) only
    # when asked for
    h = LeaseHistory()
    h.call(0, "commit", {"request_id": "c", "lease_id": "L1", "fencing_token": 1, "doc": "d", "entry": [0, 1, 1],
                         "deadline_ms": 100}, {"doc": "d", "rev": 1, "accepted_token": 1})
    commits = write_jsonl(tmp_path / "c.jsonl", h.ops)
    line = json.loads(invoke(commits, "--json").stdout)
    assert set(line["checkers"]) == {"stale-commit", "idempotency", "availability"}
    assert json.loads(invoke(commits, "--checker", "deadlines", "--json").stdout)["checkers"] == {"deadlines": True}


# -- every file read before any is judged; hints, not parser internals -------------------------------------------


@pytest.mark.parametrize("name, text, needle", [
    ("garbage.jsonl", "garbage\nmore garbage\n", ":1: malformed line"),
    # Once: one line of garbage was taken for a torn last line, so the good file was judged, then this one
    # "unknown" with 0 ops, exit 3. A file with no whole op is no history cut short.
    ("one-line.jsonl", "not json at all\n", ":1: malformed line (not JSON: "),
    ("one-line.edn", "{:type :invoke, :f\n", ":1: malformed EDN line (EDNDecodeError: "),
])
@pytest.mark.parametrize("model", [["--model", "register"], []])
def test_every_file_is_read_before_any_is_judged(tmp_path, name, text, needle, model):
    """Once the first file was judged and printed, then the second refused with exit 2 ("nothing was judged")."""
    good = write_jsonl(tmp_path / "good.jsonl", register_ops(stale=False))
    garbage = tmp_path / name
    garbage.write_text(text)
    for files in ([good, str(garbage)], [str(garbage)]):
        res = invoke(*files, *model)
        assert (res.exit_code, res.stdout) == (2, ""), res.output
        assert res.stderr.startswith(f"fencelab: error: {garbage}{needle}") and res.stderr.count("\n") == 1


def test_a_torn_last_line_after_a_whole_op_is_still_skipped(tmp_path):
    """The tolerance the one-line refusal keeps: a run killed mid-write has its whole ops judged."""
    f = write_jsonl(tmp_path / "h.jsonl", register_ops(stale=False)[:2], tail='{"index": 2, "ti')
    res = invoke(f, "--model", "register", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["ops"] == 2, res.output
    assert "h.jsonl:3: torn last line skipped" in res.stderr


@pytest.mark.parametrize("name, text, needle", [
    ("array.json", '[{"type": "invoke", "f": "read", "process": 0}]\n',
     "a JSON array, not a history: fencelab reads JSONL, one op object per line"),
    ("array.jsonl", '[{"type": "invoke", "f": "read", "process": 0}]\n', "a JSON array? one op object per line"),
    ("tagged.edn", "{:type :invoke, :f :read, :value #my/thing 3, :process 0}\n",
     "tagged.edn:1: malformed EDN line (unknown EDN tag #my/thing: a history's ops are plain EDN maps"),
])
def test_a_json_array_or_an_unknown_edn_tag_gets_a_hint(tmp_path, name, text, needle):
    """Once: the EDN parser's lexer position for a JSON array; an unknown tag on the last line skipped as a torn
    write, leaving an empty history judged "unknown" (exit 3)."""
    path = tmp_path / name
    path.write_text(text)
    res = invoke(str(path))
    assert res.exit_code == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "lexpos" not in res.stderr


# -- a model judges only what it models ---------------------------------------------------------------------------


def fenced_append_ops() -> list[dict]:
    """A fenced-append history in small: a lease, a commit, and the final read of the store's document (an `f`
    a register model shares by name only)."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    h.commit(0, "L1", 1, "e1", rev="1-a", validated=5)
    h.call(1, "read", {"doc": "d"}, {"doc": "d", "entries": [{"token": 1, "entry": "e1"}]}, key="d")
    return h.ops


def test_a_model_refuses_a_history_with_ops_it_does_not_model(tmp_path):
    """Once `valid=false`, blaming the store read a cas-register does not model (README's own example)."""
    path = write_jsonl(tmp_path / "fenced.jsonl", fenced_append_ops())
    res = invoke(path, "--model", "cas-register")
    assert res.exit_code == 2 and res.stdout == "", res.stdout
    assert res.stderr.strip() == (f"fencelab: error: {path}: model 'cas-register' does not model acquire, commit "
                                  "(it takes cas, read, write); check it with --model lease")
    assert invoke(path, "--model", "lease").exit_code == 0
    reg = write_jsonl(tmp_path / "register.jsonl", register_ops(stale=False))
    res = invoke(reg, "--model", "mutex")
    assert res.exit_code == 2 and "check it with --model register or --model cas-register" in res.stderr


def test_a_history_the_model_fits_still_convicts(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", register_ops(stale=True))
    res = invoke(bad, "--model", "cas-register", "--json")
    assert res.exit_code == 1 and json.loads(res.stdout)["valid"] is False


def test_the_readmes_check_example_names_a_model_that_fits_a_lab_run(tmp_path):
    """README's `fencelab check store/latest/history.jsonl --model M`: a lab run's history fits M (once
    cas-register, which a fenced-append history convicted falsely)."""
    root = Path(__file__).resolve().parent.parent
    line = next(ln for ln in (root / "README.md").read_text().splitlines() if ln.startswith("fencelab check "))
    model = re.search(r"--model (\S+)", line).group(1)
    res = invoke(str(root / "tests" / "data" / "lease-run-history.jsonl"), "--model", model)
    assert res.exit_code == 0, res.output
    path = write_jsonl(tmp_path / "fenced.jsonl", fenced_append_ops())
    assert invoke(path, "--model", model).exit_code == 0
