"""The contract evidence bundle: every row of the verification matrix and the races table, run and judged.

    fencelab evidence [--depth quick] [--url URL --api-key-file F] [--store-dir store]

reads `campaigns/contract-evidence.toml` (rows -> scenarios of lab.scenarios,
depths), runs each scenario (once per seed, for every row it evidences),
and writes `store/evidence/<timestamp>/evidence.json` and `evidence.html`.
See docs/evidence.md.
"""

from lab.evidence.run import Evidence, RowResult, RunRecord, EvidenceTarget, describe_depth, judge_row, plan, run_evidence
from lab.evidence.spec import Depth, EvidenceError, EvidenceSpec, ExtraRun, Row, load_spec, parse_spec

DEFAULT_SPEC = "campaigns/contract-evidence.toml"

__all__ = ["DEFAULT_SPEC", "Depth", "Evidence", "EvidenceError", "EvidenceSpec", "ExtraRun", "Row", "RowResult",
           "RunRecord", "EvidenceTarget", "describe_depth", "judge_row", "load_spec", "parse_spec", "plan", "run_evidence"]
