"""Multi-turn token fidelity (issue 36), the agent recipe with transformers generation: the ids the loss trains on are
the ids the policy sampled, token for token, and the loss mask covers those and nothing else (token_fidelity.py
checks it; tests/test_vllm_cpu.py runs the same check with vLLM).

The agent recipe (runner, agent_cpu.yaml, the chatml_tools template) runs one GRPO step on the tiny model. A random
model never calls a tool, so a scripted policy forces each row's tokens through the model's own `generate` (a logits
processor that leaves one token possible): tool calls, then answers, so episodes are multi-turn with tool results.
One row goes on freely after its tool result: the model's own random tokens, until TRL cuts the episode at
max_completion_length. One call is forced in a tokenisation that is not the tokenizer's own ("calc" + "ulator"): the
decoded text re-tokenises to other ids, which is how re-tokenising pipelines train on ids never sampled (verl 3960).

The same step with a re-tokenising pipeline (the conversation rendered through the template and tokenised again, the
loss mask from its {% generation %} markers) fails the check; so does a template that rewrites an earlier turn once a
tool message follows it (`REWRITING_TEMPLATE`), which TRL's prefix check accepts. TRL itself never re-tokenises: it
concatenates the sampled ids and the tool suffixes, and trains on them with either template.
"""

from __future__ import annotations

import re

import pytest
from token_fidelity import AGENT_CONFIG, Recording, Retokenise, episodes, problems
from transformers import LogitsProcessor, LogitsProcessorList
from trl.chat_template_utils import is_chat_template_prefix_preserving

from grpo_recipes.run import runner
from grpo_recipes.stages import grpo as grpo_stage
from grpo_recipes.tools.templates import TEMPLATES

CHATML_TOOLS = TEMPLATES["chatml_tools"].chat_template
# chatml_tools, except that an assistant turn followed by a tool message loses its text before the call (as Qwen3's
# template drops earlier turns' reasoning): prefix-preserving for TRL's probe (a call without text), not for episodes.
REWRITING_TEMPLATE = CHATML_TOOLS.replace(
    "{%- generation -%}\n        {{- message['content'] or '' -}}",
    "{%- set content = '' if not loop.last and loop.nextitem['role'] == 'tool' else (message['content'] or '') -%}"
    "\n        {%- generation -%}\n        {{- content -}}",
).replace("{%- if not loop.first or message['content'] -%}", "{%- if not loop.first or content -%}")


def call(expression: str, text: str = "") -> str:
    return f'{text}<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


# The group's six rows, by position: the first turn, then what follows a tool result (by the last call's expression)
FIRST_TURN = {
    0: ("non-canonical call", None),  # call("12 + 30", "Let me compute it.\n") with "calculator" as calc|ulator
    1: ("call with text", call("5 * 5", "Let me compute it.\n")),
    2: ("two calls", call("1 + 1")),
    3: ("direct answer", "The answer is \\boxed{7}."),
    4: ("malformed call", '<tool_call>\n{"name": "calculator", "arguments": {"expression": 95 - 21}}\n</tool_call>'),
    5: ("call, then free", call("4 * 4")),  # then sampled by the model until TRL cuts it at max_completion_length
}
AFTER_RESULT = {"1 + 1": call("2 * 3"), "4 * 4": None}  # else: answer with the result


class Forced(LogitsProcessor):
    """Leaves one token possible per scripted row (None: the model samples freely); EOS once the script is done."""

    def __init__(self, scripts: list[list[int] | None], start: int, eos: int):
        self.scripts, self.start, self.eos = scripts, start, eos

    def __call__(self, input_ids, scores):
        step = input_ids.size(1) - self.start
        for row, script in enumerate(self.scripts):
            if script is not None:
                token = script[step] if step < len(script) else self.eos
                scores[row] = float("-inf")
                scores[row, token] = 0.0
        return scores


