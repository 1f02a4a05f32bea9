"""Stack names, where their state lives, and the errors every backend raises."""

from __future__ import annotations

import os
import re
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class StackError(RuntimeError):
    """A stack cannot be brought up, found, or stopped as asked."""


class NemesisUnavailable(RuntimeError):
    """A fault cannot be injected here (not root, a binary or library missing); the message is one line.
    Raised by the nemeses and by the stack's fault substrates (network namespaces); `nemesis.core` re-exports it."""


def fencelab_home() -> Path:
    """Where named stacks keep their state: $FENCELAB_HOME or ~/.fencelab."""
    return Path(os.environ.get("FENCELAB_HOME") or Path.home() / ".fencelab")


def stack_dir(name: str, home: Path | None = None) -> Path:
    """The state directory of stack `name` (validated: it becomes a path component)."""
    if not NAME_RE.match(name):
        raise StackError(f"invalid stack name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    return (home or fencelab_home()) / "stacks" / name
