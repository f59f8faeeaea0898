"""The sft stage run alone (recipes/sft_warmup.py, `stages: [sft]`): rendered targets earn full reward, held-out
questions are never trained on, the loss covers only the assistant turn, and the saved folder is a model the GRPO
recipe trains from."""

import json
import subprocess
import sys

import pytest
from helpers import REPO, tiny_run_args

from grpo_recipes.config.resolve import resolve
from grpo_recipes.config.schema import SFTStageConfig
from grpo_recipes.rewards import registry
from grpo_recipes.run.runner import main
from grpo_recipes.stages.sft import build_examples
from grpo_recipes.state.checkpoint import checkpoint_dirs, verify
from grpo_recipes.tasks.data import load_splits, question_key

SFT_CONFIG = REPO / "recipes" / "configs" / "sft_math_cpu.yaml"
GRPO_CONFIG = REPO / "recipes" / "configs" / "math_cpu.yaml"


def sft_args(*argv):
    config = resolve(["--report_to", "none", *argv], SFT_CONFIG)
    assert isinstance(config.training, SFTStageConfig)  # the last (only) stage is sft: the flat keys are its config
    return config


def examples(config, cfg=None):
    train, held_out = load_splits(config.recipe, config.task)
    return build_examples(config.recipe, cfg or config.training, train, held_out), held_out


def completions_of(dataset):
    return [c[0]["content"] for c in dataset["completion"]]


@pytest.mark.parametrize("fmt", ["boxed", "think_boxed"])
def test_rendered_targets_earn_full_format_and_correctness_reward(fmt):
    config = sft_args("--sft_format", fmt)
    dataset, _ = examples(config)
    texts, answers = completions_of(dataset), dataset["answer"]
    assert len(texts) == config.recipe.train_size
    rewards = registry.available()
    assert rewards["boxed_format"].func(texts) == [1.0] * len(texts)
    assert rewards["math_correctness"].func(texts, answers, lambda *_: None) == [1.0] * len(texts)
    think = rewards["think_format"].func(texts, strict=True)
    assert think == ([1.0] * len(texts) if fmt == "think_boxed" else [0.0] * len(texts))


def test_sft_trains_on_no_question_of_the_grpo_held_out_split():
    config = sft_args()
    dataset, sft_held_out = examples(config)
    config = resolve(["--report_to", "none"], GRPO_CONFIG)
    grpo_recipe, _ = config.recipe, config.training
    _, grpo_held_out = load_splits(grpo_recipe, config.task)
    held_out = {question_key(q) for q in grpo_held_out["question"]}
    assert len(held_out) == grpo_recipe.eval_size == 200
    # The two configs must carve the same held-out split, or avoiding SFT's own would not protect GRPO's.
    assert {question_key(q) for q in sft_held_out["question"]} == held_out
    assert not {question_key(q) for q in dataset["question"]} & held_out


def test_traces_file_drops_held_out_questions(tmp_path):
    config = sft_args()
    _, held_out = examples(config)
    leaked = held_out["question"][0]
    traces = tmp_path / "traces.jsonl"
    lines = [{"question": leaked, "completion": "x \\boxed{1}"},
             {"question": "Calculate 1234 + 1.", "completion": "1234 + 1 = 1235\n\\boxed{1235}", "answer": 1235}]
    traces.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    config = sft_args("--sft_traces_path", str(traces))
    dataset, _ = examples(config)
    assert dataset["question"] == ["Calculate 1234 + 1."]
    assert dataset["answer"] == ["1235"]
    assert completions_of(dataset) == ["1234 + 1 = 1235\n\\boxed{1235}"]
    assert dataset["prompt"][0][-1]["content"].startswith("Calculate 1234 + 1. Give only the final answer")


