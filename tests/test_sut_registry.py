"""The SUT registry: names, entry points, module:Factory specs, capabilities, result checks, credentials."""

from __future__ import annotations

import sys
import textwrap

import pytest

import lab.sut as sut
from lab.client import Identity, Lease, LeaseClient, Result
from lab.client.starintel import StarIntelClient
from lab.sut import SutError, get_sut, open_system, register_sut, sut_names, unregister_sut, validate_test
from lab.testmap import RunContext, Test
from workloads import WORKLOADS, needs_of
from workloads.common import lease_client


def validated(test: Test):
    """`validate_test` as the runner calls it: with what the test's workload declares it needs."""
    return validate_test(test, needs_of(test.workload))


def opened(test: Test, node: str, instance: str):
    """`open_system` as a workload calls it: with what the test's workload declares it needs."""
    return open_system(test, node, instance, needs=needs_of(test.workload))

ID = Identity("t", "p", "ns", "k", "a", "wf")
GOOD_KEY = "star_sk_v1_cred1_" + "ab" * 32


class TinySystem:
    """A minimal system: every call succeeds with one lease."""

    capabilities = frozenset({"revoke"})

    def __init__(self, test, node, service_instance_id):
        self.node, self.instance = node, service_instance_id

    async def acquire(self, identity, *, ttl_ms, request_id=None, deadline_s=None):
        return Result("ok", "lease_acquired", lease=Lease("l1", 1, "active", 0, 0, ttl_ms, ttl_ms))

    async def renew(self, lease, **kw):
        return Result("ok", "lease_renewed")  # malformed on purpose: an ok renew without its lease

    async def release(self, lease, **kw):
        return "released"  # malformed on purpose: not a Result

    async def inspect(self, target, **kw):
        return Result("fail", "lease_not_found")

    async def revoke(self, lease, reason, **kw):
        return Result("maybe", "lease_revoked")  # malformed on purpose: not an outcome

    async def aclose(self):
        return None


@pytest.fixture
def tiny():
    register_sut("tiny", TinySystem)
    yield
    unregister_sut("tiny")


def test_builtins_and_unknown_names():
    assert {"reference", "starintel"} <= set(sut_names())
    assert get_sut("starintel").capabilities == {"revoke"}
    assert get_sut("reference").capabilities == {"commit", "force_release", "revoke"}
    with pytest.raises(SutError, match=r"unknown SUT 'nope'; known: .*reference.*starintel.*module\.path:Factory"):
        get_sut("nope")
    with pytest.raises(SutError, match="already registered"):
        register_sut("reference", TinySystem)
    with pytest.raises(SutError, match="unknown capabilities \\['fly'\\]"):
        register_sut("flying", TinySystem, capabilities={"fly"})
    with pytest.raises(SutError, match="callable"):
        register_sut("broken", 42)
    assert sut.__all__ and all(hasattr(sut, name) for name in sut.__all__)


async def test_third_party_results_are_checked(tiny):
    test = Test(workload="lease", extra={"sut": "tiny"})
    system = opened(test, "n1", "w-1")
    assert system.instance == "w-1" and (await system.acquire(ID, ttl_ms=5)).ok
    lease = (await system.acquire(ID, ttl_ms=5)).lease
    with pytest.raises(SutError, match=r"'tiny'.*TinySystem\)\.renew returned ok without a Lease"):
        await system.renew(lease)
    with pytest.raises(SutError, match=r"release returned str, not a lab.client.Result"):
        await system.release(lease)
    with pytest.raises(SutError, match=r"revoke returned outcome 'maybe'"):
        await system.revoke(lease, "why")
    system.clock_ms = lambda: 7  # attributes pass through to the system (the clock nemesis sets this)
    assert system._system.clock_ms() == 7


def test_capabilities_are_enforced(tiny):
    with pytest.raises(SutError, match="fenced-append.*needs commit.*'tiny'"):
        opened(Test(workload="fenced-append", extra={"sut": "tiny"}), "n", "w")

    class Liar(TinySystem):
        capabilities = frozenset({"commit"})

    register_sut("liar", Liar)
    try:
        with pytest.raises(SutError, match="lacks commit"):
            opened(Test(workload="lease", extra={"sut": "liar"}), "n", "w")
    finally:
        unregister_sut("liar")


def test_factories_must_return_the_system():
    async def factory(test, node, sid):
        return TinySystem(test, node, sid)

    register_sut("async-factory", factory)
    try:
        with pytest.raises(SutError, match="returned an awaitable"):
            opened(Test(extra={"sut": "async-factory"}), "n", "w")
    finally:
        unregister_sut("async-factory")


