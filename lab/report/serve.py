"""`fencelab serve`: a read-only browser of the store directory (Starlette + uvicorn, loopback by default).

    /                 the index: every run (test, time, verdict, ops, its report), every
                      campaign.html and evidence.html found under the store
    /api/index.json   the same index as JSON
    /files/<path>     a file of the store, or a listing of one of its directories

Only files inside the store are served: a path is resolved (symlinks
included) and refused with 404 when it lands outside the store directory.
Hidden files and secrets (a stack's `credentials.json` and `principals.json`,
keys and certificates) are never served (403). Nothing is written: a run
without a report links to its directory; `fencelab report RUN_DIR` writes one.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from lab.report.report import run_time, verdict_word
from lab.secrets import SECRET_FILES
from lab.templating import template_env

__all__ = ["ServeError", "create_app", "scan_store", "serve_store"]

DENIED = (*SECRET_FILES, ".*")  # never served
TEXT_SUFFIXES = {".jsonl", ".edn", ".log", ".txt", ".md", ".lua"}  # shown in the browser, not downloaded
MAX_DEPTH = 6  # directory levels searched below the store for runs, campaigns and evidence
PAGES = ("campaign.html", "evidence.html")

_ENV = template_env(Path(__file__).parent)


class ServeError(RuntimeError):
    """The store cannot be served as asked (no such directory, bad port, address in use)."""


def is_denied(name: str) -> bool:
    """Is this file name one that is never served (hidden files, secrets)?"""
    return any(fnmatch.fnmatch(name, pat) for pat in DENIED)


def _is_run(files: list[str]) -> bool:
    """Does a directory holding these files look like a run (store/<test>/<timestamp>/)?"""
    return "history.jsonl" in files or "test.json" in files


def _run_entry(root: Path, d: Path) -> dict:
    """One run of the index: its test, time, verdict and ops (from results.json), and its report."""
    verdict, ops = "no results", None
    try:
        results = json.loads((d / "results.json").read_text(encoding="utf-8"))
        verdict, ops = verdict_word(results.get("valid")), results.get("ops")
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError):
        verdict = "unreadable results"
    rel = d.relative_to(root).as_posix()
    return {"test": d.parent.relative_to(root).as_posix() or ".", "run": d.name, "path": rel,
            "time": run_time(d), "verdict": verdict, "ops": ops,
            "report": f"{rel}/report.html" if (d / "report.html").is_file() else None}


def scan_store(root: str | os.PathLike) -> dict[str, list[dict]]:
    """Runs (newest first), campaign pages and evidence pages under the store (symlinks not followed)."""
    root = Path(root).resolve()
    runs, pages = [], {p: [] for p in PAGES}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        d = Path(dirpath)
        depth = len(d.relative_to(root).parts)
        for page in PAGES:
            if page in filenames:
                pages[page].append({"name": d.relative_to(root).as_posix() or ".",
                                    "path": (d / page).relative_to(root).as_posix(),
                                    "time": run_time(d)})
        if depth and _is_run(filenames):
            runs.append(_run_entry(root, d))
            dirnames[:] = []  # a run holds no other run (its stack/ is not searched)
        elif depth >= MAX_DEPTH:
            dirnames[:] = []
        else:
            dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
    runs.sort(key=lambda r: (r["time"], r["path"]), reverse=True)
    return {"runs": runs, "campaigns": sorted(pages["campaign.html"], key=lambda p: p["path"]),
            "evidence": sorted(pages["evidence.html"], key=lambda p: p["path"])}


def _inside(root: Path, rel: str) -> Path | None:
    """The store path for a request path, or None when it resolves outside the store."""
    try:
        target = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
        return None
    return target if target == root or target.is_relative_to(root) else None


def _listing(root: Path, d: Path) -> list[dict]:
    """The entries of a store directory (denied names left out), directories first."""
    out = []
    for p in sorted(d.iterdir(), key=lambda p: (not p.is_dir(), p.name)):
        if is_denied(p.name):
            continue
        is_dir = p.is_dir()
        out.append({"name": p.name + ("/" if is_dir else ""), "href": p.name + ("/" if is_dir else ""),
                    "bytes": None if is_dir else p.stat().st_size})
    return out


def create_app(store_dir: str | os.PathLike, *, host: str = "127.0.0.1") -> Starlette:
    """The Starlette app serving `store_dir` read-only (see the module docstring)."""
    root = Path(store_dir).resolve()

    async def index(request: Request) -> Response:
        return HTMLResponse(_ENV.get_template("index.html.j2").render(store=str(root), **scan_store(root)))

    async def index_json(request: Request) -> Response:
        return JSONResponse(dict(scan_store(root), store=str(root)))

    async def files(request: Request) -> Response:
        rel = request.path_params["path"]
        target = _inside(root, rel)
        if target is None or not target.exists():
            return PlainTextResponse("not found in the store\n", status_code=404)
        if any(is_denied(part) for part in target.relative_to(root).parts):
            return PlainTextResponse("this file is not served (hidden or secret)\n", status_code=403)
        if target.is_dir():
            if rel and not rel.endswith("/"):
                return RedirectResponse(request.url.path + "/", status_code=308)
            page = _ENV.get_template("listing.html.j2").render(path="/" + rel, entries=_listing(root, target),
                                                               parent=bool(rel))
            return HTMLResponse(page)
        media = "text/plain; charset=utf-8" if target.suffix in TEXT_SUFFIXES else None
        return FileResponse(target, media_type=media)

    middleware = []
    if host in ("127.0.0.1", "localhost"):
        # Refuses other Host headers, so a web page cannot read the store through DNS rebinding.
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost"]))
    return Starlette(routes=[
        Route("/", index, methods=["GET", "HEAD"]),
        Route("/api/index.json", index_json, methods=["GET", "HEAD"]),
        Route("/files/{path:path}", files, methods=["GET", "HEAD"]),
    ], middleware=middleware)


def is_loopback(host: str) -> bool:
    """Is `host` a loopback address (or localhost)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or ServeError naming the address."""
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, type_, proto)
    except (OSError, UnicodeError) as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve_store(store_dir: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8080,
                echo: Callable[[str], Any] = print) -> None:
    """Serve the store until interrupted (Ctrl-C or SIGTERM); prints the URL first (port 0 picks a free one)."""
    root = Path(store_dir)
    if not root.is_dir():
        raise ServeError(f"no store directory {root} (runs land in --store-dir, default ./store; "
                         "run `fencelab test` first)")
    if not 0 <= port <= 65535:
        raise ServeError(f"--port must be between 0 and 65535, not {port}")
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    echo(f"fencelab: serving {root.resolve()} at http://{shown}:{bound}/ (Ctrl-C to stop)")
    if not is_loopback(host):
        echo(f"fencelab: warning: {host} is not a loopback address: other machines can browse this store")
    config = uvicorn.Config(create_app(root, host=host), log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
