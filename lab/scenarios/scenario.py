"""What a named race scenario is, the helpers its script and checker are written with, and how a run uses it.

A `Scenario` is one row of the contract's races table (section 8), or one
probe of its verification matrix (section 12), made runnable:

- a **script**: a generator (lab.generator) driving client threads and the
  nemesis thread together, step by step (`Script.steps`: each step starts when
  the previous one has completed, as Jepsen's `phases`), with concurrent parts
  inside a step (`Script.together`, bursts fired in one event-loop turn) and
  timed faults (`Script.fault`);
- **faults**: nemeses of `nemesis.registry` driven with explicit values (which
  link, which process), client pauses, and direct Valkey writes
  (`lab.scenarios.faults.ValkeyPoke`);
- Test **options** (`options`, what campaigns read: a mapping of Test options
  plus extra keys);
- a **checker** that states what the row requires over the history (tagged
  ops: every scripted op carries a `tag`), next to the domain checkers of
  `checkers/` that apply. A checker answers `valid: "unknown"` when the race
  was not actually hit (e.g. no response was lost), never `true` for a race
  that did not happen.

**Tags** are declared: `Scenario.tags` lists the tag names (constants) its
script and checker use; a concrete tag is a declared name, or a declared name
plus `-<round>` (one segment, no hyphen: `burst-3`, `orig-p`, `read-k0`). A
scenario whose script emits, or whose checker looks up, an undeclared tag
fails when it is built (`TagError` at import of the registry): the script is
dry-run and the script, final and check functions are read for literal tags.
At run time `Tagged` refuses undeclared tags too, so a typo'd lookup can never
return None and let a check pass without testing anything.

`scenario_workload(test)` turns a Test naming a scenario
(`test.scenario`) into a `ScenarioWorkload`, which the runner uses
like any workload plus `build_nemesis(test) -> (nemesis, script)`.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import secrets
import textwrap
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import lab.generator as gen
from checkers.core import Compose, ViewCheck, Violations, get_checker
from checkers.pairs import Pair, error_code
from checkers.view import LeaseView
from lab.scenarios.driver import ScenarioDriver, Shared
from lab.scenarios.faults import build_nemesis
from lab.sut import SutError, sut_of
from lab.sut.target import target_of
from workloads import needs_of
from workloads.base import Workload
from lab.testmap import Test

MUTATIONS = frozenset(("acquire", "renew", "release", "force-release", "revoke", "commit"))
NOT_IN_BODY = frozenset(("deadline_ms", "at", "body"))  # what the server's idempotency digest does not cover
TEST_OPTIONS = ("time_limit", "concurrency", "rate", "keys", "ttl_ms", "nemesis_interval", "servers")


class ScenarioError(ValueError):
    """A scenario cannot run as asked (unknown name, not applicable here, bad options); one line."""


class TagError(ScenarioError):
    """A scenario's script or checker uses a tag its `tags` do not declare (a typo would test nothing)."""


_ROUND = re.compile(r"[A-Za-z0-9_.]+")  # the `-<round>` part of a concrete tag: one segment, no hyphen


def tag_declared(tag: str, declared: frozenset[str]) -> bool:
    """Is `tag` a declared name, or a declared name plus `-<round>`?"""
    if tag in declared:
        return True
    head, sep, tail = tag.rpartition("-")
    return bool(sep) and head in declared and _ROUND.fullmatch(tail) is not None


def prefix_declared(prefix: str, declared: frozenset[str]) -> bool:
    """Can a tag starting with `prefix` be declared (a declared name starts with it, or it is name-<round...>)?"""
    for name in declared:
        if name.startswith(prefix):
            return True
        if prefix.startswith(name + "-") and "-" not in prefix[len(name) + 1:]:
            return True
    return False


class Tags:
    """The tags of one scenario, refusing undeclared ones (what `Script` and `Tagged` check through)."""

    def __init__(self, scenario: str, names: Any):
        self.scenario = scenario
        self.names = frozenset(names)

    def check(self, tag: str) -> str:
        """`tag` if declared, else TagError naming it and the declared ones."""
        if not tag_declared(str(tag), self.names):
            raise TagError(f"scenario {self.scenario}: tag {tag!r} is not declared (declared: "
                           f"{', '.join(sorted(self.names))}; a concrete tag is <name> or <name>-<round>)")
        return tag

    def check_prefix(self, prefix: str) -> str:
        """`prefix` if some declared tag can start with it, else TagError."""
        if not prefix_declared(str(prefix), self.names):
            raise TagError(f"scenario {self.scenario}: no declared tag starts with {prefix!r} (declared: "
                           f"{', '.join(sorted(self.names))})")
        return prefix


