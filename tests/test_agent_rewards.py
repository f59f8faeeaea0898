"""The agent rewards: one test per hack considered in rewards/agent.py, and the tool metrics."""

import importlib.util
from pathlib import Path

import pytest

from grpo_recipes.tools.episodes import read_episode, tool_metrics
from grpo_recipes.tools.templates import INVALID_CALL

_spec = importlib.util.spec_from_file_location("agent_rewards_t", Path(__file__).parent.parent / "rewards" / "agent.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)


def score(messages, gold="94", **kw):
    log = lambda *a: None  # noqa: E731
    fa = R.final_answer([""], [gold], [messages], log)[0]
    tg = R.tool_grounded([""], [gold], [messages], **kw)[0]
    return fa, tg


def call(expr, name="calculator"):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {"expression": expr}}}]}


def result(content, name="calculator"):
    return {"role": "tool", "name": name, "content": content}


def final(text):
    return {"role": "assistant", "content": text}


def test_the_intended_episode_gets_both():
    assert score([call("95 - 21 / 21"), result("94"), final("The answer is \\boxed{94}.")]) == (1.0, 1.0)


def test_correct_without_a_tool_gets_no_tool_credit():
    assert score([final("\\boxed{94}")]) == (1.0, 0.0)


def test_calling_for_its_own_sake_pays_nothing():
    # any expression, the question text, then a wrong or unrelated answer
    assert score([call("1 + 1"), result("2"), final("\\boxed{2}")]) == (0.0, 0.0)
    assert score([call("Calculate 95 - 21 / 21."), result("error (tool_error): cannot parse"),
                  final("\\boxed{94}")]) == (1.0, 0.0)  # right answer, but no tool result grounds it


def test_many_calls_do_not_pay():
    many = [m for _ in range(4) for m in (call("95 - 21 / 21"), result("94"))]
    assert score(many + [final("\\boxed{94}")], max_calls=3) == (1.0, 0.0)
    assert score(many[:6] + [final("\\boxed{94}")], max_calls=3) == (1.0, 1.0)


def test_echoing_a_wrong_expression_result_pays_nothing():
    assert score([call("95 - 21"), result("74"), final("\\boxed{74}")]) == (0.0, 0.0)


def test_correct_answer_not_from_the_tool_result_gets_no_tool_credit():
    assert score([call("95 - 21"), result("74"), final("\\boxed{94}")]) == (1.0, 0.0)


def test_fake_tool_response_in_the_assistant_text_does_not_ground():
    assert score([final("<tool_response>\n94\n</tool_response>\n\\boxed{94}")]) == (1.0, 0.0)


def test_tool_output_boxes_are_not_the_answer():
    # a python tool printing the box: registry.completion_text would have counted this text
    ep = [call("print('\\\\boxed{94}')", name="python"), result("\\boxed{94}", name="python"), final("done")]
    assert score(ep) == (0.0, 0.0)


def test_answer_inside_a_call_turn_does_not_count():
    turn = call("95 - 21 / 21")
    turn["content"] = "I think \\boxed{94}"
    assert score([turn, result("94")]) == (0.0, 0.0)  # unfinished: the last turn still calls


def test_hedging_and_non_literals_fail():
    # The project's answer policy (answers.py): the final box group must state one number literal.
    for text in ("\\boxed{74} or \\boxed{94}", "\\boxed{\\frac{188}{2}}", "\\boxed{90 + 4}", "94", "\\boxed{94"):
        fa, tg = score([call("95 - 21 / 21"), result("94"), final(text)])
        assert (fa, tg) == (0.0, 0.0), text
    # The same number written another way is the same answer; a draft box corrected later is judged on the last.
    for text in ("\\boxed{94.0}", "\\boxed{ 94 }x", "\\boxed{74}. Wait, the tool says \\boxed{94}"):
        assert score([call("95 - 21 / 21"), result("94"), final(text)]) == (1.0, 1.0), text


def test_error_results_never_ground():
    assert score([call("x"), result("error (tool_error): 94 is not allowed"), final("\\boxed{94}")]) == (1.0, 0.0)


def test_a_gold_that_is_not_a_number_is_unscorable():
    assert score([final("\\boxed{x+1}")], gold="x+1") == (None, None)
    assert score([final("\\boxed{1.5}")], gold="1.5") == (1.0, 0.0)  # non-integer numbers are scored


def test_rewards_never_raise_on_garbage():
    for junk in (None, [], [None, 3, "x"], [{"role": "assistant"}], [{"role": "tool", "content": None}],
                 [{"role": "assistant", "content": None, "tool_calls": [{"oops": 1}]}], "plain text \\boxed{94}"):
        score(junk)


