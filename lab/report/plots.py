"""PNG plots of a run, drawn with matplotlib's Agg canvas from `lab.report.data.plot_data`.

Figures are built with the object API (`matplotlib.figure.Figure` on a
`FigureCanvasAgg`), not pyplot: no global backend switch and no figure
registry, so a report can be written from any thread or process.

Every function returns the PNG bytes and what it shaded: the nemesis windows
actually drawn (fault, start, end in the plot's x units), which `plots.json`
records next to the data so tests can check the shading without reading pixels.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["PLOT_FILES", "fencing_png", "latency_quantiles_png", "latency_raw_png", "rate_png"]

PLOT_FILES = ("latency-raw.png", "latency-quantiles.png", "rate.png", "fencing-tokens.png")
TYPE_COLORS = {"ok": "#1f77b4", "fail": "#d62728", "info": "#ff9f1c"}
QUANTILE_STYLES = {"p50": "-", "p95": "--", "p99": ":"}
TYPE_STYLES = {"ok": "-", "fail": "--", "info": ":"}
MARKERS = "o^sDvP*Xh<>p"
WINDOW_COLORS = ["#ffb74d", "#ba68c8", "#4db6ac", "#e57373", "#90a4ae", "#aed581"]
DPI = 100


def _figure(height: float = 4.2, width: float = 11.0) -> Figure:
    """A new Agg-backed figure."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _fault_colors(windows: list[Mapping]) -> dict[str, str]:
    """One colour per fault name, stable in order of first appearance."""
    colors: dict[str, str] = {}
    for w in windows:
        colors.setdefault(w["fault"], WINDOW_COLORS[len(colors) % len(WINDOW_COLORS)])
    return colors


def shade(ax: Any, windows: list[Mapping], start: str = "start_s", end: str = "end_s",
          scale: float = 1.0, origin: float = 0.0, label: bool = True) -> list[dict]:
    """Shade and label each nemesis window on `ax`; returns the spans drawn (fault, start, end in x units)."""
    colors = _fault_colors(windows)
    drawn = []
    for w in windows:
        x0, x1 = (w[start] - origin) * scale, (w[end] - origin) * scale
        ax.axvspan(x0, x1, color=colors[w["fault"]], alpha=0.22, lw=0, zorder=0)
        if label:
            ax.text(x0, 1.0, f" {w['fault']}{' (open)' if w.get('open') else ''}", transform=ax.get_xaxis_transform(),
                    va="top", ha="left", fontsize=8, color="#6d4c00", clip_on=True)
        drawn.append({"fault": w["fault"], "start": round(x0, 6), "end": round(x1, 6), "open": bool(w.get("open"))})
    return drawn


