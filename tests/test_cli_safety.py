"""The CLI as a newcomer meets it: exit codes, bad input without tracebacks, the store kept safe, secrets kept out,
a replay command that parses back into the same test, and the small things (help, status, pytest -p, run clock)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import sigint_default

from lab import runner
from lab.cli import main
from lab.exitcodes import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_UNKNOWN, EXIT_VALID, verdict_exit
from lab.secrets import redact_secrets, redact_tree
from lab.testmap import Test

ROOT = Path(__file__).resolve().parent.parent
STAMP = "20260101T000000.000000Z"


def fencelab(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


# -- the exit-code table ---------------------------------------------------------------------------------------


def test_one_exit_code_table():
    assert (EXIT_VALID, EXIT_INVALID, EXIT_BAD_INPUT, EXIT_UNKNOWN, EXIT_INTERRUPTED) == (0, 1, 2, 3, 130)
    assert [verdict_exit(v) for v in (True, False, "unknown", None)] == [0, 1, 3, 3]
    from checkers import cli as check_cli
    from lab.campaign.execute import EXIT_INTERRUPTED as campaign_interrupted

    assert (check_cli.EXIT_BAD_INPUT, check_cli.EXIT_UNKNOWN) == (EXIT_BAD_INPUT, EXIT_UNKNOWN)
    assert campaign_interrupted == EXIT_INTERRUPTED
    doc = (ROOT / "docs" / "cli.md").read_text()
    assert "## Exit codes" in doc and "| 130 |" in doc


def test_check_bad_input_is_2_and_unknown_is_3(tmp_path):
    res = CliRunner().invoke(main, ["check", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == EXIT_BAD_INPUT and "Traceback" not in res.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = CliRunner().invoke(main, ["check", str(empty)])
    assert res.exit_code == EXIT_UNKNOWN, res.output


# -- the replay command parses back into the same Test -----------------------------------------------------------


class ToySystem:
    """A SUT registered in-process (as a conftest would): the replay names it by its import path."""

    capabilities = ()

    def __init__(self, test, node, service_instance_id):
        raise AssertionError("never opened: these tests do not run it")


def _captured_tests(monkeypatch, args: list[str], store: Path | None) -> tuple[list[Test], CliRunner]:
    """`fencelab test ARGS` parsed by click and validated, with the run itself replaced by a recorder."""
    captured: list[Test] = []

    def fake_run_test(test, store_dir):
        test = runner.prepare_run(test)
        test.run_dir = Path(store_dir) / test.name / STAMP
        captured.append(test)
        return {"valid": True, "ops": 0, "replay": runner.replay_command(test)}

    monkeypatch.setattr(runner, "run_test", fake_run_test)
    res = CliRunner().invoke(main, ["test", *args, *(["--store-dir", str(store)] if store else [])])
    assert res.exit_code == 0, res.output
    return captured, res


def _options(t: Test) -> dict:
    d = t.to_json()
    d.pop("sut", None)  # a registered name replays as its import path (the test below checks it is the same system)
    d["extra"] = {k: v for k, v in d["extra"].items() if k != "sut_import"}
    return d


@pytest.mark.parametrize("args", [
    [],
    ["--workload", "fenced-append", "--nemesis", "partition,kill", "--nemesis-interval", "1.5", "--servers", "3",
     "-c", "4", "--rate", "20", "--keys", "2", "--ttl-ms", "500", "--seed", "7", "--time-limit", "3"],
    ["--scenario", "concurrent-acquires", "--time-limit", "4"],
    ["--mutant", "volatile-counter", "--name", "planted/volatile"],
    ["--run-salt", "abc123", "--name", "pinned"],
    ["--workload", "fenced-append", "--store-url", "http://127.0.0.1:1/"],
    ["--sut-opt", "hold_s=1.5", "--sut-opt", "mode=fast", "--sut-opt", 'label="7"', "--sut-opt", "on=true",
     "--sut-opt", "none=null", "--sut-opt", "list=[1, 2]", "--sut-opt", "empty="],
    ["--workload", "fenced-append", "--after-info", "abandon"],
    ["--workload", "fenced-append", "--stalls", "off"],
], ids=["defaults", "options", "scenario", "mutant", "salt", "store-url", "sut-opt", "after-info", "stalls"])
def test_replay_command_parses_back_into_the_same_test(monkeypatch, tmp_path, args):
    store = tmp_path / "somewhere" / "store"
    (first,), res = _captured_tests(monkeypatch, args, store)
    replay = runner.replay_command(first)
    assert f"replay: {replay}" in res.output and "--store-dir" in replay and "--run-salt" in replay
    argv = shlex.split(replay)
    assert argv[:2] == ["fencelab", "test"]
    (again,), _ = _captured_tests(monkeypatch, argv[2:], None)
    assert again.run_dir == store / first.name / STAMP, "the replay lands in the first run's store"
    assert _options(again) == _options(first)


def test_a_replayed_fault_schedule_is_kept_in_the_replay_by_its_absolute_path(monkeypatch, tmp_path):
    from nemesis import fault_schedule

    fault_schedule.write(tmp_path / "recorded.json", ["kill"], [])
    monkeypatch.chdir(tmp_path)
    (first,), _ = _captured_tests(monkeypatch, ["--fault-schedule", "recorded.json"], tmp_path / "store")
    assert first.fault_schedule == str(tmp_path / "recorded.json")
    replay = runner.replay_command(first)
    assert f"--fault-schedule {tmp_path / 'recorded.json'}" in replay
    (again,), _ = _captured_tests(monkeypatch, shlex.split(replay)[2:], None)
    assert _options(again) == _options(first)


def test_sut_opts_are_plugin_options_in_extra_typed_as_json_scalars(monkeypatch, tmp_path):
    (t,), _ = _captured_tests(monkeypatch, ["--sut-opt", "hold_s=1.5", "--sut-opt", 'label="7"', "--sut-opt",
                                            "mode=fast", "--sut-opt", "n=3", "--sut-opt", "n=4"], tmp_path)
    assert {k: t.extra[k] for k in ("hold_s", "label", "mode", "n")} == {"hold_s": 1.5, "label": "7", "mode": "fast",
                                                                        "n": 4}
    replay = runner.replay_command(t)
    assert "--sut-opt hold_s=1.5 --sut-opt 'label=\"7\"' --sut-opt mode=fast --sut-opt n=4" in replay


def test_replay_of_an_external_run_names_the_sut_by_import_path_and_draws_a_fresh_salt(monkeypatch, tmp_path):
    from lab.sut import get_sut, register_sut, unregister_sut

    key = tmp_path / "key.txt"
    key.write_text("some-key\n")
    register_sut("toy-system", ToySystem)
    try:
        (first,), _ = _captured_tests(monkeypatch, ["--sut", "toy-system", "--api-key-file", str(key)], tmp_path)
    finally:
        unregister_sut("toy-system")
    replay = runner.replay_command(first)
    assert "--run-salt" not in replay, "an external system may remember the run's request ids: a fresh salt"
    (again,), _ = _captured_tests(monkeypatch, shlex.split(replay)[2:], None)
    assert get_sut(again.sut).factory is ToySystem and "sut" not in again.extra
    assert first.run_salt and again.run_salt and again.run_salt != first.run_salt
    a, b = _options(again), _options(first)
    a.pop("run_salt"), b.pop("run_salt")
    assert a == b


# -- every bad input: one `fencelab: error:` line, exit 2, before anything starts ----------------------------------


def one_error_line(res) -> str:
    """The single `fencelab: error:` line of a refused command (exit 2, no usage block, no traceback)."""
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencelab: error: "), res.output
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["--time-limit", "inf"], "--time-limit must be a finite number of seconds, not inf"),
    (["--time-limit", "nan"], "--time-limit must be a finite number of seconds, not nan"),
    (["--time-limit", "1e308"], "--time-limit must be between 0 and 604800 seconds, not 1e+308"),
    (["--rate", "inf"], "--rate must be a finite number of ops/s, not inf"),
    (["--rate", "1e308"], "--rate must be between 0.001 and 1000000 ops/s, not 1e+308"),
    (["--rate", "1e-300"], "--rate must be between 0.001 and 1000000 ops/s"),
    (["--nemesis", "partition", "--nemesis-interval", "inf"], "--nemesis-interval must be a finite number"),
    (["--nemesis", "partition", "--nemesis-interval", "nan"], "--nemesis-interval must be a finite number"),
    (["--nemesis", "partition,,kill"], "--nemesis: empty name in 'partition,,kill'"),
    (["--nemesis", ","], "--nemesis: empty name"),
    (["--workload", "register", "--commit-mode", "unfenced"], "workload 'register' makes no commits"),
    (["--sut", "valkey-lock-fenced", "--commit-mode", "unfenced"], "workload 'lease' makes no commits"),
    (["--url", "not-a-url"], "--url 'not-a-url' is not a URL: give the server's base URL"),
    (["--url", "http://127.0.0.1:99999"], "is not a URL"),
    (["--tim", "3"], "no such option --tim (did you mean --time-limit?)"),
    (["--workload"], "requires an argument"),
    (["--time-limit", "soon"], "Invalid value for '--time-limit'"),
    (["--sut-opt", "ttl_ms=5"], "--sut-opt 'ttl_ms=5': ttl_ms is a Test field: set it with its own option"),
    (["--sut-opt", "hold_s"], "--sut-opt 'hold_s': write KEY=VALUE"),
    (["--sut-opt", "probe=1"], "probe is recorded by the run itself"),
])
def test_bad_test_options_are_one_line_before_anything_starts(tmp_path, args, needle):
    """Each once started the stack and crashed (inf, 1e308), ran silently (partition,,kill, --commit-mode on a
    workload without commits), blamed the network (--url not-a-url) or printed click's usage block."""
    res = CliRunner().invoke(main, ["test", "--store-dir", str(tmp_path / "store"), *args])
    assert needle in one_error_line(res)
    assert not (tmp_path / "store").exists(), "nothing may start (or be written) before the options are valid"


