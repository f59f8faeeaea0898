"""The distill stage (grpo_recipes/stages/distill.py): a teacher of another vocabulary is refused before any weights load,
the rejection filter keeps exactly the verified samples, a killed stage resumes without sampling a prompt twice or
losing a trace, two processes share the sampling, a vLLM server can be the sampler, sft -> distill -> grpo runs
from one command as one run, and the stage's CPU is recorded without its evaluations."""

import json
import os
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import REPO, tiny_run_args

from grpo_recipes.config.schema import DistillTracesConfig
from grpo_recipes.errors import ConfigError
from grpo_recipes.evaluation.heldout import EvalSettings, HeldOutEvalCallback, reward_roles, score
from grpo_recipes.run.runner import main, prepare
from grpo_recipes.stages import distill
from grpo_recipes.state import budget

CONFIGS = REPO / "recipes" / "configs"
MATH = CONFIGS / "math_cpu.yaml"
# The test verifier: a random tiny teacher passes it on about half of its samples (tests/data/distill_rewards).
EVEN = ("--reward_dirs", str(REPO / "tests" / "data" / "distill_rewards"),
        "--rewards", '[{"name": "test_even_length"}]')


def traces(teacher, **extra) -> dict:
    return {"name": "distill", "teacher": str(teacher), "teacher_samples": 2, "teacher_prompts": 12,
            "teacher_max_new_tokens": 8, "teacher_batch_size": 4, "max_steps": 2, "learning_rate": 1e-3,
            "per_device_train_batch_size": 4, "max_length": 64, "nll_traces": 8, **extra}


def _args(model_dir, out, entries, *extra, steps=1) -> list[str]:
    return tiny_run_args(model_dir, out, steps, *EVEN, "--stages", json.dumps(entries), "--eval_size", "4",
                         "--eval_k", "0", *extra)


def _cli(args, cwd, launcher=(), env=None):
    cmd = [sys.executable, *launcher, str(REPO / "recipes" / "math_grpo.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd, env=env)


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# ---------------------------------------------------------------------------------------- start-up checks


def _config_only(folder: Path, tokenizer, vocab_size: int) -> Path:
    """A model folder with a tokenizer and a config.json and no weights: only a check that reads no weights passes
    it without an error about missing weights."""
    from transformers import LlamaConfig

    tokenizer.save_pretrained(folder)
    LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(folder)
    return folder


def test_a_teacher_of_another_vocabulary_is_refused_before_any_weights_load(tiny_model_dir, run_env):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "[EOS]": 1, "one": 2, "two": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    other = _config_only(run_env / "other", PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]",
                                                                     eos_token="[EOS]"), 4)
    smol = AutoTokenizer.from_pretrained(tiny_model_dir)
    wider = _config_only(run_env / "wider", smol, len(smol) + 64)

    def problems(teacher) -> str:
        entry = {"name": "distill", "mode": "logits", "teacher": str(teacher), "max_steps": 1}
        with pytest.raises(ConfigError) as err:
            prepare("math", _args(tiny_model_dir, run_env / "out", [entry, {"name": "grpo"}]), MATH)
        return str(err.value)

    message = problems(other)
    assert "stages[0] (distill): teacher: mode logits needs the student's vocabulary" in message
    words = AutoTokenizer.from_pretrained(other)
    assert f"{tiny_model_dir} ({type(smol).__name__}, {len(smol)} tokens)" in message
    assert f"{other} ({type(words).__name__}, 4 tokens)" in message
    message = problems(wider)
    assert f"{wider} has {len(smol) + 64} rows (config.json vocab_size) and the student {tiny_model_dir} " \
           f"{len(smol)}" in message
    # The student's own family passes (here: the student itself), and mode traces takes any tokenizer.
    entry = {"name": "distill", "mode": "logits", "teacher": str(tiny_model_dir), "max_steps": 1}
    prepare("math", _args(tiny_model_dir, run_env / "same", [entry, {"name": "grpo"}]), MATH)
    prepare("math", _args(tiny_model_dir, run_env / "text", [traces(other), {"name": "grpo"}]), MATH)


