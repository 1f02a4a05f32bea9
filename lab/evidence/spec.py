"""The evidence spec (`campaigns/contract-evidence.toml`): the contract's rows, their scenarios, and depths.

    name = "contract-evidence"
    default_depth = "quick"

    [depths.quick]                        # one seed, the scenarios' own short time limits
    seeds = 1
    time_scale = 1.0
    [depths.standard]
    seeds = 3
    time_scale = 2.0
    [[depths.standard.runs]]              # more: workloads under randomly scheduled faults
    workload = "lease"
    nemesis = ["partition", "kill"]
    time_limit = 10
    rows = ["M3", "M4", "M7"]

    [[rows]]
    id = "R1"                             # M1..M15: section 12; R1..R17: section 8
    table = "races"
    text = "concurrent acquires"
    requires = "exactly one active lease, one token allocated"
    rules = ["C11", "C5"]
    scenarios = ["concurrent-acquires"]   # lab.scenarios names; [] is allowed (and that row fails)
    fs = ["acquire"]                      # optional: the ops that count as the row's evidence (default: all)

Everything is validated before anything runs; a problem is one line naming
the key (`EvidenceError`).
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lab.scenarios import SCENARIOS
from lab.testmap import OptionError, check_options
from nemesis.registry import validate_names
from workloads import WORKLOADS

TABLES = ("matrix", "races")
ROW_ID = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,31}$")
TOP_KEYS = ("name", "description", "default_depth", "depths", "rows")
ROW_KEYS = ("id", "table", "text", "requires", "rules", "scenarios", "fs", "note")
DEPTH_KEYS = ("description", "seeds", "time_scale", "rows", "runs")
RUN_KEYS = ("workload", "nemesis", "time_limit", "concurrency", "rate", "keys", "ttl_ms", "nemesis_interval", "rows")


class EvidenceError(ValueError):
    """The spec or the options of `fencelab evidence` cannot be used as given; one line says what to change."""


@dataclass(frozen=True)
class Row:
    """One row of the contract's verification matrix or races table, and the scenarios evidencing it."""

    id: str
    table: str
    text: str
    requires: str
    rules: tuple[str, ...]
    scenarios: tuple[str, ...]
    fs: tuple[str, ...] = ()  # ops that count as evidence (empty: every client op)
    note: str = ""


@dataclass(frozen=True)
class ExtraRun:
    """A workload run under randomly scheduled faults that deeper depths add as evidence for some rows."""

    workload: str
    nemesis: tuple[str, ...]
    rows: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """`<workload>-<nemesis+nemesis>`: how the bundle names its runs."""
        return f"{self.workload}-{'+'.join(self.nemesis) or 'none'}"


@dataclass(frozen=True)
class Depth:
    """How much to run: seeds per scenario, a time-limit factor, a row subset, extra runs."""

    name: str
    description: str = ""
    seeds: int = 1
    time_scale: float = 1.0
    rows: tuple[str, ...] | None = None  # None: every row
    runs: tuple[ExtraRun, ...] = ()


@dataclass(frozen=True)
class EvidenceSpec:
    """A validated evidence spec."""

    name: str
    source: str
    description: str
    default_depth: str
    depths: dict[str, Depth]
    rows: tuple[Row, ...]

    def depth(self, name: str | None) -> Depth:
        """The named depth (default: the spec's), or EvidenceError listing the known ones."""
        name = name or self.default_depth
        if name not in self.depths:
            raise EvidenceError(f"--depth: unknown depth {name!r}; known: {', '.join(self.depths)}")
        return self.depths[name]

    def rows_for(self, depth: Depth) -> tuple[Row, ...]:
        """The rows a depth covers, in spec order."""
        if depth.rows is None:
            return self.rows
        return tuple(r for r in self.rows if r.id in depth.rows)


