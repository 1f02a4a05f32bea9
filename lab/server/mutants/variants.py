"""The Python side of the planted bugs: the classes a mutant server is built from (see lab/server/mutants).

`server_parts(settings)` is the one entry point `LeaseServer` calls, and only
when `settings.mutant` is set: it returns the mutant's settings and the backend,
lease-service and commit-service classes to build the server from. Every mutant
gets `MutantBackend`, whose scripts carry the mutant's Lua patches (none for the
settings-only mutants); a few replace more:

- `NonatomicAcquireService` (nonatomic-acquire): acquire as GET then SET. The
  server reads the record in one round trip and decides "free" itself, then runs
  the write step (the acquire script without its free-check) in another. An
  awaited hook between the two (`hooks["between"]`) lets tests hold one acquire
  there deterministically; lab runs rely on ordinary concurrency.
- `LocalClockBackend` (local-clock): every script call gets the server's
  `time.time()` as its last argument, which the patched `now_ms()` returns.
- `NoIdempotencyCommits` (no-idempotency): a commit's final idempotency record
  is not written either (the scripts neither read nor write theirs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from typing import Any, Awaitable, Callable, Sequence

from lab.server.backend import Backend, BackendError, NotStarted
from lab.server.commit import CommitService
from lab.server.errors import LeaseError
from lab.server.mutants import LuaPatch, Mutant, get_mutant
from lab.server.scripts import LUA_DIR, Script
from lab.server.service import LeaseService
from lab.server.settings import Settings

log = logging.getLogger("lab.server.mutants")

Hook = Callable[[], Awaitable[None]]


class MutantError(RuntimeError):
    """A mutant's Lua patch does not apply to the scripts (the built-in Lua changed)."""


def patch_scripts(scripts: dict[str, Script], patches: Sequence[LuaPatch]) -> dict[str, Script]:
    """The scripts with every patch applied: `common` patches to every script's helpers, others to one body."""
    common = (LUA_DIR / "common.lua").read_text(encoding="utf-8")
    out = {}
    for name, script in scripts.items():
        if not script.source.startswith(common + "\n"):  # pragma: no cover - scripts.py prepends it
            raise MutantError(f"{name}: the script does not start with common.lua")
        head, body = common, script.source[len(common) + 1:]
        for p in patches:
            if p.part == "common":
                head = _replace_once(head, p, "common.lua")
            elif p.part == name:
                body = _replace_once(body, p, f"{name}.lua")
        source = head + "\n" + body
        changed = source != script.source
        out[name] = Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest(),
                           script.overridden or changed)
    unknown = {p.part for p in patches} - set(scripts) - {"common"}
    if unknown:
        raise MutantError(f"a patch names {sorted(unknown)[0]!r}, which is not a script")
    return out


def _replace_once(text: str, patch: LuaPatch, where: str) -> str:
    """`text` with `patch.old` replaced; MutantError unless it occurs exactly once."""
    n = text.count(patch.old)
    if n != 1:
        raise MutantError(f"{where}: the text a mutant patch replaces occurs {n} times, not once: {patch.old!r}")
    return text.replace(patch.old, patch.new)


class MutantBackend(Backend):
    """The backend with the mutant's Lua patches applied to every script it loads."""

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.mutant: Mutant = get_mutant(settings.mutant)
        self.scripts = patch_scripts(self.scripts, self.mutant.patches)


class LocalClockBackend(MutantBackend):
    """local-clock: the server's wall clock rides along as every script's last argument."""

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Any], deadline: float) -> list:
        return await super().run(name, keys, [*args, int(time.time() * 1000)], deadline)


class NonatomicAcquireService(LeaseService):
    """nonatomic-acquire: the free-check is a separate read, so concurrent acquires can all pass it."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.hooks: dict[str, Hook] = {}  # "between": awaited after the read, before the write

    async def run(self, name: str, key_list: list[str], args: list[Any], deadline: float, *, mutation: bool) -> list:
        if name != "acquire":
            return await super().run(name, key_list, args, deadline, mutation=mutation)
        lock_key, idempotency_key = key_list[0], key_list[3]
        try:
            (now_s, us), (expires,), replay = await self.backend.pipeline(
                [("TIME",), ("HMGET", lock_key, "expires_at"), ("EXISTS", idempotency_key)], deadline)
        except NotStarted:
            raise LeaseError("deadline_exceeded", "the deadline passed before the request reached the lease store",
                             backend_health="not_contacted") from None
        except (BackendError, ValueError, TypeError):
            raise LeaseError("lease_backend_unavailable", "the lease store is unavailable; nothing was changed",
                             retry_after_ms=200, backend_health="unavailable") from None
        now = int(now_s) * 1000 + int(us) // 1000
        if not replay and expires is not None and expires.isdigit() and int(expires) > now:
            return ["lease_conflict", str(now), str(int(expires) - now)]
        hook = self.hooks.get("between")
        if hook is not None:
            await hook()
        return await super().run(name, key_list, args, deadline, mutation=mutation)


class NoIdempotencyCommits(CommitService):
    """no-idempotency: the commit's final idempotency record is not written (nothing would read it)."""

    async def remember(self, *args: Any, **kw: Any) -> None:
        return None


_VARIANTS: dict[str, type] = {c.__name__: c for c in (LocalClockBackend, NonatomicAcquireService,
                                                       NoIdempotencyCommits)}


def server_parts(settings: Settings) -> tuple[Settings, type[Backend], type[LeaseService], type[CommitService]]:
    """The mutant's settings and the (backend, service, commits) classes to build its server from."""
    mutant = get_mutant(settings.mutant)
    settings = dataclasses.replace(settings, **mutant.settings).validate() if mutant.settings else settings
    parts: dict[type, type] = {Backend: MutantBackend, LeaseService: LeaseService, CommitService: CommitService}
    for name in mutant.variants:
        cls = _VARIANTS[name]
        for base in parts:
            if issubclass(cls, base):
                parts[base] = cls
    log.warning("PLANTED BUG: mutant %s is active (%s)", mutant.name, mutant.bug)
    return settings, parts[Backend], parts[LeaseService], parts[CommitService]
