"""Campaign specs: a TOML (or YAML) file naming axes, validated eagerly and expanded into a plan of runs.

A spec names the campaign, the `[defaults]` every run starts from (any Test
option), and the axes whose product is the plan:

    workloads x nemeses x scenarios x implementations x seeds x repetitions

Every problem is found before anything runs and reported as one line that
names the key and says what to change (Hypothesis' `InvalidDefinition`
style). Each combination becomes a `PlannedRun`, whose `Test` is checked by
`lab.runner.validate`, so one bad combination fails the whole campaign before
its first run. See docs/campaigns.md for the format.
"""

from __future__ import annotations

import difflib
import importlib
import itertools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lab.runner import RunError, validate
from lab.sut.target import BACKENDS
from lab.testmap import (DEFAULT_SERVERS, OPTIONS, RUN_KEYS, SUT_OPTS, OptionError, Test, check_options,
                         merge_options as _merge_options, sut_option_problem)
from nemesis.registry import known_names, validate_names
from workloads import WORKLOADS, needs_of

__all__ = ["CampaignError", "Implementation", "PlannedRun", "Scenario", "Spec", "check_dask_address", "expand",
           "load_spec", "parse_spec", "validate_plan"]

MAX_RUNS = 10_000
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RESERVED_NAMES = {"campaigns", "latest"}
TOP_KEYS = ("name", "description", "defaults", "workloads", "nemeses", "scenarios", "implementations", "seeds",
            "repetitions", "exclude", "run")
