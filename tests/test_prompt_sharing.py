"""share_prompt_forward: one forward and backward of a group's prompt gives TRL's log-probabilities, entropies and
gradient (float rounding apart), whatever order the group's rows come in, and is off, with the reason, where it
could not hold."""

import json
import random
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO, tiny_run_args
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from trl.trainer.utils import add_fused_lm_head

from grpo_recipes.grpo.features.sharing import PromptSharing, blockers

PAD = 0


def _model(model_dir, lora: bool = False):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # as TRL does, before PEFT wraps the model
    if lora:
        config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
        model = get_peft_model(model, config)
    return model.train()


def _group(prompt_len: int, pad_left: int, completion_lens: list[int], width: int, vocab: int):
    """A group as TRL's loss sees it, one row at a time: left-padded prompt + right-padded completion."""
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(1, vocab, (prompt_len,), generator=g)
    rows = []
    for n in completion_lens:
        completion = torch.randint(1, vocab, (n,), generator=g)
        ids = torch.cat([torch.full((pad_left,), PAD), prompt, completion, torch.full((width - n,), PAD)])
        mask = torch.cat([torch.zeros(pad_left), torch.ones(prompt_len + n), torch.zeros(width - n)]).long()
        rows.append((ids[None], mask[None]))
    return rows


def _loss(logps, entropies, mask, weight):
    # Any function of both outputs: the test needs their gradients to flow, not TRL's exact loss.
    return weight * (logps * mask).sum() + 0.1 * (entropies * mask).sum()


def _trl_path(model, rows, width, weights):
    model.zero_grad()
    outs = []
    for (ids, mask), w in zip(rows, weights):
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-width] = -100
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        logps, ent = out.log_probs[:, -width:], out.entropy[:, -width:]
        _loss(logps, ent, mask[:, -width:], w).backward()
        outs.append((logps.detach(), ent.detach()))
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("order_seed, lora", [(0, False), (1, False), (2, True)])
def test_shared_prompt_gives_trls_logprobs_entropies_and_gradient(tiny_model_dir, order_seed, lora):
    model = _model(tiny_model_dir, lora)
    width, vocab = 6, model.config.vocab_size
    groups = [_group(9, 3, [6, 2, 4], width, vocab), _group(12, 0, [1, 5, 6], width, vocab)]
    weights = [[0.7, -1.3, 0.2], [-0.5, 1.1, 0.4]]
    expected_outs, expected_grad = _trl_path(model, [r for g in groups for r in g], width,
                                             [w for ws in weights for w in ws])

    model.zero_grad()
    sharing = PromptSharing(group_size=3)
    order = [(g, i) for g in range(2) for i in range(3)]
    random.Random(order_seed).shuffle(order)  # TRL shuffles rows before splitting them into micro-batches
    got = {}
    for g, i in order:
        ids, mask = groups[g][i]
        logps, ent = sharing.row(model, g, ids, mask, width, compute_entropy=True)
        _loss(logps, ent, mask[:, -width:], weights[g][i]).backward()
        got[g, i] = (logps.detach(), ent.detach())
    assert sharing.groups == {}  # every group finished: its prompt's backward ran once, with the last row

    for k, (g, i) in enumerate((g, i) for g in range(2) for i in range(3)):
        mask = groups[g][i][1][:, -width:].bool()
        for name, want, have in zip(("logps", "entropy"), expected_outs[k], got[g, i]):
            torch.testing.assert_close(have[mask], want[mask], rtol=1e-4, atol=1e-5, msg=f"{name} of row {g},{i}")
    assert expected_grad
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, expected_grad[name], rtol=1e-3, atol=1e-6, msg=name)


def test_a_new_batch_with_an_unfinished_group_is_an_error(tiny_model_dir):
    model = _model(tiny_model_dir)
    sharing = PromptSharing(group_size=2)
    ids, mask = _group(5, 0, [3, 3], 3, model.config.vocab_size)[0]
    sharing.row(model, 0, ids, mask, 3, compute_entropy=False)
    with pytest.raises(RuntimeError, match="did not get all their rows"):
        sharing.new_batch()


