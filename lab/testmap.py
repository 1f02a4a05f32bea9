"""The test: one plain value threaded through a run (Jepsen's test map).

The Test's fields are the spec: the options, validated once and then frozen (`sealed`), plus `run_dir`, where
the run lands. What exists only while the run goes lives in `live`, a typed `RunContext` filled by the run's
stack: its addresses (`live.nodes`, `live.lease_servers`, `live.valkey`, ...; test.json records them, `RUN_ADDRESSES`)
and what can never be saved (the stack, sockets, the real store URL, keys). `test.nodes` and the other
addresses still read, as read-only views of `test.live` (what plug-ins and the docs read).

Every option the lab reads is a typed field (docs/architecture.md "The test"); `extra` holds only what a run
records about itself (the probe, a scenario's nonce and identity, a SUT's import path) and options a plug-in
system reads by name. A test.json written before the fields existed kept them in `extra`: `Test.from_json`
(and the constructor) move them to their fields. `OPTIONS` is the one schema of the options a spec table may
set (campaigns, mutants, evidence: `check_options`); `lab.runner.validate` checks a whole Test.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import math
import re
import secrets
import typing
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import pydantic  # the package alone (~20 ms); its models load when the first options are checked

from lab.secrets import redact_url


RUN_SALT = re.compile(r"[0-9A-Za-z]{1,32}")
DEFAULT_SERVERS = 2  # lease servers the lab's own stack starts when a test does not say
MAX_SERVERS = 16
COMMIT_MODES = ("fenced", "unfenced")
# what a workload session does when its process crashed (an `info`) and the thread reopened its client
# (docs/plugging-in-a-system.md#client-lifecycle-after-info): carry on with the lease it still believes it holds
# (the default), or abandon that lease (its remaining ops fail `not_held`; the thread's next session acquires anew)
AFTER_INFO = ("carry-on", "abandon")
# whether a workload's own sessions stall past their TTL (stalled and solo sessions, the expiry-edge commits): on
# (the default), or off, so that only a fault makes a stale holder (docs/workloads.md#stalls)
STALLS = ("on", "off")
MAX_SECONDS = 7 * 24 * 3600  # the longest time_limit, nemesis_interval or deadline_s a run takes (a week)
RATES = (0.001, 1_000_000.0)  # ops/s: beyond them the generator's gap (1/rate) leaves what its ns clock can hold
# the first-class options that a test.json (or a caller) of before the typed fields kept in `extra`
FIRST_CLASS = ("sut", "urls", "api_key_file", "servers", "store_url", "store_db", "proxy_urls", "lab_owns_store",
               "commit_mode", "hosts_file", "swarm", "mutant", "scenario", "deadline_s", "ttl_ms", "after_info",
               "stalls")


# the one field a sealed spec still takes: where the run lands (every other field is the spec; `live` is mutated, never
# replaced)
RUN_FIELDS = frozenset({"run_dir"})
# the run context's addresses of the running stack, which test.json records beside the spec (in this order, after
# run_dir) and `Test` shows as read-only views (`test.nodes` reads `test.live.nodes`)
RUN_ADDRESSES = ("nodes", "client_nodes", "lease_servers", "valkey", "store", "credentials_file")
# the keys of a test.json that the run filled in, not the spec
RUN_KEYS = ("run_dir", *RUN_ADDRESSES)


class SpecFrozen(AttributeError):
    """A spec field assigned after validation: a resolved spec is changed by making a new one (`Test.evolve`)."""


class RunValueReadOnly(AttributeError):
    """`test.nodes = ...` (or another address of `RUN_ADDRESSES`): the run context holds it (`test.live.nodes`)."""


@dataclass(eq=False, repr=False)
class RunContext(MutableMapping):
    """What exists only while a run goes (`Test.live`): the running stack, its addresses and what the run's layers
    share through it. Only the addresses are saved (test.json records RUN_ADDRESSES); the rest never is. A test
    that needs addresses without a stack sets them: `Test(live=RunContext(nodes=["n1"]))`.
    The lab's own entries are typed attributes; any other name is a plug-in's own state
    (`plugins`), reached as a mapping, as `test.live.setdefault("my_table", Table())` always was
    (docs/plugging-in-a-system.md). A typed entry reads absent (KeyError, `get` -> None) while it is unset (None,
    or an empty list).
    The objects of layers above this one (the stack, the client nemeses' controls) are `Any` here: naming their
    classes would import upward (.importlinter)."""

    stack: Any = None  # the running stack (lab.stack; `take_status` sets it when the stack is up)
    store_url: str | None = None  # the system's real store URL (`Test.store_url` is its redacted form)
    client_clocks: Any = None  # nemesis.clock.ClientClocks: each client process's own clock (client-clock)
    client_pauses: Any = None  # nemesis.process_faults.ClientPauses: the client-pause gate
    plugin_errors: list[str] = field(default_factory=list)  # what a plug-in's factory raised while running
    sut_findings: Any = None  # lab.findings: the StarIntel findings log of the run
    sut_api_key: str | None = None  # the key the run's clients send (a secret: never in repr, never saved)
    credentials: list[dict[str, Any]] | None = None  # the stack's principals (secrets too)
    # the running stack's addresses (`take_status`; RUN_ADDRESSES: test.json records them, `Test.nodes` reads them)
    nodes: list[str] = field(default_factory=list)  # what the workload's clients talk to (thread t: nodes[t % n])
    client_nodes: list[str] = field(default_factory=list)  # the servers as clients reach them (through proxies)
    lease_servers: list[str] = field(default_factory=list)  # the lease servers' own URLs
    valkey: str | None = None  # the stack's Valkey URL
    store: str | None = None  # the store's URL without credentials (the real one: store_url)
    credentials_file: str | None = None  # the path of the stack's demo API keys (never the keys)
    plugins: dict[str, Any] = field(default_factory=dict)  # a plug-in's own entries, by its own names

    def take_status(self, stack: Any, status: Any) -> None:
        """The one place a run's stack enters its context: the stack and the addresses of its status (a
        lab.stack.base.StackStatus), as lists where it holds tuples. `nodes` is the workload's choice among them
        (`Workload.nodes`), which lab.runner sets next."""
        self.stack = stack
        self.lease_servers, self.client_nodes = list(status.lease_servers), list(status.client_nodes)
        self.valkey, self.store, self.credentials_file = status.valkey, status.store, status.credentials

    def _typed(self, key: str) -> bool:
        return key in _RUN_CONTEXT_FIELDS

    def __getitem__(self, key: str) -> Any:
        if self._typed(key):
            value = getattr(self, key)
            if value is None or (key in _RUN_CONTEXT_LISTS and not value):
                raise KeyError(key)
            return value
        return self.plugins[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if self._typed(key):
            setattr(self, key, value)
        else:
            self.plugins[key] = value

    def __delitem__(self, key: str) -> None:
        if self._typed(key):
            self[key]  # KeyError when unset, as a dict's del
            setattr(self, key, [] if key in _RUN_CONTEXT_LISTS else None)
        else:
            del self.plugins[key]

    def __iter__(self) -> Iterator[str]:
        for key in _RUN_CONTEXT_FIELDS:
            if key in self:
                yield key
        yield from self.plugins

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:  # names only: the key and the credentials are secrets
        return f"RunContext({', '.join(self)})"


_RUN_CONTEXT_FIELDS = tuple(f.name for f in fields(RunContext) if f.name != "plugins")
_RUN_CONTEXT_LISTS = frozenset(f.name for f in fields(RunContext) if f.default_factory is list)


class _RunAddress:
    """`test.nodes` (and each name of RUN_ADDRESSES): a read-only view of `test.live.<name>`, for the plug-ins and
    docs that read it from the Test; a write raises RunValueReadOnly naming `test.live`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, test: Test | None, owner: type | None = None) -> Any:
        return self if test is None else getattr(test.live, self.name)

    def __set__(self, test: Test, value: Any) -> None:
        raise RunValueReadOnly(f"test.{self.name} is read-only: it is the run context's value; set "
                               f"test.live.{self.name}")


