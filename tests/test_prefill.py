"""Prompt prefill once per distinct prompt (grpo_recipes/grpo/prefill.py) and `share_prompt_prefill` in GRPO's generation
(grpo_recipes/grpo/features/prefill.py): the same tokens as generate() prefilling every row, greedy and sampled, in a
unit and in a run; a TRL whose generation no longer calls the policy's generate() is an error, not a silent no-op."""

import json
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from helpers import REPO, tiny_run_args

from grpo_recipes.evaluation.heldout import EvalSettings, generation_config, prompt_token_ids
from grpo_recipes.grpo.features.prefill import PromptPrefill, common_prefix, distinct, prefill


def _plain(model, rows, config):
    width = max(map(len, rows))
    pad = config.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()


def test_common_prefix_stops_before_each_prompts_last_token():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # equal prompts: generate() still runs the last token
    assert common_prefix([[7], [7, 8]]) == 0
    assert common_prefix([[1, 9], [2, 9]]) == 0


def test_distinct_prompts_of_a_left_padded_batch_in_order():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [4, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]])
    prompts, index = distinct(ids, mask)
    assert prompts == [[5, 6], [4, 5, 6]] and index.tolist() == [0, 0, 1, 0]


@pytest.mark.parametrize("sample", [False, True])
def test_prefilled_rows_generate_what_generate_does_alone(tiny_model, sample):
    model, tok = tiny_model
    questions = ["1+1?", "What is the sum of seventeen and twenty-five, written in a box?", "3-2"]
    s = EvalSettings(max_new_tokens=6, temperature=0.9)
    distinct_ids = prompt_token_ids(tok, [[{"role": "user", "content": q}] for q in questions], s)
    assert common_prefix(distinct_ids) > 0 and len({len(i) for i in distinct_ids}) == 3  # shared, and padded
    config = generation_config(s, sample, tok.pad_token_id, [tok.eos_token_id])
    rows = [distinct_ids[i] for i in (0, 0, 1, 1, 2, 2)]  # a GRPO batch: each prompt num_generations times
    ready = prefill(model, distinct_ids, tok.pad_token_id, always=True)
    ids, mask, cache = ready.rows(torch.tensor([0, 0, 1, 1, 2, 2]))
    torch.manual_seed(3)
    shared = model.generate(input_ids=ids, attention_mask=mask, cache=cache,
                            generation_config=config)[:, ids.size(1):].tolist()
    torch.manual_seed(3)
    assert shared == _plain(model, rows, config)
    # The prefilled cache is left as it was: a second set of rows from it generates the same again.
    ids, mask, cache = ready.rows(torch.tensor([2, 0]))
    torch.manual_seed(5)
    again = model.generate(input_ids=ids, attention_mask=mask, cache=cache, generation_config=config)
    torch.manual_seed(5)
    assert again[:, ids.size(1):].tolist() == _plain(model, [rows[4], rows[0]], config)


def test_a_generation_that_never_calls_generate_is_an_error():
    class Policy(torch.nn.Linear):
        def generate(self, **kwargs):
            raise AssertionError("not called here")

    model = Policy(1, 1)
    trainer = SimpleNamespace(model=model, model_wrapped=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m),
                              processing_class=SimpleNamespace(pad_token_id=0))
    feature = PromptPrefill()
    with pytest.raises(RuntimeError, match="did not call the policy's generate"):
        with feature.generating(trainer):
            pass  # a TRL that generates some other way
    assert "generate" not in model.__dict__  # the model's own generate is back


def _completions(model_dir, run_env, name, share: str):
    out, tracks = run_env / name, run_env / f"trackio_{name}"
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(model_dir, out, 2),
           "--trackio_dir", str(tracks), "--run_name", name, "--log_completions", "true", "--eval_heldout", "false",
           "--share_prompt_prefill", share]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "share_prompt_prefill: off" not in proc.stderr
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        losses = [json.loads(m)["train/loss"] for (m,) in con.execute("SELECT metrics FROM metrics ORDER BY id")
                  if "train/loss" in json.loads(m)]
    tables = [pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet"))]
    return [t["completion"].tolist() for t in tables], losses


def test_a_run_sharing_the_prefill_samples_and_trains_as_one_that_does_not(tiny_model_dir, run_env):
    shared, shared_loss = _completions(tiny_model_dir, run_env, "shared", "true")
    plain, plain_loss = _completions(tiny_model_dir, run_env, "plain", "false")
    assert len(shared) == 2 and shared == plain
    assert shared_loss == pytest.approx(plain_loss, rel=1e-4, abs=1e-6)
