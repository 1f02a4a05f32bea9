"""bench/client_path.py's figures are held to issue 13's targets, both ways (a figure that cannot fail is no figure)."""

from __future__ import annotations

from tests.benches import load_bench


def measured(lease_us: float, minimal_us: float, ops_per_s: float, requests: int = 500, ops: int = 1000) -> dict:
    return {"libraries": [{"lib": "minimal", "cpu_us_per_request": minimal_us, "requests_per_s": 1.0},
                          {"lib": "aiohttp", "cpu_us_per_request": 3 * minimal_us, "requests_per_s": 1.0},
                          {"lib": "aiosonic", "skipped": "not installed (aiosonic)"},
                          {"lib": "LeaseClient", "cpu_us_per_request": lease_us, "requests_per_s": 1.0}],
            "lab": {"ops": ops, "requests": requests, "ops_per_s": ops_per_s, "lab_cpu_us_per_op": 200.0,
                    "server_cpu_us_per_op": 100.0, "valkey_cpu_us_per_op": 40.0, "other_cores": 1.0, "cores": 2}}


def by_name(figures) -> dict:
    return {f.name: f for f in figures}


def test_every_target_is_met_only_by_a_measurement_that_meets_it():
    bench = load_bench("client_path.py")
    good = by_name(bench.to_figures(measured(lease_us=60, minimal_us=40, ops_per_s=3200), 4))
    assert all(f.ok for f in good.values()), good
    assert good["LeaseClient CPU / minimal client"].value == 1.5
    assert good["client CPU per recorded op (lab run)"].value == 30.0  # 500 requests x 60 us / 1000 ops
    assert "none within 2x" in good["LeaseClient CPU / minimal client"].note
    bad = by_name(bench.to_figures(measured(lease_us=130, minimal_us=40, ops_per_s=2999, requests=1000), 4))
    assert not bad["LeaseClient CPU per request"].ok and not bad["LeaseClient CPU / minimal client"].ok
    assert not bad["recorded lease ops/s, 50 processes"].ok
    assert not bad["client CPU per recorded op (lab run)"].ok  # 1000 x 130 us / 1000 ops


def test_a_skipped_or_missing_library_is_no_figure():
    bench = load_bench("client_path.py")
    res = measured(lease_us=60, minimal_us=40, ops_per_s=3200)
    res["libraries"] = [x for x in res["libraries"] if x["lib"] != "minimal"]
    names = set(by_name(bench.to_figures(res, 4)))
    assert "LeaseClient CPU / minimal client" not in names  # no floor measured: no ratio claimed
    assert "LeaseClient CPU per request" in names
