"""`grpo-recipes launch`: start the vLLM server and the trainer on the right GPUs with one command.

    grpo-recipes launch [launcher options] RECIPE.py [recipe args...]

Launcher options come before the recipe path and recipe arguments after it, as with `accelerate launch`. The recipe
arguments (`--config X.yaml`, `--learning_rate 1e-6`, ...) reach the recipe unchanged; the launcher adds only the
vLLM flags that must agree with the layout (`--use_vllm`, `--vllm_mode`, `--vllm_server_host/port`).

The work is split in two so the layout logic is testable without GPUs:
- `plan_layout(...) -> LaunchPlan`: no side effects beyond reading the two YAML files; turns a layout (GPUs, vLLM
  mode, tensor/data parallel sizes, accelerate config, nodes) into the server and trainer command lines and
  environments, or a LaunchError naming the flag and the fix. `--dry-run` prints it.
- `execute(plan)`: starts the server in its own process group, waits for GET /health to answer 200 (failing
  clearly on a timeout or a server that dies), starts the trainer, forwards SIGINT/SIGTERM, and stops the server
  when the trainer exits.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from grpo_recipes.vllm_check import health_url, probe_health

VLLM_MODES = ("server", "colocate", "off")
ROLES = ("all", "server", "trainer")
DEFAULT_PORT = 8000
DEFAULT_MAIN_PORT = 29500
# `trl vllm-serve`'s own default: a server owns its GPUs, so it may take most of their memory for the KV cache.
SERVER_GPU_MEMORY_UTILIZATION = 0.9
# A first start downloads the weights and captures CUDA graphs; several minutes is normal for a 7B model.
DEFAULT_READY_TIMEOUT_S = 900.0
# Between SIGTERM and SIGKILL: the recipe saves a checkpoint at the end of its current step when it gets SIGTERM.
DEFAULT_STOP_TIMEOUT_S = 60.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Flags the launcher sets on the trainer from the layout. Passing them again as recipe arguments would make the
# trainer disagree with the server that was started, so that is an error, not a silent override.
LAYOUT_FLAGS = (
    "--use_vllm",
    "--vllm_mode",
    "--vllm_server_host",
    "--vllm_server_port",
    "--vllm_server_base_url",
    "--vllm_tensor_parallel_size",
)
_WRAP = 100  # width of the printed commands; flags are never separated from their values


class LaunchError(ValueError):
    """A layout that cannot work. The message names the flag or field and the fix."""


class LaunchFailure(RuntimeError):
    """A process of a valid plan failed (server died, never got ready, interrupted)."""


@dataclass
class Proc:
    """One command to run: its argv and the environment variables the launcher sets (merged over os.environ)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The command as a copy-pasteable shell line, wrapped with backslash continuations."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        i = 0
        argv = [shlex.quote(a) for a in self.argv]
        while i < len(argv):
            # Keep `--flag value` together so a wrapped line never starts with a bare value.
            if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                words.append(f"{argv[i]} {argv[i + 1]}")
                i += 2
            else:
                words.append(argv[i])
                i += 1
        lines, line = [], ""
        for word in words:
            if line and len(line) + 1 + len(word) > _WRAP:
                lines.append(line + " \\")
                line = "    " + word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
        return "\n".join(lines)


