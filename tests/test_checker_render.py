"""The counterexample page: one self-contained HTML file with the data inlined and the failures marked."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from checkers.core import DOMAIN_CHECKERS, compose, get_checker
from checkers.render import failing_ops, render_html, render_html_string
from test_checker_core import LeaseHistory


class Page(HTMLParser):
    """Collects the page's scripts, external references, and op links."""

    def __init__(self, html: str):
        super().__init__()
        self.scripts: list[tuple[dict, str]] = []
        self.external: list[str] = []
        self.op_links: list[int] = []
        self.window_rows = 0
        self._script: dict | None = None
        self._text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self._script, self._text = a, []
            if "src" in a:
                self.external.append(a["src"])
        if tag == "link" or (tag == "img" and "src" in a):
            self.external.append(a.get("href") or a.get("src"))
        if tag == "a" and "data-op" in a:
            assert a["href"] == f"#op-{a['data-op']}"
            self.op_links.append(int(a["data-op"]))
        if tag == "tr" and a.get("class") == "window-op":
            self.window_rows += 1

    def handle_data(self, data):
        if self._script is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None

    def data(self) -> dict:
        [(_, text)] = [(a, t) for a, t in self.scripts if a.get("type") == "application/json"]
        return json.loads(text)


def violating_history() -> tuple[LeaseHistory, list[int]]:
    """Two overlapping leases with the same token, inside a partition window; returns the bad acquire oks."""
    h = LeaseHistory()
    h.nemesis("partition", {"phase": "start"})
    _, a = h.acquire(0, "L1", 1, at=0, ttl=10_000)
    _, b = h.acquire(1, "L2", 1, at=100, ttl=10_000)
    h.nemesis("partition", {"phase": "end"})
    h.invoke(2, "acquire", {"request_id": "x"})  # never completes: drawn open-ended
    return h, [a, b]


def domain_results(ops: list[dict]) -> dict:
    return compose({n: get_checker(n) for n in DOMAIN_CHECKERS}).check({}, ops, {})


def test_page_inlines_the_data_and_marks_the_failing_ops(tmp_path):
    h, bad = violating_history()
    results = domain_results(h.ops)
    assert results["valid"] is False
    path = render_html(results, h.ops, tmp_path / "out" / "timeline.html", source="h.jsonl")
    page = Page(path.read_text(encoding="utf-8"))
    assert page.external == []  # self-contained: no network
    data = page.data()
    assert data["source"] == "h.jsonl" and data["valid"] is False
    assert set(bad) <= set(data["failing"]) and data["failing"] == failing_ops(results)
    drawn = {o["i1"]: o for o in data["ops"]}
    assert all(drawn[i]["bad"] for i in bad)
    assert [o["type"] for o in data["ops"]] == ["ok", "ok", "info"] and data["ops"][2]["t1"] is None
    assert [w["fault"] for w in data["windows"]] == ["partition"]
    assert {v["checker"] for v in data["violations"]} >= {"fencing", "mutual-exclusion"}
    assert set(bad) <= set(page.op_links)  # the violation table links each failing op


def test_script_closing_tags_in_values_cannot_escape_the_data_block():
    h = LeaseHistory()
    evil = "</script><script>alert(1)</script><!--"
    h.call(0, "acquire", {"request_id": evil}, None, type="fail", error={"code": "x", "msg": evil})
    results = {"valid": False, "violations": [{"type": "t", "ops": [0, 1], "msg": evil}]}
    html = render_html_string(results, h.ops)
    page = Page(html)
    assert len(page.scripts) == 2  # the data block and the page's own code, nothing injected
    data = page.data()
    assert evil in data["ops"][0]["value"] and data["violations"][0]["msg"] == evil
    assert "<script>alert" not in html


def test_linearizability_counterexample_shows_prefix_and_states():
    h = LeaseHistory()
    h.call(0, "write", 1, None, key=None)
    h.call(1, "write", 2, None, key=None)
    r0, r1 = h.call(0, "read", None, 1, key=None)  # 2 was written after 1 completed: stale read
    results = compose({"linearizable": get_checker("linearizable", model="register")}).check({}, h.ops, {})
    assert results["valid"] is False
    page = Page(render_html_string(results, h.ops))
    data = page.data()
    lin = data["linear"]
    assert lin["checker"] == "linearizable" and lin["model"] == "register"
    assert len(lin["states"]) == len(lin["prefix"]) + 1
    assert set(lin["window"]) & {r0, r1} and set(lin["window"]) <= set(data["failing"])
    assert page.window_rows == len(lin["window_ops"]) >= 1


