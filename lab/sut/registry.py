"""The registry of systems under test: a name -> a factory `(test, node, service_instance_id) -> LeaseSystem`.

Built in: `reference` (our server, `LeaseClient`) and `starintel` (the
StarIntel dialect, `StarIntelClient`). A third-party package registers its
own with an entry point in the `fencelab.suts` group

    [project.entry-points."fencelab.suts"]
    mysystem = "mypkg.sut:MyLeaseSystem"

or at import time with `register_sut("mysystem", MyLeaseSystem)`; a name of
the form `module.path:Factory` is imported directly (a system in a loose
file on `sys.path`, no packaging needed). `test.sut` names the
system a run uses (default `reference`).

A factory declares the optional abilities it has (`capabilities`, a subset
of `commit`, `force_release`, `revoke`) as an attribute or at registration;
a workload that needs one the system lacks refuses before anything starts.
The SUT layer never imports the workloads: each workload declares its
`WorkloadNeeds` (`workloads.needs_of(name)`), and the runner passes them in
(`validate_test(test, needs)`, `open_system(..., needs=...)`).
Systems from outside the lab are wrapped so that every result is checked
(`check_result`): a malformed one is an error naming the method; a factory
or check that raises is `PluginError`, one line naming the plug-in.
A system also declares how its commits are fenced (`fencing`: server, store,
none); the rules each style does not claim are one table, `FENCING_STYLES`,
merged into the entry's `not_claimed`. And whether its client runs anything
on its own between calls (`background`), and how that is stopped (`freeze` /
`thaw` on the system): client-pause is refused for a system that declares
neither `background = False` nor the hooks (`freeze_problem`).
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from checkers.core import Compose, merge_valid
from lab.client import LeaseClient
from lab.client.starintel import StarIntelClient, check_api_key, new_findings_log
from lab.findings import FINDINGS_FILE
from lab.sut.principal import pick_credential
from lab.sut.protocol import OPTIONAL_CAPABILITIES, SutError, check_capabilities, check_result, check_system
from lab.testmap import Test

ENTRY_POINT_GROUP = "fencelab.suts"
DEFAULT_SUT = "reference"
API_KEY_ENV = "FENCELAB_API_KEY"
_CHECKED_OPS = frozenset({"acquire", "renew", "release", "inspect", "commit", "force_release", "revoke"})

# -- fencing styles: how a system's commits are fenced, and the rules that do not hold for that style -----------
_STORE_FENCE = ("the store checks a write's token only against the highest it has already accepted (Kleppmann's "
                "fencing, C26/C27); it knows nothing of leases, so an old holder's write that lands before its "
                "successor's first write is accepted by design")
_NO_TOKEN = "the system hands out no fencing token: there is no token order to judge"
#: `fencing=` of a system -> the checkers (`name`) and rules (`checker.kind`) it does not claim, with why.
#: server: the lease service validates each commit at the commit point (C24-C29: this exact lease, unexpired, then a
#:   conditional write), so every rule holds (the reference server; etcd, whose fenced commit asks etcd first).
#: store: only a token the store checks fences a write (C26/C27 without C25): a write is refused only below the
#:   highest token accepted, so the rules that need the store to know of leases do not hold.
#: none: no token at all; what a write did is judged without tokens (stale-write).
FENCING_STYLES: dict[str, dict[str, str]] = {
    "server": {},
    "store": {"stale-commit.commit-after-successor": _STORE_FENCE, "stale-commit.commit-after-release": _STORE_FENCE},
    "none": {"fencing": _NO_TOKEN, "stale-commit.commit-after-successor": _NO_TOKEN,
             "stale-commit.commit-after-release": _NO_TOKEN},
}
DEFAULT_FENCING = "server"  # a system that declares nothing is held to every rule


@dataclass(frozen=True)
class WorkloadNeeds:
    """What a workload needs from the system under test (each workload module declares its `NEEDS`)."""

    workload: str
    capabilities: frozenset[str] = frozenset()  # optional abilities beyond the core operations (e.g. commit)
    lab_only: bool = False  # it tests the lab's own stack (Valkey itself), not a lease system: reference only
    store: bool = False  # it commits into, and reads back from, a CouchDB-API document store


@dataclass(frozen=True)
class SutEntry:
    """One registered system under test."""

    name: str
    factory: Callable[..., Any]
    capabilities: frozenset[str]
    doc: str = ""
    check: Callable[[Any], None] | None = None  # validates a Test before anything starts (keys, URLs)
    trusted: bool = False  # built-ins are not wrapped in result checks
    accepts_timeout: bool = False  # the factory takes a `timeout_s` keyword
    # the processes the lab runs for this system (`lab.sut.processes`): test -> SystemProcesses; None: it runs
    # elsewhere (behind --url, or in-process)
    processes: Callable[[Any], Any] | None = None
    # contract features the system does not claim: checker name -> why (the lab neither runs nor judges them)
    not_claimed: Mapping[str, str] = field(default_factory=dict)
    # how its commits are fenced (FENCING_STYLES): what that style does not claim is merged into not_claimed
    fencing: str = DEFAULT_FENCING
    # does its client run anything on its own between calls (threads, keep-alive pings, a lock watchdog)?
    # None: not declared (the lab cannot see a plug-in's threads, so client-pause is refused; `freeze_problem`)
    background: bool | None = None
    freezes: bool = False  # its system has `freeze()` / `thaw()`: client-pause stops and restarts that activity

    @property
    def where(self) -> str:
        """How error messages name this system."""
        qual = getattr(self.factory, "__qualname__", type(self.factory).__name__)
        return f"SUT {self.name!r} ({getattr(self.factory, '__module__', '?')}.{qual})"


class PluginError(SutError):
    """A registered system's own code (its factory, its check) raised: the message names the plug-in and the
    exception, in one line (docs/plugging-in-a-system.md#when-a-plug-in-raises)."""


def plugin_call(entry: SutEntry, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """`fn(*args, **kw)`, a plug-in's own code: any exception but SutError (already one line) becomes PluginError.
    A built-in's exception is the lab's own bug and keeps its traceback."""
    if entry.trusted:
        return fn(*args, **kw)
    try:
        return fn(*args, **kw)
    except SutError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a plug-in raises is reported as one line naming it
        raise PluginError(f"{entry.where}: {type(e).__name__}: {e}") from e


def check_sut(entry: SutEntry, test: Test) -> None:
    """The system's own check of a test's options, before anything starts (a plug-in that raises: PluginError)."""
    if entry.check is not None:
        plugin_call(entry, entry.check, test)


_REGISTRY: dict[str, SutEntry] = {}
_BY_SPEC: dict[str, SutEntry] = {}  # systems named as module.path:Factory, imported once


def register_sut(name: str, factory: Callable[..., Any], *, capabilities: Any = None, doc: str | None = None,
                 check: Callable[[Any], None] | None = None, replace: bool = False,
                 processes: Callable[[Any], Any] | None = None, not_claimed: Mapping[str, str] | None = None,
                 fencing: str | None = None, background: bool | None = None,
                 _trusted: bool = False) -> SutEntry:
    """Register `factory(test, node, service_instance_id) -> LeaseSystem` as system `name`.

    `capabilities` defaults to the factory's `capabilities` attribute (none
    when absent: a system claims only what it declares). `processes(test) ->
    lab.sut.processes.SystemProcesses` makes the lab run the system's own
    processes (docs/plugging-in-a-system.md); `not_claimed` maps checker
    names to why the system does not claim what they judge, beyond what its
    `fencing` style (FENCING_STYLES: server, store, none; default server)
    already does not claim. `background` (default: the factory's attribute of
    that name, else undeclared) says whether its client runs anything on its
    own between calls; `freeze` / `thaw` methods on the factory (a class)
    say how that is stopped under client-pause (docs/plugging-in-a-system.md).
    """
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise SutError(f"a SUT name is a non-empty word without ':' or surrounding spaces, not {name!r}")
    if name in _REGISTRY and not replace:
        raise SutError(f"SUT {name!r} is already registered (by {_REGISTRY[name].where}); pass replace=True "
                       "to replace it")
    entry = _make_entry(name, factory, capabilities, doc, check, _trusted, processes, not_claimed, fencing,
                        background)
    _REGISTRY[name] = entry
    return entry


def _make_entry(name: str, factory: Callable[..., Any], capabilities: Any = None, doc: str | None = None,
                check: Callable[[Any], None] | None = None, trusted: bool = False,
                processes: Callable[[Any], Any] | None = None,
                not_claimed: Mapping[str, str] | None = None, fencing: str | None = None,
                background: bool | None = None) -> SutEntry:
    """A validated registry entry (capabilities, processes, not_claimed and fencing default to the factory's
    attributes of those names, else none (fencing: server): a system claims only what it declares)."""
    if not callable(factory):
        raise SutError(f"SUT {name!r}: the factory must be callable as factory(test, node, service_instance_id), "
                       f"not {factory!r}")
    if capabilities is None:
        capabilities = getattr(factory, "capabilities", ())
    if processes is None:
        processes = getattr(factory, "processes", None)
    if processes is not None and not callable(processes):
        raise SutError(f"SUT {name!r}: processes must be a function test -> SystemProcesses, not {processes!r}")
    if not_claimed is None:
        not_claimed = getattr(factory, "not_claimed", None) or {}
    if not isinstance(not_claimed, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                       for k, v in not_claimed.items()):
        raise SutError(f"SUT {name!r}: not_claimed maps checker names to a reason each, not {not_claimed!r}")
    if fencing is None:
        fencing = getattr(factory, "fencing", None) or DEFAULT_FENCING
    if not isinstance(fencing, str) or fencing not in FENCING_STYLES:
        raise SutError(f"SUT {name!r}: fencing must be one of {', '.join(FENCING_STYLES)} (how its commits are "
                       f"fenced, docs/plugging-in-a-system.md#fencing-style), not {fencing!r}")
    if background is None:
        background = getattr(factory, "background", None)
    if background is not None and not isinstance(background, bool):
        raise SutError(f"SUT {name!r}: background must be True or False (does its client run anything on its own "
                       f"between calls: threads, keep-alive pings, a watchdog?), not {background!r}")
    hooks = [h for h in ("freeze", "thaw") if callable(getattr(factory, h, None))]
    if len(hooks) == 1:
        raise SutError(f"SUT {name!r}: freeze and thaw go together (it has only {hooks[0]}): client-pause stops the "
                       "client's background activity with one and restarts it with the other")
    return SutEntry(name=name, factory=factory, capabilities=check_capabilities(capabilities, f"SUT {name!r}"),
                    doc=doc if doc is not None else (inspect.getdoc(factory) or "").split("\n", 1)[0],
                    check=check, trusted=trusted, accepts_timeout=_accepts(factory, "timeout_s"),
                    processes=processes, not_claimed={**FENCING_STYLES[fencing], **not_claimed}, fencing=fencing,
                    background=background, freezes=bool(hooks))


def unregister_sut(name: str) -> None:
    """Forget a registered system (tests use it to clean up)."""
    _REGISTRY.pop(name, None)
    _BY_SPEC.pop(name, None)


def sut_names() -> list[str]:
    """Registered names plus the names installed packages offer through the entry point group."""
    return sorted(set(_REGISTRY) | {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def client_clock_problem(test: Test) -> str | None:
    """Why the test's system has no client clock the client-clock nemesis could set (None: it has one).

    The lab's own client (`reference`, `starintel`) has one; another system's LeaseSystem class declares a
    `clock_ms` attribute to say it has (docs/plugging-in-a-system.md)."""
    entry = get_sut(test.sut or DEFAULT_SUT)
    if entry.name in ("reference", "starintel") or hasattr(entry.factory, "clock_ms"):
        return None
    urls = list(test.urls)
    system = f"the external system {', '.join(urls)}" if urls else f"the in-process SUT {test.sut!r}"
    return (f"{system} ({entry.name}) has no settable client clock: its LeaseSystem class declares no "
            "`clock_ms` attribute (docs/plugging-in-a-system.md)")


def freeze_problem(entry: SutEntry) -> str | None:
    """Why client-pause cannot stop this system's client (None: it can): it declares neither that its client runs
    nothing on its own between calls (`background = False`) nor how that is frozen (`freeze` / `thaw`)."""
    if entry.background is False or entry.freezes:
        return None
    said = ("declares background activity (background = True)" if entry.background else
            "does not say whether its client runs anything on its own between calls (no `background`)")
    return (f"{entry.where} {said} and has no freeze()/thaw() to stop it, so a paused worker's session could stay "
            "alive; give its LeaseSystem class freeze()/thaw(), or declare `background = False` if its client runs "
            "nothing between calls (docs/plugging-in-a-system.md#background-activity)")


def get_sut(name: str) -> SutEntry:
    """The system registered (or installed, or importable as `module:Factory`) under `name`."""
    if not isinstance(name, str) or not name:
        raise SutError(f"a SUT is named by a non-empty string, not {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BY_SPEC:
        return _BY_SPEC[name]
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                factory = ep.load()
            except Exception as e:  # noqa: BLE001 - any import failure becomes one clear message
                raise SutError(f"SUT {name!r}: cannot load entry point {ep.value!r} ({ENTRY_POINT_GROUP}): "
                               f"{type(e).__name__}: {e}") from None
            return register_sut(name, factory)
    if ":" in name:
        _BY_SPEC[name] = _make_entry(name, _import_factory(name))
        return _BY_SPEC[name]
    raise SutError(f"unknown SUT {name!r}; known: {', '.join(sut_names())} "
                   f"(or name a factory as module.path:Factory)")


def require_capabilities(entry: SutEntry, needs: WorkloadNeeds, test: Test | None = None) -> None:
    """Refuse a workload that needs an ability the system lacks, saying what to do instead; and, given the `test`,
    an option about an ability the workload never uses (`--commit-mode` where nothing commits)."""
    workload = needs.workload
    if test is not None and test.commit_mode is not None and "commit" not in needs.capabilities:
        raise SutError(f"--commit-mode says how a system's commits reach the store; workload {workload!r} makes no "
                       "commits: drop --commit-mode, or run a workload that commits (fenced-append)")
    if needs.lab_only and entry.name != DEFAULT_SUT:
        raise SutError(f"workload {workload!r} tests the lab's own Valkey, not a lease system: it runs only with "
                       f"SUT {DEFAULT_SUT!r}; use a lease-API workload (lease, idempotency) with SUT {entry.name!r}")
    missing = sorted(needs.capabilities - entry.capabilities)
    if missing:
        able = [n for n in sut_names() if n in _REGISTRY and not set(missing) - _REGISTRY[n].capabilities]
        raise SutError(f"workload {workload!r} needs {', '.join(missing)}, which SUT {entry.name!r} does not "
                       f"have (its capabilities: {', '.join(sorted(entry.capabilities)) or 'none'}); run a "
                       f"workload without it (e.g. lease, idempotency) or a SUT that has it "
                       f"({', '.join(able) or 'none registered'})")


def sut_of(test: Test) -> SutEntry:
    """The system a test runs against: `test.sut`, default `reference`."""
    return get_sut(test.sut or DEFAULT_SUT)


def open_system(test: Test, node: Any, service_instance_id: str, *, needs: WorkloadNeeds,
                timeout_s: float | None = None) -> Any:
    """A fresh system for one worker: the test's SUT factory called as (test, node, service_instance_id).

    `needs`: what the caller (a workload, a scenario, a probe) will ask of it; a system lacking one is refused.
    """
    entry = sut_of(test)
    require_capabilities(entry, needs)
    kwargs = {"timeout_s": timeout_s} if timeout_s is not None and entry.accepts_timeout else {}
    try:
        system = plugin_call(entry, entry.factory, test, node, service_instance_id, **kwargs)
    except PluginError as e:  # the run notes it (a worker's failed open is an op that failed; the run is marked)
        test.live.plugin_errors.append(str(e))
        raise
    if inspect.isawaitable(system):
        if hasattr(system, "close"):
            system.close()  # never awaited: close it so Python does not warn
        raise SutError(f"{entry.where}: the factory returned an awaitable; it must return the system itself "
                       "(do async setup lazily, in the first call)")
    check_system(system, entry.capabilities, entry.where)
    return system if entry.trusted else CheckedSystem(system, entry.where)


class CheckedSystem:
    """A third-party system whose every result is checked (`check_result`); attributes pass through."""

    __slots__ = ("_system", "_where")

    def __init__(self, system: Any, where: str):
        object.__setattr__(self, "_system", system)
        object.__setattr__(self, "_where", where)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._system, name)
        if name not in _CHECKED_OPS or not callable(attr):
            return attr

        async def checked(*args: Any, **kw: Any) -> Any:
            return check_result(name, await attr(*args, **kw), self._where)

        return checked

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._system, name, value)  # e.g. clock_ms, set by the client-clock nemesis

    def __repr__(self) -> str:
        return f"CheckedSystem({self._system!r})"


# -- credentials and findings for the built-in HTTP systems --------------------------------------------------

def api_key_for(test: Test, capability: str = "targets:lease") -> str:
    """The run's API key: `test.api_key_file`, else the stack's credentials, else $FENCELAB_API_KEY."""
    if test.live.sut_api_key is not None:
        return test.live.sut_api_key
    path = test.api_key_file
    if path:
        try:
            key = Path(path).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SutError(f"--api-key-file {path}: cannot read it ({e.strerror or e})") from None
        if key.startswith(("[", "{")):  # a stack's credentials.json (every principal): one key is wanted
            raise SutError(f"--api-key-file {path}: this is a list of credentials, not one key; write one key "
                           "with `fencelab api-key --name STACK` (docs/cli.md#api-keys)")
        if not key or "\n" in key:
            raise SutError(f"--api-key-file {path}: it must hold exactly one API key on one line")
    elif test.live.credentials_file:
        try:
            key = pick_credential(test.credentials(), capability)["api_key"]
        except (ValueError, KeyError, OSError) as e:
            raise SutError(f"no usable API key in {test.live.credentials_file}: {e}") from None
    elif os.environ.get(API_KEY_ENV):
        key = os.environ[API_KEY_ENV].strip()
    else:
        raise SutError("no API key for the system under test: pass --api-key-file FILE (one key on one line) "
                       f"or set {API_KEY_ENV}")
    test.live.sut_api_key = key
    return key


def findings_for(test: Test):
    """The run's StarIntel findings log (one per test, written to <run_dir>/findings.jsonl when there is one)."""
    log = test.live.sut_findings
    if log is None:
        run_dir = test.run_dir
        log = test.live.sut_findings = new_findings_log(Path(run_dir) / FINDINGS_FILE if run_dir else None)
    return log


def _check_urls(test: Test) -> None:
    """Every node a run's clients talk to is an http(s) URL."""
    for url in list(test.live.nodes) + list(test.live.lease_servers):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SutError(f"--url must be an http(s) URL, not {url!r}")


def _check_reference(test: Test) -> None:
    """An external reference server needs URLs and a key (a local stack provides both later)."""
    _check_urls(test)
    if test.live.lease_servers and not test.live.credentials_file:
        api_key_for(test)


def _check_starintel(test: Test) -> None:
    """A StarIntel server needs http(s) URLs and a well-formed `star_sk_v1_...` key."""
    if not (test.urls or test.live.lease_servers):
        raise SutError("--sut starintel needs --url: it is a client of a StarIntel service, which the lab does not run")
    _check_urls(test)
    try:
        check_api_key(api_key_for(test))
    except ValueError as e:
        raise SutError(str(e)) from None


def reference_system(test: Test, node: str, service_instance_id: str, *, timeout_s: float = 5.0):
    """Our reference lease server (LeaseClient, the contract's wire API)."""
    return LeaseClient(node, api_key_for(test), service_instance_id=service_instance_id, timeout_s=timeout_s)


def starintel_system(test: Test, node: str, service_instance_id: str, *, timeout_s: float = 5.0):
    """The StarIntel server's dialect (StarIntelClient); differences from the contract become findings."""
    return StarIntelClient(node, api_key_for(test), service_instance_id=service_instance_id, timeout_s=timeout_s,
                           findings=findings_for(test))


def _accepts(factory: Callable[..., Any], keyword: str) -> bool:
    """Does the factory take this keyword argument?"""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _import_factory(spec: str) -> Callable[..., Any]:
    """The object named by `module.path:Attribute`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SutError(f"a SUT given as a factory is written module.path:Factory, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure becomes one clear message
        raise SutError(f"SUT {spec!r}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SutError(f"SUT {spec!r}: module {module_name!r} has no {attr!r}") from None
    return obj


# background=False: LeaseClient and StarIntelClient are httpx clients that send only when called
register_sut("reference", reference_system, capabilities=OPTIONAL_CAPABILITIES, check=_check_reference,
             background=False, _trusted=True)
register_sut("starintel", starintel_system, capabilities={"revoke"}, check=_check_starintel, background=False,
             _trusted=True)


# -- what a system does not claim ---------------------------------------------------------------------------
class NotClaimed:
    """A workload's checker without the checkers judging what the system does not claim; the result says which."""

    def __init__(self, checker: Any, not_claimed: Mapping[str, str]):
        self.checker = checker
        self.not_claimed = dict(not_claimed)

    def check(self, test: Test, history: list, opts: Any) -> dict:
        res = self.checker.check(test, history, opts)
        if isinstance(res, dict):
            _drop_rules(res, {n: why for n, why in self.not_claimed.items() if "." in n})
            res["not_claimed"] = dict(self.not_claimed)
        return res


def _drop_rules(res: dict, rules: Mapping[str, str]) -> None:
    """Remove the violations of unclaimed rules (`checker.kind`) from a composed result; re-merge the verdicts.

    A checker whose only violations were of such kinds is then valid (it judged the rest and found nothing)."""
    results = res.get("results")
    if not rules or not isinstance(results, dict):
        return
    changed = False
    for name in {n.split(".", 1)[0] for n in rules}:
        r = results.get(name)
        kinds = {n.split(".", 1)[1] for n in rules if n.split(".", 1)[0] == name}
        if not isinstance(r, dict) or not isinstance(r.get("violation_counts"), dict):
            continue
        dropped = {k: c for k, c in r["violation_counts"].items() if k in kinds}
        if not dropped:
            continue
        r["violation_counts"] = {k: c for k, c in r["violation_counts"].items() if k not in kinds}
        r["violations"] = [v for v in r.get("violations") or [] if v.get("type") not in kinds]
        r["violation_count"] = sum(r["violation_counts"].values())
        r["not_claimed_violations"] = dropped
        if r.get("valid") is False and not r["violation_count"]:
            r["valid"], changed = True, True
    if changed and res.get("valid") is False:
        res["valid"] = merge_valid(r.get("valid") for r in results.values() if isinstance(r, dict))


def claimed_checker(test: Test, checker: Any) -> Any:
    """`checker` minus the named checkers the test's system does not claim (its SutEntry.not_claimed): those
    properties are neither run nor judged, and the result lists them under `not_claimed` with the reason."""
    try:
        entry = sut_of(test)
    except SutError:
        return checker
    if not entry.not_claimed or not isinstance(checker, Compose):
        return checker
    dropped = {n: why for n, why in entry.not_claimed.items() if n in checker.checkers}
    # `checker.kind`: one rule of a checker the system does not claim (its violations are dropped, the rest judged)
    rules = {n: why for n, why in entry.not_claimed.items() if "." in n and n.split(".", 1)[0] in checker.checkers}
    kept = {n: c for n, c in checker.checkers.items() if n not in dropped}
    if not (dropped or rules) or not kept:
        return checker
    return NotClaimed(Compose(kept), {**dropped, **rules})


def claims(test: Test, checker: str) -> bool:
    """Does the test's system claim what checker `checker` judges? False when it declares it not claimed
    (`SutEntry.not_claimed`): a workload then need not exercise it (e.g. no same-request-id retries for a
    system that never sees a request id)."""
    try:
        return checker not in sut_of(test).not_claimed
    except SutError:
        return True