def test_click_usage_errors_anywhere_are_one_line_with_the_likely_meant_name():
    assert "no such command 'chek' (did you mean check?)" in one_error_line(CliRunner().invoke(main, ["chek"]))
    assert "no such option --mdl (did you mean --model?)" in one_error_line(
        CliRunner().invoke(main, ["check", "--mdl", "x", "h.jsonl"]))
    assert "see '" in one_error_line(CliRunner().invoke(main, ["test", "--bogus"]))
    from lab.cli import suggest

    known = ["--sut", "--ttl-ms", "--time-limit", "--test-count"]
    assert suggest("--tim", known) == ["--time-limit"], "a prefix wins over difflib's pick (--sut)"
    assert suggest("--tset-count", known) == ["--test-count"]
    assert suggest("--zzz", known) == []


def test_a_member_that_dies_at_start_up_says_how_it_ended(tmp_path):
    """Once `exit None`: a program whose main thread ends first looks dead (a zombie leader) before its exit
    status can be read; the message waits for the status, and names a signal by name."""
    from lab.stack.process import ManagedProcess, ProcessError

    main_thread_ends_first = ("import ctypes, os, threading, time\n"
                              "threading.Thread(target=lambda: (time.sleep(0.5), os._exit(5))).start()\n"
                              "ctypes.CDLL(None).pthread_exit(None)\n")
    for argv, how in (([sys.executable, "-c", main_thread_ends_first], "(exit 5)"),
                      (["sh", "-c", "kill -9 $$"], "(killed by SIGKILL)")):
        member = ManagedProcess("member", argv, tmp_path / "member.log", ports={"p": 1})
        with pytest.raises(ProcessError) as e:
            member.start(timeout=30)
        assert str(e.value).startswith(f"member exited during start-up {how}"), str(e.value)


