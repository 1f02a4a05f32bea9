"""Generate docs/scenarios.md from the scenario registry: `python -m lab.scenarios.docs > docs/scenarios.md`.

The registry is the single source: each scenario's race, required result,
rules, set-up, checks, faults and options come from its `Scenario` record
(tests/test_scenario_runs.py checks that the file is up to date).
"""

from __future__ import annotations

from lab.scenarios import PROBE_SCENARIOS, RACE_SCENARIOS, SCENARIOS
from lab.scenarios.scenario import Scenario

INTRO = """\
# Named race scenarios

Generated from the registry in `lab/scenarios/` by `python -m lab.scenarios.docs`; do not edit.

Every row of the contract's races table (`shared/spec/lease-contract.md`,
section 8) is a named scenario that sets its race up deterministically enough
to hit it on most runs, and every matrix row (section 12) that is a rule
rather than a race has a probe. Run one with

```
fencelab test --scenario concurrent-acquires [--time-limit S] [--seed N] [--store-dir store]
```

or name it in a campaign (`[scenarios.x] scenario = "renew-vs-expiry"`); the
bundle of all of them is `fencelab evidence` (docs/evidence.md).

## What a scenario is

A `lab.scenarios.Scenario` holds:

- **a script**: a `lab.generator` generator driving client threads and the
  nemesis thread together, in steps (each starts when the previous one has
  completed, Jepsen's `phases`), with bursts (one op per thread, dispatched in
  one event-loop turn) and timed faults. Races repeat in rounds on fresh
  identities; the number of rounds follows `--time-limit`. Request ids are
  unique per run, and identities carry a run nonce (`workflow_name
  s-<nonce>`), so a scenario can run again against the same external system;
- **faults**: nemeses of `nemesis.registry` driven with explicit values
  (which link, which direction, which process), `client-pause` (the
  GC-paused holder; it works against any system: the clients are the lab's),
  and `valkey-poke` (`lab.scenarios.faults.ValkeyPoke`: a corrupt record or a
  counter near its limit written straight into the lab's Valkey);
- **Test options** (`Scenario.options`: concurrency, time limit, TTL, ...),
  which `--scenario` applies unless the same option is given on the command
  line, and which campaigns read;
- **a checker** (`scenario:<name>` in results.json) that states what the row
  requires over the history, next to the domain checkers of `checkers/` that
  apply. Every scripted op carries a `tag` (kept in history.jsonl), which the
  checker reads. Tags are declared: `Scenario.tags` lists the tag names
  (constants) the scenario uses, and a concrete tag is a declared name or
  `<name>-<round>` (one segment: `burst-3`, `orig-p`). A script that emits, or
  a checker that looks up, an undeclared tag fails when the scenario is built
  (`TagError`, naming the tag and the declared ones): the script is dry-run
  and the functions' literal tags are read; at run time an undeclared lookup
  is an error (the verdict is `unknown`), never "the op never ran". The
  checker answers `valid: "unknown"` with `not_exercised` when the
  race was not hit (no response was lost, the renew never reached the TTL
  boundary, ...): a race that did not happen is not evidence.

The scenario driver (`lab.scenarios.driver.ScenarioDriver`) names leases by
`slot` and workers by `owner` (the owner is the principal plus the worker's
`service_instance_id`, so the same owner name is the same worker from any
thread or server). Completions add `sent_at_ms` (the client's wall clock when
the request left; on the local stack Valkey's `TIME` reads the same clock,
which tells a result replayed from the idempotency record from a fresh one),
`replayed`, `lock_key`, `stored_identity` (the record's tuple, C4),
`end_backend_ms`, `cancelled` (a definite
`lease_lost` reached the worker's cancellation path) and errors as
`{code, msg}`. `observe-backend` reads an identity's fencing counter, commit
high-water mark and record straight from Valkey, `observe-audit` the audit
stream: evidence observed against the real backend (matrix row 15), local
stack only.

Threads map to servers as the stack lays them out: thread 0 talks to lease-1
and thread 1 to lease-2; with Toxiproxy (network faults) through client group
c1, and thread 2 is group c2 to lease-1.

## How the runner uses it

`test.scenario` names the scenario. `lab.runner.validate` refuses an
unknown one, one that needs the lab's stack against an external system (`not
applicable to an external system: ...`), `--nemesis` (a scenario brings its
own faults), and too few threads or servers. `run_test` replaces the workload
by `scenario_workload(test)`, which returns it with a new spec whose `nemesis` is the
scenario's registry nemeses (so the stack gets Toxiproxy or AOF persistence), and `_run`
runs the scenario's composed nemesis and script (`build_nemesis(test)`) beside
the workload's (empty) generator. `fencelab analyze` re-judges a stored run with
the scenario's checker; the replay command includes `--scenario`.

The run's verdict is its row's: `scenario:<name>` judges it, and any violation
of a domain checker makes the run invalid; a domain checker that had nothing to
compare in a short script (one acquisition per key, no retry) says `unknown` in
its own result (listed in `nothing_to_compare`) without making the row unknown.

The commit scenarios read every document back in a final phase, from the
run's store: the lab's own, or the system's (`--store-url`, read only; the
lab installs its fence guard only in a store it started or one the user
marks `--lab-owns-store`). A final read that failed (no store, unreachable)
leaves "a refused commit never lands" unjudged: the verdict is `unknown` with
`documents_unread` naming why, never a silent pass. Documents are
`doc-<nonce>-<key>`, run-unique like the identities (docs/external-systems.md).

## The scenarios
"""


