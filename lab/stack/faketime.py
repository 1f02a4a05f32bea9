"""Per-process fake clocks through Debian's libfaketime (for the clock nemesis).

A process started with `faketime_env(file)` reads its wall-clock offset from
`file` on every time call (`FAKETIME_NO_CACHE=1`), so the nemesis moves its
clock by rewriting one small file. Monotonic clocks are left alone
(`FAKETIME_DONT_FAKE_MONOTONIC=1`): servers keep sane timeouts and event
loops, while `TIME` in Valkey, key expiry and `time.time()` follow the offset.
"""

from __future__ import annotations

import os
from pathlib import Path

from lab import paths


def faketime_env(clock_file: Path) -> dict[str, str]:
    """Environment that puts a process under libfaketime, reading its offset from `clock_file`."""
    clock_file = Path(clock_file)
    if not clock_file.exists():
        FakeClock(clock_file).reset()
    return {
        "LD_PRELOAD": str(paths.libfaketime()),
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


class FakeClock:
    """The offset file of one process's fake clock."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def set_offset(self, seconds: float) -> None:
        """Shift the process's wall clock by `seconds` (relative to the real clock) from now on."""
        if not isinstance(seconds, (int, float)) or seconds != seconds or abs(seconds) > 10 * 365 * 86400:
            raise ValueError(f"clock offset must be a finite number of seconds within 10 years, not {seconds!r}")
        self._write(f"{seconds:+.3f}")

    def reset(self) -> None:
        """Back to the real clock."""
        self._write("+0")

    def offset(self) -> float:
        """The offset currently in force, in seconds."""
        return float(self.path.read_text().strip() or 0)

    def _write(self, text: str) -> None:
        # write-then-rename: a reader never sees a half-written offset
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, self.path)