@pytest.mark.parametrize("args, name", [
    ([], "lease"),
    (["--workload", "fenced-append"], "fenced-append"),
    (["--sut", "valkey-lock-fenced"], "valkey-lock-fenced-lease"),
    (["--sut", "valkey-lock-fenced", "--workload", "fenced-append"], "valkey-lock-fenced-fenced-append"),
    (["--sut", "valkey-lock-fenced", "--name", "mine"], "mine"),
])
def test_a_third_party_run_is_named_after_its_system(monkeypatch, tmp_path, args, name):
    """Runs of another system land apart from the reference server's (`store/<system>-<workload>/`)."""
    (test,), _ = _captured_tests(monkeypatch, args, tmp_path)
    assert test.name == name and test.run_dir == tmp_path / name / STAMP
    from lab.cli import system_label

    assert system_label("reference", ["http://127.0.0.1:9000/api"]) == "127.0.0.1-9000"
    assert system_label("my.pkg:Factory", []) == "my.pkg-Factory"
    assert system_label("reference", []) is None


# -- secrets: URL user info never written down -----------------------------------------------------------------


def test_user_info_is_redacted_in_text_and_trees():
    line = "--store-url=http://admin:pw1@db:5984/x --url https://tok3n@lease.example/ http://h/"
    assert redact_secrets(line) == "--store-url=http://admin:***@db:5984/x --url https://***@lease.example/ http://h/"
    assert redact_secrets(redact_secrets(line)) == redact_secrets(line)
    tree = {"argv": ["fencelab", "--store-url=http://a:b@h"], "n": 3, "extra": {"urls": ["http://u:v@x"]}}
    assert redact_tree(tree) == {"argv": ["fencelab", "--store-url=http://a:***@h"], "n": 3,
                                 "extra": {"urls": ["http://u:***@x"]}}


