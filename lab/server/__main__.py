"""`python -m lab.server`: run one reference lease server instance with uvicorn.

    python -m lab.server --host H --port P --valkey-url URL --principals FILE
                         --instance-id NAME --audit-log PATH [--config FILE]
                         [--store-url URL] [--allow-mutants [--mutant NAME]]

Everything is validated before the server starts; a bad argument prints one
line `lab.server: error: ...` and exits with status 2. Command-line values
override the same settings in the `--config` JSON file.

`--store-url` names the CouchDB-API document store of the fenced-write
boundary (`POST /api/v1/commits`) and of the recovery rule's durable epoch.
`--allow-mutants` is a lab-run-only switch: without it the planted-bug
settings (`commit_mode: unfenced`, `recovery: off`, `--mutant NAME`: the named
planted bugs of lab/server/mutants, docs/mutants.md) are refused.
"""

from __future__ import annotations

import argparse
import os
import logging
import re
import sys
from pathlib import Path
from typing import NoReturn

import uvicorn

from lab.server.app import create_app
from lab.server.auth import PrincipalsError, load_principals
from lab.server.protocol import protocol_class
from lab.server.settings import Settings, SettingsError, load_settings

_INSTANCE_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error format."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        fail(message)


def fail(message: str) -> NoReturn:
    """Print one clear error line and exit 2."""
    print(f"lab.server: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    """Parse and validate the command line into (args, settings)."""
    ap = _Parser(prog="python -m lab.server", description="fencelab reference lease server")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", required=True, type=int)
    ap.add_argument("--valkey-url", required=True)
    ap.add_argument("--principals", required=True, type=Path)
    ap.add_argument("--instance-id", required=True)
    ap.add_argument("--audit-log", required=True, type=Path)
    ap.add_argument("--config", type=Path)
    ap.add_argument("--store-url", default=os.environ.get("FENCELAB_STORE_URL") or None,
                    help="CouchDB-API store of the fenced-write boundary [env FENCELAB_STORE_URL: keeps a "
                         "password out of the process list]")
    ap.add_argument("--allow-mutants", action="store_true",
                    help="lab runs only: accept planted-bug settings (commit_mode unfenced, recovery off, --mutant)")
    ap.add_argument("--mutant", help="lab runs only (needs --allow-mutants): plant the named bug (docs/mutants.md)")
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = ap.parse_args(argv)
    if not 1 <= args.port <= 65535:
        fail(f"--port: must be between 1 and 65535, not {args.port}")
    if not _INSTANCE_RE.match(args.instance_id):
        fail("--instance-id: must be 1-64 characters of A-Z a-z 0-9 . _ : -")
    try:
        load_principals(args.principals)
    except PrincipalsError as e:
        fail(f"--principals: {e}")
    try:
        args.audit_log.parent.mkdir(parents=True, exist_ok=True)
        with open(args.audit_log, "ab"):
            pass
    except OSError as e:
        fail(f"--audit-log: cannot write {args.audit_log}: {e.strerror}")
    try:
        seed = Settings(allow_mutants=args.allow_mutants)
        base = load_settings(args.config, seed) if args.config else seed
        overrides = dict(valkey_url=args.valkey_url, principals_file=str(args.principals),
                         instance_id=args.instance_id, audit_log=str(args.audit_log))
        if args.store_url is not None:
            overrides["store_url"] = args.store_url
        if args.mutant is not None:
            overrides["mutant"] = args.mutant
        settings = base.replace(**overrides)
    except SettingsError as e:
        fail(f"--config: {e}" if args.config else str(e))
    return args, settings


def main(argv: list[str] | None = None) -> None:
    """Validate, then serve until SIGTERM/SIGINT."""
    args, settings = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(settings)
    http = protocol_class(settings.header_timeout_ms, settings.max_header_bytes, settings.max_header_fields)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                loop="auto", http=http, lifespan="on", timeout_graceful_shutdown=3,
                proxy_headers=False, server_header=False)


if __name__ == "__main__":
    main()