def new_run_salt() -> str:
    """A fresh per-run salt (8 hex digits): seeded ids stay reproducible, yet differ from every other run's."""
    return secrets.token_hex(4)


@dataclass
class Test:
    """One test run's options and context."""

    __test__ = False  # not a pytest test class

    name: str = "fencelab"
    workload: str = "lease"
    time_limit: float = 10.0
    concurrency: int = 5
    rate: float = 50.0
    keys: int = 3
    seed: int = 0
    # makes this run's request ids and service instances its own: a second run with the same seed against the
    # same server must not be answered from the first run's idempotency records (new_run_salt; "" = unsalted)
    run_salt: str = ""
    ttl_ms: int = 2000
    nemesis: list[str] = field(default_factory=list)
    nemesis_interval: float = 5.0
    # a recorded fault schedule (a run's fault-schedule.json) the nemesis lane replays instead of drawing one;
    # its nemeses are the run's `nemesis` (nemesis.fault_schedule)
    fault_schedule: str | None = None
    backend: str = "local"  # where the lab places the system under test: local processes or Docker Compose
    # -- what is tested, and how to reach it (`fencelab test` options of the same names) --
    sut: str = "reference"  # the system under test's registered name (lab.sut), or module:Factory
    urls: list[str] = field(default_factory=list)  # an external system's lease servers (--url): no stack is started
    api_key_file: str | None = None  # the API key's file for an external system (the path only, never the key)
    servers: int | None = None  # lease servers the lab's own stack starts (None: DEFAULT_SERVERS); not with urls
    store_url: str | None = None  # the store the system writes into, redacted (the real URL: live.store_url)
    store_db: str | None = None  # that store's database (default: fencelab)
    proxy_urls: bool = False  # the lab's Toxiproxy in front of the urls (client -> server links)
    lab_owns_store: bool = False  # the store_url store is a scratch store the lab may set up
    commit_mode: str | None = None  # a third-party system's commits: fenced / unfenced (docs/third-party.md)
    hosts_file: str | None = None  # backend "ssh": the TOML file of the nodes; "swarm": the placement
    swarm: str | None = None  # backend "swarm": the manager's engine URL (over the placement's and DOCKER_HOST)
    mutant: str | None = None  # a planted bug of the reference servers (docs/mutants.md)
    scenario: str | None = None  # a named race scenario (lab.scenarios): it replaces the workload
    deadline_s: float | None = None  # each client request's deadline (None: the workload's own default)
    after_info: str | None = None  # a session after its process crashed: AFTER_INFO (None: carry-on)
    stalls: str | None = None  # the workload's own stalls past the TTL: STALLS (None: on)
    run_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what a run records about itself; plug-in options
    live: RunContext = field(default_factory=RunContext, repr=False)  # only while running: the stack, its addresses

    # the running stack's addresses, read-only views of the run context (not fields: `test.live.nodes` holds them)
    nodes = _RunAddress()
    client_nodes = _RunAddress()
    lease_servers = _RunAddress()
    valkey = _RunAddress()
    store = _RunAddress()
    credentials_file = _RunAddress()

    def __post_init__(self) -> None:
        self.extra = dict(self.extra or {})
        lift_legacy(self.extra, self)

    def __setattr__(self, name: str, value: Any) -> None:
        # a dataclass(frozen=True) would freeze run_dir too; a sealed spec refuses every other field
        if name == "live" and self.__dict__.get("_sealed"):
            raise SpecFrozen("test.live: a run has one context, shared by every spec it resolves to; set its "
                             "entries (test.live.<name> = ...), never a new one")
        if name not in RUN_FIELDS and name not in RUN_ADDRESSES and self.__dict__.get("_sealed"):
            raise SpecFrozen(f"test.{name}: the spec is validated and frozen; make a new one (Test.evolve)")
        object.__setattr__(self, name, value)

    def evolve(self, **changes: Any) -> "Test":
        """A new Test: this one with `changes` (unsealed, its own `extra` and lists; `live` is the same context)."""
        changes.setdefault("extra", dict(self.extra))
        for name in ("nemesis", "urls"):
            changes.setdefault(name, list(getattr(self, name)))
        return replace(self, **changes)

    def sealed(self) -> "Test":
        """A copy whose spec fields can no longer be assigned (what `lab.runner.resolve` hands down)."""
        spec = self.evolve()
        object.__setattr__(spec, "_sealed", True)
        return spec

    @property
    def is_sealed(self) -> bool:
        return bool(self.__dict__.get("_sealed"))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Test":
        """A Test from a test.json object (also one written before the typed fields: their keys were in `extra`);
        the stack's addresses it recorded go back into the run context (`test.live`)."""
        known = {f.name for f in fields(cls)} - {"live"}
        test = cls(**{k: v for k, v in d.items() if k in known})
        test.run_dir = Path(test.run_dir) if test.run_dir else None
        for name in RUN_ADDRESSES:
            value = d.get(name)
            if value is not None:
                setattr(test.live, name, list(value) if name in _RUN_CONTEXT_LISTS else value)
        return test

    def to_json(self) -> dict[str, Any]:
        """The spec and run_dir, JSON-able (paths as strings), then the run context's addresses (`RUN_ADDRESSES`,
        as test.json always had them); the rest of `live` is never saved. An option left unset (at its default) is
        left out, as the old `extra` left it out: test.json names what the run was given (`from_json` restores
        the rest)."""
        d: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "live" or (f.name in _UNSET_OMITTED and getattr(self, f.name) == _DEFAULTS[f.name]):
                continue
            d[f.name] = copy.deepcopy(getattr(self, f.name))
            if f.name == "run_dir":
                d["run_dir"] = str(self.run_dir) if self.run_dir else None
                d.update({name: copy.deepcopy(getattr(self.live, name)) for name in RUN_ADDRESSES})
        return d

    def sut_name(self) -> str:
        """The system under test's registered name (`reference`: our server)."""
        return str(self.sut or "reference")

    def server_count(self) -> int:
        """How many lease servers the lab's own stack starts."""
        return DEFAULT_SERVERS if self.servers is None else int(self.servers)

    def credentials(self) -> list[dict[str, Any]]:
        """The demo principals (with API keys) of the stack under test; never written to the history."""
        if self.live.credentials is None:
            if not self.live.credentials_file:
                raise ValueError("the test has no credentials file (is the stack up?)")
            self.live.credentials = json.loads(Path(self.live.credentials_file).read_text())
        return self.live.credentials


