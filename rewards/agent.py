"""Tool-use rewards: the final answer, strictly verified, and tool use that only pays when it produced that answer.

Both read the episode as messages (the `completion_messages` context name: a tool run's completions are message
lists, and their flattened text would include the tool results, where a tool output like "\\boxed{94}" would count
as the model's answer). Only the last assistant turn, one that makes no call, is the answer, read with the project's
answer policy (grpo_recipes/answers.py, via episodes.final_literal).

Hacks considered, and what stops each (tests/test_agent_rewards.py has one test per line):
- call a tool for its own sake (any expression, the question text, many calls): tool_grounded pays only when the
  final answer is correct AND a successful call computed it, and only up to `max_calls` calls;
- feed the answer to a tool to have it returned (`calculator("94")`, `calculator("94 + 0")`), or try candidates in
  one turn and keep the one that fits: the grounding call must compute (an operator between two numbers), with the
  question's numbers and earlier results only (when the prompt's question is an arithmetic expression worth the
  gold), and the other calls of its turn must return no other number;
- echo a tool result computed from the wrong expression: that answer is wrong, so neither reward pays;
- write a fake <tool_response> or a \\boxed{} inside a call turn, or have the python tool print "\\boxed{N}": only a
  real `tool` message grounds, only the final no-call turn answers;
- hedge with several different \\boxed{} or a non-literal (\\frac{188}{2}, 90+4): the final box group must state
  one number literal;
- stop mid-episode (iteration or length limit) with a guess: an unfinished episode scores 0.
"""

from __future__ import annotations

from grpo_recipes.rewards import reward
from grpo_recipes.rewards.answers import asked_expression, parse_literal
from grpo_recipes.tools.episodes import is_correct, read_episode


@reward("final_answer")
def final_answer(completions, answer, completion_messages, log_metric) -> list[float | None]:
    """1.0 when the episode's final turn states the gold number; None for a gold that is not a number literal."""
    scores = []
    for messages, gold in zip(completion_messages, answer, strict=True):
        verdict = is_correct(read_episode(messages), gold)
        scores.append(None if verdict is None else float(verdict))
    log_metric("gold_not_number", sum(s is None for s in scores) / max(len(scores), 1))
    return scores


@reward("tool_grounded")
def tool_grounded(completions, answer, completion_messages, *, max_calls: int = 3, prompts=None) -> list[float | None]:
    """1.0 when the final answer is correct and a successful tool call computed it (<= max_calls calls)."""
    scores = []
    for i, (messages, gold) in enumerate(zip(completion_messages, answer, strict=True)):
        if parse_literal(str(gold)) is None:
            scores.append(None)
            continue
        ep = read_episode(messages)
        expression = asked_expression(prompts[i], str(gold)) if prompts is not None else None
        ok = bool(is_correct(ep, gold)) and 0 < len(ep.calls) <= max_calls and ep.computed_answer(expression)
        scores.append(float(ok))
    return scores


def _check_examples(row: dict, params: dict) -> dict[str, list]:
    """For `grpo-recipes rewards check`: the question's expression computed by the calculator and its result boxed is
    good; the same call then a wrong box, and the right box with no call, are bad. Text alone never pays this reward,
    so its good and bad must be episodes."""
    gold = str(row.get("answer", ""))
    expression = asked_expression(str(row.get("question", "")), gold)
    if expression is None:  # not an arithmetic question: no episode can ground its answer
        return {"good": [], "bad": [f"\\boxed{{{gold}}}"]}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]}
    result = {"role": "tool", "name": "calculator", "content": gold}
    return {"good": [[call, result, {"role": "assistant", "content": f"The answer is \\boxed{{{gold}}}."}]],
            "bad": [[call, result, {"role": "assistant", "content": f"\\boxed{{{gold}1}}"}], f"\\boxed{{{gold}}}"]}


tool_grounded.check_examples = _check_examples
