"""Scenario tags are declared constants: an undeclared tag fails when the scenario is built, never a silent None.

Before, `Tagged.one("typo-0")` returned None and the check read it as "the
script never got there", passing without testing anything.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from checkers.core import safe_check
from lab.scenarios import SCENARIOS
from lab.scenarios.scenario import Scenario, ScenarioChecker, Script, Tagged, Tags, TagError, ok


def _script(s: Script):
    return s.steps(s.on(0, s.op("acquire", "k0", "acq-0", slot="A"), s.op("inspect", "k0", "inspect-0")))


def _check(t: Tagged, v, test):
    acq = t.one("acq-0")
    if ok(acq) and not ok(t.one("inspect-0")):
        v.add("not-inspected", [], "the inspect failed")
    return {"exercised": acq is not None}


def scenario(**changes) -> Scenario:
    base = dict(name="tiny", race="r", requires="q", rules=("C1",), setup="s", checks="c",
                script=_script, check=_check, tags=("acq", "inspect"))
    return Scenario(**{**base, **changes})


def test_a_scenario_with_declared_tags_builds():
    assert scenario().tags == ("acq", "inspect")


def test_a_script_emitting_an_undeclared_tag_fails_when_the_scenario_is_built():
    def typo_script(s: Script):
        tag = "inspcet-0"  # a variable: only the dry run of the script sees it
        return s.steps(s.on(0, s.op("acquire", "k0", "acq-0", slot="A"), s.op("inspect", "k0", tag)))

    with pytest.raises(TagError, match=r"scenario tiny: tag 'inspcet-0' is not declared \(declared: acq, inspect"):
        scenario(script=typo_script)


def test_a_check_looking_up_an_undeclared_literal_tag_fails_when_built():
    def typo_check(t: Tagged, v, test):
        return {"exercised": t.one("inspct-0") is not None}

    with pytest.raises(TagError, match="'inspct-0' is not declared"):
        scenario(check=typo_check)


def test_an_f_string_tag_with_an_undeclared_prefix_fails_when_built():
    def typo_check(t: Tagged, v, test):
        return {"exercised": any(t.one(f"aqc-{r}") for r in range(3))}

    with pytest.raises(TagError, match="no declared tag starts with 'aqc-'"):
        scenario(check=typo_check)


def test_starting_with_an_undeclared_prefix_fails_when_built():
    def typo_check(t: Tagged, v, test):
        return {"exercised": bool(t.starting("burst-"))}

    with pytest.raises(TagError, match="no declared tag starts with 'burst-'"):
        scenario(check=typo_check)


def test_a_round_is_one_segment_a_longer_suffix_is_not_declared():
    tags = Tags("x", ("acq", "acq-b"))
    assert tags.check("acq-0") == "acq-0" and tags.check("acq-b-3") == "acq-b-3" and tags.check("acq") == "acq"
    for bad in ("acq-x-0", "ac-0", "acq-", "acqb-0"):
        with pytest.raises(TagError):
            tags.check(bad)


def test_a_scenario_declaring_no_tags_fails_when_built():
    with pytest.raises(TagError, match="declares no tags"):
        scenario(tags=())


def test_an_undeclared_lookup_at_run_time_is_an_error_never_a_pass():
    """A tag built at run time (invisible to the source scan) still cannot read as "never ran"."""

    def sneaky_check(t: Tagged, v, test):
        name = "inspect" + "ed"
        return {"exercised": t.one(name + "-0") is None}  # a None here would have passed

    sc = scenario(check=sneaky_check)
    history = [{"index": 0, "type": "invoke", "process": 0, "f": "acquire", "key": "k0", "value": {}, "tag": "acq-0",
                "time": 1},
               {"index": 1, "type": "ok", "process": 0, "f": "acquire", "key": "k0", "value": {}, "time": 2}]
    with pytest.raises(TagError, match="'inspected-0' is not declared"):
        ScenarioChecker(sc).check({}, history, {})
    res = safe_check(ScenarioChecker(sc), {}, history, {})
    assert res["valid"] == "unknown" and "inspected-0" in str(res.get("error")), res


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_registered_scenario_emits_only_declared_tags(name):
    """Each registered scenario declares its tags, and its script (with and without the stack) uses them."""
    sc = SCENARIOS[name]
    assert sc.tags, name
    seen: set[str] = set()

    class Recording(Tags):
        def check(self, tag: str) -> str:
            seen.add(tag)
            return super().check(tag)

    for local in (True, False):
        test = SimpleNamespace(extra={"key_nonce": "n", "identity": {"namespace": "fencelab", "workflow": "w"}},
                               ttl_ms=2000, time_limit=3.0, concurrency=max(8, sc.min_concurrency))
        script = Script(test, local, Recording(name, sc.tags))
        sc.script(script)
        if sc.final is not None:
            sc.final(script)
    assert seen, f"{name}: the script emitted no tagged op"