# the option fields test.json leaves out while unset (every first-class option but ttl_ms, which always was a field,
# and the fields added since, which never were in `extra`)
_UNSET_OMITTED = frozenset(FIRST_CLASS) - {"ttl_ms"} | {"fault_schedule"}
_DEFAULTS = {f.name: (f.default_factory() if callable(f.default_factory) else f.default) for f in fields(Test)}


def lift_legacy(extra: dict[str, Any], target: Any) -> dict[str, Any]:
    """Move the first-class options an old-shape `extra` carries onto `target` (a Test, or a dict of options).

    The old CLI wrote `servers` (2) also beside `urls`, where it meant nothing: that one is dropped, not lifted.
    """
    moved = {k: extra.pop(k) for k in FIRST_CLASS if k in extra}
    if moved.get("urls") and moved.get("servers") == DEFAULT_SERVERS:
        moved.pop("servers")
    for k, v in moved.items():
        if v is None:
            continue
        if k in ("urls",):
            v = list(v)
        elif k in ("api_key_file", "hosts_file") and isinstance(v, Path):
            v = str(v)
        if isinstance(target, dict):
            target[k] = v
        else:
            setattr(target, k, v)
    return moved


# -- the option schema (pydantic: types checked by a schema, not by hand-written predicates) --------------
# pydantic is imported when a schema is first used, not with this module: `fencelab` starts without it

