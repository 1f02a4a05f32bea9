"""Reports of runs: `write_report(run_dir)` writes report.html, the plots, plots.json and junit.xml.

- `lab.report.report`: `write_report`, `load_run`, `ReportError` (the page and its sibling files).
- `lab.report.data`: `plot_data(history)`, the data behind every plot (also `plots.json`).
- `lab.report.plots`: the matplotlib (Agg) PNGs, each shading the nemesis windows.
- `lab.report.junit`: JUnit XML for CI (one testcase per checker).
- `lab.report.serve`: `fencelab serve`, a read-only browser of the store (runs, campaigns, evidence).

See docs/reports.md.
"""

from lab.report.data import plot_data
from lab.report.junit import junit_tree, write_junit
from lab.report.report import ReportError, load_run, write_report

__all__ = ["ReportError", "junit_tree", "load_run", "plot_data", "write_junit", "write_report"]