def script_generation(trainer) -> None:
    tok = trainer.processing_class
    eos = tok.eos_token_id

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    split = call("12 + 30", "Let me compute it.\n").split("calculator")
    non_canonical = ids(split[0]) + ids("calc") + ids("ulator") + ids(split[1]) + [eos]
    assert tok.decode(non_canonical) == call("12 + 30", "Let me compute it.\n") + "<|im_end|>"
    assert non_canonical != ids(tok.decode(non_canonical))  # re-tokenising changes it

    def script(row: int, context: list[int]) -> list[int] | None:
        text = tok.decode(context)
        episode = text.rsplit("<|im_start|>user\n", 1)
        if "<tool_response>" not in episode[-1]:  # first turn: by the row's place in its group
            kind, reply = FIRST_TURN[row % len(FIRST_TURN)]
            return non_canonical if kind == "non-canonical call" else None if reply is None else ids(reply) + [eos]
        expression = re.findall(r'"expression": "?([^"}]*)', text)[-1]
        result = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
        value = result if result.isdigit() else "0"
        reply = AFTER_RESULT.get(expression, f"The answer is \\boxed{{{value}}}.")
        return None if reply is None else ids(reply) + [eos]

    generate = trainer.model.generate

    def scripted(*args, input_ids, attention_mask, **kwargs):
        contexts = [row[m.bool()].tolist() for row, m in zip(input_ids, attention_mask, strict=True)]
        forced = Forced([script(i, c) for i, c in enumerate(contexts)], input_ids.size(1), eos)
        return generate(*args, input_ids=input_ids, attention_mask=attention_mask,
                        logits_processor=LogitsProcessorList([forced]), **kwargs)

    trainer.model.generate = scripted


def agent_step(model_dir, out, template: str, retokenise: bool):
    """One GRPO step of the agent recipe on the tiny model: (recording, trainer)."""
    argv = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--stages", '[{"name": "grpo"}]',
            "--max_steps", "1", "--train_size", "16", "--eval_size", "2", "--eval_heldout", "false",
            "--num_generations", "6", "--per_device_train_batch_size", "3", "--gradient_accumulation_steps", "2",
            "--save_strategy", "no", "--report_to", "none", "--log_completions", "false"]
    run = runner.prepare("agent", argv, AGENT_CONFIG)
    with pytest.MonkeyPatch.context() as mp:
        def with_template(recipe, model_path):
            tok = tool_tokenizer(recipe, model_path)
            tok.chat_template = template
            return tok

        tool_tokenizer = grpo_stage.tool_tokenizer
        mp.setattr(grpo_stage, "tool_tokenizer", with_template)
        trainer = runner.build_trainer(run)
    if retokenise:
        trainer.features.append(Retokenise())
    script_generation(trainer)
    recording = Recording().attach(trainer)
    assert runner.train_and_save(trainer, run) == 0
    return recording, trainer


MARKERS = {"non-canonical call": '"12 + 30"', "call with text": '"5 * 5"', "two calls": '"1 + 1"',
           "direct answer": "boxed{7}", "malformed call": "95 - 21}", "call, then free": '"4 * 4"'}


def kind_of(trainer, ids: list[int]) -> str:
    """Which scripted row a trained completion came from, read from its first turn."""
    first = trainer.processing_class.decode(ids).split("<|im_end|>")[0]
    [kind] = [kind for kind, marker in MARKERS.items() if marker in first]
    return kind


@pytest.fixture(scope="module")
def steps(tiny_model_dir, tmp_path_factory):
    cache = {}

    def step(template: str, retokenise: bool):
        key = (template, retokenise)
        if key not in cache:
            cache[key] = agent_step(tiny_model_dir, tmp_path_factory.mktemp("agent"), template, retokenise)
        return cache[key]

    return step