# the options a spec table (a campaign's [defaults], a mutants row, an evidence run) may set: name -> (type, what)
OPTION_TYPES: dict[str, tuple[Any, str]] = {
    "time_limit": (float, "a number of seconds (the main phase)"),
    "concurrency": (int, "an integer number of client processes"),
    "rate": (float, "a number of ops/s over all clients"),
    "keys": (int, "an integer number of independent keys"),
    "ttl_ms": (int, "an integer lease TTL in ms"),
    "nemesis_interval": (float, "a number of seconds between faults"),
    "servers": (int, f"an integer number of reference lease servers (1-{MAX_SERVERS})"),
    # a spec table's own backends: those that need no more than their name (lab.sut.target.BACKENDS has every row;
    # ssh needs its hosts file, so it is set by an implementation with backend = "ssh" and hosts)
    "backend": (Literal["local", "compose"], "local or compose (where the reference stack is placed; ssh: an "
                                             "implementation with backend = \"ssh\" and hosts)"),
    "deadline_s": (float, "a number of seconds (each request's deadline)"),
    "commit_mode": (Literal["fenced", "unfenced"], "\"fenced\" or \"unfenced\""),
    "after_info": (Literal["carry-on", "abandon"], "\"carry-on\" or \"abandon\" (a session after its process "
                                                   "crashed: docs/plugging-in-a-system.md)"),
    "stalls": (Literal["on", "off"], "\"on\" or \"off\" (the workload's own stalls past the TTL: "
                                      "docs/workloads.md#stalls)"),
    "store_db": (str, "a database name (a string)"),
    "mutant": (str, "the name of a planted bug (docs/mutants.md)"),
    "extra": (dict[str, Any], "a table of extra test options (e.g. hold_s = 1.0)"),
}
OPTIONS: dict[str, str] = {name: what for name, (_t, what) in OPTION_TYPES.items()}


