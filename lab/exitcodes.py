"""One exit-code table for every command that gives a verdict: test, analyze, check, campaign, evidence, mutants.

docs/cli.md#exit-codes documents it; every command's help points there.

| code | meaning |
|---|---|
| 0 | valid (every run, file or row) |
| 1 | invalid (any) |
| 2 | bad input: an option, a file, a spec or a system the command cannot work with; nothing was judged |
| 3 | unknown (any verdict that could not be decided, and none invalid; a run that failed to complete) |
| 130 | interrupted (Ctrl-C or SIGTERM): the partial run is kept; `fencelab analyze <dir>` judges it |
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_VALID, EXIT_INVALID, EXIT_BAD_INPUT, EXIT_UNKNOWN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def verdict_exit(valid: Any) -> int:
    """The exit code of one merged verdict: True 0, False 1, anything else (unknown) 3."""
    return EXIT_VALID if valid is True else EXIT_INVALID if valid is False else EXIT_UNKNOWN


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (like Ctrl-C), so a run stops its stack and keeps its partial history
    (exit 130). Only the main thread can take signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
