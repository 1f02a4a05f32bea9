"""The `register` workload: plain read / write / cas on Valkey keys, a baseline that checks the store itself.

Each key is an independent linearizable register (Jepsen's cas-register):
`read` returns the value (null when unset), `write` sets it, `cas [old, new]`
sets it only if it holds `old` (one Lua script: atomic inside Valkey). The
checker is the linearizability engine with the `cas-register` model, per key.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted, with a warning each time
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

import lab.generator as gen
from checkers.core import compose, get_checker
from lab.sut import WorkloadNeeds
from workloads.base import Workload
from workloads.common import key_names

DOC = __doc__
NEEDS = WorkloadNeeds("register", lab_only=True)  # it tests the lab's own Valkey, not a lease system

CAS_SCRIPT = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end
return 0
"""
# A cas whose expected value is "unset" (Jepsen: cas from nil).
CAS_FROM_NIL_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) return 1 end
return 0
"""


def valkey_client(url: str, timeout_s: float = 1.0) -> aioredis.Redis:
    """redis.asyncio with retries OFF: redis-py's default re-sends commands and would corrupt the history."""
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                   retry=Retry(NoBackoff(), 0), retry_on_timeout=False, retry_on_error=[],
                                   decode_responses=True)


class RegisterDriver:
    """A worker's Valkey connection for register ops."""

    def __init__(self, timeout_s: float = 1.0, conn: aioredis.Redis | None = None, prefix: str = "fencelab:reg:"):
        self.timeout_s = timeout_s
        self.conn = conn
        self.prefix = prefix

    async def open(self, test, node: str) -> "RegisterDriver":
        return RegisterDriver(self.timeout_s, valkey_client(test.live.valkey, self.timeout_s), self.prefix)

    async def setup(self, test) -> None:
        return None

    async def teardown(self, test) -> None:
        return None

    async def close(self, test) -> None:
        if self.conn is not None:
            await self.conn.aclose()

    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        """read/write/cas; a read that errs is `fail` (no effect), a write or cas that errs is `info`."""
        f, key, value = op["f"], self.prefix + str(op.get("key")), op.get("value")
        try:
            if f == "read":
                got = await self.conn.get(key)
                return {"type": "ok", "value": None if got is None else int(got)}
            if f == "write":
                await self.conn.set(key, int(value))
                return {"type": "ok", "value": value}
            if f == "cas":
                old, new = value
                if old is None:
                    won = await self.conn.eval(CAS_FROM_NIL_SCRIPT, 1, key, int(new))
                else:
                    won = await self.conn.eval(CAS_SCRIPT, 1, key, str(int(old)), int(new))
                return {"type": "ok" if won == 1 else "fail", "value": value}
        except RedisConnectionError as e:
            # a refused connection sent nothing; anything else may have reached Valkey
            definite = f == "read" or "Connection refused" in str(e)
            return {"type": "fail" if definite else "info", "value": value, "error": f"connection: {e}"}
        except (RedisTimeoutError, RedisError, OSError) as e:
            return {"type": "fail" if f == "read" else "info", "value": value, "error": f"{type(e).__name__}: {e}"}
        raise ValueError(f"register workload: unknown f {f!r}")


def workload(test):
    """Random reads, writes and cas on `test.keys` registers, checked for linearizability per key."""
    keys = key_names(test.keys)

    def one(test_, ctx):
        k, r = ctx.rng.choice(keys), ctx.rng.random()
        if r < 0.5:
            return {"f": "read", "key": k, "value": None}
        if r < 0.75:
            return {"f": "write", "key": k, "value": ctx.rng.randint(0, 4)}
        return {"f": "cas", "key": k, "value": [ctx.rng.randint(0, 4), ctx.rng.randint(0, 4)]}

    return Workload(
        name="register",
        client=RegisterDriver(timeout_s=float(test.deadline_s or 1.0)),
        generator=gen.stagger(1.0 / test.rate, one),
        checker=compose({"linearizable": get_checker("linearizable", model="cas-register"),
                         "availability": get_checker("availability")}),
        nodes=lambda t: [t.live.valkey],
        doc=DOC,
    )
