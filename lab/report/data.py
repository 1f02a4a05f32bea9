"""The data behind a run's plots, computed from the history alone (JSON-ready, no pixels).

Every plot of a report is drawn from one of these dicts, and the same dicts
are written to `plots.json` and inlined in `report.html`, so what a plot
shows (series, buckets, the shaded nemesis windows) can be tested and
re-plotted without reading pixels.

- `latency_raw`: one point per completed client op (invocation time, latency),
  per (f, outcome); uniformly downsampled above `max_points` (seeded, so a
  report is reproducible), and the data says how many points were kept.
- `latency_quantiles`: p50/p95/p99 latency per f per time bucket (all points).
- `rate`: completions per second per f and outcome per time bucket.
- `fencing`: per key, in backend (Valkey `TIME`) milliseconds: tokens issued
  by acquire oks, leases' validity intervals `[acquired_at_ms, expires_at_ms]`
  (the latest expiry any grant reported) and when an ok release ended them,
  commits accepted (at `validated_at_ms`) and rejected (at the backend time
  estimated from their completion, see `clock_offset_ms`).
- `windows`: the nemesis's fault windows (`checkers.windows.nemesis_windows`), in
  seconds since the test started.

Times on the client axes are seconds since the test started (the history's
monotonic `time`, invocation time for latency, completion time for rates).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np

from checkers.pairs import Pair, error_code
from checkers.view import LeaseView, lease_view
from checkers.windows import NEMESIS, history_end_time, nemesis_windows
from lab.history import HistoryError, HistoryWarning, to_frame

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MAX_KEYS", "MAX_RAW_POINTS", "QUANTILES", "TYPES", "bucket_width", "outcome_counts",
           "plot_data"]

MAX_RAW_POINTS = 10_000  # raw latency points drawn (and inlined); more are downsampled
MAX_KEYS = 8  # keys drawn in the fencing-token timeline
QUANTILES = (0.5, 0.95, 0.99)
TYPES = ("ok", "fail", "info")
NS = 1e9


def bucket_width(duration_s: float, buckets: int = 50) -> float:
    """A round bucket width (1, 2 or 5 times a power of ten seconds) giving about `buckets` buckets."""
    target = max(duration_s, 1e-3) / buckets
    exp = math.floor(math.log10(target))
    for mult in (1, 2, 5, 10):
        width = mult * 10.0 ** exp
        if width >= target:
            return round(width, 9)
    return round(10.0 ** (exp + 1), 9)  # unreachable: 10 * 10**exp >= target always


def _windows(history: list[dict]) -> list[dict]:
    """Nemesis fault windows (`checkers.windows.nemesis_windows`) in seconds since the start."""
    end = history_end_time(history)
    out = []
    for w in nemesis_windows(history):
        stop = end if w["open"] else w["end"]
        out.append({"fault": w["fault"], "start_s": round(w["start"] / NS, 6), "end_s": round(stop / NS, 6),
                    "start_index": w["start_index"], "end_index": w["end_index"], "open": w["open"]})
    return out


def client_frame(history: list[dict]) -> "pd.DataFrame":
    """`lab.history.to_frame` of the client ops, with t_invoke_s, t_done_s and latency_ms columns."""
    with warnings.catch_warnings():  # a malformed history is still drawn; its problems are the checkers' to report
        warnings.simplefilter("ignore", HistoryWarning)
        frame = to_frame((op for op in history if op.get("process") != NEMESIS), strict=False)
    frame["t_invoke_s"] = frame["invoke_time"].astype("float64") / NS
    done = frame["complete_time"].astype("float64")
    frame["t_done_s"] = done.fillna(frame["invoke_time"].astype("float64")) / NS
    frame["latency_ms"] = frame["latency_ns"].astype("float64") / 1e6
    return frame


def _latency_raw(frame: "pd.DataFrame", max_points: int) -> dict:
    """Raw latency points per (f, type), downsampled to at most about `max_points`."""
    done = frame[frame["latency_ms"].notna()]
    total = len(done)
    rng = np.random.default_rng(0)
    series = []
    for (f, typ), g in done.groupby(["f", "type"], sort=True):
        n = len(g)
        keep = n if total <= max_points else min(n, max(1, math.ceil(n * max_points / total)))
        idx = np.sort(rng.choice(n, size=keep, replace=False)) if keep < n else np.arange(n)
        t = g["t_invoke_s"].to_numpy()[idx]
        lat = g["latency_ms"].to_numpy()[idx]
        series.append({"f": str(f), "type": str(typ), "count": n,
                       "t": np.round(t, 4).tolist(), "latency_ms": np.round(lat, 4).tolist()})
    shown = sum(len(s["t"]) for s in series)
    return {"series": series, "points_total": total, "points_shown": shown, "downsampled": shown < total,
            "max_points": max_points}


def _bucket_index(t: "pd.Series", width: float) -> np.ndarray:
    """The time bucket of each time (seconds)."""
    return np.floor(t.to_numpy(dtype="float64") / width).astype("int64")


def _latency_quantiles(frame: "pd.DataFrame", width: float) -> dict:
    """p50/p95/p99 latency per f per time bucket of invocation, over every completed op."""
    done = frame[frame["latency_ms"].notna()].copy()
    series = []
    if len(done):
        done["bucket"] = _bucket_index(done["t_invoke_s"], width)
        q = done.groupby(["f", "bucket"])["latency_ms"].quantile(list(QUANTILES)).unstack()
        for f, g in q.groupby(level=0, sort=True):
            buckets = g.index.get_level_values(1).to_numpy()
            s = {"f": str(f), "t": np.round((buckets + 0.5) * width, 6).tolist()}
            for qq in QUANTILES:
                s[f"p{round(qq * 100)}"] = np.round(g[qq].to_numpy(dtype="float64"), 4).tolist()
            series.append(s)
    return {"quantiles": [f"p{round(q * 100)}" for q in QUANTILES], "bucket_s": width, "series": series}


def _rate(frame: "pd.DataFrame", width: float, end_s: float) -> dict:
    """Completions per second per (f, type) per time bucket (zeros included, so lines drop to 0)."""
    n_buckets = max(1, math.ceil(end_s / width)) if end_s > 0 else 1
    t = np.round((np.arange(n_buckets) + 0.5) * width, 6).tolist()
    series = []
    if len(frame):
        frame = frame.assign(bucket=np.minimum(_bucket_index(frame["t_done_s"], width), n_buckets - 1))
        for (f, typ), g in frame.groupby(["f", "type"], sort=True):
            counts = np.bincount(g["bucket"].to_numpy(), minlength=n_buckets)
            series.append({"f": str(f), "type": str(typ), "count": int(counts.sum()), "t": t,
                           "rate": np.round(counts / width, 4).tolist()})
    return {"bucket_s": width, "t": t, "series": series}


def _clock_offset_ms(pairs: list[Pair]) -> float | None:
    """Backend ms minus test-relative ms, estimated as the median over ok ops that report a backend time.

    A backend time (acquired/renewed/validated_at_ms) lies between the op's
    invocation and completion, so each op gives offset = backend - midpoint.
    """
    offsets = []
    for p in pairs:
        if p.type != "ok" or not isinstance(p.result, dict):
            continue
        r = p.result
        at = r.get("validated_at_ms") if p.f == "commit" else (
            r.get("renewed_at_ms") if p.f == "renew" else r.get("acquired_at_ms") if p.f == "acquire" else None)
        if isinstance(at, int | float):
            offsets.append(at - (p.t0 + p.t1) / 2e6)
    return round(median(offsets), 3) if offsets else None


def _key_order(keys: Iterable[Any], first: Iterable[Any]) -> list[Any]:
    """Keys sorted naturally ("k2" before "k10"), those in `first` before the others."""
    def natural(k: Any) -> tuple:
        s = str(k)
        head = s.rstrip("0123456789")
        tail = s[len(head):]
        return (head, int(tail) if tail else -1, s)

    first = set(first)
    return sorted(set(keys), key=lambda k: (k not in first, natural(k)))


def _token(value: Any) -> Any:
    """The fencing token a commit carried (its value's fencing_token or its entry's token)."""
    if not isinstance(value, dict):
        return None
    if value.get("fencing_token") is not None:
        return value["fencing_token"]
    entry = value.get("entry")
    return entry[1] if isinstance(entry, list) and len(entry) == 3 else None


def _released(lease: Any, offset: float | None) -> dict:
    """When an ok release/revoke ended a lease: the backend time it reports, else estimated from its completion."""
    if lease.ended_at_ms is not None:
        return {"released_ms": lease.ended_at_ms, "release_estimated": False}
    done = [p.t1 for p in lease.ends if p.type == "ok" and p.t1 is not None]
    if done and offset is not None:
        return {"released_ms": round(min(done) / 1e6 + offset, 3), "release_estimated": True}
    return {"released_ms": None, "release_estimated": False}


def _fencing(view: LeaseView, windows: list[dict], focus_keys: Iterable[Any], max_keys: int) -> dict:
    """Per key: tokens issued, leases' backend validity, commits accepted and rejected (backend ms)."""
    offset = _clock_offset_ms(view.pairs)
    leases = view.leases
    per_key: dict[Any, dict] = {}

    def slot(key: Any) -> dict:
        return per_key.setdefault(key, {"key": key, "tokens": [], "leases": [], "commits_accepted": [],
                                        "commits_rejected": []})

    for lease in leases.values():
        if lease.acquired_at_ms is None or lease.token is None:
            continue
        s = slot(lease.key)
        first = lease.first
        s["tokens"].append({"t_ms": lease.acquired_at_ms, "token": lease.token, "lease_id": lease.lease_id,
                            "index": first.i1})
        s["leases"].append({"lease_id": lease.lease_id, "token": lease.token, "start_ms": lease.acquired_at_ms,
                            "end_ms": lease.expires_at_ms if lease.expires_at_ms is not None else lease.acquired_at_ms,
                            **_released(lease, offset)})
    for p in view.pairs:
        if p.f != "commit" or p.type not in ("ok", "fail"):
            continue
        s = slot(p.key)
        r = p.result if isinstance(p.result, dict) else {}
        if p.type == "ok":
            token = next((t for t in (r.get("accepted_token"), _token(r), _token(p.value)) if t is not None), None)
            at = r.get("validated_at_ms")
            estimated = at is None
            if estimated and offset is not None:
                at = round(p.t1 / 1e6 + offset, 3)
            if at is not None:
                s["commits_accepted"].append({"t_ms": at, "token": token, "index": p.i1, "estimated": estimated})
        elif offset is not None and (_token(p.value) is not None or _token(r) is not None):
            # a commit that carried no token never reached the fence (e.g. the client held no lease): not drawn
            token = _token(p.value) if _token(p.value) is not None else _token(r)
            s["commits_rejected"].append({"t_ms": round(p.t1 / 1e6 + offset, 3), "token": token, "index": p.i1,
                                          "error": error_code(p.comp), "estimated": True})
    ordered = [k for k in _key_order(per_key, focus_keys) if k in per_key]
    shown = ordered[:max_keys]
    keys = []
    for k in shown:
        s = per_key[k]
        for name in ("tokens", "leases", "commits_accepted", "commits_rejected"):
            s[name].sort(key=lambda x: (x.get("t_ms", x.get("start_ms")) or 0))
        keys.append(s)
    base = offset if offset is not None else min(
        (x["start_ms"] for s in keys for x in s["leases"]), default=None)
    return {
        "time_unit": "backend ms (Valkey TIME)", "clock_offset_ms": offset, "base_ms": base,
        "keys_total": len(per_key), "keys_shown": len(shown), "keys": keys,
        "windows": [] if offset is None else [
            dict(w, start_ms=round(w["start_s"] * 1000 + offset, 3), end_ms=round(w["end_s"] * 1000 + offset, 3))
            for w in windows],
    }


