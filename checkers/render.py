"""Counterexamples as ONE self-contained HTML file (Porcupine's visualization, for any checker).

`render_html(results, history, path)` writes a page that needs no network: the
data is inlined as JSON in a `<script type="application/json">`, the script
and style are inline. It shows one row per process on a time axis, each op a
bar from invocation to completion (info ops, completed or not, open-ended to
the end of the history: they may take effect any time after they were invoked), the failing ops highlighted (every op a violation or the
linearizability counterexample names), nemesis windows shaded, a button that
jumps to the first error, the violation list (also as plain links, readable
without JavaScript), and for linearizability the longest linearizable prefix
with the model states it reaches.

`results` is what a checker or `compose` returned. Histories larger than
`max_ops` operations keep only the operations near the failing ones (or the
first `max_ops` when nothing failed), and say so on the page.
"""

from __future__ import annotations

from lab.templating import template_env

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from markupsafe import Markup

from checkers.pairs import pair_ops
from checkers.windows import NEMESIS, history_end_time, nemesis_windows

__all__ = ["failing_ops", "iter_violations", "render_html", "render_html_string"]

MAX_OPS = 20_000
CONTEXT = 200  # operations kept on each side of a failing one when the history is cut
SHOWN_CHARS = 300  # values longer than this are shortened in the page

_ENV = template_env(Path(__file__).with_name("templates"), trim=False)


def _checker_results(results: Mapping) -> Iterator[tuple[str, Mapping]]:
    """(name, result) for each checker inside a composed result, or ("result", results) for one."""
    inner = results.get("results")
    if isinstance(inner, Mapping):
        for name, r in inner.items():
            if isinstance(r, Mapping):
                yield str(name), r
    else:
        yield str(results.get("checker", "result")), results


def iter_violations(results: Mapping) -> Iterator[dict]:
    """Every reported problem as {checker, type, msg, ops}: domain violations and linearizability counterexamples."""
    for name, r in _checker_results(results):
        for v in r.get("violations") or []:
            if isinstance(v, Mapping):
                yield {"checker": name, "type": str(v.get("type", "violation")), "msg": str(v.get("msg", "")),
                       "ops": [i for i in v.get("ops", []) if isinstance(i, int)]}
        ce = r.get("counterexample")
        if isinstance(ce, Mapping):
            window = [i for i in ce.get("window", []) if isinstance(i, int)]
            yield {"checker": name, "type": "not-linearizable",
                   "msg": f"key {ce.get('key')!r}: no linearization extends the longest linearizable prefix "
                          f"({len(ce.get('prefix', []))} ops) with any of the ops in the window",
                   "ops": window}
        if r.get("error"):
            yield {"checker": name, "type": "error", "msg": str(r["error"]), "ops": []}


def failing_ops(results: Mapping) -> list[int]:
    """The history indices of every op a violation or counterexample names, sorted."""
    return sorted({i for v in iter_violations(results) for i in v["ops"]})


def _linear(results: Mapping) -> dict | None:
    """The first linearizability counterexample, shaped for the page."""
    for name, r in _checker_results(results):
        ce = r.get("counterexample")
        if isinstance(ce, Mapping):
            return {"checker": name, "model": r.get("model"), "key": _short(ce.get("key")),
                    "prefix": list(ce.get("prefix", [])), "window": list(ce.get("window", [])),
                    "prefix_ops": [_short_op(o) for o in ce.get("prefix_ops", [])],
                    "window_ops": [_short_op(o) for o in ce.get("window_ops", [])],
                    "states": [_short(s) for s in ce.get("states", [])]}
    return None


def _short(x: Any) -> str | None:
    """A JSON-ish one-line text of a value, shortened for display."""
    if x is None:
        return None
    s = x if isinstance(x, str) else json.dumps(x, default=str, sort_keys=True)
    return s if len(s) <= SHOWN_CHARS else s[:SHOWN_CHARS] + "…"