@pytest.mark.parametrize("entries, message", [
    ([{"name": "distill", "mode": "logit", "teacher": "x", "max_steps": 1}, {"name": "grpo"}],
     "stages[0].mode: 'logit' is not one of traces, logits; did you mean 'logits'?"),
    ([{"name": "distill", "teacher": "x", "teacher_sample": 3, "max_steps": 1}, {"name": "grpo"}],
     "stages[0].teacher_sample: unknown setting of the distill stage (mode traces); did you mean `teacher_samples`?"),
    ([{"name": "distill", "mode": "logits", "teacher": "x", "teacher_samples": 3, "max_steps": 1}, {"name": "grpo"}],
     "stages[0].teacher_samples: unknown setting of the distill stage (mode logits); not a field of "
     "DistillLogitsConfig"),
    ([{"name": "distill", "max_steps": 1}, {"name": "grpo"}],
     "stages[0] (distill): teacher: the distill stage needs one"),
    ([{"name": "distill", "teacher": "stage:1", "max_steps": 1}, {"name": "grpo"}],
     "stages[0] (distill): teacher: stage:1 is not an earlier stage (this is stages[0]; earlier: none)"),
    ([{"name": "sft", "max_steps": 1}, {"name": "distill", "teacher": "stage:sft", "use_vllm": True, "max_steps": 1},
      {"name": "grpo"}], "stages[1] (distill): use_vllm: a vLLM server must serve the teacher before the run starts"),
    ([{"name": "sft", "max_steps": 1}, {"name": "distill", "teacher": "stage:0", "teacher_samples": 0, "max_steps": 1},
      {"name": "grpo"}], "stages[1] (distill): teacher_samples: must be >= 1, got 0"),
    ([{"name": "distill", "teacher": "stage:0", "max_steps": 1}, {"name": "grpo"}],
     "stages[0] (distill): teacher: stage:0 is not an earlier stage"),
])
def test_distill_settings_that_cannot_work_are_named_before_anything_loads(entries, message, run_env):
    with pytest.raises(ConfigError) as err:
        prepare("math", ["--output_dir", str(run_env / "out"), "--stages", json.dumps(entries)], MATH)
    assert message in str(err.value)


@pytest.mark.parametrize("config", ["distill_math_cpu.yaml", "distill_math_logits_cpu.yaml"])
def test_the_cpu_configs_say_to_train_their_teacher_first(config, run_env, monkeypatch):
    monkeypatch.chdir(run_env)  # no outputs/math_grpo here
    with pytest.raises(ConfigError) as err:
        prepare(None, ["--config", str(CONFIGS / config)])
    assert "stages[0] (distill): teacher: no model at 'outputs/math_grpo'" in str(err.value)
    assert "It is where recipes/configs/math_cpu.yaml saves its model: train it first, `make run`" in str(err.value)


@pytest.mark.parametrize("config,mode", [("distill_math_cpu.yaml", "DistillTracesConfig"),
                                         ("distill_math_logits_cpu.yaml", "DistillLogitsConfig")])
def test_the_cpu_configs_plan_a_distill_stage_then_grpo_without_recomputation(config, mode):
    from grpo_recipes.config.resolve import resolve

    resolved = resolve(["--config", str(CONFIGS / config)])
    plans, problems = resolved.stages, list(resolved.problems)
    assert problems == []
    assert [type(p.training).__name__ for p in plans] == [mode, "GRPOConfig"]
    # TRL's trainers default to activation checkpointing; the flat `false` reaches the distill stage (135M on CPU:
    # recomputing costs more than the memory it saves).
    assert plans[0].training.activation_checkpointing is False


def test_the_gpu_config_plans_a_traces_stage_then_grpo():
    from grpo_recipes.config.resolve import resolve

    # bf16 and vLLM colocate need CUDA: the parse on this CPU turns them off; the stages are what is checked here.
    config = resolve(["--bf16", "false", "--use_vllm", "false"], REPO / "recipes" / "configs" / "distill_gsm8k_gpu.yaml")
    plans, problems = config.stages, list(config.problems)
    assert problems == []
    assert [type(p.training).__name__ for p in plans] == ["DistillTracesConfig", "GRPOConfig"]
    assert plans[0].training.teacher == "Qwen/Qwen2.5-7B-Instruct" and plans[0].training.use_vllm


# ------------------------------------------------------------------------------------------ the rejection filter