_LOOKUPS = {"one": 0, "all": 0, "starting": 0}  # Tagged methods: position of the tag argument
_EMITS = {"op": 2, "again": 1}  # Script methods: position of the tag argument


def _literal_tags(fn: Callable[..., Any]) -> list[tuple[str, str, bool]]:
    """(method, literal tag or literal prefix of an f-string, is_prefix) for every tag written in `fn`'s source.

    A function whose source cannot be read (built at run time) gives nothing: the dry run and `Tagged` still check.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return []
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        pos = _LOOKUPS.get(method, _EMITS.get(method))
        if pos is None:
            continue
        arg = next((k.value for k in node.keywords if k.arg == "tag"), None)
        if arg is None and len(node.args) > pos:
            arg = node.args[pos]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append((method, arg.value, method == "starting"))
        elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            found.append((method, str(arg.values[0].value), True))
    return found


def _check_tags(sc: "Scenario") -> None:
    """Fail (TagError) when the scenario's script, final phase or checker uses an undeclared tag."""
    if not sc.tags:
        raise TagError(f"scenario {sc.name}: declares no tags (Scenario.tags: the tag names its script and checker use)")
    for name in sc.tags:
        if not name or not isinstance(name, str) or name != name.strip():
            raise TagError(f"scenario {sc.name}: bad tag name {name!r}")
    tags = Tags(sc.name, sc.tags)
    for fn in (sc.script, sc.check, sc.final):
        if fn is None:
            continue
        for method, text, is_prefix in _literal_tags(fn):
            if is_prefix:
                tags.check_prefix(text)
            else:
                tags.check(text)
    # dry run: every tag the script and final phase emit, with and without the lab's stack
    for local in (True, False):
        test = SimpleNamespace(extra={"key_nonce": "dry", "identity": {"namespace": "fencelab", "workflow": "dry"},
                                      "servers": max(2, sc.min_servers)},
                               ttl_ms=int(sc.options.get("ttl_ms", 2000)),
                               time_limit=float(sc.options.get("time_limit", 3.0)),
                               concurrency=max(int(sc.options.get("concurrency", 2)), sc.min_concurrency),
                               nemesis=list(sc.nemeses), workload=sc.workload)
        script = Script(test, local, tags)
        sc.script(script)
        if sc.final is not None:
            sc.final(script)


@dataclass(frozen=True)
class Scenario:
    """One runnable race or probe: script, faults, options and the checker of what its row requires."""

    name: str
    race: str  # the races-table row (or the matrix row of a probe), in the contract's words
    requires: str  # the required result, in the contract's words
    rules: tuple[str, ...]  # contract rules (C-numbers) the checker verifies
    setup: str  # how the script provokes the race (docs/scenarios.md)
    checks: str  # what the scenario checker verifies (docs/scenarios.md)
    script: Callable[["Script"], Any]
    check: Callable[["Tagged", Violations, Mapping[str, Any]], dict[str, Any]]
    workload: str = "lease"  # the registered workload it builds on: capabilities and the store
    options: Mapping[str, Any] = field(default_factory=dict)  # Test options (+ extra keys), as campaigns read them
    domain: tuple[str, ...] = ("fencing", "mutual-exclusion", "lease-state", "idempotency")
    nemeses: tuple[str, ...] = ()  # nemesis.registry names (they need the lab's own stack)
    client_pause: bool = False  # holds client threads at their gates (works against any system)
    pokes: bool = False  # writes into the lab's Valkey (ValkeyPoke)
    stack_only: str | None = None  # why it cannot run against an external system (None: it can)
    min_concurrency: int = 1
    min_servers: int = 1
    final: Callable[["Script"], Any] | None = None  # the final phase (e.g. read every document back)
    tags: tuple[str, ...] = ()  # the tag names its script and checker use (see the module doc); checked when built

    def __post_init__(self) -> None:
        _check_tags(self)

    @property
    def needs_store(self) -> bool:
        """Does it commit through the fenced-write boundary (and so need the store)?"""
        return self.workload == "fenced-append"


@dataclass
class ScenarioWorkload(Workload):
    """A workload whose faults and script come from a scenario: the runner calls `build_nemesis(test)`."""

    build_nemesis: Callable[[Any], tuple[Any, Any]] | None = None
    scenario: Scenario | None = None


# -- scripts ------------------------------------------------------------------------------------------