@dataclass
class LaunchPlan:
    server: Proc | None
    trainer: Proc | None
    health_url: str | None  # polled before the trainer starts; None when no vLLM server is involved
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    summary: list[str] = field(default_factory=list)  # one line per process: what runs where
    notes: list[str] = field(default_factory=list)  # things worth knowing that are not errors

    def script(self) -> str:
        """What --dry-run prints: the commands in order, with the wait between them as a comment."""
        out = []
        if self.server is not None:
            out += [f"# {self.summary[0]}", self.server.shell() + " &"]
        if self.health_url is not None:
            out.append(f"# wait until {self.health_url} answers 200 (up to {self.ready_timeout_s:g} s)")
        if self.trainer is not None:
            out += [f"# {self.summary[-1]}", self.trainer.shell()]
        out += [f"# note: {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def read_yaml(path: str | os.PathLike, what: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise LaunchError(f"{what}: no file at {path}")
    data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise LaunchError(f"{what}: {path} must hold a YAML mapping, got {type(data).__name__}")
    return data


def _gpu_list(ids: Sequence[str]) -> str:
    return ",".join(ids)


def _check_batch(recipe_cfg: Mapping[str, Any], recipe_args: Sequence[str], processes: int) -> None:
    """GRPOConfig's own rule, checked before any GPU is touched: a generation batch holds whole prompt groups.

    Only when the recipe config sets all three values and no recipe argument overrides them; otherwise the
    trainer's own check at start-up applies.
    """
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations")
    overriding = {a.split("=")[0].lstrip("-") for a in recipe_args if a.startswith("--")}
    skip = ("generation_batch_size", "steps_per_generation")
    if any(k in overriding for k in keys + skip) or any(recipe_cfg.get(k) is not None for k in skip):
        return
    if not all(isinstance(recipe_cfg.get(k), int) for k in keys):
        return
    per_device, accum, gens = (recipe_cfg[k] for k in keys)
    batch = per_device * processes * accum
    if gens > 0 and batch % gens:
        raise LaunchError(
            f"per_device_train_batch_size ({per_device}) x trainer processes ({processes}) x "
            f"gradient_accumulation_steps ({accum}) = {batch} completions per generation step, which is not a "
            f"multiple of num_generations ({gens}); GRPO needs whole groups. Make per_device_train_batch_size a "
            "multiple of num_generations (then any process count works), or change the GPU count."
        )


def plan_layout(
    recipe: str,
    *,
    accelerate_config: str,
    gpu_ids: Sequence[str] = (),
    vllm_mode: str = "server",
    vllm_gpus: int | None = None,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    host: str = "127.0.0.1",
    bind_host: str | None = None,
    port: int = DEFAULT_PORT,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    model: str | None = None,
    role: str = "all",
    num_nodes: int = 1,
    node_rank: int = 0,
    main_process_ip: str | None = None,
    main_process_port: int = DEFAULT_MAIN_PORT,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    recipe_args: Sequence[str] = (),
    accelerate_settings: Mapping[str, Any] | None = None,
    recipe_settings: Mapping[str, Any] | None = None,
) -> LaunchPlan:
    """Turn a layout into the command lines and environments of the vLLM server and the trainer.

    gpu_ids: the GPU ids this node may use, as CUDA_VISIBLE_DEVICES values (the first ones go to the server).
    vllm_mode: "server" (a `trl vllm-serve` on its own GPUs), "colocate" (vLLM inside each trainer process) or
        "off" (generate with transformers; the only choice with a CPU accelerate config).
    role: "all" runs both on this node; on a cluster, "server" runs only the server (on the server node) and
        "trainer" only the trainer (on each of `num_nodes` trainer nodes, `node_rank` 0..num_nodes-1).
    host: the address the trainer connects to; bind_host: the address the server listens on (default: host
        for role "all", so a single-node server stays on loopback; 0.0.0.0 for role "server").
    recipe_args: the recipe's own arguments (`--config X.yaml`, ...), passed through unchanged.
    accelerate_settings / recipe_settings: the parsed YAML files; read from disk when None.
    """
    # ---- arguments that make no sense on their own
    if vllm_mode not in VLLM_MODES:
        raise LaunchError(f"--vllm-mode: {vllm_mode!r} is not one of {', '.join(VLLM_MODES)}")
    if role not in ROLES:
        raise LaunchError(f"--role: {role!r} is not one of {', '.join(ROLES)}")
    for flag, value in (("--tensor-parallel-size", tensor_parallel_size), ("--data-parallel-size", data_parallel_size),
                        ("--nnodes", num_nodes)):
        if not isinstance(value, int) or value < 1:
            raise LaunchError(f"{flag}: must be a whole number >= 1, got {value!r}")
    if not 0 <= node_rank < num_nodes:
        raise LaunchError(f"--node-rank: must be in 0..{num_nodes - 1} for --nnodes {num_nodes}, got {node_rank}")
    for flag, value in (("--port", port), ("--main-process-port", main_process_port)):
        if not 1 <= int(value) <= 65535:
            raise LaunchError(f"{flag}: {value} is not a TCP port (1-65535)")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise LaunchError(f"--gpu-memory-utilization: a fraction in (0, 1], got {gpu_memory_utilization}")
    for arg in recipe_args:
        if arg.split("=")[0] in LAYOUT_FLAGS:
            raise LaunchError(
                f"recipe argument {arg.split('=')[0]}: the launcher sets it from the layout; use the launcher's "
                "--vllm-mode / --host / --port / --tensor-parallel-size (before the recipe path) instead"
            )
        if arg.split("=")[0] in _LAUNCHER_FLAGS:
            raise LaunchError(
                f"{arg.split('=')[0]} comes after the recipe path, so it would be passed to the recipe: put "
                "launcher options before it (grpo-recipes launch [launcher options] RECIPE.py [recipe args])"
            )

    acc = dict(accelerate_settings) if accelerate_settings is not None else read_yaml(
        accelerate_config, "--accelerate-config")
    config_path = _recipe_config_path(recipe_args)
    if recipe_settings is not None:
        rcfg = dict(recipe_settings)
    else:
        rcfg = read_yaml(config_path, "recipe --config") if config_path else {}
    dist = str(acc.get("distributed_type", "")).upper()
    if not dist:
        raise LaunchError(f"--accelerate-config {accelerate_config}: it has no distributed_type")
    use_cpu = bool(acc.get("use_cpu", False))

    model = model or rcfg.get("model_name_or_path")
    max_model_len = max_model_len or rcfg.get("vllm_max_model_length")
    notes: list[str] = []
    summary: list[str] = []
    tp, dp = tensor_parallel_size, data_parallel_size

    # ---- CPU: no GPUs, no vLLM, one node
    if use_cpu:
        if vllm_mode != "off":
            raise LaunchError(
                f"--vllm-mode {vllm_mode}: vLLM needs CUDA GPUs, but --accelerate-config {accelerate_config} is a "
                "CPU config (use_cpu: true). Pass --vllm-mode off, or a GPU accelerate config."
            )
        if role != "all" or num_nodes != 1:
            raise LaunchError("--role/--nnodes: CPU accelerate configs run on one machine; drop them")
        processes = int(acc.get("num_processes", 1))
        if processes < 1:
            raise LaunchError(f"--accelerate-config {accelerate_config}: a CPU config must set num_processes >= 1")
        # The torchrun path Accelerate takes for more than one process does not export ACCELERATE_USE_CPU, and
        # without it every worker would silently train alone (see accelerate_configs/cpu_ddp.yaml).
        trainer_env = {"ACCELERATE_USE_CPU": "1"}
        trainer = _trainer_proc(accelerate_config, processes, recipe, recipe_args, ["--use_vllm", "false"],
                                trainer_env, num_nodes, node_rank, main_process_ip, main_process_port)
        _check_batch(rcfg, recipe_args, processes)
        summary.append(f"trainer: {processes} process{'es' if processes > 1 else ''} on CPU "
                       f"({'gloo' if processes > 1 else 'no distribution'}), generation with transformers")
        return LaunchPlan(None, trainer, None, ready_timeout_s, summary, notes)

    # ---- GPU layouts
    if not gpu_ids:
        raise LaunchError(
            "no GPUs to lay out: none are visible (CUDA_VISIBLE_DEVICES / torch.cuda.device_count()). Pass --gpus N "
            "(with --dry-run to only print the commands), or use a CPU accelerate config with --vllm-mode off."
        )
    gpu_ids = [str(g) for g in gpu_ids]
    multi_node = num_nodes > 1
    if role in ("server", "trainer") and host in LOOPBACK:
        raise LaunchError(
            f"--host {host}: with --role {role} the server and the trainers are on different nodes, so the "
            "trainers cannot reach it on loopback; pass the server node's hostname or IP"
        )
    if role == "all" and multi_node:
        raise LaunchError("--nnodes > 1 needs --role server (on the server node) or --role trainer (on each trainer "
                          "node); one process cannot start work on other nodes")

    server_ids: list[str] = []
    trainer_ids: list[str] = []
    server = None
    url = None
    trainer_flags: list[str]
    if vllm_mode == "server":
        wanted = tp * dp
        if vllm_gpus is not None and vllm_gpus != wanted:
            raise LaunchError(
                f"--vllm-gpus {vllm_gpus}: the server uses tensor-parallel-size x data-parallel-size = {tp} x {dp} = "
                f"{wanted} GPUs; make them agree (e.g. --vllm-gpus {wanted}, or change the parallel sizes)"
            )
        if role in ("all", "server"):
            if len(gpu_ids) < wanted:
                raise LaunchError(f"--vllm-gpus {wanted}: only {len(gpu_ids)} GPU(s) available ({_gpu_list(gpu_ids)})")
            server_ids = gpu_ids[:wanted]
            if not model:
                raise LaunchError("the vLLM server needs a model: pass --model, or set model_name_or_path in the "
                                  "recipe config (--config after the recipe path)")
        if role == "all":
            trainer_ids = gpu_ids[wanted:]
            if not trainer_ids:
                raise LaunchError(
                    f"--gpus: the vLLM server takes {wanted} of the {len(gpu_ids)} GPU(s), leaving none for the "
                    "trainer. Use --vllm-mode colocate on a single GPU, or give the launcher more GPUs."
                )
        elif role == "trainer":
            trainer_ids = gpu_ids
        if role == "server" and len(gpu_ids) > wanted:
            notes.append(f"GPUs {_gpu_list(gpu_ids[wanted:])} of the server node stay idle; raise "
                         "--tensor-parallel-size to use them")
        if dp > 1:
            notes.append("--data-parallel-size > 1 is for mixture-of-experts models; TRL's vllm-serve rejects it "
                         "for dense models (vLLM PR #30739): use --tensor-parallel-size for those")
        if rcfg.get("vllm_server_base_url"):
            raise LaunchError(
                "vllm_server_base_url is set in the recipe config, and TRL then ignores vllm_server_host/port, so "
                "the trainer would not talk to the server this launcher starts; remove it from the config"
            )
        if role in ("all", "server"):
            bind = bind_host or (host if role == "all" else "0.0.0.0")
            util = gpu_memory_utilization if gpu_memory_utilization is not None else SERVER_GPU_MEMORY_UTILIZATION
            argv = ["trl", "vllm-serve", "--model", str(model), "--tensor-parallel-size", str(tp),
                    "--data-parallel-size", str(dp), "--host", bind, "--port", str(port),
                    "--gpu-memory-utilization", f"{util:g}"]
            if max_model_len:
                argv += ["--max-model-len", str(int(max_model_len))]
            server = Proc("vllm-server", argv, {"CUDA_VISIBLE_DEVICES": _gpu_list(server_ids)})
            summary.append(f"vLLM server: GPU{'s' if len(server_ids) > 1 else ''} {_gpu_list(server_ids)}, "
                           f"tensor-parallel {tp} x data-parallel {dp}, listening on {bind}:{port}")
        # Probe exactly the address the trainer will use, so "ready" means ready for the trainer.
        url = health_url(host, port)
        trainer_flags = ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", host,
                         "--vllm_server_port", str(port)]
    else:
        if role == "server":
            raise LaunchError(f"--role server: there is no server in --vllm-mode {vllm_mode}")
        if vllm_gpus:
            raise LaunchError(f"--vllm-gpus {vllm_gpus}: only server mode gives vLLM GPUs of its own; in "
                              f"{vllm_mode} mode every GPU runs a trainer process")
        trainer_ids = gpu_ids
        if vllm_mode == "colocate":
            trainer_flags = ["--use_vllm", "true", "--vllm_mode", "colocate"]
            world = len(trainer_ids) * num_nodes
            if world % tp:
                raise LaunchError(f"--tensor-parallel-size {tp}: in colocate mode it must divide the number of "
                                  f"trainer processes ({world})")
            if tp > 1:
                trainer_flags += ["--vllm_tensor_parallel_size", str(tp)]
            if gpu_memory_utilization is not None:
                trainer_flags += ["--vllm_gpu_memory_utilization", f"{gpu_memory_utilization:g}"]
            if dp > 1:
                raise LaunchError("--data-parallel-size: colocate mode has one vLLM engine per trainer process "
                                  "(or per tensor-parallel group) already; it takes no data-parallel size")
        else:
            trainer_flags = ["--use_vllm", "false"]

    trainer = None
    if role in ("all", "trainer"):
        per_node = len(trainer_ids)
        processes = per_node * num_nodes
        notes += _check_accelerate_fits(acc, accelerate_config, dist, per_node, processes, num_nodes,
                                        main_process_ip)
        trainer = _trainer_proc(accelerate_config, processes, recipe, recipe_args, trainer_flags,
                                {"CUDA_VISIBLE_DEVICES": _gpu_list(trainer_ids)}, num_nodes, node_rank,
                                main_process_ip, main_process_port)
        _check_batch(rcfg, recipe_args, processes)
        where = f"GPUs {_gpu_list(trainer_ids)}" if per_node > 1 else f"GPU {trainer_ids[0]}"
        if multi_node:
            where = f"{per_node} on {where} of each of {num_nodes} nodes (this is node {node_rank})"
        gen = {"server": f"generation on the vLLM server at {host}:{port}",
               "colocate": f"vLLM colocated in each process (tensor-parallel {tp})",
               "off": "generation with transformers"}[vllm_mode]
        summary.append(f"trainer: {processes} process{'es' if processes > 1 else ''}{',' if multi_node else ' on'} {where}, "
                       f"{_describe_dist(acc, dist)}; {gen}")
        if vllm_mode == "server" and (multi_node or role == "trainer") and node_rank == 0:
            notes.append("weight sync: the vLLM server connects back to this node (trainer rank 0) on TCP port "
                         "51216 (vllm_group_port); the firewall must allow it")
    return LaunchPlan(server, trainer, url, ready_timeout_s, summary, notes)