@functools.cache
def _options_model() -> Any:
    """The pydantic model of OPTION_TYPES: strict (no "3" for 3, no true for 1), unknown keys refused."""
    return pydantic.create_model("Options", __config__=pydantic.ConfigDict(extra="forbid", strict=True),
                        **{k: (t | None, None) for k, (t, _w) in OPTION_TYPES.items()})


@functools.cache
def _fields_model() -> Any:
    """The pydantic model of the Test's own fields, strict: what `lab.runner.validate` holds a Test's types to."""
    hints = typing.get_type_hints(Test)
    return pydantic.create_model("TestFields", __config__=pydantic.ConfigDict(strict=True),
                        **{f.name: (hints[f.name], ...) for f in fields(Test) if f.name not in ("live", "run_dir")})


class OptionError(ValueError):
    """A spec's option is unknown or of the wrong type; the message is one line naming it."""


def check_options(table: Any, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A validated copy of a table of Test options (`OPTIONS`, or the `allowed` subset); OptionError naming the key.

    Legacy `extra` keys that are now fields (e.g. `extra = {deadline_s = 1.0}`) move to their fields.
    """
    if not isinstance(table, dict):
        raise OptionError(f"must be a table of Test options, not {table!r}")
    known = [k for k in OPTIONS if allowed is None or k in allowed]
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionError(f"unknown key {key!r}{hint}; known Test options: {', '.join(known)}")
    try:
        _options_model().model_validate(table)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        raise OptionError(f"{key} must be {OPTIONS.get(key, 'valid')}, not {table.get(key)!r}") from None
    out = {k: (dict(v) if k == "extra" else v) for k, v in table.items()}
    if "extra" in out:
        lifted: dict[str, Any] = {}
        lift_legacy(out["extra"], lifted)
        for k, v in lifted.items():
            if k in known and k not in table:
                try:
                    _options_model().model_validate({k: v})
                except pydantic.ValidationError:
                    raise OptionError(f"extra.{k} must be {OPTIONS[k]}, not {v!r}") from None
                out[k] = v
            elif k not in table:
                raise OptionError(f"extra.{k} is set by the runner (from the spec's own keys); remove it")
        if not out["extra"]:
            del out["extra"]
    return out


def merge_options(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; `extra` tables merge key by key (the one merge of campaigns, mutants and faults)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in layer.items():
            out[k] = {**out.get(k, {}), **v} if k == "extra" else v
    return out


_KINDS = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "true or false",
          "list_type": "a list", "dict_type": "a table", "none_required": "empty"}


def field_problem(test: Test) -> str | None:
    """The first Test field not of its declared type (a bool is no number, a tuple no list), a float option out of
    its range (`numbers_problem`) or a `--url` that is no URL (`urls_problem`), as one line; or None.
    `lab.runner.validate` asks it first."""
    model = _fields_model()
    try:
        model.model_validate({f: getattr(test, f) for f in model.model_fields})
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        where = str(err["loc"][0]) + "".join(f"[{p}]" for p in err["loc"][1:] if not isinstance(p, str))
        kind = _KINDS.get(err["type"], err["msg"].removeprefix("Input should be ").lower())
        return f"{where} must be {kind}, not {err['input']!r}"
    return numbers_problem(test) or urls_problem(test)


# the float options of a run: field -> (its flag, its unit, the least value allowed above 0, the most allowed)
_NUMBERS = (("time_limit", "--time-limit", "seconds", None, MAX_SECONDS),
            ("rate", "--rate", "ops/s", RATES[0], RATES[1]),
            ("nemesis_interval", "--nemesis-interval", "seconds", None, MAX_SECONDS),
            ("deadline_s", "deadline_s", "seconds", None, MAX_SECONDS))


def numbers_problem(test: Test) -> str | None:
    """The one range check of a Test's float options (finite, > 0, bounded) as one line, or None.

    `field_problem`, which `lab.runner.validate` asks first, ends with it, so `fencelab test`, campaigns (their
    dry run too), evidence and mutants refuse `inf`, `nan` and `1e308` before anything starts, where the
    generator or the fault schedule would crash later.
    """
    for name, flag, unit, least, most in _NUMBERS:
        v = getattr(test, name)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # unset (deadline_s), or of the wrong type (field_problem names that first)
        if not math.isfinite(v):
            return f"{flag} must be a finite number of {unit}, not {v}"
        if v <= 0:
            return f"{flag} must be > 0 {unit}, not {v}"
        if v > most or (least is not None and v < least):
            return f"{flag} must be between {least or 0:.15g} and {most:.15g} {unit}, not {v:g}"
    return None


def urls_problem(test: Test) -> str | None:
    """Why a `--url` is not the base URL of a server reached over HTTP (the lab probes each one with an HTTP GET
    before its run, whatever the system), as one line; or None."""
    for url in test.urls if isinstance(test.urls, list) else ():
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
            if ok:
                parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError:
            ok = False
        if not ok:
            shown = redact_url(url) if isinstance(url, str) else repr(url)
            return f"--url {shown!r} is not a URL: give the server's base URL, e.g. http://127.0.0.1:8080"
    return None


def servers_problem(servers: Any) -> str | None:
    """The one range check of a lease server count (`--servers`: a Test, `fencelab up`, every stack), or None."""
    if isinstance(servers, bool) or not isinstance(servers, int) or not 1 <= servers <= MAX_SERVERS:
        return f"--servers must be between 1 and {MAX_SERVERS}, not {servers}"
    return None


# -- per-system options (`--sut-opt KEY=VALUE`, a campaign implementation's `sut_options`) -----------------------
SUT_OPTS = "sut_opts"  # test.extra: the names of the keys set as per-system options (the replay repeats them)
# what the runner itself records in `extra`: a per-system option may not take one of these names
RUN_RECORDS = frozenset({SUT_OPTS, "sut_import", "nemesis_schedule", "probe", "run_failed", "key_nonce", "identity"})
SUT_OPT_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def sut_option_problem(key: Any, value: Any) -> str | None:
    """Why `key = value` cannot be a per-system option (None: it can): a word, not a Test field nor a key the run
    records, and a value that is a string, a number, a boolean or null."""
    if not isinstance(key, str) or not SUT_OPT_KEY.fullmatch(key):
        return f"{key!r} is not an option name (a word: letters, digits, _ . -)"
    if key in _DEFAULTS or key in RUN_RECORDS or key in RUN_ADDRESSES:
        what = "a Test field: set it with its own option" if key in _DEFAULTS else "recorded by the run itself"
        return f"{key} is {what}"
    if value is not None and not isinstance(value, (str, int, float, bool)) or (
            isinstance(value, float) and not math.isfinite(value)):
        return f"{key}: the value must be a string, a finite number, true, false or null, not {value!r}"
    return None


def parse_sut_opt(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` as a per-system option: VALUE as a JSON scalar when it is one (1, 2.5, true, null, "quoted"),
    else the string itself. ValueError naming what to change."""
    key, eq, raw = text.partition("=")
    if not eq:
        raise ValueError(f"--sut-opt {text!r}: write KEY=VALUE")
    try:
        value = json.loads(raw, parse_constant=_not_a_scalar)
    except ValueError:
        value = raw
    if isinstance(value, (list, dict)):
        value = raw  # only scalars are parsed: anything else is the string as given
    problem = sut_option_problem(key, value)
    if problem:
        raise ValueError(f"--sut-opt {text!r}: {problem}")
    return key, value


def _not_a_scalar(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: kept as the string given


def sut_opt_arg(key: str, value: Any) -> str:
    """The `KEY=VALUE` text that `parse_sut_opt` reads back as this value (a string that would parse as another
    scalar is quoted)."""
    if isinstance(value, str) and parse_sut_opt(f"{key}={value}")[1] == value:
        return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def set_sut_options(test: "Test", options: dict[str, Any]) -> None:
    """Set per-system options in `test.extra`, and note their names so that the replay repeats them."""
    test.extra.update(options)
    test.extra[SUT_OPTS] = sorted(set(test.extra.get(SUT_OPTS) or ()) | set(options))


def sut_options_of(test: "Test") -> dict[str, Any]:
    """The per-system options a test was given (`--sut-opt`, `sut_options`)."""
    return {k: test.extra[k] for k in test.extra.get(SUT_OPTS) or () if k in test.extra}