class Script:
    """What a scenario's script is written with: unique request ids, tagged ops, steps, bursts and faults."""

    def __init__(self, test: Test, local: bool, tags: Tags):
        self.test = test
        self.local = local  # the lab runs the system (its stack): stack faults and direct backend reads allowed
        self.tags = tags  # the scenario's declared tags: an op with any other tag is refused (TagError)
        self.nonce = test.extra["key_nonce"]
        self._ids = itertools.count(1)

    @property
    def ttl(self) -> int:
        """The Test's TTL in ms (what scripts use for short-lived leases)."""
        return int(self.test.ttl_ms)

    def rounds(self, seconds_per_round: float, minimum: int = 2, maximum: int = 200) -> int:
        """How many rounds of a repeated race fit in the test's time limit."""
        return max(minimum, min(maximum, int(self.test.time_limit / seconds_per_round)))

    def rid(self) -> str:
        """A fresh request id, unique to this run."""
        return f"{self.nonce}-{next(self._ids)}"

    def op(self, f: str, key: str, tag: str, **value: Any) -> dict[str, Any]:
        """A client op: mutations get a request id, a deadline, and `body` (what the idempotency digest covers)."""
        if f in MUTATIONS:
            value.setdefault("request_id", self.rid())
            value.setdefault("deadline_ms", 2000)
            value["body"] = {k: v for k, v in value.items() if k not in NOT_IN_BODY}
        return {"f": f, "key": key, "value": value, "tag": self.tags.check(tag)}

    def again(self, original: dict[str, Any], tag: str, **changes: Any) -> dict[str, Any]:
        """The same request again (same request id), with some fields changed (a changed body, a longer deadline)."""
        value = {k: v for k, v in original["value"].items() if k != "body"}
        value.update(changes)
        value["body"] = {k: v for k, v in value.items() if k not in NOT_IN_BODY}
        return {"f": original["f"], "key": original["key"], "value": value, "tag": self.tags.check(tag)}

    @staticmethod
    def on(thread: int, *items: Any) -> Any:
        """Ops (and sleeps) for one client thread, in order."""
        return gen.on_threads({thread}, list(items))

    @staticmethod
    def nem(f: str, value: Any = None) -> dict[str, Any]:
        """A nemesis op (use inside `fault`)."""
        return {"f": f, "value": value}

    @staticmethod
    def fault(*items: Any) -> Any:
        """Nemesis ops and sleeps, in order, on the nemesis thread."""
        return gen.nemesis(list(items))

    @staticmethod
    def sleep(seconds: float) -> dict[str, Any]:
        """A sleep of the thread that takes it (not recorded)."""
        return gen.sleep(seconds)

    def wait(self, seconds: float) -> Any:
        """A step that only lets time pass (on the nemesis thread, which every scenario run has)."""
        return gen.nemesis(gen.sleep(seconds))

    @staticmethod
    def steps(*parts: Any) -> Any:
        """Each part starts once every op of the previous one has completed."""
        return gen.phases(*(p for p in parts if p is not None))

    @staticmethod
    def together(*parts: Any) -> Any:
        """Parts running at the same time (a step completes when all of them have)."""
        return gen.any_of(*(p for p in parts if p is not None))

    @staticmethod
    def burst(ops_by_thread: Mapping[int, dict[str, Any]]) -> Any:
        """One op per thread, all due at the same instant: the interpreter dispatches them in one turn."""
        return gen.any_of(*(gen.on_threads({t}, o) for t, o in ops_by_thread.items()))


# -- checkers ----------------------------------------------------------------------------------------


class Tagged:
    """A history's client ops by the `tag` the script gave them, and its fault windows.

    Looking up a tag the scenario does not declare raises TagError (a typo must not read as "never ran").
    """

    def __init__(self, view: LeaseView, tags: Tags):
        self.history = view.history
        self.declared = tags
        self.pairs = view.pairs
        self.tags: dict[str, list[Pair]] = defaultdict(list)
        for p in self.pairs:
            tag = p.inv.get("tag")
            if tag is not None:
                self.tags[str(tag)].append(p)
        self.windows = view.faults.windows

    def one(self, tag: str) -> Pair | None:
        """The (first) op tagged `tag`, or None when the script never got there."""
        found = self.tags.get(self.declared.check(tag))
        return found[0] if found else None

    def all(self, tag: str) -> list[Pair]:
        """Every op tagged `tag`, in history order."""
        return list(self.tags.get(self.declared.check(tag), ()))

    def starting(self, prefix: str) -> list[tuple[str, Pair]]:
        """(tag, op) for every op whose tag starts with `prefix`, in history order."""
        self.declared.check_prefix(prefix)
        return sorted(((t, p) for t, ps in self.tags.items() if t.startswith(prefix) for p in ps),
                      key=lambda tp: tp[1].i0)

    def faults(self) -> list[str]:
        """The faults whose windows opened."""
        return [w["fault"] for w in self.windows]