def _short_op(o: Any) -> dict:
    """A described op of a counterexample, values shortened."""
    if not isinstance(o, Mapping):
        return {"op": _short(o)}
    return {k: (v if isinstance(v, int | float | bool) or v is None else _short(v)) for k, v in o.items()}


def _ops_for_page(history: list[dict], failing: set[int], max_ops: int) -> tuple[list[dict], bool]:
    """The operations drawn on the page (all, or those near failing ones), and whether some were cut."""
    pairs = pair_ops(history, strict=False)  # a page shows even a malformed history (its verdict says why)
    keep = range(len(pairs))
    cut = len(pairs) > max_ops
    if cut:
        hits = [n for n, p in enumerate(pairs) if p.i0 in failing or p.i1 in failing]
        chosen: set[int] = set()
        context = max(1, min(CONTEXT, max_ops // (2 * max(1, len(hits)))))
        for n in hits:
            chosen.update(range(max(0, n - context), min(len(pairs), n + context + 1)))
            if len(chosen) >= max_ops:
                break
        keep = sorted(chosen) if hits else range(max_ops)
    ops = []
    for n in keep:
        p = pairs[n]
        ops.append({"i0": p.i0, "i1": p.i1, "process": p.process, "f": p.f, "type": p.type, "t0": p.t0,
                    "t1": p.t1, "key": _short(p.key), "value": _short(p.value), "result": _short(p.result),
                    "error": _short(p.comp.get("error")) if p.comp else None,
                    "bad": p.i0 in failing or (p.i1 is not None and p.i1 in failing)})
    return ops, cut


def _json_for_script(data: Any) -> Markup:
    """JSON safe to inline in a <script> element.

    Autoescaping would turn quotes into entities, which a script element does not
    decode; instead every character that could end the element or open markup
    (`<`, `>`, `&`) and the JS line separators are written as \\u escapes,
    so "</script>" inside any value cannot close the element.
    """
    text = json.dumps(data, default=str, allow_nan=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return Markup(text)


def render_html_string(results: Mapping, history: list[dict], *, title: str = "fencelab check",
                       source: str | None = None, max_ops: int = MAX_OPS) -> str:
    """The page for `results` over `history` (see module docstring)."""
    violations = list(iter_violations(results))
    failing = {i for v in violations for i in v["ops"]}
    ops, cut = _ops_for_page(history, failing, max_ops)
    processes = sorted({o["process"] for o in ops}, key=lambda p: (not isinstance(p, int), str(p)))
    checkers = [{"name": n, "valid": r.get("valid"), "why": _why(r)} for n, r in _checker_results(results)]
    data = {
        "title": title, "source": source, "valid": results.get("valid"), "checkers": checkers,
        "ops": ops, "processes": processes, "cut": cut, "total_ops": len(history),
        "end": history_end_time(history), "windows": nemesis_windows(history),
        "nemesis": [{"index": op.get("index", n), "time": op.get("time", 0), "f": op.get("f"),
                     "value": _short(op.get("value"))}
                    for n, op in enumerate(history) if op.get("process") == NEMESIS][:max_ops],
        "failing": sorted(failing), "violations": violations, "linear": _linear(results),
    }
    template = _ENV.get_template("timeline.html.j2")
    return template.render(data=data, data_json=_json_for_script(data), violations=violations[:1000],
                           linear=data["linear"], title=title, source=source, valid=results.get("valid"),
                           checkers=checkers, cut=cut,
                           reason=results.get("reason") if isinstance(results.get("results"), Mapping) else None)


def render_html(results: Mapping, history: list[dict], path: str | Path, **kw: Any) -> Path:
    """Write the page to `path` (parent directories created); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html_string(results, history, **kw), encoding="utf-8")
    return p


def _why(r: Mapping) -> str | None:
    """Why a checker could not decide (its error or reason), shown next to an unknown verdict."""
    if r.get("valid") in (True, False):
        return None
    return str(r.get("error") or r.get("reason") or "undecided")
