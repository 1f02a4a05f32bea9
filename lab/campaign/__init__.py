"""Campaigns: many tests from one spec, run resumably, summed up on one page.

A campaign spec (TOML, or YAML with pyyaml) names axes whose product is the
plan: workloads x nemeses x scenarios x implementations x seeds x
repetitions, each run starting from `[defaults]`. `fencelab campaign SPEC`
validates the whole plan before anything runs, then runs each test with
`lab.runner.run_test`, recording every run's status in
`store/campaigns/<name>/campaign.json` (atomically, after every run) and
rendering `campaign.html` (the verdict matrix, availability and latency per
nemesis, totals). An interrupted campaign resumes where it stopped.

- `lab.campaign.spec`: `load_spec`, `parse_spec`, `expand`, `validate_plan`, `check_dask_address`, `CampaignError`.
- `lab.campaign.state`: campaign.json (atomic writes, resume semantics in `settle`).
- `lab.campaign.execute`: `run_campaign`, the progress display, exit codes.
- `lab.campaign.page`: campaign.html.

See docs/campaigns.md.
"""

from lab.campaign.execute import CampaignOutcome, check_store_dir, exit_code, format_plan, run_campaign
from lab.campaign.page import write_page
from lab.campaign.spec import (CampaignError, PlannedRun, Spec, check_dask_address, expand, load_spec, parse_spec,
                               validate_plan)

__all__ = ["CampaignError", "CampaignOutcome", "PlannedRun", "Spec", "check_dask_address", "check_store_dir", "exit_code",
           "expand", "format_plan", "load_spec", "parse_spec", "run_campaign", "validate_plan", "write_page"]