def test_the_filter_keeps_exactly_the_samples_the_verifier_accepts(run_env):
    run = prepare("math", ["--output_dir", str(run_env / "out"), "--stages", '["grpo"]', "--train_size", "20",
                           "--eval_size", "4", "--report_to", "none"], MATH)
    correctness, _ = reward_roles(run.recipe, run.funcs)
    rows = {i: run.train[i] for i in (3, 7)}
    samples = {}  # per row: (completion, verified?) by hand
    for i, row in rows.items():
        a = int(row["answer"])
        samples[i] = [(f"{row['expression']} = {a}. \\boxed{{{a}}}", True), (f"\\boxed{{{a + 1}}}", False),
                      (f"\\boxed{{{a}}}", True), ("", False), ("\\boxed{", False),
                      (f"\\boxed{{{a}}} \\boxed{{{a + 1}}}", False)]
    texts = [t for i in rows for t, _ in samples[i]]
    scores = score(correctness, list(rows.values()), [[0]] * len(texts), texts, 6)
    prompts, kept = distill.verified(rows, texts, scores, 6, run.recipe.correctness_threshold)
    assert [(t["row"], t["completion"]) for t in kept] == [(i, t) for i in rows for t, ok in samples[i] if ok]
    assert [(p["row"], p["samples"], p["kept"]) for p in prompts] == [(3, 6, 2), (7, 6, 2)]
    assert all(t["answer"] == str(rows[t["row"]]["answer"]) and t["score"] >= 1.0 for t in kept)
    # An unscorable sample (a reward that raised: None) is rejected; a partial score counts at the threshold.
    _, kept = distill.verified({0: rows[3]}, ["a", "b", "c"], [None, 0.5, 0.49], 3, 0.5)
    assert [t["completion"] for t in kept] == ["b"]
    assert distill.acceptance(prompts) == {"distill/prompts": 2, "distill/acceptance_rate": 4 / 12,
                                           "distill/traces_per_prompt": 2.0, "distill/prompts_without_trace": 0}


# ------------------------------------------------------------------------------------------------------ resume


