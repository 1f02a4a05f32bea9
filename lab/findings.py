"""Findings: every place a system under test differs from the contract, as evidence.

A finding is one structured record

    {"id": ..., "rule": "C12 / section 9", "contract": what the contract says,
     "dialect": what this system does instead, "observed": what a run saw (None in the static list)}

An adapter ships a static catalogue of the differences it knows from its
spec (`static` records, `observed: None`) and reports each one again, with a
concrete example, the first time a run actually meets it
(`FindingsLog.observe`). Observations go to `<run_dir>/findings.jsonl` as they
happen (one line per distinct finding, like the history: on disk before the
run ends) and are counted in memory; `load_findings(run_dir)` reads them back
for the evidence report.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

FINDINGS_FILE = "findings.jsonl"
MAX_REMEMBERED_LEASES = 100_000  # bound on the lease_id -> acquiring node map


@dataclass(frozen=True, slots=True)
class Finding:
    """One known difference between a system and the contract."""

    id: str
    rule: str
    contract: str
    dialect: str

    def record(self, observed: str | None = None) -> dict[str, Any]:
        """The finding as the report lists it (observed: None for the static list)."""
        return {"id": self.id, "rule": self.rule, "contract": self.contract, "dialect": self.dialect,
                "observed": observed}


class FindingsLog:
    """The findings a run observed, in memory and (with a path) appended to findings.jsonl as they happen."""

    def __init__(self, catalogue: Mapping[str, Finding], path: str | Path | None = None):
        self.catalogue = dict(catalogue)
        self.path = Path(path) if path is not None else None
        self.first: dict[str, dict[str, Any]] = {}
        self.counts: dict[str, int] = {}
        # which node acquired a lease: evidence for "renew via another instance is not_owner"
        self._acquired_via: OrderedDict[str, str] = OrderedDict()

    def observe(self, finding_id: str, observed: str) -> None:
        """Count one observation; the first one of each finding is recorded (and written) with its example."""
        if finding_id not in self.catalogue:
            raise KeyError(f"unknown finding {finding_id!r}; known: {', '.join(sorted(self.catalogue))}")
        self.counts[finding_id] = self.counts.get(finding_id, 0) + 1
        if finding_id in self.first:
            return
        rec = self.catalogue[finding_id].record(observed)
        self.first[finding_id] = rec
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")

    def observed(self, finding_id: str) -> bool:
        """Was this finding seen in this run?"""
        return finding_id in self.first

    def records(self) -> list[dict[str, Any]]:
        """Every observed finding (first example) with how often it was seen, in the order first seen."""
        return [dict(rec, count=self.counts[fid]) for fid, rec in self.first.items()]

    def remember_acquired(self, lease_id: str, node: str) -> None:
        """Note the node that granted a lease (bounded: the oldest entries are forgotten)."""
        self._acquired_via[lease_id] = node
        while len(self._acquired_via) > MAX_REMEMBERED_LEASES:
            self._acquired_via.popitem(last=False)

    def acquired_via(self, lease_id: str) -> str | None:
        """The node that granted this lease, if this run saw it."""
        return self._acquired_via.get(lease_id)


def static_records(catalogue: Mapping[str, Finding] | Iterable[Finding]) -> list[dict[str, Any]]:
    """The static list (from the spec): every known finding with `observed: None`."""
    items = catalogue.values() if isinstance(catalogue, Mapping) else catalogue
    return [f.record(None) for f in items]


def load_findings(run_dir: str | Path) -> list[dict[str, Any]]:
    """The findings a stored run observed (empty when it observed none); a damaged line is reported, not skipped."""
    path = Path(run_dir) / FINDINGS_FILE
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not a JSON finding record: {e}") from None
        if not isinstance(rec, dict) or not {"rule", "contract", "dialect", "observed"} <= rec.keys():
            raise ValueError(f"{path}:{n}: a finding needs rule, contract, dialect and observed")
        out.append(rec)
    return out
