"""fencelab: a Jepsen-style test lab for lease and fencing systems.

`lab` holds orchestration (the local stack), the reference lease server, the
history store, reports and the CLI. See docs/architecture.md.
"""

__version__ = "0.1.0"