def test_tool_metrics():
    eps = [
        [call("95 - 21 / 21"), result("94"), final("\\boxed{94}")],  # call, used, right
        [call("1+1"), result("2"), final("\\boxed{3}")],  # call, not used, wrong
        [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": INVALID_CALL, "arguments": {}}}]},
         result("error (malformed): x", name=INVALID_CALL), final("\\boxed{94}")],
        [final("\\boxed{94}")],  # no call, right
    ]
    m = tool_metrics(eps, ["94", "94", "94", "94"])
    assert m["tools/call_rate"] == 0.75
    assert m["tools/calls_per_episode"] == 0.75
    assert m["tools/turns_per_episode"] == 7 / 4
    assert m["tools/error_rate"] == pytest.approx(1 / 3)
    assert m["tools/errors/malformed"] == pytest.approx(1 / 3) and m["tools/errors/timeout"] == 0
    assert m["tools/malformed_call_rate"] == pytest.approx(1 / 3)
    assert m["tools/accuracy_with_call"] == pytest.approx(2 / 3)
    assert m["tools/accuracy_without_call"] == 1.0
    assert m["tools/answer_from_tool_rate"] == 0.5
    assert "tools/accuracy_with_call" not in tool_metrics([[final("x")]], ["1"])  # undefined: absent, not 0


def test_read_episode_counts_turns_and_results():
    ep = read_episode([call("1"), result("1"), call("2"), result("2"), final("\\boxed{2}")])
    assert (ep.turns, len(ep.calls), [v.value for v in ep.tool_values], ep.final_text) == (3, 2, [1, 2], "\\boxed{2}")


def test_transcript_is_one_readable_line():
    from grpo_recipes.tools.episodes import transcript

    ep = [call("1 + 2"), result("3"), final("The answer is \\boxed{3}.")]
    assert transcript(ep) == '-> calculator({"expression": "1 + 2"}) => 3 | The answer is \\boxed{3}.'
    assert transcript(None) == "" and transcript("plain") == "plain"


# ---- issue 46: the bonus pays only for an answer a tool computed, and final_answer reads the answer policy's text

QUESTION = [{"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "Calculate 95 - 21 / 21. Answer with \\boxed{} around the final number."}]


def asked(messages, gold="94"):
    """Both rewards with the prompt, as TRL calls them."""
    return (R.final_answer([""], [gold], [messages], lambda *a: None)[0],
            R.tool_grounded([""], [gold], [messages], prompts=[QUESTION])[0])


def calls(*exprs):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}} for e in exprs]}


def test_issue46_a_call_that_computes_nothing_earns_no_bonus():
    done = final("\\boxed{94}")
    for episode in ([call("94"), result("94"), done],                                       # the answer fed in
                    [call("(94)"), result("94"), done],
                    [call("94 + 0"), result("94"), done],                                   # plus nothing
                    [call("94 * 1"), result("94"), done],
                    [calls("93", "94", "95"), result("93"), result("94"), result("95"), done],   # candidates
                    [calls("95 - 21 / 21", "95 + 21 / 21"), result("94"), result("96"), done]):
        assert asked(episode) == (1.0, 0.0), episode
    # Without the prompt, what needs no question still holds: a literal echo and candidates earn nothing.
    assert score([call("94"), result("94"), done]) == (1.0, 0.0)
    assert score([calls("93", "94", "95"), result("93"), result("94"), result("95"), done]) == (1.0, 0.0)


def test_issue46_computing_the_answer_still_earns_the_bonus():
    done = final("The answer is \\boxed{94}.")
    for episode in ([call("95 - 21 / 21"), result("94"), done],
                    [call("-21/21 + 95"), result("94"), done],                              # reordered
                    [call("21 / 21"), result("1"), call("95 - 1"), result("94"), done],     # in two steps
                    [call("95 - 21 / 21"), result("94"), call("94 + 21 / 21"), result("95"), done],  # then a check
                    [calls("95 - 21 / 21", "95 - 1"), result("94"), result("94"), done]):   # two agreeing calls
        assert asked(episode) == (1.0, 1.0), episode


@pytest.mark.parametrize("text", ["\\boxed{94} no wait, 95", "\\boxed{94}. Actually, the answer is 95.",
                                  "It is not \\boxed{94}.", "\\boxed{94} is wrong.",
                                  "\\boxed{95}\n<!-- final: \\boxed{94} -->", "\\boxed{95} or it could be \\boxed{94}",
                                  "\\boxed{94 \\text{ is ruled out}}"])
def test_issue46_final_answer_reads_the_text_around_the_box(text):
    assert score([call("95 - 21 / 21"), result("94"), final(text)]) == (0.0, 0.0)


def test_issue46_final_answer_accepts_fair_forms():
    for text in ("\\boxed{\\boldsymbol{94}}", "\\boxed{\u200e94}", "\\boxed{94}, not 95. I hope it is correct."):
        assert score([call("95 - 21 / 21"), result("94"), final(text)]) == (1.0, 1.0), text
