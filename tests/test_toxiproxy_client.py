"""The async Toxiproxy client against the real Toxiproxy server (v2.12.0), and interop with `toxiproxy-python`."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted, with a warning each time
from redis.backoff import NoBackoff

from lab.stack.process import free_port, port_open
from lab.stack.toxiproxy import ToxiproxyProcess
from lab.stack.topology import Topology
from lab.stack.toxiproxy_api import ToxiproxyClient, ToxiproxyError, validate_toxic
from conftest import SESSION_PIDS


@pytest.fixture(scope="module")
def toxiproxy_server(tmp_path_factory):
    """One real Toxiproxy server for this module."""
    p = ToxiproxyProcess(tmp_path_factory.mktemp("toxiproxy-client")).start()
    SESSION_PIDS.add(p.pid)
    yield p
    p.stop()
    SESSION_PIDS.discard(p.pid)


@pytest.fixture
async def tp(toxiproxy_server):
    """A client on a clean server: no proxies before or after the test."""
    client = ToxiproxyClient(toxiproxy_server.url, timeout=5.0)
    for name in await client.proxies():
        await client.delete_proxy(name)
    yield client
    await client.reset()
    for name in await client.proxies():
        await client.delete_proxy(name)
    await client.aclose()


def redis_at(addr: str, timeout: float = 0.5) -> aredis.Redis:
    """A redis client with short timeouts and no retries."""
    host, port = addr.rsplit(":", 1)
    return aredis.Redis(host=host, port=int(port), socket_timeout=timeout, socket_connect_timeout=timeout,
                        retry=Retry(NoBackoff(), 0))


async def test_version_and_proxy_lifecycle(tp, valkey):
    version = await tp.version()  # "git" for a `go install` build, "2.12.0" for a release
    assert isinstance(version, str) and version
    made = await tp.create_proxy("c1_valkey", f"127.0.0.1:{valkey.port}")
    assert made["name"] == "c1_valkey" and made["enabled"] is True
    host, port = made["listen"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0  # port 0 asked: the server picked one
    assert set(await tp.proxies()) == {"c1_valkey"}
    got = await tp.get_proxy("c1_valkey")
    assert got["upstream"] == f"127.0.0.1:{valkey.port}" and got["toxics"] == []

    r = redis_at(made["listen"])
    assert await r.ping()
    await r.aclose()

    down = await tp.disable("c1_valkey")
    assert down["enabled"] is False
    assert not port_open(host, int(port))
    up = await tp.enable("c1_valkey")
    assert up["enabled"] is True and up["listen"] == made["listen"]  # same port again
    r = redis_at(made["listen"])
    assert await r.ping()
    await r.aclose()

    await tp.delete_proxy("c1_valkey")
    assert await tp.proxies() == {}


async def test_populate_creates_and_is_idempotent_for_fixed_listen(tp, valkey):
    port = free_port()
    spec = [{"name": "lease-1_valkey", "upstream": f"127.0.0.1:{valkey.port}", "listen": f"127.0.0.1:{port}"},
            {"name": "lease-2_valkey", "upstream": f"127.0.0.1:{valkey.port}"}]
    made = await tp.populate(spec)
    assert {p["name"] for p in made} == {"lease-1_valkey", "lease-2_valkey"}
    assert next(p for p in made if p["name"] == "lease-1_valkey")["listen"] == f"127.0.0.1:{port}"
    again = await tp.populate(spec[:1])
    assert again[0]["listen"] == f"127.0.0.1:{port}"
    assert set(await tp.proxies()) == {"lease-1_valkey", "lease-2_valkey"}


async def test_toxics_add_update_remove_and_reset(tp, valkey):
    await tp.create_proxy("c1_valkey", f"127.0.0.1:{valkey.port}")
    t = await tp.add_toxic("c1_valkey", "latency", name="lat", stream="upstream", toxicity=0.5,
                           attributes={"latency": 100, "jitter": 10})
    assert t == {"name": "lat", "type": "latency", "stream": "upstream", "toxicity": 0.5,
                 "attributes": {"latency": 100, "jitter": 10}}
    default = await tp.add_toxic("c1_valkey", "timeout", attributes={"timeout": 0})
    assert default["name"] == "timeout_downstream" and default["stream"] == "downstream"

    updated = await tp.update_toxic("c1_valkey", "lat", attributes={"latency": 300})
    assert updated["attributes"] == {"latency": 300, "jitter": 10} and updated["toxicity"] == 0.5
    updated = await tp.update_toxic("c1_valkey", "lat", toxicity=1.0)
    assert updated["toxicity"] == 1.0 and updated["attributes"]["latency"] == 300
    assert (await tp.get_toxic("c1_valkey", "lat"))["attributes"]["latency"] == 300
    assert {t["name"] for t in await tp.toxics("c1_valkey")} == {"lat", "timeout_downstream"}

    await tp.remove_toxic("c1_valkey", "lat")
    assert [t["name"] for t in await tp.toxics("c1_valkey")] == ["timeout_downstream"]
    await tp.disable("c1_valkey")
    await tp.reset()
    proxy = await tp.get_proxy("c1_valkey")
    assert proxy["toxics"] == [] and proxy["enabled"] is True


async def test_server_errors_name_the_proxy_toxic_and_message(tp, valkey):
    with pytest.raises(ToxiproxyError) as e:
        await tp.get_proxy("nope_valkey")
    assert e.value.status == 404 and "proxy nope_valkey" in str(e.value) and "proxy not found" in str(e.value)

    await tp.create_proxy("c1_valkey", f"127.0.0.1:{valkey.port}")
    with pytest.raises(ToxiproxyError) as e:
        await tp.create_proxy("c1_valkey", f"127.0.0.1:{valkey.port}")
    assert e.value.status == 409 and "proxy already exists" in e.value.server_message

    await tp.add_toxic("c1_valkey", "latency", name="lat", attributes={"latency": 1})
    with pytest.raises(ToxiproxyError) as e:
        await tp.add_toxic("c1_valkey", "latency", name="lat", attributes={"latency": 1})
    assert e.value.status == 409 and "toxic lat" in str(e.value) and "toxic already exists" in str(e.value)
    with pytest.raises(ToxiproxyError) as e:
        await tp.remove_toxic("c1_valkey", "missing")
    assert e.value.status == 404 and e.value.proxy == "c1_valkey" and e.value.toxic == "missing"


@pytest.mark.parametrize("kwargs,needle", [
    ({"type": "lag"}, "toxic type"),
    ({"type": "latency", "stream": "sideways"}, "stream"),
    ({"type": "latency", "toxicity": 1.5}, "toxicity"),
    ({"type": "latency", "attributes": {"latency": -1}}, "'latency'"),
    ({"type": "latency", "attributes": {"delay": 5}}, "no attribute 'delay'"),
    ({"type": "slicer", "attributes": {"average_size": 4, "size_variation": 4}}, "size_variation"),
    ({"type": "slicer", "attributes": {}}, "average_size"),
])
def test_bad_toxics_are_refused_before_sending(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        validate_toxic(**kwargs)


async def test_bad_arguments_are_value_errors(tp):
    with pytest.raises(ValueError, match="url"):
        ToxiproxyClient("localhost:8474")
    with pytest.raises(ValueError, match="upstream"):
        await tp.create_proxy("x", "no-port")
    with pytest.raises(ValueError, match="proxy name"):
        await tp.get_proxy("a/b")
    with pytest.raises(ValueError, match="unknown field"):
        await tp.populate([{"name": "x", "upstream": "127.0.0.1:1", "toxics": []}])
    assert await tp.proxies() == {}  # nothing was sent


async def test_unreachable_server_is_a_clear_error():
    port = free_port()
    async with ToxiproxyClient(f"http://127.0.0.1:{port}", timeout=0.5) as client:
        with pytest.raises(ToxiproxyError, match=f"Toxiproxy at http://127.0.0.1:{port} did not answer"):
            await client.version()


async def test_toxiproxy_python_reads_and_toggles_a_lab_proxy(tp, toxiproxy_server, valkey):
    """Users who script with `toxiproxy-python` can read and toggle the proxies the lab made."""
    from toxiproxy import Toxiproxy
    from toxiproxy.api import APIConsumer

    topo = await Topology.build(tp, {"valkey": f"127.0.0.1:{valkey.port}"}, [("c1", "valkey")])
    addr = topo.address("c1", "valkey")
    saved = (APIConsumer.host, APIConsumer.port)
    server = Toxiproxy()
    server.update_api_consumer("127.0.0.1", toxiproxy_server.ports["api"])
    try:
        proxy = await asyncio.to_thread(server.get_proxy, "c1_valkey")
        assert proxy is not None
        assert (proxy.listen, proxy.upstream, proxy.enabled) == (addr, f"127.0.0.1:{valkey.port}", True)

        await asyncio.to_thread(proxy.disable)
        assert (await tp.get_proxy("c1_valkey"))["enabled"] is False
        r = redis_at(addr)
        with pytest.raises(redis.ConnectionError):
            await r.ping()
        await r.aclose()

        await asyncio.to_thread(proxy.enable)
        assert (await tp.get_proxy("c1_valkey"))["enabled"] is True
        r = redis_at(addr)
        assert await r.ping()
        await r.aclose()

        # and a toxic the lab added is visible to it
        await tp.add_toxic("c1_valkey", "latency", name="lab-latency", attributes={"latency": 5})
        toxics = await asyncio.to_thread(proxy.toxics)
        assert set(toxics) == {"lab-latency"} and toxics["lab-latency"].attributes["latency"] == 5
    finally:
        APIConsumer.host, APIConsumer.port = saved
        await topo.teardown()
    assert await tp.proxies() == {}