def ok(p: Pair | None) -> bool:
    """Did the op complete ok?"""
    return p is not None and p.type == "ok"


def code(p: Pair | None) -> str | None:
    """The contract code of a completed op's error (None for ok or never completed)."""
    return None if p is None or p.comp is None else error_code(p.comp)


def val(p: Pair | None, name: str, default: Any = None) -> Any:
    """A field of the op's completion value, else of its invocation value."""
    if p is None:
        return default
    for v in (p.result, p.value):
        if isinstance(v, dict) and v.get(name) is not None:
            return v[name]
    return default


def describe(p: Pair | None) -> str:
    """`acquire ok` / `renew fail lease_lost` / `never ran`: for messages."""
    if p is None:
        return "never ran"
    return f"{p.f} {p.type}" + (f" {code(p)}" if code(p) else "")


def idx(*pairs: Pair | None) -> list[int]:
    """History indices of the given ops (for a violation's `ops`)."""
    return [i for p in pairs if p is not None for i in p.indices]


class ScenarioChecker(ViewCheck):
    """Runs one scenario's check over the tagged history.

    The check function adds violations and returns details; `exercised: False`
    in its details (the race was not hit) makes a violation-free result
    `valid: "unknown"` with the reason in `not_exercised`.
    """

    def __init__(self, scenario: Scenario):
        self.scenario = scenario

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge the scenario's history against what its row requires."""
        tagged = Tagged(view, Tags(self.scenario.name, self.scenario.tags))
        v = Violations()
        details = dict(self.scenario.check(tagged, v, test if isinstance(test, Mapping) else {}) or {})
        exercised = details.pop("exercised", True)
        why = details.pop("why_not", None)
        res = v.result(scenario=self.scenario.name, requires=self.scenario.requires,
                       rules=list(self.scenario.rules), tagged_ops=sum(len(x) for x in tagged.tags.values()),
                       faults=tagged.faults(), **details)
        if res["valid"] and not exercised:
            res["valid"] = "unknown"
            res["not_exercised"] = why or "the race was not hit in this run"
        unread = self._unread(tagged)
        if unread:  # the row's "never lands" part was not judged: say so, never a silent pass
            res["documents_unread"] = unread
            if res["valid"] is True:
                res["valid"] = "unknown"
                res["not_exercised"] = (f"the final read of the store failed ({unread[0]}): whether a refused "
                                        "commit landed in the document is unknown")
        return res

    def _unread(self, tagged: "Tagged") -> list[str]:
        """The scenario's final reads that did not return a document (tag: why), or all missing if none ran."""
        if self.scenario.final is None:
            return []
        reads = tagged.starting("read-")
        if not reads:
            return ["no final read ran"]
        out = []
        for tag, p in reads:
            if not ok(p):
                err = p.comp.get("error") if p.comp else None
                why = (err.get("msg") or err.get("code")) if isinstance(err, dict) else (err or p.type)
                out.append(f"{tag}: {why}")
        return out


# -- the registry glue ---------------------------------------------------------------------------------


def scenario_of(test: Test, registry: Mapping[str, Scenario]) -> Scenario:
    """The scenario a Test names (`test.scenario`), or ScenarioError listing the known ones."""
    name = test.scenario
    if name not in registry:
        raise ScenarioError(f"--scenario: unknown scenario {name!r}; known: {', '.join(registry)}")
    return registry[name]


def validate_scenario(test: Test, registry: Mapping[str, Scenario]) -> Scenario:
    """Check a Test naming a scenario before anything starts; ScenarioError says what to change."""
    sc = scenario_of(test, registry)
    target = target_of(test)
    problem = target.scenario_problem(sc.stack_only)
    if problem:
        raise ScenarioError(f"--scenario {sc.name}: {problem}")
    if test.nemesis and list(test.nemesis) != list(sc.nemeses):
        raise ScenarioError(f"--scenario {sc.name} brings its own faults ({', '.join(sc.nemeses) or 'no nemesis'}); "
                            "run it without --nemesis")
    if test.concurrency < sc.min_concurrency:
        raise ScenarioError(f"--scenario {sc.name} drives {sc.min_concurrency} client threads: --concurrency must be "
                            f">= {sc.min_concurrency}, not {test.concurrency}")
    servers = test.server_count()
    if target.lab_runs and servers < sc.min_servers:
        raise ScenarioError(f"--scenario {sc.name} needs {sc.min_servers} lease servers: --servers must be "
                            f">= {sc.min_servers}, not {servers}")
    if sc.nemeses and target.lab_runs:
        try:
            target.check_faults(list(sc.nemeses))
        except (ValueError, SutError) as e:
            raise ScenarioError(f"--scenario {sc.name}: {e}") from None
    if sc.client_pause and not target.can_take("client-pause"):  # it pauses clients: they must stop whole
        raise ScenarioError(f"--scenario {sc.name}: {target.fault_problem('client-pause')}")
    missing = sorted(needs_of(sc.workload).capabilities - sut_of(test).capabilities)
    if missing:
        raise ScenarioError(f"--scenario {sc.name} needs {', '.join(missing)}, which SUT {sut_of(test).name!r} "
                            "does not have")
    return sc


