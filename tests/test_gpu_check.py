"""bench/gpu_check.py and bench/gpu_check.sh, without running the check: the wheel list and its size budget, the
script's arguments, the random model, the runs' flags against the start-up checks, the check's reward, and the
verdicts it prints."""

import importlib.util
import os
import subprocess
import sys
import zlib

import pytest
from helpers import REPO

spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)
MiB = 2**20


def test_every_wheel_is_installed_here_at_one_version():
    versions = gc.wheel_versions(gc.WHEELS)
    assert set(versions) == set(gc.WHEELS) and all(versions.values())
    with pytest.raises(SystemExit, match="not installed in this environment: no-such-dist"):
        gc.wheel_versions(["trl", "no-such-dist"])


def test_the_runtime_dependencies_missing_from_the_gpu_image_are_carried():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {gc.norm(d.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()) for d in deps}
    # trackio: the check runs with report_to none; gguf: only the offline conversion of the real model reads it;
    # jsonschema: only the json recipe's reward imports it
    missing = names - gc.device_packages() - {gc.norm(n) for n in gc.WHEELS} - {"trackio", "gguf", "jsonschema"}
    assert not missing


def test_file_names_and_stale_versions(tmp_path):
    assert gc.dist_name(tmp_path / "latex2sympy2_extended-1.11.0-py3-none-any.whl") == ("latex2sympy2-extended", "1.11.0")
    assert gc.dist_name(tmp_path / "pycosat-0.6.6.tar.gz") == ("pycosat", "0.6.6")
    for name in ("trl-1.16.0-py3-none-any.whl", "trl-1.15.0-py3-none-any.whl", "pycosat-0.6.5.tar.gz",
                 "pycosat-0.6.6.tar.gz", "notes.txt"):
        (tmp_path / name).write_text("x")
    gc.fetch_wheels(tmp_path, {"trl": "1.16.0", "pycosat": "0.6.6"})  # both present: nothing to fetch
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pycosat-0.6.6.tar.gz",
                                                          "trl-1.16.0-py3-none-any.whl"]


def test_size_budget(tmp_path):
    fits, table = gc.within_budget({"working tree": 40 * MiB, ".gpu-check": 24 * MiB})
    assert fits and "64.00 MiB of 64 MiB" in table
    fits, table = gc.within_budget({"working tree": 40 * MiB, ".gpu-check": 24 * MiB + 1})
    assert not fits
    # what travels: tracked and untracked-not-ignored files, and the carried folder; not what git ignores
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/carried/\n/ignored.bin\n")
    (tmp_path / "tracked.py").write_bytes(b"x" * 1000)
    (tmp_path / "ignored.bin").write_bytes(b"x" * 5000)
    (tmp_path / "carried").mkdir()
    (tmp_path / "carried" / "a.whl").write_bytes(b"x" * 300)
    sizes = gc.travel_bytes(tmp_path, [tmp_path / "carried"])
    assert sizes == {"working tree": 1000 + len("/carried/\n/ignored.bin\n"), "carried": 300}


def script(*args, env=None):
    return subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_script_arguments():
    done = script("--help")
    assert done.returncode == 0 and "bench/gpu_check.sh --device cuda" in done.stdout
    for args, says in [((), "expected prepare or --device cuda|cpu"), (("--device",), "--device needs cuda or cpu"),
                       (("--device", "gpu"), "--device must be cuda or cpu, got 'gpu'")]:
        done = script(*args)
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
    # the Python side's own arguments pass through: its --help lists them
    done = script("--device", "cpu", "--help", env={"PYTHON": sys.executable})
    assert done.returncode == 0 and "--resume-steps" in done.stdout


def test_cuda_without_a_gpu_is_refused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for machines without one")
    assert gc.main(["run", "--device", "cuda"]) == 2
    assert "torch sees no GPU" in capsys.readouterr().err


