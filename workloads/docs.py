"""Generate docs/workloads.md from the workload registry: `python -m workloads.docs [--check]`."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from workloads import WORKLOADS

OUT = Path(__file__).resolve().parent.parent / "docs" / "workloads.md"


def render() -> str:
    """The Markdown page: one section per registered workload, from its module docstring."""
    lines = ["# Workloads", "",
             "Generated from the registry in `workloads/__init__.py` by `python -m workloads.docs`; do not edit.",
             "Run one with `fencelab test --workload NAME`.", ""]
    for name in sorted(WORKLOADS):
        mod = WORKLOADS[name]
        lines += [f"## `{name}`", "", inspect.cleandoc(mod.__doc__ or "(undocumented)"), "",
                  f"Module: `{mod.__name__}`. {inspect.getdoc(mod.workload) or ''}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run `python -m workloads.docs`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
