"""Run-level shrinking (`fencelab shrink RUN_DIR`, docs/shrinking.md): the smallest configuration that still
reproduces an invalid run's violation, with its reproduction rate.

`lab.shrink.search` is the search, pure over a `trial(candidate, rep) -> bool`; `lab.shrink.run` drives it over
`lab.runner.run_test` (a driver over runs, like campaigns and `lab.exposure`) and writes shrink.jsonl, shrink.json
and the runs; `lab.shrink.page` writes shrink.html.
"""

from lab.shrink.run import LOG, RESULT, STOPPED_WORDS, ShrinkError, ShrinkReport, exit_code, shrink_run
from lab.shrink.search import Candidate, Outcome, Space, Step, search

__all__ = ["LOG", "RESULT", "STOPPED_WORDS", "Candidate", "Outcome", "ShrinkError", "ShrinkReport", "Space", "Step",
           "exit_code", "search", "shrink_run"]