RUN_KEYS = ("dask",)  # [run]: where the cells run (not what they are: the plan does not change)
DASK_ADDRESS = re.compile(r"^(?:(tcp|tls)://)?(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
EXCLUDE_KEYS = ("workload", "nemesis", "scenario", "implementation", "why")
# the axes own these Test fields: setting them in [defaults] or a scenario is a mistake the error explains
AXIS_FIELDS = {"workload": "workloads", "nemesis": "nemeses", "seed": "seeds", "name": "name"}
REFERENCE = "reference"
IMPL_KEYS = ("name", "sut", "url", "api_key_file", "commit_mode", "backend", "hosts", "swarm", "sut_options")


class CampaignError(ValueError):
    """A campaign cannot run as specified; the one-line message names the key and what to change."""


# -- option values ----------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _unknown_key(where: str, key: str, known: list[str] | tuple[str, ...], what: str = "keys") -> CampaignError:
    """An 'unknown key' error with the closest known key suggested."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return CampaignError(f"{where}: unknown key {key!r}{hint}; known {what}: {', '.join(known)}")


def _check_options(where: str, table: Any, allowed_extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """A table of Test option overrides, each key known and of the right type (lab.testmap's one schema)."""
    if not isinstance(table, Mapping):
        raise CampaignError(f"{where} must be a table of Test options, not {table!r}")
    for key in table:
        if key in AXIS_FIELDS and key not in allowed_extra:
            raise CampaignError(f"{where}: {key!r} is an axis of the campaign, not an option: "
                                f"list its values in the top-level {AXIS_FIELDS[key]!r} instead")
    opts = {k: v for k, v in table.items() if k not in allowed_extra}
    try:
        return check_options(opts)
    except OptionError as e:
        msg = str(e)
        if msg.startswith("unknown key") and allowed_extra:  # the keys a scenario table takes besides options
            msg = msg.replace("; known Test options: ", f"; known Test options: {', '.join(allowed_extra)}, ")
        raise CampaignError(f"{where}: {msg}") from None


# -- axes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A named bundle of Test option overrides (optionally a named scenario of `lab.scenarios`)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    scenario: str | None = None  # a key of lab.scenarios.SCENARIOS
    description: str = ""


@dataclass(frozen=True)
class Implementation:
    """The system under test: the lab's reference servers, or a `lab.sut` system (`Test.sut`)."""

    name: str
    sut: str = REFERENCE
    url: str | None = None  # -> Test.urls (the runner's external servers)
    api_key_file: str | None = None  # -> Test.api_key_file
    commit_mode: str | None = None  # -> Test.commit_mode (fenced / unfenced: docs/third-party.md)
    backend: str | None = None  # -> Test.backend: local processes, Docker Compose (docs/compose.md) or SSH nodes
    hosts: str | None = None  # -> Test.hosts_file: the SSH nodes of backend "ssh" (docs/ssh-backend.md)
    swarm: str | None = None  # -> Test.swarm: the Swarm manager's engine of backend "swarm"
    # -> Test.extra: per-system options (`--sut-opt KEY=VALUE`), as sorted (key, value) pairs (a frozen value)
    sut_options: tuple[tuple[str, Any], ...] = ()

    def options(self) -> dict[str, Any]:
        """The Test fields this implementation sets (none for the reference servers on the local backend)."""
        out = {"sut": self.sut if self.sut != REFERENCE else None, "urls": [self.url] if self.url else None,
               "api_key_file": self.api_key_file, "commit_mode": self.commit_mode, "backend": self.backend,
               "hosts_file": self.hosts, "swarm": self.swarm,
               "extra": {**dict(self.sut_options), SUT_OPTS: [k for k, _ in self.sut_options]} if self.sut_options
               else None}
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class Spec:
    """A validated campaign spec."""

    name: str
    source: str
    description: str
    defaults: dict[str, Any]
    workloads: list[str]
    nemeses: dict[str, list[str]]  # column label -> nemesis names ([] for "none")
    scenarios: list[Scenario]
    implementations: list[Implementation]
    seeds: list[int]
    repetitions: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    # combinations left out of the plan (a nemesis a system cannot take): {axis: value, ..., "why": reason}
    exclude: list[dict[str, str]] = field(default_factory=list)
    dask: str | None = None  # [run] dask: the scheduler the cells run on (`--dask` overrides it)


def check_dask_address(address: Any, where: str = "--dask") -> str:
    """A Dask scheduler address, `tcp://host:port` (a bare `host:port` means tcp), or a one-line CampaignError."""
    m = DASK_ADDRESS.match(address.strip()) if isinstance(address, str) else None
    if not m or not 0 < int(m.group(3)) < 65536:
        raise CampaignError(f"{where}: {address!r} is not a Dask scheduler address such as tcp://10.0.0.5:8786")
    return f"{m.group(1) or 'tcp'}://{m.group(2)}:{m.group(3)}"


def _run_table(where: str, value: Any) -> str | None:
    """`[run] dask = "tcp://host:8786"`: the Dask scheduler of docs/beyond-one-machine.md, or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise CampaignError(f"{where} must be a table such as [run] dask = \"tcp://10.0.0.5:8786\", not {value!r}")
    for key in value:
        if key not in RUN_KEYS:
            raise _unknown_key(where, key, RUN_KEYS, "[run] keys")
    return None if value.get("dask") is None else check_dask_address(value["dask"], f"{where}.dask")


def _check_name(where: str, value: Any, what: str) -> str:
    """A name usable as a directory and in a run id."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise CampaignError(f"{where}: {what} must be a non-empty string of letters, digits, '.', '_' or '-' "
                            f"(starting with a letter or digit), not {value!r}")
    return value


def _check_list(where: str, value: Any, what: str) -> list:
    """A non-empty list (a single string is accepted as a list of one)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise CampaignError(f"{where} must be a non-empty list of {what}, not {value!r}")
    return value


def _workloads(where: str, value: Any) -> list[str]:
    """Known workload names, each once."""
    names = _check_list(where, value, "workload names")
    for i, n in enumerate(names):
        if n not in WORKLOADS:
            raise CampaignError(f"{where}[{i}]: unknown workload {n!r}; "
                                f"known workloads: {', '.join(sorted(WORKLOADS))}")
    _no_repeats(where, names)
    return names


def _no_repeats(where: str, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CampaignError(f"{where}: {', '.join(map(str, repeated))} given more than once; list each once")


def _nemeses(where: str, value: Any) -> dict[str, list[str]]:
    """Column label -> validated nemesis names; "none" is the column without faults."""
    out: dict[str, list[str]] = {}
    for i, item in enumerate(_check_list(where, value, 'nemesis names, name lists or "none"')):
        here = f"{where}[{i}]"
        if item == "none" or item == ["none"]:
            names: list[str] = []
        else:
            if isinstance(item, list) and "none" in item:
                raise CampaignError(f'{here}: "none" cannot be combined with other nemeses; give it on its own')
            names_list = isinstance(item, list) and item and all(isinstance(x, str) for x in item)
            if not (isinstance(item, str) or names_list):
                raise CampaignError(f'{here} must be a nemesis name, a list of names or "none", not {item!r}; '
                                    f"known: none, {', '.join(known_names())}")
            try:
                names = validate_names(item)
            except ValueError as e:
                msg = str(e).removeprefix("--nemesis: ").removeprefix("--nemesis ")
                raise CampaignError(f"{here}: {msg}") from None
        label = "+".join(names) or "none"
        if label in out:
            raise CampaignError(f"{here}: nemesis {label!r} given more than once; list each once")
        out[label] = names
    return out


def _named_scenarios() -> Mapping[str, Any] | None:
    """`lab.scenarios.SCENARIOS` when that module exists, else None."""
    try:
        mod = importlib.import_module("lab.scenarios")
    except ModuleNotFoundError as e:
        if e.name in ("lab.scenarios",):
            return None
        raise CampaignError(f"cannot load lab.scenarios: {e}") from None
    except Exception as e:  # noqa: BLE001 - a broken module must be a one-line error, not a traceback
        raise CampaignError(f"cannot load lab.scenarios: {type(e).__name__}: {e}") from None
    found = getattr(mod, "SCENARIOS", None)
    return found if isinstance(found, Mapping) else None


def _scenario_options(obj: Any) -> Mapping[str, Any]:
    """The Test option overrides a named scenario carries (a mapping, or its `options` / `overrides`)."""
    if isinstance(obj, Mapping):
        return obj
    for attr in ("options", "overrides", "test_options"):
        found = getattr(obj, attr, None)
        if isinstance(found, Mapping):
            return found
    return {}


def _scenarios(source: str, value: Any) -> list[Scenario]:
    """Named option bundles; `scenario = "<name>"` refers to lab.scenarios.SCENARIOS."""
    where = f"{source}: scenarios"
    if value is None:
        return [Scenario("default")]
    if not isinstance(value, Mapping) or not value:
        raise CampaignError(f"{where} must be a table of named scenarios, e.g. [scenarios.short-ttl] ttl_ms = 300, "
                            f"not {value!r}")
    out = []
    for name, table in value.items():
        _check_name(f"{where}.{name}", name, "a scenario name")
        here = f"{source}: [scenarios.{name}]"
        opts = _check_options(here, table, allowed_extra=("scenario", "description"))
        named = table.get("scenario")
        if named is not None:
            known = _named_scenarios()
            if not isinstance(named, str):
                raise CampaignError(f"{here} scenario must be the name of a scenario, not {named!r}")
            if known is None:
                raise CampaignError(f"{here} scenario: unknown scenario {named!r}: this lab has no named "
                                    "scenarios (lab.scenarios is not installed); set Test options in the table instead")
            if named not in known:
                raise CampaignError(f"{here} scenario: unknown scenario {named!r}; known scenarios: "
                                    f"{', '.join(sorted(known)) or 'none'}")
            base = _scenario_options(known[named])
            inherited = {k: v for k, v in base.items() if k in OPTIONS}
            extra = {k: v for k, v in base.items() if k not in OPTIONS and k not in AXIS_FIELDS}
            opts = _merge_options(inherited, {"extra": extra} if extra else {}, {"scenario": named}, opts)
        description = table.get("description", "")
        if not isinstance(description, str):
            raise CampaignError(f"{here} description must be a string, not {description!r}")
        out.append(Scenario(name, opts, named, description))
    return out


def _sut_registry() -> Any:
    """The `lab.sut` package when it is installed and loads, else None (then only `reference` exists)."""
    try:
        mod = importlib.import_module("lab.sut")
    except Exception:  # noqa: BLE001 - no usable lab.sut means only the reference implementation
        return None
    return mod if callable(getattr(mod, "get_sut", None)) and callable(getattr(mod, "sut_names", None)) else None


def _check_sut(where: str, sut: Any) -> None:
    """`sut` names a system lab.sut knows (registered, installed, or `module.path:Factory`)."""
    registry = _sut_registry()
    if sut == REFERENCE:
        return
    if registry is None:
        raise CampaignError(f"{where}: unknown implementation {sut!r}; known: {REFERENCE} "
                            "(other systems need the lab.sut package)")
    try:
        registry.get_sut(sut)
    except ValueError as e:  # lab.sut.SutError
        raise CampaignError(f"{where}: {e}".replace("unknown SUT", "unknown implementation")) from None


def _implementation(where: str, name: Any, table: Mapping[str, Any]) -> Implementation:
    """One implementation: `reference`, or a lab.sut system with its url and API key file."""
    _check_name(where, name, "an implementation name")
    for key in table:
        if key not in IMPL_KEYS:
            raise _unknown_key(where, key, IMPL_KEYS, "implementation keys")
    sut = table.get("sut", name)
    _check_sut(where, sut)
    url, key_file = table.get("url"), table.get("api_key_file")
    if sut == REFERENCE and (url is not None or key_file is not None):
        raise CampaignError(f"{where}: the reference implementation runs the lab's own servers and takes no url "
                            "or api_key_file; remove them, or set sut to the system the url serves")
    if url is not None and (not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url)):
        raise CampaignError(f"{where}: url must be an http(s) URL such as http://127.0.0.1:9000, not {url!r}")
    if key_file is not None and not isinstance(key_file, str):
        raise CampaignError(f"{where}: api_key_file must be a path (a string), not {key_file!r}")
    mode = table.get("commit_mode")
    if mode is not None and mode not in ("fenced", "unfenced"):
        raise CampaignError(f"{where}: commit_mode must be \"fenced\" or \"unfenced\", not {mode!r}")
    backend = table.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise CampaignError(f"{where}: backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
    if backend not in (None, "local") and (sut != REFERENCE or url is not None):
        raise CampaignError(f"{where}: backend {backend!r} places the lab's reference stack; another system or a "
                            "url places itself: drop backend")
    hosts = table.get("hosts")
    needs_hosts = backend is not None and BACKENDS[backend].needs_hosts  # ssh: its nodes; swarm: its placement
    if needs_hosts != (hosts is not None):
        raise CampaignError(f"{where}: backend \"{backend if needs_hosts else 'ssh'}\" and hosts (a hosts file: "
                            f"{BACKENDS[backend].hosts_doc if needs_hosts else 'docs/ssh-backend.md'}) go together")
    if hosts is not None and not isinstance(hosts, str):
        raise CampaignError(f"{where}: hosts must be the path of a hosts file (a string), not {hosts!r}")
    swarm = table.get("swarm")
    if swarm is not None and (backend != "swarm" or not isinstance(swarm, str)):
        raise CampaignError(f"{where}: swarm is the Swarm manager's engine URL (a string) of backend \"swarm\", "
                            f"not {swarm!r}{'' if backend == 'swarm' else ' beside backend ' + repr(backend)}")
    sut_options = table.get("sut_options", {})
    if not isinstance(sut_options, Mapping):
        raise CampaignError(f"{where}: sut_options is a table of per-system options (hold_s = 1.0), not "
                            f"{sut_options!r}")
    for k, v in sut_options.items():
        problem = sut_option_problem(k, v)
        if problem:
            raise CampaignError(f"{where}: sut_options: {problem}")
    return Implementation(name, sut, url, key_file, mode, backend, hosts, swarm, tuple(sorted(sut_options.items())))


def _implementations(where: str, value: Any) -> list[Implementation]:
    """A list of names or {name, sut, url} tables, or a table of named tables."""
    if value is None:
        return [Implementation(REFERENCE)]
    if isinstance(value, Mapping):
        items = [(f"{where}.{k}", k, v) for k, v in value.items()]
    else:
        items = []
        for i, item in enumerate(_check_list(where, value, "implementation names or tables")):
            if isinstance(item, Mapping):
                items.append((f"{where}[{i}]", item.get("name", item.get("sut")), item))
            else:
                items.append((f"{where}[{i}]", item, {}))
    if not items:
        raise CampaignError(f"{where} must name at least one implementation, e.g. [\"reference\"]")
    out = []
    for here, name, table in items:
        if not isinstance(table, Mapping):
            raise CampaignError(f"{here} must be a table with sut and url, not {table!r}")
        out.append(_implementation(here, name, table))
    _no_repeats(where, [i.name for i in out])
    return out


def _seeds(where: str, value: Any) -> list[int]:
    """A count (seeds 0..n-1) or a list of distinct integer seeds."""
    if value is None:
        return [0]
    if _is_int(value):
        if value < 1:
            raise CampaignError(f"{where} must be a count >= 1 or a list of seeds, not {value}")
        return list(range(value))
    if not isinstance(value, list) or not value or not all(_is_int(s) for s in value):
        raise CampaignError(f"{where} must be a count (e.g. 3: seeds 0, 1, 2) or a non-empty list of integers, "
                            f"not {value!r}")
    _no_repeats(where, value)
    return list(value)


def _repetitions(where: str, value: Any) -> int:
    if value is None:
        return 1
    if not _is_int(value) or value < 1:
        raise CampaignError(f"{where} must be an integer >= 1 (runs per seed), not {value!r}")
    return value


# -- loading ----------------------------------------------------------------------------------


def load_spec(path: Path | str) -> Spec:
    """Read and validate a spec file (TOML; YAML when pyyaml is installed)."""
    path = Path(path)
    if not path.is_file():
        raise CampaignError(f"{path}: no such spec file")
    text = path.read_bytes()
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise CampaignError(f"{path}: invalid TOML: {e}") from None
    elif path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # optional for campaigns: a TOML spec needs no pyyaml (the error below says so)
        except ImportError:
            raise CampaignError(f"{path}: reading YAML specs needs pyyaml (pip install pyyaml); "
                                "or write the spec as TOML") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise CampaignError(f"{path}: invalid YAML: {' '.join(str(e).split())}") from None
    else:
        raise CampaignError(f"{path}: a spec is a .toml file (or .yaml / .yml), not {path.suffix or 'no suffix'}")
    return parse_spec(data, source=str(path))


def parse_spec(data: Any, source: str = "<spec>") -> Spec:
    """Validate a parsed spec (a mapping) into a `Spec`; the plan itself is checked by `validate_plan`."""
    if not isinstance(data, Mapping):
        raise CampaignError(f"{source}: a spec is a table of keys ({', '.join(TOP_KEYS)}), not {type(data).__name__}")
    for key in data:
        if key not in TOP_KEYS:
            if key in AXIS_FIELDS and key != "name":
                raise CampaignError(f"{source}: unknown key {key!r}: the axis is {AXIS_FIELDS[key]!r} (a list)")
            raise _unknown_key(source, key, TOP_KEYS)
    if "name" not in data:
        raise CampaignError(f"{source}: missing key 'name': name the campaign, e.g. name = \"demo\"")
    name = _check_name(f"{source}: name", data["name"], "the campaign name")
    if name in RESERVED_NAMES:
        raise CampaignError(f"{source}: name {name!r} is reserved in the store; choose another campaign name")
    if "workloads" not in data:
        raise CampaignError(f"{source}: missing key 'workloads': list the workloads to run, "
                            "e.g. workloads = [\"lease\"]")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise CampaignError(f"{source}: description must be a string, not {description!r}")
    return Spec(
        name=name, source=source, description=description,
        defaults=_check_options(f"{source}: [defaults]", data.get("defaults", {})),
        workloads=_workloads(f"{source}: workloads", data["workloads"]),
        nemeses=_nemeses(f"{source}: nemeses", data.get("nemeses", ["none"])),
        scenarios=_scenarios(source, data.get("scenarios")),
        implementations=_implementations(f"{source}: implementations", data.get("implementations")),
        seeds=_seeds(f"{source}: seeds", data.get("seeds")),
        repetitions=_repetitions(f"{source}: repetitions", data.get("repetitions")),
        raw=dict(data),
        exclude=_exclude(f"{source}: exclude", data.get("exclude")),
        dask=_run_table(f"{source}: run", data.get("run")),
    )


def _exclude(where: str, value: Any) -> list[dict[str, str]]:
    """`exclude = [{implementation = "etcd", nemesis = "clock", why = "..."}]`: combinations the plan leaves out."""
    if value is None:
        return []
    out = []
    for i, item in enumerate(_check_list(where, value, "tables of axis values")):
        here = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise CampaignError(f"{here} must be a table such as {{implementation = \"x\", nemesis = \"clock\"}}, "
                                f"not {item!r}")
        for key, v in item.items():
            if key not in EXCLUDE_KEYS:
                raise _unknown_key(here, key, EXCLUDE_KEYS, "exclude keys")
            if not isinstance(v, str):
                raise CampaignError(f"{here}.{key} must be a string, not {v!r}")
        if not set(item) - {"why"}:
            raise CampaignError(f"{here} names no axis value ({', '.join(EXCLUDE_KEYS[:-1])}): it would exclude "
                                "every run")
        out.append(dict(item))
    return out


def _excluded(spec: Spec, wl: str, nemesis: str, scenario: str, impl: str) -> bool:
    """Does an `exclude` entry match this combination (every axis value it names)?"""
    here = {"workload": wl, "nemesis": nemesis, "scenario": scenario, "implementation": impl}
    return any(all(here[k] == v for k, v in ex.items() if k != "why") for ex in spec.exclude)


# -- the plan ---------------------------------------------------------------------------------


def sanitize(part: str) -> str:
    """A run-id part safe as a directory name (letters, digits, '.', '_', '-', '+')."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", str(part)).strip("_") or "_"