def test_large_histories_keep_the_neighbourhood_of_failures():
    h = LeaseHistory()
    for n in range(300):
        h.call(n % 4, "inspect", {}, None)
    results = {"valid": False, "violations": [{"type": "t", "ops": [401], "msg": "m"}]}
    data = Page(render_html_string(results, h.ops, max_ops=50)).data()
    assert data["cut"] is True and 401 in {o["i1"] for o in data["ops"]} and len(data["ops"]) < 300


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_page_script_draws_every_op_and_jumps_to_the_first_error(tmp_path):
    """Run the page's own script under node with a minimal DOM stand-in."""
    h, bad = violating_history()
    html = render_html_string(domain_results(h.ops), h.ops)
    page = Page(html)
    [(_, code)] = [(a, t) for a, t in page.scripts if not a]
    data_text = page.data()
    harness = tmp_path / "run.js"
    harness.write_text(DOM_STUB + f"\nvar DATA = {json.dumps(json.dumps(data_text))};\n" + code + RUN_STUB)
    out = subprocess.run(["node", str(harness)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ops"] == len(data_text["ops"])
    assert sorted(report["bad"]) == sorted(f"op-{o['i0']}" for o in data_text["ops"] if o["bad"])
    assert report["windows"] == 1
    first = min(data_text["failing"])
    target = next(o for o in data_text["ops"] if first in (o["i0"], o["i1"]))
    assert report["focused"] == f"op-{target['i0']}"
    assert json.loads(report["details"])["i1"] == target["i1"] and target["i1"] in bad


DOM_STUB = r"""
function El(tag) { this.tag = tag; this.children = []; this.style = {}; this.className = ""; this.id = "";
  this.textContent = ""; this.listeners = {}; this.attrs = {}; var self = this;
  this.classList = { add: function (c) { self.className += " " + c; },
                     remove: function (c) { self.className = self.className.replace(c, ""); } }; }
El.prototype.appendChild = function (c) { this.children.push(c); return c; };
El.prototype.addEventListener = function (ev, fn) { this.listeners[ev] = fn; };
El.prototype.scrollIntoView = function () {};
El.prototype.getAttribute = function (k) { return this.attrs[k]; };
El.prototype.querySelectorAll = function (sel) {
  var out = []; (function walk(e) { e.children.forEach(function (c) {
    if (sel === ".focus" && / focus/.test(c.className)) { out.push(c); } walk(c); }); })(this); return out; };
var byId = {};
["lanes", "labels", "details", "jump", "zoom-in", "zoom-out", "fit", "summary"].forEach(function (id) {
  byId[id] = new El("div"); });
var document = {
  getElementById: function (id) { return id === "fencelab-data" ? { textContent: DATA } : byId[id]; },
  createElement: function (t) { return new El(t); },
  querySelectorAll: function () { return []; } };
var window = { innerWidth: 1200 };
"""

RUN_STUB = r"""
byId["jump"].listeners.click();
var ops = byId["lanes"].children.filter(function (c) { return /(^| )op /.test(c.className); });
var focused = ops.filter(function (c) { return / focus/.test(c.className); });
console.log(JSON.stringify({
  ops: ops.length,
  bad: ops.filter(function (c) { return / bad/.test(c.className); }).map(function (c) { return c.id; }),
  windows: byId["lanes"].children.filter(function (c) { return c.className === "win"; }).length,
  focused: focused.length ? focused[0].id : null,
  details: byId["details"].textContent }));
"""


def test_an_unknown_verdict_shows_its_reason():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)  # one acquisition: fencing has nothing to compare
    html = render_html_string(compose({"fencing": get_checker("fencing")}).check({}, h.ops, {}), h.ops)
    assert "no key was acquired twice" in html
    empty = render_html_string(compose({"fencing": get_checker("fencing")}).check({}, [], {}), [])
    assert "empty history: no client operation" in empty