def test_module_factory_specs(tmp_path, monkeypatch):
    (tmp_path / "my_lease_lib.py").write_text(textwrap.dedent('''
        from test_sut_registry import TinySystem

        class Plugged(TinySystem):
            capabilities = frozenset()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = get_sut("my_lease_lib:Plugged")
    assert entry.capabilities == frozenset() and get_sut("my_lease_lib:Plugged") is entry
    assert type(opened(Test(extra={"sut": "my_lease_lib:Plugged"}), "n", "w")._system).__name__ == "Plugged"
    with pytest.raises(SutError, match="has no 'Nope'"):
        get_sut("my_lease_lib:Nope")
    with pytest.raises(SutError, match="cannot import 'no_such_module_xyz'"):
        get_sut("no_such_module_xyz:X")
    unregister_sut("my_lease_lib:Plugged")


def test_entry_point_group(tmp_path, monkeypatch):
    """A package installed with a `fencelab.suts` entry point is found by name."""
    (tmp_path / "ep_lease_pkg.py").write_text("from test_sut_registry import TinySystem as System\n")
    dist = tmp_path / "ep_lease_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-lease-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[fencelab.suts]\nep-tiny = ep_lease_pkg:System\n"
                                           "ep-broken = ep_lease_pkg:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert {"ep-tiny", "ep-broken"} <= set(sut_names())
        assert get_sut("ep-tiny").capabilities == {"revoke"}
        with pytest.raises(SutError, match="cannot load entry point 'ep_lease_pkg:Missing'"):
            get_sut("ep-broken")
    finally:
        unregister_sut("ep-tiny")
        sys.modules.pop("ep_lease_pkg", None)


def test_lease_client_goes_through_the_registry(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text(GOOD_KEY + "\n")
    test = Test(workload="lease", extra={"sut": "starintel", "api_key_file": str(key_file)})
    c = lease_client(test, "http://127.0.0.1:9", needs=needs_of("lease"), instance="w-9", timeout_s=1.5)
    assert isinstance(c, StarIntelClient) and (c.service_instance_id, c.timeout_s) == ("w-9", 1.5)
    assert c.findings is test.live["sut_findings"], "one findings log per run"
    creds = tmp_path / "credentials.json"
    creds.write_text('[{"principal_id": "p", "api_key": "ref-key", "capabilities": ["targets:lease"], "scopes": {}}]')
    ref = lease_client(Test(workload="lease", live=RunContext(credentials_file=str(creds))), "http://127.0.0.1:9",
                       needs=needs_of("lease"))
    assert type(ref) is LeaseClient and ref._headers[0][1] == "Bearer ref-key"


def test_api_keys_and_validation_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv(sut.registry.API_KEY_ENV, raising=False)

    def external(**kw):  # a test whose run context has an external server's address (each its own context)
        return Test(workload="lease", live=RunContext(lease_servers=["http://10.0.0.1:8080"],
                                                      nodes=["http://10.0.0.1:8080"]), **kw)

    with pytest.raises(SutError, match="no API key.*--api-key-file"):
        validated(external(extra={"sut": "starintel"}))
    with pytest.raises(SutError, match="--api-key-file .*missing: cannot read it"):
        validated(external(extra={"sut": "starintel", "api_key_file": str(tmp_path / "missing")}))
    bad = tmp_path / "bad"
    bad.write_text("sk_live_secret\n")
    with pytest.raises(SutError, match="star_sk_v1_<credential-id>_<hex-secret>") as e:
        validated(external(extra={"sut": "starintel", "api_key_file": str(bad)}))
    assert "sk_live_secret" not in str(e.value)
    with pytest.raises(SutError, match="--url must be an http"):
        validated(Test(workload="lease", live=RunContext(lease_servers=["10.0.0.1:8080"]), extra={"sut": "starintel"}))
    monkeypatch.setenv(sut.registry.API_KEY_ENV, GOOD_KEY)
    assert validated(external(extra={"sut": "starintel"})).name == "starintel"
    assert validated(Test(workload="lease")).name == "reference", "a local stack provides URLs and keys later"
    with pytest.raises(SutError, match="fenced-append"):
        validated(Test(workload="fenced-append", extra={"sut": "starintel"}))


def test_lab_only_workloads_need_the_reference_system():
    with pytest.raises(SutError, match="'register' tests the lab's own Valkey.*only with SUT 'reference'"):
        validated(Test(workload="register", extra={"sut": "starintel"}))
    assert validated(Test(workload="register")).name == "reference"


def test_workloads_declare_what_they_need_and_the_sut_layer_never_asks_them():
    """Each workload module declares its NEEDS; the runner passes them down (lab.sut imports no workload)."""
    assert {name: needs_of(name).workload for name in WORKLOADS} == {name: name for name in WORKLOADS}
    assert needs_of("fenced-append").capabilities == {"commit"} and not needs_of("fenced-append").lab_only
    assert needs_of("register").lab_only and needs_of("lease") == sut.WorkloadNeeds("lease")
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        needs_of("nope")
    # the same system, asked for different needs, is refused or not by what was passed, not by test.workload
    lease_test = Test(workload="lease", extra={"sut": "starintel"})
    with pytest.raises(SutError, match="fenced-append.*needs commit"):
        open_system(lease_test, "http://127.0.0.1:9", "w", needs=needs_of("fenced-append"))
    with pytest.raises(SutError, match="'register' tests the lab's own Valkey"):
        sut.registry.require_capabilities(get_sut("starintel"), needs_of("register"))
    sut.registry.require_capabilities(get_sut("starintel"), needs_of("lease"))  # core operations: fine


# -- fencing style: declared once, the rules follow ------------------------------------------------------------

class TokenStore:
    """A store that checks tokens (Kleppmann's fence): a write below the highest token accepted is refused."""

    def __init__(self):
        self.entries, self.highest = [], 0

    def write(self, token, entry):
        if token < self.highest:
            return False
        self.highest = token
        self.entries.append(entry)
        return True


class StoreFenced:
    """A correct store-fenced plug-in: leases with increasing tokens, commits through the store's token guard only."""

    capabilities = frozenset({"commit"})
    fencing = "store"
    store = TokenStore()

    def __init__(self, test, node, service_instance_id):
        self.instance = service_instance_id

    async def commit(self, lease, doc, body, *, identity=None, request_id=None, deadline_s=None):
        if not self.store.write(lease.fencing_token, body):
            return Result("fail", "stale_token")
        return Result("ok", "commit_accepted", data={"doc": doc, "accepted_token": lease.fencing_token})


def _old_holder_writes_first(fencing):
    """Run the plug-in's commits (L1 token 1, L2 token 2 acquired, then L1 writes, then L2), judged as `fencing`."""
    from test_checker_core import LeaseHistory

    from checkers.core import compose, get_checker
    from lab.sut.registry import claimed_checker

    register_sut("fenced-plugin", StoreFenced, fencing=fencing, replace=True)
    try:
        StoreFenced.store = TokenStore()
        system = StoreFenced(None, "n", "i")
        l1, l2 = (Lease(f"L{t}", t, "active", 0, 0, 1000, 1000) for t in (1, 2))
        h = LeaseHistory()
        h.acquire(0, "L1", 1, at=0)
        h.acquire(1, "L2", 2, at=10)
        import asyncio

        for p, lease, n in ((0, l1, 1), (1, l2, 1)):  # the old holder's write lands before its successor's first
            r = asyncio.run(system.commit(lease, "d", [p, lease.fencing_token, n]))
            assert r.outcome == "ok"
            h.commit(p, lease.lease_id, lease.fencing_token, [p, lease.fencing_token, n], rev=n)
        h.read(9, list(StoreFenced.store.entries))
        test = Test(workload="fenced-append", extra={"sut": "fenced-plugin"})
        return claimed_checker(test, compose({"stale-commit": get_checker("stale-commit")})).check({}, h.ops, {})
    finally:
        unregister_sut("fenced-plugin")


def test_a_store_fenced_plugin_is_valid_without_copying_anything():
    """fencing="store": an old holder's write accepted by the token guard before its successor's first write is
    correct; the same history from a system whose commits the lease service validates (server) is a violation."""
    res = _old_holder_writes_first("store")
    assert res["valid"] is True, res
    assert res["results"]["stale-commit"]["not_claimed_violations"] == {"commit-after-successor": 1}
    res = _old_holder_writes_first("server")
    assert res["valid"] is False and "commit-after-successor" in res["results"]["stale-commit"]["violation_counts"]


def test_fencing_style_is_declared_once_and_merged_with_not_claimed():
    from lab.sut.registry import FENCING_STYLES

    entry = register_sut("fenced-plugin", StoreFenced, not_claimed={"idempotency": "no request ids"}, replace=True)
    try:  # the class attribute declares it; what it does not claim beyond its style is kept
        assert entry.fencing == "store"
        assert entry.not_claimed == {**FENCING_STYLES["store"], "idempotency": "no request ids"}
        assert register_sut("fenced-plugin", TinySystem, replace=True).fencing == "server"  # the default: all rules
        with pytest.raises(SutError, match=r"fencing must be one of server, store, none .*not 'token'"):
            register_sut("fenced-plugin", TinySystem, fencing="token", replace=True)
    finally:
        unregister_sut("fenced-plugin")
    assert (get_sut("valkey-lock-fenced").fencing, get_sut("valkey-lock").fencing, get_sut("etcd").fencing) == (
        "store", "none", "server")
    assert "stale-commit.commit-after-successor" in get_sut("valkey-lock-fenced").not_claimed
    assert "fencing" in get_sut("valkey-lock").not_claimed
    assert "fencing" not in get_sut("valkey-lock-fenced").not_claimed


# -- a plug-in that raises -------------------------------------------------------------------------------------

RAISING = '''
from lab.client import Result


class Boom:
    """A factory that raises at once."""

    def __init__(self, test, node, instance):
        raise ValueError("no such cluster")


class Later:
    """Opens once (the run's first open), then every later open raises."""

    opened = 0

    def __init__(self, test, node, instance):
        Later.opened += 1
        if Later.opened > 1:
            raise RuntimeError("second open fails")

    async def acquire(self, identity, *, ttl_ms, request_id=None, deadline_s=None):
        return Result("fail", "lease_conflict")

    async def renew(self, lease, **kw):
        return Result("fail", "lease_lost")

    async def release(self, lease, **kw):
        return Result("fail", "lease_lost")

    async def inspect(self, target, **kw):
        return Result("fail", "lease_not_found")

    async def aclose(self):
        return None


def bad_check(test):
    raise KeyError("port")
'''


def test_a_plugin_that_raises_is_one_line_naming_it():
    """A factory or a check that raises anything: PluginError naming the plug-in and the exception."""
    def boom(test, node, instance):
        raise ValueError("no such cluster")

    def bad_check(test):
        raise KeyError("port")

    register_sut("raiser", boom, check=bad_check)
    try:
        with pytest.raises(SutError, match=r"^SUT 'raiser' \(test_sut_registry\..*boom\): ValueError: no such "
                                           r"cluster$"):
            opened(Test(extra={"sut": "raiser"}), "n", "i")
        with pytest.raises(SutError, match=r"^SUT 'raiser' \(.*\): KeyError: 'port'$"):
            validated(Test(extra={"sut": "raiser"}))
    finally:
        unregister_sut("raiser")


def _fencelab(tmp_path, factory):
    """`fencelab test` on a system in a loose module (`raising:Factory`), its output and exit code."""
    import json
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "raising.py").write_text(RAISING)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    p = subprocess.run([sys.executable, "-m", "lab", "test", "--sut", f"raising:{factory}", "--workload", "lease",
                        "--time-limit", "1", "--concurrency", "2", "--store-dir", str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    results = [json.loads(f.read_text()) for f in (tmp_path / "store").rglob("results.json")]
    return p, results


def test_a_factory_that_raises_at_the_first_open_is_bad_input(tmp_path):
    p, _ = _fencelab(tmp_path, "Boom")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == "fencelab: error: SUT 'raising:Boom' (raising.Boom): ValueError: no such cluster"


def test_a_factory_that_raises_during_the_run_marks_it_failed(tmp_path):
    """Not 1 (invalid): the run is cut short, results.json says so, exit 3 (unknown); no traceback."""
    p, results = _fencelab(tmp_path, "Later")
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert "run failed: SUT 'raising:Later' (raising.Later): RuntimeError: second open fails" in p.stdout
    (res,) = results
    assert res["valid"] == "unknown" and res["run_failed"].startswith("SUT 'raising:Later'")


def test_background_and_freeze_hooks_are_declared_and_checked():
    """`background` (attribute or keyword) and freeze()/thaw() (both or neither) land on the entry."""
    class Frozen(TinySystem):
        background = True

        def freeze(self): ...

        def thaw(self): ...

    class HalfFrozen(TinySystem):
        def freeze(self): ...

    try:
        entry = register_sut("bg-plugin", Frozen)
        assert entry.background is True and entry.freezes
        entry = register_sut("bg-plugin", TinySystem, replace=True)
        assert entry.background is None and not entry.freezes  # not declared: client-pause is refused (Target)
        assert register_sut("bg-plugin", TinySystem, background=False, replace=True).background is False
        with pytest.raises(SutError, match="background must be True or False"):
            register_sut("bg-plugin", TinySystem, background="no", replace=True)
        with pytest.raises(SutError, match="freeze and thaw go together \\(it has only freeze\\)"):
            register_sut("bg-plugin", HalfFrozen, replace=True)
    finally:
        unregister_sut("bg-plugin")
