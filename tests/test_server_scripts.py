"""The script set: one Lua script per operation, swappable one at a time (how mutants are planted)."""

from __future__ import annotations

import pytest

from lab.server.scripts import LUA_DIR, OPERATIONS, load_scripts
from lab.server.settings import SettingsError, settings_from_dict
from lab.server.testing import in_process_server


def test_every_operation_has_one_script_with_the_shared_helpers():
    scripts = load_scripts()
    assert set(scripts) == set(OPERATIONS)
    common = (LUA_DIR / "common.lua").read_text()
    for name, script in scripts.items():
        assert script.source.startswith(common) and not script.overridden
        assert script.source.count("redis.call('TIME')") == 1  # TIME lives in now_ms(), used by every script
        body = script.source[len(common):]
        assert "now_ms()" in body or "end_by_admin(" in body, name  # end_by_admin starts with now_ms()
    assert len({s.sha for s in scripts.values()}) == len(OPERATIONS)


def test_an_override_directory_replaces_only_the_named_operation(tmp_path):
    (tmp_path / "renew.lua").write_text("return {'lease_lost', int(now_ms()), 'planted'}\n")
    scripts = load_scripts(tmp_path)
    assert scripts["renew"].overridden and "planted" in scripts["renew"].source
    assert not any(s.overridden for n, s in scripts.items() if n != "renew")
    (tmp_path / "nonsense.lua").write_text("return 1\n")
    with pytest.raises(ValueError, match="nonsense.lua is not an operation"):
        load_scripts(tmp_path)


def test_script_dir_must_exist():
    with pytest.raises(SettingsError, match="script_dir"):
        settings_from_dict({"script_dir": "/no/such/dir"})


async def test_a_planted_renew_changes_behaviour_through_the_api(valkey, run_dir, tmp_path):
    """A renew that skips the token check (a mutant) lets a wrong token renew: the swap is real."""
    source = (LUA_DIR / "renew.lua").read_text()
    planted = source.replace("local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], ARGV[6], now)",
                             "local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], r and r.fencing_token, now)")
    assert planted != source
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    (mutants / "renew.lua").write_text(planted)
    async with in_process_server(run_dir, valkey.url) as honest:
        lease = (await honest.acquire(target_id="honest")).json()["lease"]
        assert (await honest.renew(lease, fencing_token=lease["fencing_token"] + 5)).status_code == 409
    async with in_process_server(run_dir / "m", valkey.url, script_dir=str(mutants)) as mutant:
        lease = (await mutant.acquire(target_id="mutant")).json()["lease"]
        r = await mutant.renew(lease, fencing_token=lease["fencing_token"] + 5)
        assert r.status_code == 200 and r.json()["code"] == "lease_renewed"
