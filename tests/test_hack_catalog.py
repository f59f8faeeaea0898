"""The hack catalog (grpo_recipes/rewards/hacks.py) against every shipped reward: each catalogued score holds, on the rows
`grpo-recipes rewards check` uses by default. A change that makes a shipped reward pay for a hack fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_recipes.rewards import hacks, registry
from grpo_recipes.rewards.check import check_reward, default_rows

pytestmark = pytest.mark.filterwarnings("ignore::Warning")  # sympy deprecations from odd LaTeX, not ours

REPO = Path(__file__).resolve().parent.parent
KNOWN = registry.available()
SHIPPED = sorted(n for n, r in KNOWN.items() if Path(r.source).parent == REPO / "rewards")
SANDBOXED = {"unit_tests", "unit_tests_binary", "io_tests"}  # code rewards: their catalog is the sandbox's own suite


def _params(profile: str) -> tuple[str, dict]:
    name, _, rest = profile.partition("[")
    params = dict(item.split("=", 1) for item in rest.rstrip("]").split(",") if item)
    return name, params


def test_every_shipped_reward_has_a_catalogued_profile():
    assert {_params(p)[0] for p in hacks.PROFILES} == set(SHIPPED) - SANDBOXED


@pytest.mark.parametrize("profile", sorted(hacks.PROFILES))
def test_catalogued_scores_hold(profile):
    name, params = _params(profile)
    rdef = KNOWN[name]
    report = check_reward(rdef, default_rows(rdef, 6), params, fuzz=False)
    assert report.ok, report.render()
    assert report.profile == profile
    assert report.hacks, f"no catalog entry matches {profile} ({report.hack_targets})"
    for result in report.hacks:
        assert result.expected is not None, f"{result.hack.name}: the catalog records no score for {profile}"
        assert result.as_catalogued, (f"{profile} scored {result.hack.name} {result.scores}, the catalog records "
                                      f"{result.expected}")
        # A shipped reward that pays for a hack, or refuses a fair answer, does so only where the catalog says why.
        if result.finding != "ok":
            assert hacks.gap(result.hack, profile), f"{profile}: {result.hack.name} {result.finding} without a reason"


def test_catalog_entries_are_well_formed():
    names = [h.name for h in hacks.CATALOG]
    assert len(names) == len(set(names))
    for h in hacks.CATALOG:
        assert h.kind in ("hack", "fair") and h.what and h.target in (hacks.ANSWER, hacks.THINK, hacks.BOXED,
                                                                        hacks.SCHEMA, hacks.GOLD, hacks.TOKENS,
                                                                        hacks.EPISODE)
        assert set(h.expect) <= hacks.PROFILES and set(h.gaps) <= hacks.PROFILES | {"*"} | {
            p.split("[")[0] for p in hacks.PROFILES}


@pytest.mark.parametrize("question, expression", [
    ("Calculate ( -9 - 8 ).", "( -9 - 8 )"),
    ("Calculate -1 - 0.", "-1 - 0"),
    ("Calculate 2 + -1.", "2 + -1"),
    ("What is 12 * 3 and then some?", "12 * 3"),
    ("Natalia sold clips to 48 of her friends.", None),
])
def test_question_expression(question, expression):
    assert hacks.question_expression(question) == expression


def test_targets_follow_what_a_reward_reads():
    def of(name: str) -> set[str]:
        r = KNOWN[name]
        return hacks.targets(r.name, r.columns, r.role, r.context, r.doc)

    assert of("math_correctness") == {hacks.ANSWER}
    assert of("think_format_if_correct") == {hacks.ANSWER, hacks.THINK}
    assert of("boxed_format") == {hacks.BOXED}
    assert of("think_format") == of("think_tag_count") == {hacks.THINK}
    assert of("json_schema") == {hacks.SCHEMA} and of("json_field_accuracy") == {hacks.GOLD}
    assert of("length_reward") == {hacks.TOKENS}
    assert of("tool_grounded") == {hacks.EPISODE} and of("final_answer") == {hacks.ANSWER}
    assert hacks.targets("my_format", (), "format", (), "checks the layout") == {hacks.THINK, hacks.BOXED}
    assert hacks.targets("mine", ("answer", "question"), None, ("completion_ids",), "") == {hacks.ANSWER, hacks.TOKENS}