def test_the_rewriting_template_passes_trls_check_and_rewrites_earlier_turns(tool_tokenizer):
    tool_tokenizer.chat_template = REWRITING_TEMPLATE
    assert is_chat_template_prefix_preserving(tool_tokenizer)  # TRL would train with it
    turn = {"role": "assistant", "content": "Let me compute it.",
            "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1"}}}]}
    history = [{"role": "user", "content": "q"}, turn]
    alone = tool_tokenizer.apply_chat_template(history, tokenize=False)
    followed = tool_tokenizer.apply_chat_template(history + [{"role": "tool", "name": "calculator", "content": "1"}],
                                                  tokenize=False)
    assert "Let me compute it." in alone and "Let me compute it." not in followed


@pytest.mark.parametrize("template", [CHATML_TOOLS, REWRITING_TEMPLATE], ids=["chatml_tools", "rewriting"])
def test_the_loss_trains_on_the_sampled_ids_and_masks_everything_else(steps, template):
    recording, trainer = steps(template, retokenise=False)
    limit, decode = trainer.args.max_completion_length, trainer.processing_class.decode
    assert problems(recording, limit, decode) == []
    eps = episodes(recording.calls)
    assert len(recording.rows) == len(eps) == 6  # one group, shuffled into two micro-batches
    assert sorted(len(e.turns) for e in eps) == [1, 2, 2, 2, 2, 3]
    assert sum(len(e.ids) > limit for e in eps) == 1  # trained as TRL cuts it (inside the last turn)
    masked = [decode([t for t, s in zip(e.ids, e.sampled, strict=True) if not s]) for e in eps]
    assert sum(bool(m) for m in masked) == 5  # each tool-using episode's suffixes, out of the loss:
    assert all(m.startswith("\n<|im_start|>user\n<tool_response>\n") and m.endswith("<|im_start|>assistant\n")
               for m in masked if m)  # the template's tokens and the results, the calculator's and its errors
    assert "<tool_response>\n42\n</tool_response>" in "".join(masked) and "error (malformed)" in "".join(masked)


def test_the_check_fails_on_trained_tool_results_and_on_a_cut_trl_does_not_make(steps):
    recording, trainer = steps(CHATML_TOOLS, retokenise=False)
    limit = trainer.args.max_completion_length
    unmasked = Recording(recording.calls, [{**row, "tool_mask": None} for row in recording.rows])
    assert sum("loss mask wrong" in p for p in problems(unmasked, limit)) == 5  # the rows with a tool result
    first = recording.rows[0]
    n, width = sum(first["completion_mask"]), len(first["completion_mask"])
    shorter = {**first, "completion_mask": [1] * (n - 1) + [0] * (width - n + 1)}  # its last sampled token dropped
    [found] = problems(Recording(recording.calls, [shorter, *recording.rows[1:]]), limit)
    assert found.startswith("row 0: trains") and "a cut other than TRL's" in found


# Rows a re-tokenising pipeline trains on ids never sampled: the same text in the tokenizer's own tokenisation, a
# malformed call rendered as parsed (INVALID_CALL), random tokens that decode and encode to other ids.
RETOKENISED = {"non-canonical call", "malformed call", "call, then free"}


@pytest.mark.parametrize("template, flagged", [
    (CHATML_TOOLS, RETOKENISED),
    (REWRITING_TEMPLATE, RETOKENISED | {"call with text"}),  # the text before its call is gone from the rendering
], ids=["chatml_tools", "rewriting"])
def test_a_retokenising_pipeline_fails_the_check(steps, template, flagged):
    recording, trainer = steps(template, retokenise=True)
    found = problems(recording, trainer.args.max_completion_length, trainer.processing_class.decode)
    rows = [int(re.match(r"row (\d+): ", p).group(1)) for p in found if p.startswith("row ")]
    # Exactly these rows: the others' sampled ids are what the template renders, tokenised, and they pass
    assert sorted(kind_of(trainer, recording.rows[r]["completion"]) for r in rows) == sorted(flagged), found
    assert all("trained ids differ from the sampled episode's" in p for p in found if p.startswith("row ")), found
    assert sum(p.startswith("episode ") and "never trained" in p for p in found) == len(flagged)
