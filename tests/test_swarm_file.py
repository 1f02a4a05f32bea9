"""The Swarm backend without a Swarm: the stack file it generates and the placement file it reads.

What Swarm does with a Compose file as it stands was measured (docs/beyond-one-machine.md, "Swarm"); each test
here holds the generated file to one of those findings. The live runs are tests/test_swarm_live.py.
"""

from __future__ import annotations

import pytest

from lab.stack.compose import COMPOSE_FILE
from lab.stack.errors import StackError
from lab.stack.images import LOCAL_OVERRIDE
from lab.stack.swarm import SwarmOptions, _interpolate, load_placement, stack_file
from lab.runner import RunError, validate
from lab.testmap import Test

ENV = {"FENCELAB_STATE_DIR": "/state", "FENCELAB_UID": "0", "FENCELAB_GID": "0", "COUCHDB_USER": "u",
       "COUCHDB_PASSWORD": "p", "FENCELAB_OWNER": ""}
SERVICES = ["valkey", "store", "toxiproxy", "lease-1", "lease-2"]
NODES = {"valkey": "node1", "store": "node1", "toxiproxy": "node1", "lease-1": "node2", "lease-2": "node3"}


@pytest.fixture(scope="module")
def doc():
    return stack_file([COMPOSE_FILE, LOCAL_OVERRIDE], ENV, SERVICES, NODES)


def test_ports_are_host_mode_on_their_own_numbers_and_services_are_dnsrr(doc):
    """No ingress (it needs IPVS) and no VIPs (they time out without it): host-mode ports, dnsrr endpoints."""
    for name, svc in doc["services"].items():
        assert svc["deploy"]["endpoint_mode"] == "dnsrr", name
        assert all(p["mode"] == "host" for p in svc["ports"]), svc["ports"]
    published = [p["published"] for svc in doc["services"].values() for p in svc["ports"]]
    assert len(published) == len(set(published)), "two services would bind one port on a shared node"
    assert {p["published"] for p in doc["services"]["toxiproxy"]["ports"]} >= {26011, 26012}


def test_each_service_is_pinned_to_its_node_and_what_swarm_ignores_is_gone(doc):
    for name, svc in doc["services"].items():
        assert svc["deploy"]["placement"]["constraints"] == [f"node.hostname == {NODES[name]}"]
        assert not {"build", "restart", "depends_on"} & set(svc), name
    assert set(doc["services"]) == set(SERVICES)
    assert doc["networks"] == {"front": {"driver": "overlay"}, "back": {"driver": "overlay"}}


def test_values_are_literal_and_the_override_replaces_healthchecks(doc):
    """The lab interpolates (Swarm's CLI reads `${X:?a-b}` as a default) and merges (Swarm's CLI concatenates
    two files' healthcheck lists): the local image's check replaces the official one."""
    text = repr(doc)
    assert "${" not in text
    assert doc["services"]["valkey"]["healthcheck"]["test"] == ["CMD", "valkey-ping"]
    assert doc["services"]["lease-1"]["image"] == "fencelab/lease-server:trixie"
    assert "/state/principals:/fencelab/principals:ro" in doc["services"]["lease-1"]["volumes"]


def test_interpolation_reads_a_dash_in_a_message_as_a_message():
    assert _interpolate("${A:?set A-first}", {"A": "x"}) == "x"
    assert _interpolate("${A:-d-e}", {}) == "d-e"
    with pytest.raises(StackError, match="set A-first"):
        _interpolate("${A:?set A-first}", {})


def test_the_default_placement_puts_lease_servers_on_workers():
    opts = SwarmOptions(servers=3, place={"store": "node2"})
    assert opts.placement(["node1"], ["node2", "node3"]) == {
        "valkey": "node1", "store": "node2", "toxiproxy": "node1", "lease-1": "node2", "lease-2": "node3",
        "lease-3": "node2"}


@pytest.mark.parametrize("text, words", [
    ('[engines]\nnode1 = "unix:///x"\n[place]\nvalkey = "node9"\n', "node9.*no such node"),
    ('[engines]\nnode1 = "unix:///x"\n[place]\nredis = "node1"\n', "'redis' is not a service"),
    ('nodes = ["a"]\n', "unknown key 'nodes'"),
    ('manager = "unix:///x"\n', "`engines` must map"),
])
def test_a_bad_placement_is_one_line(tmp_path, text, words):
    path = tmp_path / "place.toml"
    path.write_text(text)
    with pytest.raises(StackError, match=words):
        load_placement(path)
    with pytest.raises(RunError, match=words):
        validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path)))


def test_the_swarm_backend_refuses_what_it_cannot_do(tmp_path):
    path = tmp_path / "place.toml"
    path.write_text('[engines]\nnode1 = "unix:///x"\n')
    with pytest.raises(RunError, match="needs --hosts FILE"):
        validate(Test(workload="fenced-append", backend="swarm"))
    with pytest.raises(RunError, match="--nemesis clock cannot run on --backend swarm"):
        validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path), nemesis=["clock"]))
    validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path), nemesis=["partition", "kill",
                                                                                              "pause"]))