@dataclass(frozen=True)
class PlannedRun:
    """One combination of the axes: its id, coordinates and the options of its Test."""

    campaign: str
    workload: str
    nemesis: str  # the column label ("none", "partition", "partition+kill")
    nemesis_names: tuple[str, ...]
    scenario: str
    implementation: str
    seed: int
    rep: int
    options: dict[str, Any]  # Test keyword arguments besides name, workload, nemesis and seed

    @property
    def id(self) -> str:
        """`<workload>-<nemesis>-<scenario>-<impl>-s<seed>-r<rep>`, sanitized."""
        parts = (self.workload, self.nemesis, self.scenario, self.implementation)
        return "-".join(map(sanitize, parts)) + f"-s{self.seed}-r{self.rep}"

    @property
    def test_name(self) -> str:
        """The Test name, and so the run's directory in the store: `<campaign>/<id>`."""
        return f"{self.campaign}/{self.id}"

    def to_test(self) -> Test:
        """A fresh Test for this run."""
        return Test(name=self.test_name, workload=self.workload, seed=self.seed, nemesis=list(self.nemesis_names),
                    **self.options)

    def test_options(self) -> dict[str, Any]:
        """The Test's options as saved in campaign.json (what decides whether a finished run still matches)."""
        return saved_options(self.to_test().to_json())