def test_a_killed_stage_resumes_without_sampling_a_prompt_twice_or_losing_a_trace(tiny_model_dir, run_env,
                                                                                   monkeypatch):
    entries = [traces(tiny_model_dir), {"name": "grpo"}]

    def sampled_stage(out, *extra):
        run = prepare("math", _args(tiny_model_dir, out, entries, *extra), MATH)
        stage = run.stages[0]
        stage.start(run)
        stage.sample(run)
        return Path(stage.spec.training.output_dir)

    straight = sampled_stage(run_env / "straight")
    straight_traces, straight_prompts = _jsonl(straight / distill.TRACES), _jsonl(straight / distill.PROMPTS)
    assert [p["row"] for p in straight_prompts] == list(range(12))
    assert 0 < len(straight_traces) < 24  # the verifier kept some samples and rejected others

    # Killed for real (os._exit: no cleanup) right after the second of three batches was written.
    out = run_env / "killed"
    script = f"""
import os
from grpo_recipes.stages import distill
from grpo_recipes.run.runner import prepare
written = []
append = distill.TraceStore.append
def append_then_die(self, prompts, traces):
    append(self, prompts, traces)
    written.append(1)
    if len(written) == 2:
        os._exit(9)
distill.TraceStore.append = append_then_die
run = prepare("math", {_args(tiny_model_dir, out, entries)!r}, {str(MATH)!r})
run.stages[0].start(run)
run.stages[0].sample(run)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 9, proc.stderr[-3000:]
    folder = out / "stages" / "1-distill"
    assert [p["row"] for p in _jsonl(folder / distill.PROMPTS)] == list(range(8))
    before = _jsonl(folder / distill.TRACES)
    # And as if a second kill had cut the third batch between its two writes: its traces without its prompt lines,
    # the last one torn.
    orphan = json.dumps({"row": 8, "question": "?", "answer": "1", "completion": "x", "score": 1.0})
    with open(folder / distill.TRACES, "a") as f:
        f.write(orphan + "\n" + orphan[:20])

    asked = []
    verified = distill.verified
    monkeypatch.setattr(distill, "verified", lambda rows, *a: (asked.extend(rows), verified(rows, *a))[1])
    sampled_stage(out, "--resume")
    assert asked == [8, 9, 10, 11]  # the prompts not done, once each
    assert _jsonl(folder / distill.PROMPTS) == straight_prompts
    after = _jsonl(folder / distill.TRACES)
    assert after[: len(before)] == before  # nothing written before the kill was lost
    assert after == straight_traces  # and nothing is there twice: the same traces as the run never killed


# ---------------------------------------------------------------------------------------------------- the runs


def test_sft_distill_grpo_runs_from_one_command_as_one_run(tiny_model_dir, run_env):
    out, tracks = run_env / "out", run_env / "trackio"
    sft = {"name": "sft", "max_steps": 2, "learning_rate": 1e-3, "per_device_train_batch_size": 4, "max_length": 64}
    proc = _cli(_args(tiny_model_dir, out, [sft, traces("stage:sft"), {"name": "grpo"}], "--trackio_dir",
                      str(tracks), "--run_name", "staged", "--report_to", "trackio", "--learning_rate", "1e-6",
                      "--alert_teacher_acceptance", "0.99"), run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    folder = out / "stages" / "2-distill"
    assert (out / "stages" / "1-sft" / "model.safetensors").is_file() and (folder / "model.safetensors").is_file()
    assert (out / "model.safetensors").is_file()
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        rows = [(s, json.loads(m)) for s, m in con.execute(
            "SELECT step, metrics FROM metrics WHERE run_name = 'staged' ORDER BY id")]
    assert sorted(s for s, m in rows if "train/loss" in m) == [1, 2, 3, 4, 5]  # one step axis across three stages
    assert sorted(s for s, m in rows if "eval/pass@1" in m) == [0, 2, 4, 5]
    summary = json.loads((out / "eval_summary.json").read_text())
    assert [(s["stage"], s["from_step"], s["to_step"]) for s in summary["stages"]] == [
        ("sft", 0, 2), ("distill", 2, 4), ("grpo", 4, 5)]
    # The stage's own metrics, logged at its start (step 2) and end (step 4), agree with its files.
    prompts, kept = _jsonl(folder / distill.PROMPTS), _jsonl(folder / distill.TRACES)
    start = next(m for s, m in rows if s == 2 and "train/distill/acceptance_rate" in m)
    assert start["train/distill/acceptance_rate"] == pytest.approx(len(kept) / (2 * len(prompts)))
    assert start["train/distill/prompts_without_trace"] == sum(p["kept"] == 0 for p in prompts)
    assert "train/distill/teacher_pass@1" in start and "train/distill/student_nll" in start
    assert any(s == 4 and "train/distill/student_nll" in m for s, m in rows)
    stage = json.loads((folder / distill.SUMMARY).read_text())
    assert stage["student"]["start"]["step"] == 2 and stage["student"]["end"]["step"] == 4
    assert stage["start"]["student_nll"] > 0 and stage["end"]["student_nll"] > 0
    assert "ALERT The teacher fails its own verifier" in proc.stderr  # acceptance < 0.99


def test_the_stage_records_its_cpu_without_the_evaluations(tiny_model_dir, run_env, monkeypatch):
    """distill_cpu_seconds is the teacher's sampling plus the student's training steps. Here the run's CPU clock
    (budget.cpu_seconds) jumps by BURN seconds inside each held-out evaluation (the teacher's, and the student's at the
    stage's start and end), far more than the tiny run's own work: the teacher's lands in teacher_eval_cpu_seconds
    only, the student's in no figure."""
    burn = 1000.0
    jumped = [0.0]
    real = budget.cpu_seconds
    monkeypatch.setattr(budget, "cpu_seconds", lambda: real() + jumped[0])

    def burning(evaluation):
        def slow(*args, **kwargs):
            jumped[0] += burn
            return evaluation(*args, **kwargs)
        return slow

    monkeypatch.setattr(distill, "teacher_evaluation", burning(distill.teacher_evaluation))
    monkeypatch.setattr(HeldOutEvalCallback, "_evaluate", burning(HeldOutEvalCallback._evaluate))
    out = run_env / "out"
    assert main("math", MATH, _args(tiny_model_dir, out, [traces(tiny_model_dir), {"name": "grpo"}],
                                    "--report_to", "none")) == 0
    assert jumped[0] == 4 * burn  # the teacher's evaluation, the student's at the start, the distill and grpo ends
    summary = json.loads((out / "stages" / "1-distill" / distill.SUMMARY).read_text())
    sampling, steps = summary["teacher_sampling_cpu_seconds"], summary["student_train_cpu_seconds"]
    assert burn <= summary["teacher_eval_cpu_seconds"] < 2 * burn
    assert 0 < sampling < burn and 0 < steps < burn
    assert summary["distill_cpu_seconds"] == pytest.approx(sampling + steps)
    assert summary["teacher_cpu_seconds"] == pytest.approx(sampling + summary["teacher_eval_cpu_seconds"])


def test_a_stage_the_cpu_budget_ends_is_summed_up_as_a_finished_one(tiny_model_dir, run_env):
    """max_cpu_minutes spent in the distill stage ends the run there, before the stage's max_steps: its summary still
    gets the student's end (accuracy, NLL) and gain. Only a signal leaves that to the resumed stage."""
    out = run_env / "out"
    assert main("math", MATH, _args(tiny_model_dir, out, [traces(tiny_model_dir, max_steps=3), {"name": "grpo"}],
                                    "--report_to", "none", "--max_cpu_minutes", "1e-6")) == 0
    summary = json.loads((out / "stages" / "1-distill" / distill.SUMMARY).read_text())
    assert summary["student"]["start"]["step"] == 0 and summary["student"]["end"]["step"] == 1
    assert summary["end"]["student_nll"] > 0 and "student_gain" in summary
    assert (out / "model.safetensors").is_file()  # the run's model: the grpo stage did not run


def test_two_processes_share_the_sampling_and_train_the_stage(tiny_model_dir, run_env):
    out = run_env / "out"
    launcher = ("-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs/cpu_ddp.yaml"))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    proc = _cli(_args(tiny_model_dir, out, [traces(tiny_model_dir, teacher_prompts=10), {"name": "grpo"}],
                      "--use_cpu", "true"), run_env, launcher, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    folder = out / "stages" / "1-distill"
    prompts = _jsonl(folder / distill.PROMPTS)
    assert [p["row"] for p in prompts] == list(range(10))  # each prompt once, from one process or the other
    assert len(_jsonl(folder / distill.TRACES)) == sum(p["kept"] for p in prompts)
    assert (folder / "model.safetensors").is_file() and (out / "model.safetensors").is_file()
    assert proc.stderr.count("distill: sampled 10 of 10 prompts") == 1  # the main process reports


def test_a_run_of_one_logits_stage(tiny_model_dir, run_env):
    """`stages: [distill]`: the flat keys are the stage's, its mode picks their config (DistillLogitsConfig)."""
    out, config = run_env / "out", run_env / "logits.yaml"
    config.write_text("task: arithmetic\ngym_params: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}\n")
    args = ["--config", str(config), "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
            "--stages", '["distill"]', "--mode", "logits", "--teacher", str(tiny_model_dir), "--max_steps", "2",
            "--learning_rate", "1e-3", "--per_device_train_batch_size", "4", "--max_completion_length", "8",
            "--train_size", "20", "--eval_size", "4", "--eval_k", "0", "--save_strategy", "no", "--report_to", "none",
            *EVEN]
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / "train.py"), *args], capture_output=True,
                          text=True, timeout=900, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "distill (logits): 2 steps of TRL's DistillationTrainer" in proc.stderr
    summary = json.loads((out / distill.SUMMARY).read_text())
    assert summary["mode"] == "logits" and summary["teacher_eval"]["rows"] == 4
    assert summary["student"]["end"]["step"] == 2 and (out / "model.safetensors").is_file()
    # No sampling stage before the steps: the stage's CPU is its steps' (the teacher's forwards are inside them).
    assert summary["distill_cpu_seconds"] == summary["student_train_cpu_seconds"] > 0
    assert summary["teacher_eval_cpu_seconds"] > 0 and "teacher_sampling_cpu_seconds" not in summary