def test_loss_is_on_the_assistant_turn_only(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    config = sft_args("--train_size", "4", "--eval_size", "2")
    cfg = SFTStageConfig(output_dir=str(tmp_path), report_to=[], bf16=False, max_length=128, sft_format="boxed")
    dataset, _ = examples(config, cfg)
    trainer = SFTTrainer(model=str(tiny_model_dir), args=cfg, train_dataset=dataset)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for row, prepared in zip(dataset, trainer.train_dataset, strict=True):
        prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        labels = prepared["labels"]
        assert labels[: len(prompt_ids)] == [-100] * len(prompt_ids)
        assert all(x != -100 for x in labels[len(prompt_ids) :])
        trained = tok.decode(labels[len(prompt_ids) :])
        assert trained.startswith(row["completion"][0]["content"] + tok.eos_token), trained
        assert row["question"] not in trained


def run(script, args, cwd):
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / script), *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_sft_output_is_a_model_the_math_recipe_trains_from(tiny_model_dir, run_env):
    sft_out, grpo_out = run_env / "sft", run_env / "grpo"
    sft_args_ = ["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(sft_out), "--max_steps", "2",
                 "--per_device_train_batch_size", "4", "--train_size", "40", "--eval_size", "8",
                 "--eval_max_new_tokens", "8", "--logging_steps", "1"]
    proc = run("sft_warmup.py", sft_args_, run_env)
    assert (sft_out / "model.safetensors").is_file() and (sft_out / "tokenizer.json").is_file()
    report = json.loads((sft_out / "eval_summary.json").read_text())
    assert [(e["step"], e["when"]) for e in report["evaluations"]] == [(0, "start"), (2, "end")]
    for when in ("start", "end"):
        assert report[when]["rows"] == 8
        assert 0.0 <= report[when]["format_rate"] <= 1.0  # boxed_format, the config's role-"format" reward
    assert "held-out evaluation, 8 rows (step 0 -> step 2)" in proc.stdout
    from helpers import trackio_metrics

    logged = " ".join(m for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-sft_math"))
    assert "train/loss" in logged and "eval/format_rate" in logged

    run("math_grpo.py", tiny_run_args(sft_out, grpo_out, 1), run_env)
    assert (grpo_out / "model.safetensors").is_file()


def test_lora_warm_up_is_saved_merged(tiny_model_dir, run_env):
    from grpo_recipes.state.models import resolve_model

    out = run_env / "lora"
    argv = ["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--train_size", "8", "--eval_size", "2", "--eval_heldout", "false",
            "--report_to", "none", "--use_peft"]
    assert main("sft_math", SFT_CONFIG, argv) == 0
    assert not (out / "adapter_config.json").exists()  # an adapter folder would not load as a GRPO model
    assert resolve_model(str(out)) == (str(out), "local")


def test_warm_up_checkpoints_refuses_a_second_run_and_resumes_like_grpo(tiny_model_dir, run_env, capsys, caplog):
    out = run_env / "ckpt"
    argv = ["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--per_device_train_batch_size",
            "4", "--train_size", "8", "--eval_size", "2", "--eval_heldout", "false", "--report_to", "none",
            "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "1"]
    assert main("sft_math", SFT_CONFIG, [*argv, "--max_steps", "2"]) == 0
    # marked complete, and the older one deleted only after that (checkpoint.CheckpointCallback)
    assert [p.name for _, p in checkpoint_dirs(out)] == ["checkpoint-2"] and verify(out / "checkpoint-2") is None
    assert main("sft_math", SFT_CONFIG, [*argv, "--max_steps", "3"]) == 2
    assert "already holds checkpoints of an earlier run (checkpoint-2)" in capsys.readouterr().err
    with caplog.at_level("INFO", logger="grpo_recipes"):
        assert main("sft_math", SFT_CONFIG, [*argv, "--max_steps", "3", "--resume", "true"]) == 0
    assert f"resuming from {out / 'checkpoint-2'} (step 2)" in caplog.text
    assert [p.name for _, p in checkpoint_dirs(out)] == ["checkpoint-3"] and verify(out / "checkpoint-3") is None
    assert json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3


@pytest.mark.parametrize("argv, message", [
    (["--sft_format", "xml"], "sft_format: 'xml' is not one of demonstration, boxed, think_boxed"),
    (["--sft_traces_path", "missing.jsonl"], "sft_traces_path: no such file missing.jsonl"),
    (["--answer_field", ""], "answer_field: sft_format boxed renders gold answers"),
    (["--sft_format", "demonstration"], "demonstration_field: the sft stage trains on it"),
])
def test_bad_settings_are_reported_before_any_model_loads(argv, message, capsys):
    assert main("sft_math", SFT_CONFIG, ["--report_to", "none", *argv]) == 2
    assert message in capsys.readouterr().err