def test_test_json_and_replay_hold_no_user_info(monkeypatch, tmp_path):
    url = "http://alice:pw-in-url@127.0.0.1:9/"
    monkeypatch.setattr(sys, "argv", ["fencelab", "test", f"--store-url={url}", "--url", url])
    t = Test(name="t", extra={"urls": [url], "store_url": url, "api_key_file": "k"})
    t.run_dir = tmp_path
    runner.write_test_json(t)
    text = (tmp_path / "test.json").read_text()
    assert "pw-in-url" not in text and "alice:***@" in text
    assert "pw-in-url" not in runner.replay_command(t)


def test_store_url_password_given_with_equals_is_nowhere(tmp_path):
    from lab.stack.store import PouchDBProcess

    store = PouchDBProcess(tmp_path / "ext", in_memory=True).start()
    try:
        r = httpx.put(store.url + "/_config/admins/admin", content='"eq-s3cret"',
                      headers={"Content-Type": "application/json"}, timeout=5)
        assert r.status_code == 200
        url = store.url.replace("http://", "http://admin:eq-s3cret@")
        res = fencelab("test", "--workload", "fenced-append", "--time-limit", "3", f"--store-url={url}",
                       "--store-dir", str(tmp_path / "st"))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "eq-s3cret" not in res.stdout + res.stderr
        run = (tmp_path / "st" / "fenced-append" / "latest").resolve()
        assert any("--store-url=http://admin:***@" in a for a in json.loads((run / "test.json").read_text())["argv"])
        leaked = [str(p) for p in run.rglob("*") if p.is_file() and "eq-s3cret" in p.read_text(errors="ignore")]
        assert not leaked, f"the store password was written to {leaked}"
    finally:
        store.stop()


# -- the store: names cannot escape it; only completed runs become `latest` --------------------------------------


@pytest.mark.parametrize("name", ["../x", "/abs/x", "", "a/../../b", ".", "latest", "a//b"])
def test_name_cannot_escape_the_store(tmp_path, name):
    store = tmp_path / "inner" / "store"
    res = CliRunner().invoke(main, ["test", "--name", name, "--time-limit", "1", "--store-dir", str(store)])
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    assert "--name" in res.output and "Traceback" not in res.output
    assert [p for p in tmp_path.rglob("*")] == [], "nothing was created"