def _legend(ax: Any) -> None:
    """A compact legend outside the axes, when there is something to list."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _time_axes(fig: Any, ax: Any, data: Mapping, xlabel: str, ylabel: str, title: str) -> tuple[bytes, list[dict]]:
    """Finish a plot over test time: shade the nemesis windows, label, grid, legend; (PNG, shaded spans)."""
    drawn = shade(ax, data["windows"])
    ax.set_xlim(0, max(data["end_s"], 1e-3))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _png(fig), drawn


def _markers(series: list[Mapping]) -> dict[str, str]:
    """One marker per f."""
    return {f: MARKERS[i % len(MARKERS)] for i, f in enumerate(sorted({s["f"] for s in series}))}


def latency_raw_png(data: Mapping) -> tuple[bytes, list[dict]]:
    """Raw latency points, coloured by outcome, one marker per f, log scale; nemesis windows shaded."""
    raw = data["latency_raw"]
    fig = _figure()
    ax = fig.add_subplot()
    markers = _markers(raw["series"])
    for s in raw["series"]:
        ax.scatter(s["t"], s["latency_ms"], s=6 if raw["points_shown"] > 2000 else 14, marker=markers[s["f"]],
                   color=TYPE_COLORS.get(s["type"], "#555"), alpha=0.6, linewidths=0, label=f"{s['f']} {s['type']}",
                   zorder=2)
    if any(s["t"] for s in raw["series"]):
        ax.set_yscale("log")
    title = "Latency, raw"
    if raw["downsampled"]:
        title += f" ({raw['points_shown']} of {raw['points_total']} points, uniformly sampled)"
    return _time_axes(fig, ax, data, "time since the test started (s), at invocation", "latency (ms)", title)


def latency_quantiles_png(data: Mapping) -> tuple[bytes, list[dict]]:
    """p50/p95/p99 latency per f per time bucket; nemesis windows shaded."""
    q = data["latency_quantiles"]
    fig = _figure()
    ax = fig.add_subplot()
    colors = {f: f"C{i}" for i, f in enumerate(sorted({s["f"] for s in q["series"]}))}
    for s in q["series"]:
        for name in q["quantiles"]:
            ax.plot(s["t"], s[name], QUANTILE_STYLES.get(name, "-"), color=colors[s["f"]], lw=1.2,
                    marker=".", ms=3, label=f"{s['f']} {name}", zorder=2)
    if any(s["t"] for s in q["series"]):
        ax.set_yscale("log")
    return _time_axes(fig, ax, data, f"time since the test started (s), buckets of {q['bucket_s']:g} s",
                      "latency (ms)", "Latency quantiles per f")


def rate_png(data: Mapping) -> tuple[bytes, list[dict]]:
    """Throughput per f (colour) and outcome (line style); nemesis windows shaded."""
    r = data["rate"]
    fig = _figure()
    ax = fig.add_subplot()
    colors = {f: f"C{i}" for i, f in enumerate(sorted({s["f"] for s in r["series"]}))}
    for s in r["series"]:
        ax.plot(s["t"], s["rate"], TYPE_STYLES.get(s["type"], "-"), color=colors[s["f"]], lw=1.2,
                label=f"{s['f']} {s['type']}", zorder=2)
    ax.set_ylim(bottom=0)
    return _time_axes(fig, ax, data, f"time since the test started (s), buckets of {r['bucket_s']:g} s, at completion",
                      "ops/s", "Throughput per f and outcome")


def fencing_png(data: Mapping) -> tuple[bytes, list[dict]] | None:
    """Per key: lease validity bars and tokens issued, commits accepted / rejected, in backend time."""
    fz = data["fencing"]
    keys = fz["keys"]
    if not keys or fz["base_ms"] is None:
        return None
    base = fz["base_ms"]
    fig = _figure(height=1.0 + 2.0 * len(keys))
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    drawn: list[dict] = []
    for ax, k in zip(axes, keys):
        ys, x0s, xrs, x1s = [], [], [], []
        for lease in k["leases"]:
            x0, x1 = (lease["start_ms"] - base) / 1000, (lease["end_ms"] - base) / 1000
            cut = lease.get("released_ms")
            ys.append(lease["token"])
            x0s.append(x0)
            x1s.append(x1)
            xrs.append(min(x1, max(x0, (cut - base) / 1000)) if cut is not None else x1)
        # one LineCollection per colour (hlines), not one artist per lease: 100k-op runs draw in a second
        ax.hlines(ys, x0s, xrs, color="#42a5f5", lw=6, zorder=1, label="lease held [acquired, expires or release]")
        if any(xr < x1 for xr, x1 in zip(xrs, x1s)):  # released before expiry: the rest drawn faint
            ax.hlines(ys, xrs, x1s, color="#bbdefb", lw=6, zorder=1, label="after its release, until expires_at")
        if k["tokens"]:
            ax.scatter([(x["t_ms"] - base) / 1000 for x in k["tokens"]], [x["token"] for x in k["tokens"]],
                       marker="|", s=120, color="#0d47a1", label="token issued (acquire ok)", zorder=3)
        ok = [c for c in k["commits_accepted"] if c["token"] is not None]
        if ok:
            ax.scatter([(c["t_ms"] - base) / 1000 for c in ok], [c["token"] for c in ok], marker="o", s=16,
                       color="#2e7d32", label="commit accepted", zorder=4)
        bad = [c for c in k["commits_rejected"] if c["token"] is not None]
        if bad:
            ax.scatter([(c["t_ms"] - base) / 1000 for c in bad], [c["token"] for c in bad], marker="x", s=22,
                       color="#c62828", label="commit rejected (time estimated)", zorder=4)
        spans = shade(ax, fz["windows"], "start_ms", "end_ms", scale=1 / 1000, origin=base, label=ax is axes[0])
        drawn.extend(dict(s, key=k["key"]) for s in spans)
        ax.set_ylabel(f"key {k['key']}\ntoken", fontsize=8)
        all_tokens = [t for t in ys + [c["token"] for c in ok + bad] if isinstance(t, int | float)]
        if all_tokens:
            ax.set_ylim(min(all_tokens) - 0.5, max(all_tokens) + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        _legend(ax)
    axes[-1].set_xlabel("backend time (s since the test started, Valkey TIME)")
    title = "Fencing tokens per key"
    if fz["keys_shown"] < fz["keys_total"]:
        title += f" ({fz['keys_shown']} of {fz['keys_total']} keys)"
    axes[0].set_title(title, fontsize=10)
    return _png(fig), drawn