def test_random_model_has_the_carried_shape(tmp_path, smollm_tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    files = tmp_path / "files"
    for name in gc.MODEL_FILES:
        if (smollm_tokenizer_dir / name).is_file():
            (files / name).parent.mkdir(exist_ok=True)
            (files / name).write_bytes((smollm_tokenizer_dir / name).read_bytes())
    with pytest.raises(SystemExit, match="lacks config.json"):
        gc.build_random_model(files, tmp_path / "none")
    # SmolLM2-135M's config.json, two of its 30 layers (the same code builds all 30 there)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=2, pad_token_id=2)
    config.save_pretrained(files)
    out, params = gc.build_random_model(files, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 576 and model.config.num_key_value_heads == 3
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576  # q, o; k, v (3 of 9 heads); mlp; norms
    assert params == sum(p.numel() for p in model.parameters()) == 49152 * 576 + 2 * per_layer + 576
    assert len(AutoTokenizer.from_pretrained(out)) == len(AutoTokenizer.from_pretrained(smollm_tokenizer_dir))
    again, _ = gc.build_random_model(files, tmp_path / "again")  # seeded: the same weights on every device
    assert (AutoModelForCausalLM.from_pretrained(again).lm_head.weight == model.lm_head.weight).all()


def test_the_runs_pass_the_start_up_checks_and_turn_every_feature_on(tmp_path, run_env, monkeypatch):
    from grpo_recipes.rewards import registry
    from grpo_recipes.run import runner

    monkeypatch.chdir(tmp_path)
    runs = dict(gc.phases(tmp_path / "model", tmp_path / "work", steps=2, resume_steps=1, sft_steps=2))
    assert list(runs) == ["full", "resume", "lora"]
    prepared = {}
    for name, flags in runs.items():
        # model_name_or_path is not read before the model loads; the stages are planned and the data loaded
        prepared[name] = run = runner.prepare("math", [*flags, "--bf16", "false"],
                                              REPO / "recipes" / "configs" / "math_cpu.yaml")
        r = run.recipe
        assert (r.skip_zero_advantage_batches, r.share_prompt_forward, r.dynamic_sampling, r.curriculum) == (True,) * 4
        assert [s.name for s in run.stages] == ["sft", "grpo"]
        assert run.training.report_to == [] or run.training.report_to == ["none"]
    assert prepared["full"].stages[0].spec.training.max_steps == 2 and prepared["full"].training.max_steps == 2
    assert prepared["resume"].recipe.resume and prepared["resume"].training.max_steps == 3
    assert prepared["lora"].model_args.use_peft and not prepared["full"].model_args.use_peft
    # the check's reward ties within about half of the groups of the task's own training questions
    signal = registry.available([REPO / "bench" / "gpu_check_rewards"])["gpu_check_signal"].func
    tied = [len(set(signal(["ab", "abcc", "aaaa"], [q] * 3))) == 1 for q in prepared["full"].train["question"]]
    assert 0.3 < sum(tied) / len(tied) < 0.7


def test_the_check_reward():
    from grpo_recipes.rewards import registry

    signal = registry.available([REPO / "bench" / "gpu_check_rewards"])["gpu_check_signal"].func
    questions = [f"Calculate {i} + 1." for i in range(20)]
    even = next(q for q in questions if zlib.crc32(q.encode()) % 2 == 0)
    odd = next(q for q in questions if zlib.crc32(q.encode()) % 2)
    assert signal(["abcd", "aaaa"], [even, even]) == [0.0, 0.0]
    assert signal(["abcd", "aaaa", ""], [odd] * 3) == [1.0, 0.25, 0.0]
    assert signal(["x", "yy"], [None, 3]) == [signal(["x"], ["None"])[0], signal(["yy"], ["3"])[0]]  # never raises


def recorded(resumed=(3,), skipped=0.5):
    """A Recorder as the three runs leave it (2 sft steps, 2 GRPO steps, a resume, LoRA)."""
    rec = gc.Recorder(cuda=False)
    for phase, stage, steps in [("full", "sft", [1, 2]), ("full", "grpo", [1, 2]), ("resume", "grpo", resumed),
                                ("lora", "sft", [1, 2]), ("lora", "grpo", [1, 2])]:
        rec.steps += [{"phase": phase, "stage": stage, "step": n, "s": 2.0 * n, "cpu_s": 1.5 * n, "tokens": 100}
                      for n in steps]
        rec.trainers.append({"phase": phase, "stage": stage, "bf16": False, "device": "cpu", "params": 1000,
                             "trainable": 10 if phase == "lora" else 1000, "peft": phase == "lora"})
        if stage == "grpo":
            rec.logs += [{"phase": phase, "stage": stage, "frac_rows_skipped": skipped, "frac_rows_prompt_shared": 1.0,
                          "sampling/rounds": 1.0, "sampling/groups_unfilled": 1.0,
                          "sampling/frac_groups_swapped": 0.5} for _ in steps]
    return rec


def verdicts(rec):
    results = [{"phase": p, "exit_code": 0} for p in ("full", "resume", "lora")]
    return {c["check"]: c["ok"] for c in [gc.device_row(rec, "cpu"), *gc.feature_checks(rec, results, 2, 1, 2)]}


def test_verdicts():
    assert all(verdicts(recorded()).values())
    assert not verdicts(recorded(resumed=(1, 2, 3)))["checkpoint and resume"]  # started over: not a resume
    assert not verdicts(recorded(skipped=1.0))["skip_zero_advantage_batches"]  # no row ran the loss
    assert not gc.device_row(recorded(), "cuda")["ok"]  # a cuda check whose trainers ran on the CPU
    rec = recorded()
    rec.logs = [log for log in rec.logs if log["phase"] != "lora" or "frac_rows_prompt_shared" not in log]
    rec.logs = [{k: v for k, v in log.items() if k != "sampling/rounds"} for log in rec.logs]
    assert not verdicts(rec)["dynamic_sampling"] and verdicts(rec)["share_prompt_forward"]


def test_summary_ratio_against_the_baseline():
    stages = [{"phase": "full", "stage": "grpo", **gc.stage_figures(recorded().steps[2:4]),
               "peak_gpu_gib": 1.5, "peak_rss_gib": 3.0}]
    assert stages[0]["median_step_s"] == 4.0 and stages[0]["tokens_per_s"] == 25  # the first step left out
    result = {"device": "cuda", "device_name": "H", "load": [1, 2], "precision": "bf16", "date": "d", "stages": stages,
              "checks": [],
              "wall_s": 1.0, "cpu_s": 1.0, "versions": {}}
    baseline = {"stages": [{"phase": "full", "stage": "grpo", "median_step_cpu_s": 40.0}]}
    assert "| full | grpo | 1-2 | 4.00 | 3.00 | 25 | 1.50 | 3.00 | 10.0x |" in gc.summary(result, baseline)
    assert "| 3.00 | - |" in gc.summary(result, None)


def test_import_coverage(monkeypatch):
    monkeypatch.setattr(gc, "imported_distributions", lambda: {"torch", "trl", "grpo-recipes", "no-such-dist"})
    row = gc.coverage_row()
    assert not row["ok"] and "not covered: no-such-dist" in row["detail"]
    monkeypatch.setattr(gc, "imported_distributions", lambda: {"torch", "trl", "grpo-recipes"})
    assert gc.coverage_row()["ok"]


@pytest.mark.e2e
def test_the_runner_runs_without_trackio(tmp_path):
    """The GPU machine has no Trackio: with it hidden, the runner and TRL's GRPO trainer import, and a run that does
    not report to Trackio checks its config and plans its stages (tracking.py imports Trackio on first use)."""
    code = f"""
import sys
sys.modules["trackio"] = None  # find_spec answers None: not installed, for TRL and transformers too
from grpo_recipes.run import runner
from grpo_recipes.state import tracking
import trl.trainer.grpo_trainer
run = runner.prepare("math", ["--report_to", "none", "--output_dir", {str(tmp_path / "out")!r}, "--train_size", "8",
                              "--eval_size", "4", "--bf16", "false"], {str(REPO / "recipes/configs/math_cpu.yaml")!r})
assert not tracking.active() and sys.modules["trackio"] is None
print("ok", [s.name for s in run.stages])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert done.returncode == 0 and "ok ['sft', 'grpo']" in done.stdout, done.stderr[-3000:]