def apply_scenario(test: Test, registry: Mapping[str, Scenario], given: frozenset[str] | set[str] = frozenset()) -> Test:
    """A new Test: this one with its scenario's options (`fencelab test --scenario`); options the user gave win."""
    sc = scenario_of(test, registry)
    if "workload" in given and test.workload != sc.workload:
        raise ScenarioError(f"--scenario {sc.name} runs on the {sc.workload!r} workload; drop --workload")
    changes: dict[str, Any] = {"workload": sc.workload, "extra": dict(test.extra)}
    if "name" not in given:
        changes["name"] = f"scenario-{sc.name}"
    for key, value in sc.options.items():
        if key in given:
            continue
        if key in TEST_OPTIONS:
            changes[key] = value
        else:
            changes["extra"].setdefault(key, value)
    return test.evolve(**changes)


def scenario_workload(test: Test, registry: Mapping[str, Scenario]) -> tuple[Test, ScenarioWorkload]:
    """The spec a scenario run goes on (a new one: the scenario's workload, faults and run-unique identity) and the
    workload it executes: its client, script, faults, final phase and checkers."""
    sc = scenario_of(test, registry)
    # run-unique identities, request ids and instances (external systems persist): the run's salt, if it has one
    extra = dict(test.extra)
    extra.setdefault("key_nonce", test.run_salt or secrets.token_hex(3))
    extra.setdefault("identity", {"namespace": "fencelab", "workflow": f"s-{extra['key_nonce']}"})
    local = target_of(test).lab_runs
    new = test.evolve(workload=sc.workload, extra=extra, nemesis=list(sc.nemeses) if local else list(test.nemesis))
    test = new.sealed() if test.is_sealed else new  # a resolved spec stays sealed
    shared = Shared(test.extra["identity"])
    script = Script(test, local, Tags(sc.name, sc.tags))
    body = sc.script(script)
    final = sc.final(script) if sc.final is not None else None
    checkers = {f"scenario:{sc.name}": ScenarioChecker(sc), **{n: get_checker(n) for n in sc.domain}}

    def faults_and_script(t: Any) -> tuple[Any, Any]:
        """The run's composed nemesis (built once the stack is up) and the script to run beside it."""
        return build_nemesis(t, sc, shared.identity_for), body

    wl = ScenarioWorkload(name=f"scenario:{sc.name}",
                          client=ScenarioDriver(shared, needs_of(sc.workload), needs_store=sc.needs_store),
                          generator=None, checker=ScenarioCompose(checkers, f"scenario:{sc.name}"), final_generator=final,
                          needs_store=sc.needs_store, doc=sc.setup, build_nemesis=faults_and_script, scenario=sc)
    return test, wl


class ScenarioCompose(Compose):
    """The scenario's checker and the domain checkers that apply; the run's verdict is its row's.

    A domain checker that had nothing to compare in a short scripted run (one acquisition per key, no retry)
    says "unknown" in its own result, and that does not make the row's verdict unknown: the row was judged by
    the scenario's checker. Any violation still makes the run invalid; a checker that failed (an error) and a
    row that was not hit still make it unknown.
    """

    def __init__(self, checkers: Mapping[str, Any], row: str):
        super().__init__(checkers)
        self.row = row

    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        out = super().check(test, history, opts)
        results = out["results"]
        if out["valid"] != "unknown" or out.get("reason") or results.get(self.row, {}).get("valid") is not True:
            return out
        idle = [n for n, r in results.items() if n != self.row and r.get("valid") == "unknown"]
        if all(r.get("valid") is True or (n in idle and "error" not in r) for n, r in results.items()):
            out["valid"] = True
            out["nothing_to_compare"] = idle  # their own results say why; the row's verdict stands
        return out