TESTS = """\
## Tests

- `tests/test_scenario_checkers.py`: every scenario checker on hand-written
  histories: the required result is valid, each way of breaking it is valid
  False with its violation kind, and a race that was not hit is unknown.
- `tests/test_scenario_runs.py`: every registered scenario run live on its
  own fresh stack at the shortest depth (`--time-limit 1`): its own checker
  judged its row (valid, not "unknown"), no checker found a violation, and the
  extra evidence some must show (both enforcement points of
  `older-holder-commit`, commits after expiry, idempotency conflicts, the
  identity probe's spellings and distinct keys); `analyze`,
  the CLI (`--scenario`, its refusals), a scenario against an external URL,
  campaign specs, this file being up to date, and two scenarios against the
  server's planted bugs: `backup-restore` with `recovery: off` finds a token
  issued twice after the restore, `older-holder-commit` with `commit_mode:
  unfenced` finds the old holder's write landing after its successor's.

- `tests/test_external_identity.py`: `identity-probe` against in-memory
  systems with other documented case rules (keep case and trim; fold every
  field): valid; one that maps two identities to one lease: invalid
  (`collision`). `tests/test_external_runs.py`: the commit scenarios against an
  external server read its store (`--store-url`), and say unknown without it.

```
.tools/venv/bin/pytest -q tests/test_scenario_checkers.py tests/test_scenario_runs.py
```
"""


def _faults(sc: Scenario) -> str:
    """The scenario's faults, as a list of names."""
    parts = list(sc.nemeses)
    if sc.client_pause:
        parts.append("client-pause")
    if sc.pokes:
        parts.append("valkey-poke")
    return ", ".join(parts) or "none"


def _options(sc: Scenario) -> str:
    """The scenario's Test options, as `k=v` pairs."""
    return ", ".join(f"{k}={v}" for k, v in sc.options.items()) or "defaults"


def section(sc: Scenario) -> str:
    """One scenario's section."""
    external = f"no: {sc.stack_only}" if sc.stack_only else "yes"
    if not sc.stack_only and "lab's stack" in sc.setup:
        external += " (what the set-up does only on the lab's stack is left out)"
    lines = [f"### `{sc.name}`", "",
             f"**Row:** {sc.race}. **Requires:** {sc.requires}. **Rules:** {', '.join(sc.rules)}.", "",
             f"**Set-up.** {sc.setup}", "",
             f"**Checker** (`scenario:{sc.name}`). {sc.checks} Also judged by: {', '.join(sc.domain)}.", "",
             f"Workload base `{sc.workload}`; faults: {_faults(sc)}; options: {_options(sc)}; "
             f"against an external system: {external}.", ""]
    return "\n".join(lines)


def render() -> str:
    """The whole of docs/scenarios.md."""
    out = [INTRO, "### Races table (section 8)", "", "| # | scenario | race | required result |", "|---|---|---|---|"]
    out += [f"| {i} | `{n}` | {SCENARIOS[n].race} | {SCENARIOS[n].requires} |"
            for i, n in enumerate(RACE_SCENARIOS, 1)]
    out += ["", "### Matrix probes (section 12)", "", "| scenario | row |", "|---|---|"]
    out += [f"| `{n}` | {SCENARIOS[n].race.removeprefix('matrix ')} |" for n in PROBE_SCENARIOS]
    out += ["", *(section(SCENARIOS[n]) for n in RACE_SCENARIOS + PROBE_SCENARIOS), TESTS]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
