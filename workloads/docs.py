"""Generate docs/workloads.md from the workload registry: `python -m workloads.docs [--check]`."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from workloads import WORKLOADS

OUT = Path(__file__).resolve().parent.parent / "docs" / "workloads.md"


STALLS_DOC = """## Stalls

The lease workloads (`lease`, `fenced-append`, `idempotency`) make stale holders by themselves: a stalled
session sleeps 1.15-1.6 x the TTL on the takeover key while another thread polls for it, then acts on its
old lease; a solo session sleeps 1.05-1.5 x the TTL on a key of its own (`workloads/common.py`). That is
Kleppmann's paused holder without a fault, and it is on by default, so a default run exercises every row.
The poll lasts up to 3 x the TTL, whatever the ops' speed (it was 50 attempts: about 2.5 s at the
defaults, so on a fast run the successor could give up just before the holder's lease expired).

`--stalls off` (campaigns and mutants rows: `stalls = "off"`; kept in the replay) makes every session a
plain one: no sleep past the TTL, no expiry-edge commits, and so no stale holder unless a fault (a
`client-pause`, a partition, a clock step) or a crash-and-carry-on (`--after-info abandon` turns that off
too) makes one. Use it to ask whether a fault alone breaks a system, and to shrink a failure to the fault
that causes it: with stalls on, `fencelab shrink` drops a client pause whenever the workload's own stall
reproduces the violation (docs/shrinking.md)."""


def render() -> str:
    """The Markdown page: one section per registered workload, from its module docstring."""
    lines = ["# Workloads", "",
             "Generated from the registry in `workloads/__init__.py` by `python -m workloads.docs`; do not edit.",
             "Run one with `fencelab test --workload NAME`.", "", STALLS_DOC, ""]
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