# ------------------------------------------------------------------------------------------- the vLLM sampler


def test_a_vllm_server_samples_the_teacher(smollm_tokenizer_dir):
    """ServerTeacher against a stand-in for vLLM's OpenAI-compatible server: token-id prompts in, each prompt's n
    samples back as token ids (in vLLM's prompt-major choice order, here shuffled), decoded with the teacher's
    tokenizer."""
    seen = []

    class Server(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"data": [{"id": str(smollm_tokenizer_dir)}]} if self.path == "/v1/models" else {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            n = body["n"]
            choices = [{"index": p * n + j, "token_ids": [*prompt[-1:], 100 + j]}
                       for p, prompt in enumerate(body["prompt"]) for j in range(n)]
            self._send({"choices": choices[::-1]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = DistillTracesConfig(output_dir="unused", teacher=str(smollm_tokenizer_dir), use_vllm=True,
                                  vllm_server_base_url=f"http://127.0.0.1:{server.server_port}", bf16=False)
        teacher = distill.ServerTeacher(cfg, None)
        settings = EvalSettings(k=3, max_new_tokens=5, temperature=0.7)
        assert teacher.sample([[1, 2], [3]], settings) == [[2, 100], [2, 101], [2, 102], [3, 100], [3, 101], [3, 102]]
        assert {k: seen[-1][k] for k in ("prompt", "n", "temperature", "max_tokens")} == {
            "prompt": [[1, 2], [3]], "n": 3, "temperature": 0.7, "max_tokens": 5}
        other = DistillTracesConfig(output_dir="unused", teacher="Qwen/Qwen2.5-7B-Instruct", use_vllm=True,
                                    vllm_server_base_url=cfg.vllm_server_base_url, bf16=False)
        with pytest.raises(ConfigError, match="serves .* not the teacher Qwen/Qwen2.5-7B-Instruct"):
            distill.ServerTeacher(other, None)
    finally:
        server.shutdown()
