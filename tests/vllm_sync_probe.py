"""Test helper for tests/test_vllm_cpu.py: train the math recipe with vLLM on CPU through the project's own runner
(start-up checks, RecipeTrainer and its CPU weight sync, checkpoint markers) and record what the generator and the
trainer compute.

    python vllm_sync_probe.py --out records.json [--kill-server-pgid P] [--fault corrupt-weights] -- RECIPE ARGS...

Runs in its own process because a colocated vLLM engine changes process-wide state (torch.distributed's default
group, `torch.set_num_threads`, which vLLM-CPU disables), so two engines cannot share one test process.

Each record holds, for one fixed prompt, the log-probability of every prompt token after the first, from
- the trainer's model (fp32, transformers) at the end of each optimiser step, and
- vLLM (prompt_logprobs: `LLM.generate` when colocated, the server's `/v1/completions` through TRL's client), read at
  the end of each step, i.e. with the weights the trainer synced before that step's generation: those of the
  previous step.
Fault injection: `--fault corrupt-weights` sends a wrongly shaped tensor on the second sync; `--kill-server-pgid`
kills the server's process group at the end of step 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback
from vllm import SamplingParams

from grpo_recipes.run import runner
from grpo_recipes.vllm.cpu_sync import CPUVLLMGeneration

RECIPE_CONFIG = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "math_cpu.yaml"
PROMPT_IDS = list(range(100, 140))  # 40 arbitrary token ids: the same prompt in every run


def trainer_logprobs(model) -> list[float]:
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        logits = model(input_ids=ids).logits.float()
        return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


def vllm_logprobs(generation: CPUVLLMGeneration) -> list[float]:
    if generation.mode == "colocate":
        out = generation.llm.generate([{"prompt_token_ids": PROMPT_IDS}],
                                      SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        lps = out[0].prompt_logprobs
        return [lps[i][PROMPT_IDS[i]].logprob for i in range(1, len(PROMPT_IDS))]
    out = generation.vllm_client.get_sequence_logprobs([PROMPT_IDS], [1], top_logprobs=1)
    return [position[0] for position in out["actual_logprobs"][0]]


class Probe(TrainerCallback):
    def __init__(self, trainer, records: list, out: Path, kill_pgid: int | None):
        self.trainer, self.records, self.out, self.kill_pgid = trainer, records, out, kill_pgid

    def record(self, step: int) -> None:
        self.records.append({"step": step, "trainer": trainer_logprobs(self.trainer.model),
                             "vllm": vllm_logprobs(self.trainer.vllm_generation)})
        self.out.write_text(json.dumps({"records": self.records}))  # kept even if a later step fails

    def on_step_end(self, args, state, control, **kwargs):
        self.record(state.global_step)
        if self.kill_pgid and state.global_step == 1:
            os.killpg(self.kill_pgid, signal.SIGKILL)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The step's reward spread, logged after on_step_end: a step whose groups all scored alike cannot move.
        if self.records and logs and "reward_std" in logs:
            self.records[-1]["logs"] = {k: logs[k] for k in ("reward_std", "frac_reward_zero_std") if k in logs}
            self.out.write_text(json.dumps({"records": self.records}))


def corrupt_second_sync(generation: CPUVLLMGeneration) -> None:
    original = generation._iter_named_params
    calls = {"n": 0}

    def iterate():
        calls["n"] += 1
        for name, param in original():
            if calls["n"] == 2 and name.endswith("embed_tokens.weight"):
                param = param[:-1]  # one row short: vLLM must refuse it
            yield name, param

    generation._iter_named_params = iterate


def main(argv: list[str]) -> int:
    split = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--fault", choices=("none", "corrupt-weights"), default="none")
    p.add_argument("--kill-server-pgid", type=int, default=None)
    a = p.parse_args(argv[:split])
    run = runner.prepare("math", argv[split + 1:], RECIPE_CONFIG)
    trainer = runner.build_trainer(run)
    assert type(trainer.vllm_generation) is CPUVLLMGeneration, type(trainer.vllm_generation)
    probe = Probe(trainer, [], Path(a.out), a.kill_server_pgid)
    probe.record(0)
    trainer.add_callback(probe)
    if a.fault == "corrupt-weights":
        corrupt_second_sync(trainer.vllm_generation)
    return runner.train_and_save(trainer, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
