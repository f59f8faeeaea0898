"""End to end through TRL 1.16's own tool loop (GRPOTrainer(tools=...), transformers generation, CPU).

A tiny random model never writes a tool call, so the failure modes are driven by a scripted policy: the trainer's
_generate_single_turn returns chosen texts (everything else, parsing, dispatch, tool suffixes, masks, rewards,
loss and logging, is TRL's and ours, unchanged). One rollout per failure mode, all in one step.
"""

import importlib.util
import re
import threading
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from grpo_recipes.grpo.features.tools import ToolCalls
from grpo_recipes.grpo.trainer import RecipeTrainer
from grpo_recipes.tools.episodes import classify, read_episode
from grpo_recipes.tools.registry import available, build_tools, guarded, registered, tool
from grpo_recipes.tools.templates import INVALID_CALL

_spec = importlib.util.spec_from_file_location("agent_rewards_e2e", Path(__file__).parent.parent / "rewards" / "agent.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)

RELEASE = threading.Event()
INT = r"-?\d+"


def stall(seconds: int) -> str:
    """Wait (test tool: never answers in time).

    Args:
        seconds: how long
    """
    RELEASE.wait()
    return "late"


def broken(x: int) -> str:
    """Raise (test tool).

    Args:
        x: anything
    """
    raise RuntimeError("tool bug")


tool(timeout_s=0.3)(stall)
tool(broken)

FIRST_TURN = [  # rollout i of the step, first turn
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "EXPR"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": 95 - 21}}\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "calc", "arguments": {"expression": "1"}}\n</tool_call>',  # unknown tool
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(1/0)"}}\n</tool_call>',
    '<tool_call>\n{"name": "python", "arguments": {"code": "while True: pass"}}\n</tool_call>',
    '<tool_call>\n{"name": "stall", "arguments": {"seconds": 5}}\n</tool_call>',
    '<tool_call>\n{"name": "broken", "arguments": {"x": 1}}\n</tool_call>',
    "I know it: \\boxed{1}",
]
KINDS = [None, "malformed", "unknown_tool", "program_error", "timeout", "timeout", "exception", "no call"]


def reward_funcs():
    def adapt(func):
        def f(prompts, completions, completion_ids, answer, log_metric, **_):
            extra = {"log_metric": log_metric} if func is R.final_answer else {}
            return func([""] * len(completions), answer, completions, **extra)

        f.__name__ = func.__name__
        return f

    return [adapt(R.final_answer), adapt(R.tool_grounded)]


class ScriptedTrainer(RecipeTrainer):
    captured = {}

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        out = []
        for i, ids in enumerate(prompt_ids):
            text = tok.decode(ids)
            turn = text.rsplit("<|im_start|>assistant\n", 1)[0]
            if "<tool_response>" not in turn.rsplit("<|im_start|>user\nCalculate", 1)[-1]:
                expr = re.search(r"Calculate (.*?)\. Answer", text).group(1)
                reply = FIRST_TURN[i].replace("EXPR", expr)
            else:
                last = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
                value = last if re.fullmatch(INT, last) else "0"
                reply = "The answer is \\boxed{" + value + "}."
            out.append(tok(reply + "<|im_end|>", add_special_tokens=False)["input_ids"])
        return out, None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.captured.update(output=output)
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.captured.update(completions=completions, prompts=prompts, rewards=rewards, inputs=inputs)
        return rewards


@pytest.fixture(scope="module")
def trained(tiny_model_dir, smollm_tokenizer_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    from grpo_recipes.tools.templates import install

    tool_tokenizer = install(AutoTokenizer.from_pretrained(smollm_tokenizer_dir), "chatml_tools")
    tmp_path = tmp_path_factory.mktemp("scripted")
    RELEASE.clear()
    rows = [{"q": "Calculate 95 - 21 / 21.", "a": "94"}]
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": "Use tools."},
                                          {"role": "user", "content": f"{r['q']} Answer with \\boxed{{}}."}],
                               "answer": r["a"]} for r in rows] * 4)
    tools = build_tools(["calculator", {"name": "python", "params": {"timeout_s": 1}}], available())
    tools += [guarded(registered()["stall"], {}), guarded(registered()["broken"], {})]
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, num_generations=8, per_device_train_batch_size=8,
                      max_completion_length=256, max_tool_calling_iterations=2, beta=0.0, learning_rate=1e-5,
                      logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                      log_completions=True, num_completions_to_print=0, shuffle_dataset=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trainer = ScriptedTrainer(model=model, processing_class=tool_tokenizer, reward_funcs=reward_funcs(), args=args,
                              train_dataset=data, tools=tools, features=[ToolCalls()])
    try:
        trainer.train()
    finally:
        RELEASE.set()
    return trainer


