"""Scale-out paths that run on CPU: two gloo processes, and LoRA adapters that load and merge."""

import json
import os
import subprocess
import sys

import pandas as pd
from helpers import REPO, tiny_run_args, trackio_metrics


def test_two_process_cpu_run_trains_and_logs_once(tiny_model_dir, run_env):
    out = run_env / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "accelerate_configs/cpu_ddp.yaml"), str(REPO / "recipes/math_grpo.py"),
           *tiny_run_args(tiny_model_dir, out, 2, "--eval_heldout", "false", "--use_cpu", "true",
                          "--skip_zero_advantage_batches", "true", "--share_prompt_forward", "true",
                          "--demonstration_field", "worked_solution", "--demonstrate_unsolved_groups", "true",
                          # an sft stage of one step first, each process on its own rows, then two GRPO steps
                          "--stages", json.dumps([{"name": "sft", "max_steps": 1, "per_device_train_batch_size": 2},
                                                  {"name": "grpo"}]),
                          # 6 rows a process, groups of 4: the middle group's rows are split between the processes.
                          "--per_device_train_batch_size", "6")]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    # The timeout catches the exit deadlock runner.exit_without_teardown prevents (gloo worker vs DDP Reducer).
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=run_env, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-math")]
    steps = [r["train/global_step"] for r in records if "train/loss" in r]
    assert steps == [1, 2, 3]  # one writer: each step logged once, not once per process
    assert (out / "model.safetensors").is_file()
    # The default config's skip_zero_advantage_batches is for one process: off here, and said so.
    assert "skip_zero_advantage_batches: off in this run: 2 processes would each" in proc.stderr
    assert not any("train/frac_rows_skipped" in r for r in records)
    # So is share_prompt_forward: each process's DDP hooks pair one forward with one backward.
    assert "share_prompt_forward: off in this run: 2 processes" in proc.stderr
    assert not any("train/frac_rows_prompt_shared" in r for r in records)
    # Demonstrations work across processes: the process holding a group's last row puts the demonstration there
    # (a random tiny model solves nothing), and the table, gathered in process order, shows one per group of 4.
    sft, *grpo = [r for r in records if "train/loss" in r]
    assert sft["train/loss"] > 0 and "train/reward" not in sft  # the sft stage's step: SFTTrainer's loss
    assert [r["train/demonstrations/frac_groups"] for r in grpo] == [1.0, 1.0]
    table = pd.concat([pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet"))])
    assert table["demonstration"].tolist() == [i % 4 == 3 for i in range(12)] * 2


def test_lora_run_saves_an_adapter_that_loads_and_merges(tiny_model_dir, run_env):
    out = run_env / "out"
    cmd = [sys.executable, str(REPO / "recipes/math_grpo.py"),
           *tiny_run_args(tiny_model_dir, out, 2, "--eval_heldout", "false", "--report_to", "none"),
           "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "learning rate 0.0001 (peft_learning_rate)" in proc.stderr
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = PeftModel.from_pretrained(base, out)
    assert adapted.peft_config["default"].r == 4
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = adapted(ids).logits
        merged = adapted.merge_and_unload()
        got = merged(ids).logits
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert torch.allclose(expected, got, atol=1e-5)  # merging keeps the adapted model's outputs
