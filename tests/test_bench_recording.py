"""bench/recording_overhead.py's part A figures are held to issue 13's target 2, both ways (a figure that cannot
fail is no figure), and its measurement runs: the recorded rounds write every record, the figures come from it."""

from __future__ import annotations

from tests.benches import load_bench


def part_a(bench, recorded_us: float, unrecorded_us: float):
    return bench.PartA(ops=30000, concurrency=10, rounds=15, recorded_cpu=recorded_us / 1e6,
                       unrecorded_cpu=unrecorded_us / 1e6, recorded_wall=2 * recorded_us / 1e6,
                       unrecorded_wall=2 * unrecorded_us / 1e6, records=60000)


def by_name(figures) -> dict:
    return {f.name: f for f in figures}


def test_every_target_is_met_only_by_a_measurement_that_meets_it():
    bench = load_bench("recording_overhead.py")
    good = by_name(bench.to_figures(part_a(bench, recorded_us=11.5, unrecorded_us=10.0)))
    cpu, ratio = "recording CPU per op (invoke + completion)", "recorded / unrecorded ops per CPU second"
    assert good[cpu].value == 1.5 and good[cpu].ok
    assert good[ratio].value == 0.87 and good[ratio].ok
    above = by_name(bench.to_figures(part_a(bench, recorded_us=10.0, unrecorded_us=8.51)))
    below = by_name(bench.to_figures(part_a(bench, recorded_us=10.0, unrecorded_us=8.49)))
    assert above[ratio].ok and not below[ratio].ok
    bad = by_name(bench.to_figures(part_a(bench, recorded_us=12.5, unrecorded_us=10.0)))  # 2.5 us, ratio 0.8
    assert bad[cpu].ok and not bad[ratio].ok
    worse = by_name(bench.to_figures(part_a(bench, recorded_us=21.0, unrecorded_us=10.0)))  # 11 us
    assert not any(f.ok for f in worse.values())


def test_part_a_measures_recorded_and_unrecorded_rounds():
    bench = load_bench("recording_overhead.py")
    r = bench.measure_a(ops=500, concurrency=4, rounds=1)
    assert r.records == 2 * 500  # every op's invocation and completion reached the history
    assert r.recorded_cpu > 0 and r.unrecorded_cpu > 0
    figs = bench.to_figures(r)
    assert [f.area for f in figs] == ["recording", "recording"] and all(f.value == f.value for f in figs)  # no NaN


def test_the_flush_thread_ab_measures_three_writers_and_puts_the_batch_size_back():
    """bench/recording_flush_ab.py (docs/performance.md, 4a): every mode's rounds ran and wrote every record, and the
    writer module's 1 MiB wake-up size is what it was before (the no-wake mode lifts it for its rounds only)."""
    import lab.history.writer as writer_module

    bench = load_bench("recording_flush_ab.py")
    before = writer_module._BATCH_BYTES
    best = bench.measure(ops=500, rounds=2)
    assert writer_module._BATCH_BYTES == before
    assert set(best) == {"unrecorded", "default", "no-wake"}
    assert all(cpu > 0 and own > 0 and switches >= 0 for cpu, own, switches in best.values()), best