def plot_data(history: list[dict], *, max_points: int = MAX_RAW_POINTS, max_keys: int = MAX_KEYS,
              focus_keys: Iterable[Any] = ()) -> dict:
    """Every plot's data for a history (see the module docstring); `focus_keys` are drawn first."""
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    frame = client_frame(history)
    end_s = history_end_time(history) / NS
    width = bucket_width(end_s)
    windows = _windows(history)
    try:
        fencing = _fencing(lease_view(history), windows, focus_keys, max_keys)  # its passes share one pairing
    except HistoryError as e:  # leases are read only from a well-formed history: no fencing plot, and why
        fencing = {"time_unit": "backend ms (Valkey TIME)", "clock_offset_ms": None, "base_ms": None,
                   "keys_total": 0, "keys_shown": 0, "keys": [], "windows": [], "error": f"HistoryError: {e}"}
    return {
        "version": 1,
        "time_unit": "s since the test started",
        "end_s": round(end_s, 6),
        "ops": int(len(frame)),
        "windows": windows,
        "latency_raw": _latency_raw(frame, max_points),
        "latency_quantiles": _latency_quantiles(frame, width),
        "rate": _rate(frame, width, end_s),
        "fencing": fencing,
    }


def outcome_counts(data: Mapping) -> dict[str, int]:
    """Client ops by outcome (ok / fail / info), from plot data's rate series."""
    counts = {t: 0 for t in TYPES}
    for s in data["rate"]["series"]:
        counts[s["type"]] = counts.get(s["type"], 0) + s["count"]
    return counts