def _describe_dist(acc: Mapping[str, Any], dist: str) -> str:
    if dist == "DEEPSPEED":
        return f"DeepSpeed ZeRO-{(acc.get('deepspeed_config') or {}).get('zero_stage', '?')}"
    if dist == "FSDP":
        return f"FSDP{(acc.get('fsdp_config') or {}).get('fsdp_version', 1)}"
    return {"NO": "no distribution", "MULTI_GPU": "DDP"}.get(dist, dist)


def _check_accelerate_fits(acc: Mapping[str, Any], path: str, dist: str, per_node: int, processes: int,
                           num_nodes: int, main_process_ip: str | None) -> list[str]:
    """Refuse combinations Accelerate would refuse (or, worse, accept and run wrongly), naming the fix."""
    if dist == "NO" and processes != 1:
        raise LaunchError(
            f"--accelerate-config {path}: distributed_type NO runs one process, but the trainer has {per_node} "
            f"GPU(s) x {num_nodes} node(s). Use multi_gpu.yaml, zero2.yaml, zero3.yaml or fsdp2.yaml, or give the "
            "trainer one GPU."
        )
    if dist == "MULTI_GPU" and processes < 2:
        raise LaunchError(
            f"--accelerate-config {path}: MULTI_GPU needs at least 2 processes (Accelerate refuses 1), and the "
            "trainer has 1 GPU. Use accelerate_configs/single_gpu.yaml."
        )
    if num_nodes > 1:
        if not main_process_ip:
            raise LaunchError("--main-process-ip: a multi-node trainer needs the address of trainer node 0 "
                              "(e.g. the first trainer host of $SLURM_JOB_NODELIST)")
        launcher = (acc.get("deepspeed_config") or {}).get("deepspeed_multinode_launcher", "pdsh")
        if dist == "DEEPSPEED" and launcher != "standard":
            raise LaunchError(
                f"--accelerate-config {path}: deepspeed_multinode_launcher is {launcher!r}; one launch per node "
                "(Slurm, this launcher) needs 'standard' (torchrun on every node), as in multi_node.yaml"
            )
    if acc.get("num_processes") not in (None, -1, processes):
        # Not an error (the flag wins), but whoever runs that file by hand gets a different process count.
        return [f"{path} says num_processes: {acc['num_processes']}; --num_processes {processes} overrides it"]
    return []