def _unknown(where: str, key: str, known: tuple[str, ...]) -> EvidenceError:
    """An unknown-key error suggesting the closest known key."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return EvidenceError(f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(known)}")


def _keys(where: str, table: Any, known: tuple[str, ...]) -> Mapping[str, Any]:
    """A table whose keys are all known."""
    if not isinstance(table, Mapping):
        raise EvidenceError(f"{where} must be a table, not {table!r}")
    for key in table:
        if key not in known:
            raise _unknown(where, key, known)
    return table


def _strings(where: str, value: Any, *, empty: bool = True) -> tuple[str, ...]:
    """A list of non-empty strings (at least one unless `empty`)."""
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value) or (not empty and not value):
        raise EvidenceError(f"{where} must be a list of names{'' if empty else ' (at least one)'}, not {value!r}")
    return tuple(value)


def _text(where: str, value: Any, required: bool = True) -> str:
    """A non-empty string (or, when not required, an absent one as "")."""
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise EvidenceError(f"{where} must be a non-empty string, not {value!r}")
    return value


def _row(where: str, table: Any, scenarios: Mapping[str, Any]) -> Row:
    """One validated [[rows]] table."""
    t = _keys(where, table, ROW_KEYS)
    for key in ("id", "table", "text", "scenarios"):
        if key not in t:
            raise EvidenceError(f"{where}: missing key {key!r}")
    rid = _text(f"{where}.id", t["id"])
    if not ROW_ID.match(rid):
        raise EvidenceError(f"{where}.id must be a short name (letters, digits, . _ -), not {rid!r}")
    if t["table"] not in TABLES:
        raise EvidenceError(f"{where} ({rid}).table must be one of {', '.join(TABLES)}, not {t['table']!r}")
    names = _strings(f"{where} ({rid}).scenarios", t["scenarios"])
    for name in names:
        if name not in scenarios:
            raise EvidenceError(f"{where} ({rid}).scenarios: unknown scenario {name!r}; known: {', '.join(scenarios)}")
    rules = _strings(f"{where} ({rid}).rules", t.get("rules", []))
    for rule in rules:
        if not re.fullmatch(r"C\d{1,2}", rule):
            raise EvidenceError(f"{where} ({rid}).rules: {rule!r} is not a contract rule id (C1..C29)")
    return Row(id=rid, table=t["table"], text=_text(f"{where} ({rid}).text", t["text"]),
               requires=_text(f"{where} ({rid}).requires", t.get("requires"), required=False), rules=rules,
               scenarios=names, fs=_strings(f"{where} ({rid}).fs", t.get("fs", [])),
               note=_text(f"{where} ({rid}).note", t.get("note"), required=False))


def _extra_run(where: str, table: Any, row_ids: set[str]) -> ExtraRun:
    """One validated [[depths.X.runs]] table."""
    t = _keys(where, table, RUN_KEYS)
    wl = t.get("workload")
    if wl not in WORKLOADS:
        raise EvidenceError(f"{where}.workload: unknown workload {wl!r}; known: {', '.join(sorted(WORKLOADS))}")
    nemesis = _strings(f"{where}.nemesis", t.get("nemesis", []))
    if nemesis:
        try:
            validate_names(list(nemesis))
        except ValueError as e:
            raise EvidenceError(f"{where}.nemesis: {e}") from None
    rows = _strings(f"{where}.rows", t.get("rows", []), empty=False)
    for r in rows:
        if r not in row_ids:
            raise EvidenceError(f"{where}.rows: unknown row {r!r}")
    options = {k: v for k, v in t.items() if k not in ("workload", "nemesis", "rows")}
    try:  # typed by lab.testmap's one option schema; the runner's validate() checks the ranges of each run
        check_options(options, allowed=RUN_KEYS)
    except OptionError as e:
        raise EvidenceError(f"{where}.{e}") from None
    for k, v in options.items():
        if v <= 0:
            raise EvidenceError(f"{where}.{k} must be a positive number, not {v!r}")
    return ExtraRun(wl, nemesis, rows, options)


def _depth(where: str, name: str, table: Any, row_ids: set[str]) -> Depth:
    """One validated [depths.X] table."""
    t = _keys(where, table, DEPTH_KEYS)
    seeds = t.get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= 100:
        raise EvidenceError(f"{where}.seeds must be an integer between 1 and 100, not {seeds!r}")
    scale = t.get("time_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0.1 <= scale <= 100:
        raise EvidenceError(f"{where}.time_scale must be a number between 0.1 and 100, not {scale!r}")
    rows = None
    if "rows" in t:
        rows = _strings(f"{where}.rows", t["rows"], empty=False)
        for r in rows:
            if r not in row_ids:
                raise EvidenceError(f"{where}.rows: unknown row {r!r}")
    runs = t.get("runs", [])
    if not isinstance(runs, list):
        raise EvidenceError(f"{where}.runs must be a list of tables ([[depths.{name}.runs]]), not {runs!r}")
    return Depth(name=name, description=_text(f"{where}.description", t.get("description"), required=False),
                 seeds=seeds, time_scale=float(scale), rows=rows,
                 runs=tuple(_extra_run(f"{where}.runs[{i}]", r, row_ids) for i, r in enumerate(runs)))


def parse_spec(data: Any, source: str = "<spec>") -> EvidenceSpec:
    """Validate a parsed spec (a mapping) into an EvidenceSpec."""
    t = _keys(source, data, TOP_KEYS)
    for key in ("name", "rows", "depths"):
        if key not in t:
            raise EvidenceError(f"{source}: missing key {key!r}")
    name = _text(f"{source}: name", t["name"])
    if not ROW_ID.match(name):
        raise EvidenceError(f"{source}: name must be letters, digits, . _ -, not {name!r}")
    if not isinstance(t["rows"], list) or not t["rows"]:
        raise EvidenceError(f"{source}: rows must be a non-empty list of [[rows]] tables")
    rows = tuple(_row(f"{source}: rows[{i}]", r, SCENARIOS) for i, r in enumerate(t["rows"]))
    ids = [r.id for r in rows]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise EvidenceError(f"{source}: row ids must be unique; repeated: {', '.join(repeated)}")
    depths_t = t["depths"]
    if not isinstance(depths_t, Mapping) or not depths_t:
        raise EvidenceError(f"{source}: depths must be a table of named depths ([depths.quick] ...)")
    depths = {n: _depth(f"{source}: depths.{n}", n, d, set(ids)) for n, d in depths_t.items()}
    default = t.get("default_depth", next(iter(depths)))
    if default not in depths:
        raise EvidenceError(f"{source}: default_depth {default!r} is not one of the depths: {', '.join(depths)}")
    return EvidenceSpec(name=name, source=source, description=_text(f"{source}: description", t.get("description"),
                                                                     required=False),
                        default_depth=default, depths=depths, rows=rows)


def load_spec(path: str | Path) -> EvidenceSpec:
    """Read and validate an evidence spec file (TOML)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise EvidenceError(f"cannot read the evidence spec {p}: {e.strerror or e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise EvidenceError(f"{p}: not valid TOML: {e}") from None
    return parse_spec(data, str(p))