def test_rows_of_one_group_with_different_prompts_are_an_error(tiny_model_dir):
    model = _model(tiny_model_dir)
    sharing = PromptSharing(group_size=2)
    vocab = model.config.vocab_size
    (a, ma), (b, mb) = _group(5, 0, [3], 3, vocab)[0], _group(6, 0, [3], 3, vocab)[0]
    sharing.row(model, 0, a, ma, 3, compute_entropy=False)
    with pytest.raises(RuntimeError, match="different prompts"):
        sharing.row(model, 0, b, mb, 3, compute_entropy=False)


def _args(**kw):
    return SimpleNamespace(**{"per_device_train_batch_size": 1, "steps_per_generation": 16,
                              "gradient_accumulation_steps": 16, "gradient_checkpointing": False,
                              "use_liger_kernel": False, **kw})


def test_blockers_name_what_prevents_sharing(tiny_model_dir):
    model = _model(tiny_model_dir)
    assert blockers(_args(), 1, model, False) == []
    assert "one row per micro-batch" in blockers(_args(per_device_train_batch_size=2), 1, model, False)[0]
    assert "one optimiser step" in blockers(_args(steps_per_generation=32), 1, model, False)[0]
    assert "checkpointing" in blockers(_args(gradient_checkpointing=True), 1, model, False)[0]
    assert "2 processes" in blockers(_args(), 2, model, False)[0]
    assert "router loss" in blockers(_args(), 1, model, True)[0]
    model.config.sliding_window, model.config.layer_types = 4, ["sliding_attention"] * model.config.num_hidden_layers
    assert "not plain full attention" in blockers(_args(), 1, model, False)[0]


def _run(model_dir, run_env, name: str, *extra: str):
    out, tracks = run_env / name, run_env / f"trackio_{name}"
    config = run_env / "share.yaml"  # a reward that varies with the completion, so the random tiny model learns
    config.write_text((REPO / "recipes" / "configs" / "math_cpu.yaml").read_text() + f"""
reward_dirs: [{REPO / "tests" / "data" / "skip_rewards"}]
rewards:
  - {{name: test_length_on_multiples_of_three, weight: 1.0}}
""")
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), "--config", str(config),
           *tiny_run_args(model_dir, out, 2),
           "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8", "--learning_rate", "1e-3",
           "--eval_heldout", "false", "--trackio_dir", str(tracks), "--run_name", name, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        rows = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics ORDER BY id")]
    return load_file(out / "model.safetensors"), [r for r in rows if "train/loss" in r], proc.stderr


def test_a_run_with_the_shared_prompt_trains_like_one_without(tiny_model_dir, run_env):
    # Same seed, so the same completions at step 1; their loss and the update must agree.
    plain, plain_logs, _ = _run(tiny_model_dir, run_env, "plain", "--share_prompt_forward", "false")
    shared, logs, stderr = _run(tiny_model_dir, run_env, "shared", "--share_prompt_forward", "true")
    assert "share_prompt_forward: off" not in stderr
    assert [r["train/frac_rows_prompt_shared"] for r in logs] == [1.0, 1.0]
    assert all("train/frac_rows_prompt_shared" not in r for r in plain_logs)
    assert logs[0]["train/loss"] == pytest.approx(plain_logs[0]["train/loss"], rel=1e-4, abs=1e-6)
    assert logs[0]["train/entropy"] == pytest.approx(plain_logs[0]["train/entropy"], rel=1e-4)
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert any(not initial[k].equal(plain[k]) for k in plain)  # it trained
    for k in plain:
        torch.testing.assert_close(shared[k], plain[k], rtol=0, atol=1e-5, msg=k)


def test_a_run_where_sharing_cannot_hold_trains_as_before_and_says_why(tiny_model_dir, run_env):
    _, logs, stderr = _run(tiny_model_dir, run_env, "two_rows", "--share_prompt_forward", "true",
                           "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4")
    assert "share_prompt_forward: off in this run: it needs one row per micro-batch" in stderr
    assert len(logs) == 2 and all("train/frac_rows_prompt_shared" not in r for r in logs)