def test_only_a_completed_run_takes_over_latest(tmp_path):
    store = tmp_path / "store"
    ok = fencelab("test", "--workload", "register", "--time-limit", "2", "--store-dir", str(store))
    assert ok.returncode in (0, 1, 3), ok.stdout + ok.stderr
    completed = (store / "latest").resolve()
    assert (completed / "results.json").exists()
    results = json.loads((completed / "results.json").read_text())
    history = [json.loads(line) for line in (completed / "history.jsonl").read_text().splitlines()]
    assert results["ops"] == sum(1 for op in history if op["type"] == "invoke" and isinstance(op["process"], int))
    assert results["entries"] == len(history) > results["ops"] > 0

    # interrupted mid-run (Ctrl-C): exit 130, the partial run is kept and named with an analyze hint
    proc = subprocess.Popen([sys.executable, "-m", "lab", "test", "--workload", "register", "--time-limit", "120",
                             "--store-dir", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    try:
        hist, deadline = None, time.monotonic() + 120
        while hist is None and time.monotonic() < deadline:
            found = [h for h in store.glob("register/*/history.jsonl")
                     if not h.parent.is_symlink() and h.parent != completed]
            if found and found[0].stat().st_size > 2000:
                hist = found[0]
            time.sleep(0.1)
        assert hist is not None, "the interrupted run never wrote a history"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, out + err
    assert "Traceback" not in err
    partial = hist.parent
    assert f"the partial run is kept in {partial}" in err and f"fencelab analyze {partial}" in err
    assert (store / "latest").resolve() == completed and (store / "register" / "latest").resolve() == completed
    res = CliRunner().invoke(main, ["analyze", str(partial)])
    assert res.exit_code in (EXIT_VALID, EXIT_INVALID, EXIT_UNKNOWN), res.output
    # and says the verdict is about a partial run (results.json too)
    assert "partial run: interrupted (Ctrl-C or SIGTERM) before its time limit" in res.output, res.output
    assert json.loads((partial / "results.json").read_text())["interrupted"]["by"] == "Ctrl-C or SIGTERM"
    assert (store / "latest").resolve() == completed, "analyze does not move latest"

    # a run whose stack cannot start: bad input, its dir kept, latest untouched
    bad = fencelab("test", "--workload", "fenced-append", "--store-url", "http://127.0.0.1:1", "--time-limit", "2",
                   "--store-dir", str(store))
    assert bad.returncode == EXIT_BAD_INPUT and "Traceback" not in bad.stderr, bad.stdout + bad.stderr
    assert (store / "latest").resolve() == completed
    assert not (store / "fenced-append" / "latest").exists()


_LINK_MANY = """
import sys
from pathlib import Path
from lab.runner import link_latest
store, rounds, names = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
for name in names:
    (store / name).mkdir(parents=True, exist_ok=True)
for i in range(rounds):
    for name in names:
        link_latest(store / name / f"20260101T000000.{i:06d}Z", store, name)
"""


def test_runs_judged_at_once_in_one_store_each_move_latest_without_failing(tmp_path):
    """Runs at once in one store (campaign jobs, Dask, the exposure table's two runs at a time) each point
    `store/latest` at themselves when judged; one shared temporary link made one of them raise (CI, 2026-12-04)."""
    import threading

    procs = [subprocess.Popen([sys.executable, "-c", _LINK_MANY, str(tmp_path), "300", f"t{i}", "shared"], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    errors: list[BaseException] = []

    def in_thread(name: str) -> None:
        try:
            (tmp_path / name).mkdir(parents=True, exist_ok=True)
            for i in range(300):
                for n in (name, "shared"):
                    runner.link_latest(tmp_path / n / f"20260101T000001.{i:06d}Z", tmp_path, n)
        except BaseException as e:  # noqa: BLE001 - the test asserts there was none
            errors.append(e)

    (tmp_path / "shared").mkdir(parents=True, exist_ok=True)
    threads = [threading.Thread(target=in_thread, args=(f"u{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    failed = [p.communicate(timeout=120)[1] for p in procs if p.wait(timeout=120) != 0]
    assert failed == [] and errors == [], (failed, errors)
    assert (tmp_path / "latest").is_symlink() and (tmp_path / "shared" / "latest").is_symlink()
    assert not [p for p in tmp_path.rglob("*.tmp")], "no temporary link is left behind"


# -- bad input a newcomer meets, against a running stack ----------------------------------------------------------


def test_newcomer_mistakes_against_a_named_stack_are_one_line(tmp_path):
    home = tmp_path / "home"
    up = fencelab("up", "--name", "s", "--home", str(home), "--servers", "1", "--toxiproxy", "--no-store")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        st = json.loads(fencelab("status", "--name", "s", "--home", str(home), "--json").stdout)
        plain = fencelab("status", "--name", "s", "--home", str(home)).stdout
        for url in st["client_nodes"]:  # the proxied URLs, as the lab's clients dial them
            assert url in plain, plain
        key = fencelab("api-key", "--name", "s", "--home", str(home))
        assert key.returncode == 0, key.stderr
        key_file = Path(key.stdout.strip())
        assert len(key_file.read_text().splitlines()) == 1 and (key_file.stat().st_mode & 0o077) == 0
        url, creds = st["lease_servers"][0], st["credentials"]
        cases = {
            "credentials.json as the key file": (["--url", url, "--api-key-file", creds], "not one key"),
            "register with --url": (["--workload", "register", "--url", url, "--api-key-file", str(key_file)],
                                    "lab's own Valkey"),
            "--url without --store-url": (["--workload", "fenced-append", "--url", url, "--api-key-file",
                                           str(key_file)], "--store-url"),
            "--url without a key": (["--url", url], "API key"),
        }
        for what, (args, needle) in cases.items():
            r = fencelab("test", *args, "--time-limit", "2", "--store-dir", str(tmp_path / "store"),
                         timeout=120)
            assert r.returncode == EXIT_BAD_INPUT, f"{what}: {r.stdout}{r.stderr}"
            assert "Traceback" not in r.stderr and needle in r.stderr, f"{what}: {r.stderr}"
            assert len(r.stderr.strip().splitlines()) == 1, f"{what}: {r.stderr}"
    finally:
        fencelab("down", "--name", "s", "--home", str(home))


def test_help_lists_nemesis_scenario_and_workload_names():
    from lab.scenarios import SCENARIOS
    from nemesis.registry import known_names
    from workloads import WORKLOADS

    res = CliRunner().invoke(main, ["test", "--help"], terminal_width=60)
    assert res.exit_code == 0
    words = set(res.output.replace(",", " ").split())  # a name is never broken across lines
    for name in [*known_names(), *SCENARIOS, *WORKLOADS]:
        assert name in words, name


def test_analyze_names_the_failing_checker_and_its_first_violation(tmp_path):
    """A history where a later acquisition gets a lower token: analyze says which checker and why."""
    run = tmp_path / "lease" / STAMP
    run.mkdir(parents=True)
    t = Test(name="lease", workload="lease", run_salt="x1")
    t.run_dir = run
    (run / "test.json").write_text(json.dumps(t.to_json()))

    def pair(i, t0, token, lease, rid):
        inv = {"index": 2 * i, "time": t0, "type": "invoke", "process": i, "f": "acquire",
               "value": {"request_id": rid, "ttl_ms": 2000}, "key": "k0"}
        ok = {"index": 2 * i + 1, "time": t0 + 1000, "type": "ok", "process": i, "f": "acquire",
              "value": {"lease_id": lease, "fencing_token": token, "acquired_at_ms": 1000 + t0 // 10 ** 6,
                        "renewed_at_ms": 1000 + t0 // 10 ** 6, "expires_at_ms": 3000 + t0 // 10 ** 6,
                        "ttl_ms": 2000, "state": "active", "request_id": rid, "sent": {"request_id": rid}},
              "key": "k0"}
        return [inv, ok]

    history = pair(0, 10 ** 6, 5, "lease-a", "r1") + pair(1, 5 * 10 ** 9, 3, "lease-b", "r2")
    (run / "history.jsonl").write_text("".join(json.dumps(op) + "\n" for op in history))
    res = CliRunner().invoke(main, ["analyze", str(run)])
    assert res.exit_code == EXIT_INVALID, res.output
    assert "valid=false ops=2 (4 history entries)" in res.output
    assert "  fencing: false" in res.output and "\n    - " in res.output


# -- the plugin, the run clock ------------------------------------------------------------------------------------


def test_documented_pytest_p_lab_plugin_loads_beside_the_entry_point():
    project = ROOT / "examples" / "pytest-project"
    for extra in (["-p", "lab.pytest_plugin"], [], ["-p", "lab.pytest_plugin", "-p", "no:fencelab"]):
        r = subprocess.run([sys.executable, "-m", "pytest", *extra, "--collect-only", "-q", "-p", "no:cacheprovider"],
                           cwd=project, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "already registered" not in r.stdout + r.stderr, (extra, r.stdout, r.stderr)
        assert "test_lease_lab.py" in r.stdout


def test_history_clock_starts_when_the_workload_starts(monkeypatch, tmp_path):
    """Time 0 of the history is taken after the stack is up, not before it starts (plots began ~4 s in)."""
    from lab.history import writer as writer_mod
    from lab.stack import local

    events: list[str] = []
    real_up, real_init = local.LocalStack.up, writer_mod.HistoryWriter.__init__

    def up(self, *a, **kw):
        events.append("stack-up-begins")
        out = real_up(self, *a, **kw)
        events.append("stack-up-done")
        return out

    def init(self, *a, **kw):
        events.append("history-clock-starts")
        real_init(self, *a, **kw)

    monkeypatch.setattr(local.LocalStack, "up", up)
    monkeypatch.setattr(writer_mod.HistoryWriter, "__init__", init)
    results = runner.run_test(Test(name="clock", workload="register", time_limit=1.0, concurrency=2), tmp_path)
    assert results["ops"] > 0
    assert events[:3] == ["stack-up-begins", "stack-up-done", "history-clock-starts"], events


@pytest.mark.parametrize("command", ["mutants", "evidence"])
def test_the_shipped_specs_are_found_from_any_directory(command, tmp_path):
    """`fencelab mutants` / `evidence` outside the checkout use the specs shipped with the lab (it said
    "campaigns/mutants.toml: no such spec file"); a bad --only still names each mutant once."""
    args = ["--only", "nope"] if command == "mutants" else ["--depth", "nope"]
    r = fencelab(command, *args, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "no such spec file" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencelab: error:"), r.stderr
    if command == "mutants":
        assert "not a mutant of" in lines[0] and lines[0].count("local-clock") == 1, lines[0]
    assert not list(tmp_path.iterdir())  # refused before anything was written
