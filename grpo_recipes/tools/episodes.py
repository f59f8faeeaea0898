"""What happened in one tool-use episode, read from the completion TRL hands to rewards: a list of chat messages
(assistant turns, with their parsed `tool_calls`, and the `tool` messages the model was shown).

Shared by the agent rewards (final answer, tool grounding), the trainer's tool metrics and the held-out rollouts,
so all three read an episode the same way. The tool-message error format (`error (<kind>): ...`) is defined here
because it is what an episode is read by; tools.py writes it.

The final answer follows the project's answer policy (answers.py): the last assistant turn, one that makes no call,
is the answer turn; its final \\boxed{} group (or, without a box, "the answer is ...") must state one number
literal (no hedge, no expression).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..rewards.answers import (
    OPERATION,
    anchored_answer,
    answer_region,
    final_box_group,
    literal_equal,
    numbers_in,
    parse_literal,
    question_numbers,
    single_answer,
)
from .templates import INVALID_CALL

ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "program_error", "timeout", "exception")
_ERROR_RE = re.compile(r"^error \(([a-z_]+)\): ")


def error_message(kind: str, text: str) -> str:
    return f"error ({kind}): {text}"


def classify(content: str) -> str | None:
    """The error kind of a tool message's content, or None for a result. TRL's own wrapper ("{'error': ...}")
    only appears when a call bypassed the guard: reported as 'unguarded'."""
    m = _ERROR_RE.match(content or "")
    if m:
        return m.group(1)
    return "unguarded" if (content or "").startswith("{'error':") else None


@dataclass
class Episode:
    calls: list[tuple[str, dict]] = field(default_factory=list)  # (tool name, arguments) as parsed
    call_turns: list[int] = field(default_factory=list)  # the assistant turn (1, 2...) that made each call
    results: list[tuple[str, str | None]] = field(default_factory=list)  # (tool message content, error kind)
    turns: int = 0  # assistant turns
    final_text: str | None = None  # the last assistant turn, when it makes no call; None: the episode never ended

    @property
    def tool_values(self) -> list:
        """Number literals successful tool calls returned: the last line of a result, when it is one."""
        return [v for v in map(_result_value, self.results) if v is not None]

    def answer_from_tool(self) -> bool:
        """The final answer equals a number some successful call returned (the metric: answered with a result)."""
        answer = final_literal(self.final_text)
        return answer is not None and any(literal_equal(answer, v) for v in self.tool_values)

    def computed_answer(self, question_expression: str | None = None) -> bool:
        """The final answer is a result the episode computed, not one it fed a tool: a successful call returned it
        whose arguments compute something (an operator between two numbers: not `calculator("94")`), with only the
        question's numbers and earlier results when the question's expression is known (not `94 + 0`), and no call
        of the same turn returned another number (not three candidates at once, keeping the one that fits)."""
        answer = final_literal(self.final_text)
        if answer is None:
            return False
        allowed = question_numbers(question_expression) if question_expression else None
        values_by_turn: dict[int, list] = {}
        grounding_turns = set()
        for (_, arguments), turn, result in zip(self.calls, self.call_turns, self.results):
            value = _result_value(result)
            if value is None:
                continue
            values_by_turn.setdefault(turn, []).append(value)
            text = " ".join(str(v) for v in arguments.values() if isinstance(v, (str, int, float)))
            if OPERATION.search(text) is None or (allowed is not None and not numbers_in(text) <= allowed):
                continue
            if allowed is not None:
                allowed.add(abs(value.value))
            if literal_equal(answer, value):
                grounding_turns.add(turn)
        return any(all(literal_equal(v, answer) for v in values_by_turn[t]) for t in grounding_turns)

    @property
    def errors(self) -> list[str]:
        return [kind for _, kind in self.results if kind is not None]


def read_episode(completion) -> Episode:
    """A TRL completion (list of messages, or plain text for a run without tools) -> Episode. Never raises."""
    ep = Episode()
    if isinstance(completion, str):
        completion = [{"role": "assistant", "content": completion}]
    for msg in completion or ():
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "assistant":
            ep.turns += 1
            calls = msg.get("tool_calls") or []
            for call in calls:
                fn = call.get("function", call) if isinstance(call, dict) else {}
                ep.calls.append((str(fn.get("name")), fn.get("arguments") if isinstance(fn.get("arguments"), dict)
                                 else {}))
                ep.call_turns.append(ep.turns)
            ep.final_text = None if calls else str(msg.get("content") or "")
        elif msg.get("role") == "tool":
            content = msg.get("content")
            content = content if isinstance(content, str) else str(content)
            ep.results.append((content, classify(content)))
    return ep


def _result_value(result: tuple[str, str | None]):
    """The number a tool message returned: the last line of a successful result, when it is a number literal."""
    content, kind = result
    lines = [ln for ln in (content or "").strip().splitlines() if ln.strip()]
    return parse_literal(lines[-1].strip()) if kind is None and lines else None


def final_literal(text: str | None):
    """The answer of a final turn under the answer policy (answers.py): its final \\boxed{} group stating one number
    literal, or without a box the text after "the answer is"; None otherwise (no free-text fallback)."""
    region = answer_region(text) if text else None
    if region is None:
        return None
    group = final_box_group(region)
    answer = (single_answer(group) if group else None) if group is not None else anchored_answer(region)
    return parse_literal(answer) if answer is not None else None


def is_correct(ep: Episode, gold) -> bool | None:
    """None when the gold is not a number literal (cannot be scored strictly)."""
    g = parse_literal(str(gold)) if gold is not None else None
    if g is None:
        return None
    answer = final_literal(ep.final_text)
    return answer is not None and literal_equal(answer, g)


def tool_metrics(completions: list, answers: list) -> dict[str, float]:
    """Per-batch tool diagnostics (absent, never a fake 0, when undefined for this batch)."""
    eps = [read_episode(c) for c in completions]
    correct = [is_correct(e, a) for e, a in zip(eps, answers, strict=True)]
    n = max(len(eps), 1)
    calls = sum(len(e.calls) for e in eps)
    out = {
        "tools/call_rate": sum(bool(e.calls) for e in eps) / n,  # episodes with at least one call
        "tools/calls_per_episode": calls / n,
        "tools/turns_per_episode": sum(e.turns for e in eps) / n,
        "tools/unfinished_rate": sum(e.final_text is None for e in eps) / n,  # iteration/length limit hit
        "tools/malformed_call_rate": sum(name == INVALID_CALL for e in eps for name, _ in e.calls) / max(calls, 1),
    }
    results = [k for e in eps for _, k in e.results]
    if results:
        out["tools/error_rate"] = sum(k is not None for k in results) / len(results)
        for kind in (*ERROR_KINDS, "unguarded"):
            out[f"tools/errors/{kind}"] = sum(k == kind for k in results) / len(results)
    with_tool = [c for e, c in zip(eps, correct) if e.calls and c is not None]
    without = [c for e, c in zip(eps, correct) if not e.calls and c is not None]
    if with_tool:
        out["tools/accuracy_with_call"] = sum(with_tool) / len(with_tool)
    if without:
        out["tools/accuracy_without_call"] = sum(without) / len(without)
    grounded = [e for e in eps if e.tool_values]
    if grounded:  # of the episodes that got a usable result, how many answered with it
        out["tools/answer_from_tool_rate"] = sum(e.answer_from_tool() for e in grounded) / len(grounded)
    return out


def transcript(completion, max_chars: int = 2000) -> str:
    """One readable line per episode for the completions table (Parquet/Trackio keep `tool_calls` only as a Python
    repr string): 'text -> calculator({"expression": "1+2"}) => 3 | The answer is \\boxed{3}.'"""
    if isinstance(completion, str):
        return completion[:max_chars]
    parts = []
    for msg in completion or ():
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "tool":  # results follow their call on the same part
            result = f"=> {msg.get('content')}"
            parts[-1:] = [f"{parts[-1]} {result}" if parts else result]
            continue
        text = str(msg.get("content") or "").strip()
        for call in msg.get("tool_calls") or ():
            fn = call.get("function", call) if isinstance(call, dict) else {}
            text += f"{' ' if text else ''}-> {fn.get('name')}({json.dumps(fn.get('arguments'), ensure_ascii=False)})"
        parts.append(text)
    return " | ".join(parts)[:max_chars]
