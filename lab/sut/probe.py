"""Before a run against an external system: is it there, does it take the key, is its store usable?

A run against a wrong URL, a wrong key or a store the server does not write
into records nothing but failures, and a verdict about nothing must never look
like a pass. So before `fencelab test --url ...` creates its run directory,
`probe_external(test)` asks, in order:

1. **health** of every `--url`: the reference wire API's `GET /healthz` must
   answer 200 (contract section 13); another SUT's URL must answer HTTP at all;
2. **auth** on every `--url`: one cheap authenticated request through the
   system's own client (`inspect` of a fresh lab identity of the workload's
   scope): `lease_inspected` or `lease_not_found` pass; `invalid_credential`
   (a wrong key), `access_denied` (a key whose scope does not cover the
   workload's identities), no answer, or any other refusal is refused;
3. **store**, when the workload reads documents back (fenced-append and the
   commit scenarios) and a `--store-url` is given: the store answers with
   its welcome object, accepts the URL's credentials, and holds the database
   the server writes into (`--store-db`, default `fencelab`) unless the user
   said the store is the lab's (`--lab-owns-store`: then the lab creates it).

Any failure is a `ProbeError`: one line naming the URL (passwords redacted),
what was asked and what came back; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any
from urllib.parse import quote

import httpx

from lab.secrets import redact_url
from lab.sut.principal import identity_for
from lab.sut.target import target_of
from lab.sut.registry import WorkloadNeeds, open_system
from lab.testmap import Test

PASSING_CODES = ("lease_inspected", "lease_not_found")


class ProbeError(ValueError):
    """The external system or its store cannot be used as given (one line: what to fix)."""


def probe_external(test: Test, *, needs_store: bool, timeout_s: float = 3.0) -> dict[str, Any]:
    """Probe the test's external system (and store); returns what was checked, raises ProbeError."""
    return asyncio.run(_probe(test, needs_store=needs_store, timeout_s=timeout_s))


async def _probe(test: Test, *, needs_store: bool, timeout_s: float) -> dict[str, Any]:
    urls = list(test.urls or [])
    done: dict[str, Any] = {"urls": [], "store": None}
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        for url in urls:
            await _health(http, test, url)
            await _auth(test, url, timeout_s)
            done["urls"].append(redact_url(url))
        store = test.live.store_url
        if needs_store and store:
            done["store"] = await _store(http, store, store_db(test), create=lab_owns_store(test))
    return done


async def _health(http: httpx.AsyncClient, test: Test, url: str) -> None:
    """The reference API's /healthz is 200; any other SUT's URL answers HTTP."""
    shown = redact_url(url)
    reference = test.sut_name() == "reference"
    target = url.rstrip("/") + ("/healthz" if reference else "/")
    try:
        r = await http.get(target)
    except httpx.HTTPError as e:
        raise ProbeError(f"--url {shown}: cannot reach the system under test ({type(e).__name__}: "
                         f"{e or 'no answer'}): is it running, and is the URL right?") from None
    if reference and r.status_code != 200:
        raise ProbeError(f"--url {shown}: GET /healthz answered HTTP {r.status_code} ({_code_of(r)}), not 200: the "
                         "server is not healthy (or is not a lease server of this API)")


async def _auth(test: Test, url: str, timeout_s: float) -> None:
    """One inspect of a fresh lab identity through the system's own client, with the run's key."""
    shown = redact_url(url)
    # the probe asks only an inspect: the core operations, which every system has
    system = open_system(test, url, f"fencelab-probe-{secrets.token_hex(3)}", needs=WorkloadNeeds("probe"))
    try:
        r = await system.inspect(identity_for(f"probe-{secrets.token_hex(4)}"), deadline_s=timeout_s)
    finally:
        await system.aclose()
    if r.outcome == "ok" or r.code == "lease_not_found":
        return
    msg = f" ({r.msg})" if getattr(r, "msg", None) else ""
    if r.code == "invalid_credential":
        raise ProbeError(f"--url {shown}: the server refused the API key (invalid_credential){msg}: check "
                         "--api-key-file / $FENCELAB_API_KEY")
    if r.code == "access_denied":
        raise ProbeError(f"--url {shown}: the API key's principal may not act on the workload's identities "
                         f"(tenant-a / program-1 / actor-1, capability targets:lease): access_denied{msg}")
    raise ProbeError(f"--url {shown}: an authenticated inspect answered {r.outcome} {r.code}{msg}, not "
                     "lease_inspected or lease_not_found: every operation of the run would fail")


async def _store(http: httpx.AsyncClient, url: str, db: str, *, create: bool) -> dict[str, Any]:
    """The store answers, takes the credentials, and (unless the lab owns it) holds the server's database."""
    shown = redact_url(url)
    base = url.rstrip("/")
    try:
        r = await http.get(base + "/")
    except httpx.HTTPError as e:
        raise ProbeError(f"--store-url {shown}: cannot reach the store ({type(e).__name__}: {e or 'no answer'})") \
            from None
    if r.status_code in (401, 403):
        raise ProbeError(f"--store-url {shown}: the store refused the credentials (HTTP {r.status_code})")
    if r.status_code != 200 or not isinstance(_json(r), dict):
        raise ProbeError(f"--store-url {shown}: GET / answered HTTP {r.status_code} without a CouchDB welcome "
                         "object: is it a CouchDB-API store?")
    if create:
        return {"url": shown, "db": db, "created_by_lab": True}
    try:
        r = await http.get(f"{base}/{quote(db, safe='')}")
    except httpx.HTTPError as e:
        raise ProbeError(f"--store-url {shown}: cannot read database {db!r} ({type(e).__name__}: {e})") from None
    if r.status_code in (401, 403):
        raise ProbeError(f"--store-url {shown}: the store refused the credentials for database {db!r} "
                         f"(HTTP {r.status_code})")
    if r.status_code == 404:
        raise ProbeError(f"--store-url {shown}: the store has no database {db!r}: it is not the store the server "
                         "under test writes into (or --store-db names another database); the lab creates nothing "
                         "in a store it does not own (say --lab-owns-store if this is a scratch store)")
    if r.status_code != 200:
        raise ProbeError(f"--store-url {shown}: GET /{db} answered HTTP {r.status_code}")
    return {"url": shown, "db": db, "doc_count": (_json(r) or {}).get("doc_count")}


def store_db(test: Test) -> str:
    """The database the server under test writes its fenced documents into (`--store-db`, default fencelab)."""
    return str(test.store_db or "fencelab")


def lab_owns_store(test: Test) -> bool:
    """May the lab create the database and install its own fence guard in the run's store?

    Only when the lab started the store itself (a local stack without --store-url), or when the user says so
    (`--lab-owns-store`). Never in a store the system under test brought: the guard is protection the lab
    would be supplying to the system it tests.
    """
    if test.lab_owns_store:
        return True
    return target_of(test).lab_runs and not test.store_url


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _code_of(r: httpx.Response) -> str:
    body = _json(r)
    return str(body.get("code")) if isinstance(body, dict) and body.get("code") else r.reason_phrase or "no code"
