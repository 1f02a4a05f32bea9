"""The campaign's backend axis: the same cells on local processes and on Docker Compose (docs/campaigns.md)."""

from __future__ import annotations

import pytest

import tomllib

from lab.campaign import CampaignError, expand
from lab.campaign.spec import parse_spec as _parse


def parse_spec(text: str, source: str):
    return _parse(tomllib.loads(text), source)


def _spec(impls: str) -> str:
    return f'''
name = "b"
workloads = ["fenced-append"]
nemeses = ["none", "kill"]
{impls}
[defaults]
time_limit = 3
'''


def test_implementations_with_a_backend_place_the_same_cells_on_both():
    spec = parse_spec(_spec('implementations = [{ name = "local", sut = "reference", backend = "local" },'
                            ' { name = "compose", sut = "reference", backend = "compose" }]'), "b.toml")
    runs = expand(spec)
    by_impl = {impl: sorted((r.workload, r.nemesis, r.seed) for r in runs if r.implementation == impl)
               for impl in ("local", "compose")}
    assert by_impl["local"] == by_impl["compose"] and len(by_impl["local"]) == 2
    assert {r.to_test().backend for r in runs if r.implementation == "compose"} == {"compose"}
    assert {r.to_test().backend for r in runs if r.implementation == "local"} == {"local"}
    # a finished run on one backend never stands in for the other (the saved options differ)
    local = next(r for r in runs if r.implementation == "local").test_options()
    compose = next(r for r in runs if r.implementation == "compose").test_options()
    assert local["backend"] == "local" and compose["backend"] == "compose"


@pytest.mark.parametrize("impls, words", [
    ('implementations = [{ name = "x", sut = "reference", backend = "kubernetes" }]', "backend must be one of"),
    ('implementations = [{ name = "x", sut = "starintel", url = "http://127.0.0.1:9", backend = "compose" }]',
     "places the lab's reference stack"),
])
def test_a_bad_backend_is_one_line_naming_the_key(impls, words):
    with pytest.raises(CampaignError, match=words):
        parse_spec(_spec(impls), "b.toml")


def test_an_ssh_implementation_names_its_hosts_file(tmp_path):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('nodes = ["10.200.0.1", "10.200.0.2"]\n')
    spec = parse_spec(_spec(f'implementations = [{{ name = "nodes", sut = "reference", backend = "ssh", '
                            f'hosts = "{hosts}" }}]'), "b.toml")
    tests = [r.to_test() for r in expand(spec)]
    assert {t.backend for t in tests} == {"ssh"} and {t.hosts_file for t in tests} == {str(hosts)}
    with pytest.raises(CampaignError, match="go together"):
        parse_spec(_spec('implementations = [{ name = "x", sut = "reference", backend = "ssh" }]'), "b.toml")
    with pytest.raises(CampaignError, match="go together"):
        parse_spec(_spec(f'implementations = [{{ name = "x", sut = "reference", hosts = "{hosts}" }}]'), "b.toml")


def test_evidence_and_mutants_take_ssh_only_with_a_hosts_file_and_mutants_go_to_ssh_nodes(tmp_path):
    from click.testing import CliRunner

    from lab.cli import main
    from lab.runner import RunError, validate
    from lab.testmap import Test

    res = CliRunner().invoke(main, ["evidence", "--backend", "ssh"])
    assert res.exit_code == 2 and "--backend ssh and --hosts FILE go together" in res.output, res.output
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('nodes = ["10.200.0.1"]\n')
    validate(Test(backend="ssh", extra={"hosts_file": str(hosts), "mutant": "nonatomic-acquire"}))  # planted there too
    with pytest.raises(RunError, match="unknown mutant 'no-such-bug'"):
        validate(Test(backend="ssh", extra={"hosts_file": str(hosts), "mutant": "no-such-bug"}))
    res = CliRunner().invoke(main, ["mutants", "--backend", "ssh"])
    assert res.exit_code == 2 and "--backend ssh and --hosts FILE go together" in res.output, res.output