# the keys of a test.json campaign.json keeps per run (a run whose saved options differ is run again on resume):
# every option; not what a run fills in (its directory and the stack's addresses, RUN_KEYS; its salt)
UNSAVED_FIELDS = (*RUN_KEYS, "run_salt")


def saved_options(test_json: Mapping[str, Any]) -> dict[str, Any]:
    """The saved options of a test.json-shaped object; an old campaign.json's (options in `extra`) reads the same."""
    test = Test.from_json(dict(test_json))
    if test.servers is None and not test.urls:  # what the lab's own stack starts: saved as the number it is
        test = test.evolve(servers=DEFAULT_SERVERS)
    return {k: v for k, v in test.to_json().items() if k not in UNSAVED_FIELDS}


def expand(spec: Spec) -> list[PlannedRun]:
    """Every combination, in matrix order: workload, scenario, implementation, nemesis, seed, repetition."""
    runs = []
    for wl, sc, impl, (label, names), seed, rep in itertools.product(
            spec.workloads, spec.scenarios, spec.implementations, spec.nemeses.items(), spec.seeds,
            range(spec.repetitions)):
        if _excluded(spec, wl, label, sc.name, impl.name):
            continue
        runs.append(PlannedRun(spec.name, wl, label, tuple(names), sc.name, impl.name, seed, rep,
                               _merge_options(spec.defaults, sc.options, impl.options())))
    return runs


def validate_plan(spec: Spec, runs: list[PlannedRun] | None = None) -> list[PlannedRun]:
    """The plan, once every run's Test passes `lab.runner.validate` and every id is distinct."""
    runs = expand(spec) if runs is None else runs
    if len(runs) > MAX_RUNS:
        raise CampaignError(f"{spec.source}: the spec expands to {len(runs)} runs, more than {MAX_RUNS}; "
                            "use fewer seeds, repetitions or axis values")
    seen: dict[str, PlannedRun] = {}
    registry = _sut_registry()
    for run in runs:
        if run.id in seen:
            raise CampaignError(f"{spec.source}: two combinations share the run id {run.id!r} once sanitized; "
                                "rename a scenario or implementation so their ids differ")
        seen[run.id] = run
        try:
            test = run.to_test()
            validate(test)
            if registry is not None and callable(getattr(registry, "validate_test", None)):
                registry.validate_test(test, needs_of(test.workload))
        except (RunError, ValueError) as e:
            msg = re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), str(e))
            raise CampaignError(f"{spec.source}: run {run.id}: {msg} (fix it in [defaults] or the scenario)") from None
    return runs