def test_every_failure_mode_is_a_tool_message_and_the_step_completes(trained):
    completions = trained.captured["completions"]
    assert trained.state.global_step == 1
    for i, (messages, kind) in enumerate(zip(completions, KINDS, strict=True)):
        tool_msgs = [m for m in messages if m["role"] == "tool"]
        if kind == "no call":
            assert tool_msgs == [] and len(messages) == 1, i
            continue
        assert len(tool_msgs) == 1, (i, messages)
        assert classify(tool_msgs[0]["content"]) == kind, (i, tool_msgs[0]["content"])
        assert messages[-1]["role"] == "assistant" and "\\boxed{" in messages[-1]["content"], i  # the model went on
    assert completions[0][1]["content"] == "94"
    assert "calculator" in completions[2][1]["content"]  # the unknown-tool message lists the real tools
    assert completions[1][0]["tool_calls"][0]["function"]["name"] == INVALID_CALL


def test_rewards_see_the_conversation(trained):
    rewards = trained.captured["rewards"]  # columns: final_answer, tool_grounded
    assert rewards[0].tolist() == [1.0, 1.0]  # called, used the result, right
    assert rewards[7].tolist() == [0.0, 0.0]  # guessed
    assert rewards[1:7, 1].sum() == 0  # no failed call earns tool credit


def test_tool_results_are_masked_from_the_loss(trained):
    out, tok = trained.captured["output"], trained.processing_class
    ids, mask, tmask = out["completion_ids"], out["completion_mask"], out["tool_mask"]
    for i in range(len(ids)):
        masked = [t for t, m, tm in zip(ids[i].tolist(), mask[i].tolist(), tmask[i].tolist()) if m and not tm]
        trained_text = tok.decode([t for t, m, tm in zip(ids[i].tolist(), mask[i].tolist(), tmask[i].tolist())
                                   if m and tm])
        if KINDS[i] == "no call":
            assert masked == []
            continue
        text = tok.decode(masked)
        assert text.startswith("\n<|im_start|>user\n<tool_response>\n") and text.endswith("<|im_start|>assistant\n")
        assert "<tool_response>" not in trained_text and trained_text.endswith("<|im_end|>")


def test_tool_metrics_are_logged(trained):
    logged = trained.state.log_history[0]
    assert logged["tools/call_rate"] == 7 / 8
    assert logged["tools/errors/timeout"] == pytest.approx(2 / 7)
    assert logged["tools/errors/malformed"] == pytest.approx(1 / 7)
    assert logged["tools/accuracy_without_call"] == 0.0
    assert logged["tools/call_frequency"] == 7 / 8  # TRL's own: calls per rollout
    assert logged["tools/failure_frequency"] == 0.0  # the guard answers before TRL sees an exception


def test_completions_table_holds_whole_conversations(trained):
    import pandas as pd

    [table] = (Path(trained.args.output_dir) / "completions").glob("*.parquet")
    df = pd.read_parquet(table)
    roles = [m["role"] for m in df["completion"][0]]
    assert roles == ["assistant", "tool", "assistant"]
    assert [v.value for v in read_episode(list(df["completion"][0])).tool_values] == [94]
    # tool_calls survive only as a Python repr string in the Parquet table: the transcript column is the readable one
    assert df["episode"][0] == ('-> calculator({"expression": "95 - 21 / 21"}) => 94 | The answer is \\boxed{94}.')