def _trainer_proc(accelerate_config: str, processes: int, recipe: str, recipe_args: Sequence[str],
                  trainer_flags: list[str], env: dict[str, str], num_nodes: int, node_rank: int,
                  main_process_ip: str | None, main_process_port: int) -> Proc:
    argv = ["accelerate", "launch", "--config_file", accelerate_config, "--num_processes", str(processes)]
    if num_nodes > 1:
        # Accelerate's flags override the file: these are exactly the values multi_node.yaml leaves to the job.
        argv += ["--num_machines", str(num_nodes), "--machine_rank", str(node_rank),
                 "--main_process_ip", str(main_process_ip), "--main_process_port", str(main_process_port)]
    argv += [recipe, *recipe_args, *trainer_flags]
    return Proc("trainer", argv, env)


def _recipe_config_path(recipe_args: Sequence[str]) -> str | None:
    for i, arg in enumerate(recipe_args):
        if arg == "--config" and i + 1 < len(recipe_args):
            return recipe_args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


# ----------------------------------------------------------------------------------------------------------------
# Executor


def _resolve_program(name: str) -> str:
    """A bare program name as an absolute path: on PATH, else next to this Python (a venv that is not activated)."""
    if os.sep in name:
        return name
    found = shutil.which(name)
    if found:
        return found
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    raise LaunchFailure(f"`{name}` was not found on PATH or next to {sys.executable}; run from the environment "
                        "where grpo-recipes (and, for the server, vLLM) is installed")


