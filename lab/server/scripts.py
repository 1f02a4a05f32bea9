"""The Valkey Lua scripts: one script per operation, each one atomic step.

Each operation's whole decision and effect lives in `lua/<operation>.lua`;
`lua/common.lua` (helpers only, no effect of its own) is prepended to every
one. A planted bug (a mutant) replaces one operation by pointing the
`script_dir` setting at a directory holding its own `<operation>.lua`; the
other operations keep the built-in source.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

LUA_DIR = Path(__file__).with_name("lua")
OPERATIONS = ("acquire", "renew", "release", "force_release", "revoke", "inspect", "inspect_id", "list", "commit",
              "recover")


@dataclass(frozen=True)
class Script:
    """One operation's full Lua source and its SHA-1 (the EVALSHA handle)."""

    name: str
    source: str
    sha: str
    overridden: bool = False


def _script(name: str, body: str, overridden: bool) -> Script:
    source = (LUA_DIR / "common.lua").read_text(encoding="utf-8") + "\n" + body
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest(), overridden)


def load_scripts(script_dir: str | Path | None = None) -> dict[str, Script]:
    """All operation scripts; a `script_dir` may override any of them by file name."""
    override_dir = Path(script_dir) if script_dir else None
    if override_dir is not None:
        unknown = sorted(p.stem for p in override_dir.glob("*.lua") if p.stem not in OPERATIONS)
        if unknown:
            raise ValueError(f"script_dir: {unknown[0]}.lua is not an operation ({', '.join(OPERATIONS)})")
    scripts = {}
    for name in OPERATIONS:
        path = LUA_DIR / f"{name}.lua"
        overridden = False
        if override_dir is not None and (override_dir / f"{name}.lua").exists():
            path, overridden = override_dir / f"{name}.lua", True
        scripts[name] = _script(name, path.read_text(encoding="utf-8"), overridden)
    return scripts