def _spawn(proc: Proc) -> subprocess.Popen:
    argv = [_resolve_program(proc.argv[0]), *proc.argv[1:]]
    # Own session = own process group: vLLM and torchrun start worker processes, and signalling the group reaches
    # all of them. It also keeps a terminal's Ctrl-C from hitting server and trainer at once; we forward it in order.
    return subprocess.Popen(argv, env={**os.environ, **proc.env}, start_new_session=True)


def _group_alive(p: subprocess.Popen) -> bool:
    """Whether any process of the child's group (pgid = its pid, from start_new_session) is still running.

    The leader can exit before the rest: `accelerate launch`'s single-process launcher dies at once on SIGTERM
    while the recipe under it is still saving its checkpoint. Watching the group, not the leader, is what keeps
    the launcher from returning (and stopping the server) while that happens.
    """
    p.poll()  # reap the leader if it has exited, so it does not count as a member
    try:
        os.killpg(p.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id now belongs to someone else's group: ours is gone
        return False
    return True


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    # The group id stays reserved while the group has members, so it cannot name anyone else's processes here.
    if _group_alive(p):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def _wait_group(p: subprocess.Popen, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait until the whole group has exited; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(p):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _stop(p: subprocess.Popen, grace_s: float, signalled: bool = False) -> None:
    """Stop a child's whole group: SIGTERM (unless it was already sent one, since a second SIGTERM means "now" to
    the recipe), `grace_s` to finish, then SIGKILL."""
    if not _group_alive(p):
        p.wait()
        return
    if not signalled:
        _signal_group(p, signal.SIGTERM)
    if not _wait_group(p, grace_s):
        _signal_group(p, signal.SIGKILL)
        _wait_group(p, 10.0)
    p.wait()


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by signal N -> 128+N, as a shell reports it


class _Signals:
    """SIGINT/SIGTERM handling: the first signal goes to the trainer if it runs (else the server); the server is
    stopped after the trainer has exited. A second signal kills everything."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server: subprocess.Popen | None = None
        self.trainer: subprocess.Popen | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            for p in (self.trainer, self.server):
                if p is not None:
                    _signal_group(p, signal.SIGKILL)
        elif self.trainer is not None and _group_alive(self.trainer):
            _signal_group(self.trainer, signum)
        elif self.server is not None:
            _signal_group(self.server, signum)


def wait_ready(url: str, timeout_s: float, server: subprocess.Popen | None = None, poll_s: float = 1.0,
               interrupted: Any = lambda: False) -> None:
    """Poll `url` until it answers 200. Raise LaunchFailure when `server` exits first, on timeout, or when
    `interrupted()` turns true. With no `server` (a trainer node waiting for a remote one) only the timeout applies."""
    deadline = time.monotonic() + timeout_s
    why = "not tried"
    while True:
        if interrupted():
            raise LaunchFailure(f"interrupted while waiting for the vLLM server at {url}")
        if server is not None and server.poll() is not None:
            raise LaunchFailure(
                f"the vLLM server exited with code {_exit_code(server.returncode)} before answering {url} (its "
                "output is above). Common causes: vLLM not installed (`pip install 'grpo-recipes[vllm]'`), the port "
                "already in use, out of GPU memory (lower --gpu-memory-utilization or --max-model-len), or a model "
                "name that cannot be downloaded."
            )
        remaining = deadline - time.monotonic()
        ok, why = probe_health(url, timeout_s=min(5.0, max(remaining, 0.2)))
        if ok:
            return
        if time.monotonic() + poll_s > deadline:
            break
        time.sleep(poll_s)
    if server is not None:
        raise LaunchFailure(
            f"the vLLM server did not answer {url} within {timeout_s:g} s (last try: {why}). A first start downloads "
            "the model and captures CUDA graphs; raise --ready-timeout, or read the server output above."
        )
    raise LaunchFailure(
        f"no vLLM server answered {url} within {timeout_s:g} s (last try: {why}). Start it on the server node "
        "(`grpo-recipes launch --role server ...`), or check --host/--port and that this node can reach it."
    )


def execute(plan: LaunchPlan, *, poll_s: float = 1.0, grace_s: float = DEFAULT_STOP_TIMEOUT_S,
            out: TextIO | None = None) -> int:
    """Run a plan: server, readiness wait, trainer; stop the server when the trainer exits. Returns an exit code:
    the trainer's (128+N if killed by signal N), 1 if the server failed, the server's own for role server.
    `grace_s`: how long a process group gets between SIGTERM and SIGKILL."""
    out = out or sys.stderr
    server = trainer = None

    def say(msg: str) -> None:
        print(f"[grpo-recipes launch] {msg}", file=out, flush=True)

    with _Signals() as signals:
        try:
            if plan.server is not None:
                say(f"{plan.summary[0]}\n{plan.server.shell()}")
                server = signals.server = _spawn(plan.server)
            if plan.health_url is not None:
                say(f"waiting for {plan.health_url} (up to {plan.ready_timeout_s:g} s)")
                wait_ready(plan.health_url, plan.ready_timeout_s, server, poll_s, lambda: bool(signals.received))
                say("vLLM server is ready")
            if plan.trainer is None:  # role server: serve until stopped (Slurm ends the step when training is done)
                assert server is not None
                while server.poll() is None:
                    time.sleep(poll_s)
                return _exit_code(server.returncode)
            say(f"{plan.summary[-1]}\n{plan.trainer.shell()}")
            trainer = signals.trainer = _spawn(plan.trainer)
            while trainer.poll() is None:
                if server is not None and server.poll() is not None and not signals.received:
                    say(f"the vLLM server exited with code {_exit_code(server.returncode)} while the trainer was "
                        "running; stopping the trainer")
                    _stop(trainer, grace_s)
                    return 1
                time.sleep(poll_s)
            rc = _exit_code(trainer.returncode)
            if _group_alive(trainer):  # the launcher process is gone but the recipe under it is still finishing
                say(f"trainer launcher exited with code {rc}; waiting up to {grace_s:g} s for its processes")
                _stop(trainer, grace_s, signalled=bool(signals.received))
            say(f"trainer exited with code {rc}" + ("; stopping the vLLM server" if server is not None else ""))
            return rc
        except LaunchFailure as exc:
            say(f"error: {exc}")
            return 1
        finally:
            for p in (trainer, server):
                if p is not None:
                    _stop(p, grace_s, signalled=p is trainer and bool(signals.received))


# ----------------------------------------------------------------------------------------------------------------
# CLI

_LAUNCHER_FLAGS = (
    "--accelerate-config", "--vllm-mode", "--gpus", "--vllm-gpus", "--tensor-parallel-size", "--data-parallel-size",
    "--host", "--bind-host", "--port", "--gpu-memory-utilization", "--max-model-len", "--model", "--role", "--nnodes",
    "--node-rank", "--main-process-ip", "--main-process-port", "--ready-timeout", "--stop-timeout", "--dry-run",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch",
        help="start a vLLM server and the trainer on the right GPUs (see docs/scaling.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--accelerate-config", required=True,
                   help="accelerate config file, e.g. accelerate_configs/zero3.yaml")
    p.add_argument("--vllm-mode", choices=VLLM_MODES, default=None,
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
    p.add_argument("recipe", help="recipe script, e.g. recipes/math_grpo.py")
    p.add_argument("recipe_args", nargs=argparse.REMAINDER,
                   help="the recipe's own arguments, e.g. --config recipes/configs/math_gsm8k_gpu.yaml")
    p.set_defaults(func=run)


def resolve_gpu_ids(gpus: int | None, env: Mapping[str, str], detect: Any = None) -> list[str]:
    """The GPU ids to hand out, as values valid in this process's environment.

    Children inherit CUDA_VISIBLE_DEVICES semantics from the physical ids, so when it is already set (Slurm sets
    it) the children's subsets must be drawn from its entries, not from 0..N-1.
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    if gpus is not None:
        if gpus < 0:
            raise LaunchError(f"--gpus: must be >= 0, got {gpus}")
        if ids is not None:
            if len(ids) < gpus:
                raise LaunchError(f"--gpus {gpus}: CUDA_VISIBLE_DEVICES={visible} allows only {len(ids)}")
            return ids[:gpus]
        return [str(i) for i in range(gpus)]
    if ids is not None:
        return ids
    count = (detect or _detect_gpu_count)()
    return [str(i) for i in range(count)]


def _detect_gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def plan_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> LaunchPlan:
    env = os.environ if env is None else env
    recipe_args = list(args.recipe_args)
    acc = read_yaml(args.accelerate_config, "--accelerate-config")
    config_path = _recipe_config_path(recipe_args)
    rcfg = read_yaml(config_path, "recipe --config") if config_path else {}
    mode = args.vllm_mode
    if mode is None:  # the recipe config says what it expects; the launcher follows unless told otherwise
        mode = str(rcfg.get("vllm_mode", "colocate")) if rcfg.get("use_vllm") is True else "off"
    gpu_ids = [] if acc.get("use_cpu") else resolve_gpu_ids(args.gpus, env)
    return plan_layout(
        args.recipe,
        accelerate_config=args.accelerate_config,
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
    )


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_from_args(args)
    except LaunchError as exc:
        print(f"grpo-recipes launch: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        sys.stdout.write(plan.script())
        return 0
    return execute(plan, grace_s=args.stop_timeout)
