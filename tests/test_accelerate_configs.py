"""accelerate_configs/*.yaml: each loads with Accelerate's own loader, is internally consistent, and turns into the
launch environment it is meant to (checked with Accelerate's own launch-time code, minus spawning). cpu_ddp.yaml is
also run for real: two processes on this machine's CPUs that all-reduce over gloo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import free_port

pytest.importorskip("accelerate")
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "accelerate_configs"

# name -> (distributed_type, use_cpu, num_processes as loaded; -1 = left to --num_processes)
EXPECTED = {
    "cpu": (DistributedType.NO, True, 1),
    # MULTI_GPU on purpose: it is what makes `accelerate launch` start 2 workers (see the file's comment)
    "cpu_ddp": (DistributedType.MULTI_GPU, True, 2),
    "single_gpu": (DistributedType.NO, False, 1),
    "multi_gpu": (DistributedType.MULTI_GPU, False, -1),
    "zero2": (DistributedType.DEEPSPEED, False, -1),
    "zero3": (DistributedType.DEEPSPEED, False, -1),
    "fsdp2": (DistributedType.FSDP, False, -1),
    "multi_node": (DistributedType.DEEPSPEED, False, -1),
}


def test_every_config_file_is_covered():
    assert {p.stem for p in CONFIG_DIR.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_and_is_consistent(name):
    # from_yaml_file rejects unknown top-level keys, so a typo fails here rather than being ignored at launch.
    cfg = load_config_from_file(str(CONFIG_DIR / f"{name}.yaml"))
    assert isinstance(cfg, ClusterConfig)
    dist, use_cpu, processes = EXPECTED[name]
    assert (cfg.distributed_type, cfg.use_cpu, cfg.num_processes) == (dist, use_cpu, processes)

    # CPU: no bf16 autocast (slow, partly unsupported); GPU: bf16, matching the GPU recipe configs' bf16: true.
    assert cfg.mixed_precision == ("no" if use_cpu else "bf16")
    if dist == DistributedType.NO:
        assert cfg.num_processes == 1
    if dist == DistributedType.MULTI_GPU:
        assert cfg.num_processes == -1 or cfg.num_processes >= 2  # Accelerate refuses MULTI_GPU with 1 process
    if dist == DistributedType.DEEPSPEED:
        ds = cfg.deepspeed_config
        stage = int(name[-1]) if name.startswith("zero") else 3
        assert ds["zero_stage"] == stage
        assert ds["zero3_init_flag"] is (stage == 3)
        # one `accelerate launch` per node (Slurm, grpo-recipes launch) needs torchrun on every node, not pdsh
        assert ds["deepspeed_multinode_launcher"] == "standard"
        assert "gradient_accumulation_steps" not in ds  # must come from the recipe, not be pinned here
    else:
        assert cfg.deepspeed_config == {}
    if dist == DistributedType.FSDP:
        assert cfg.fsdp_config["fsdp_version"] == 2
        assert cfg.fsdp_config["fsdp_reshard_after_forward"] is True  # FSDP2 takes a bool, not FULL_SHARD
    else:
        assert cfg.fsdp_config == {}
    if name == "multi_node":
        # flags must supply these per job: a value here would be silently stale on other clusters
        assert cfg.main_process_ip is None and cfg.num_processes == -1
        assert cfg.num_machines >= 2  # with 1, every node would quietly run its own single-node job
    else:
        assert cfg.num_machines == 1 and cfg.machine_rank == 0


def _launch_env(name: str, *flags: str):
    """What `accelerate launch --config_file <name> <flags> train.py` would set up, without spawning anything."""
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(CONFIG_DIR / f"{name}.yaml"), *flags, "train.py", "--x", "1"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
        return "deepspeed", args, env
    if args.use_fsdp or args.multi_gpu:
        return "torchrun", args, prepare_multi_gpu_env(args)
    _, env = prepare_simple_launcher_cmd_env(args)
    return "simple", args, env


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_nested_keys_are_accelerate_launch_options(name):
    # Accelerate copies deepspeed_config/fsdp_config entries onto its launch arguments without checking them, so a
    # misspelt key would be dropped silently: every key must name a real `accelerate launch` option.
    cfg = load_config_from_file(str(CONFIG_DIR / f"{name}.yaml"))
    known = vars(launch_command_parser().parse_args(["train.py"]))
    for key in list(cfg.deepspeed_config) + list(cfg.fsdp_config):
        assert key in known, f"{name}.yaml: {key} is not an accelerate launch option"


def test_launch_environments(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    kind, args, env = _launch_env("cpu")
    assert kind == "simple" and env["ACCELERATE_USE_CPU"] == "True" and env["ACCELERATE_MIXED_PRECISION"] == "no"

    kind, args, env = _launch_env("cpu_ddp")
    assert kind == "torchrun" and args.nproc_per_node == "2" and env["ACCELERATE_MIXED_PRECISION"] == "no"
    # The torchrun path does not export ACCELERATE_USE_CPU: grpo-recipes launch (or the recipe's use_cpu) must.
    assert "ACCELERATE_USE_CPU" not in env

    kind, args, env = _launch_env("single_gpu")
    assert kind == "simple" and env["ACCELERATE_USE_CPU"] == "False" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"

    kind, args, env = _launch_env("multi_gpu", "--num_processes", "8", "--main_process_port", str(free_port()))
    assert kind == "torchrun" and args.nproc_per_node == "8"

    for stage in (2, 3):
        kind, args, env = _launch_env(f"zero{stage}", "--num_processes", "7", "--main_process_port", str(free_port()))
        assert kind == "deepspeed" and args.nproc_per_node == "7"
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == str(stage)
        assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == str(stage == 3).lower()

    kind, args, env = _launch_env("fsdp2", "--num_processes", "8", "--main_process_port", str(free_port()))
    assert kind == "torchrun" and env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true" and env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"

    # The multi-node template with the flags grpo-recipes launch / the Slurm example pass on trainer node 1 of 2.
    kind, args, env = _launch_env("multi_node", "--num_processes", "16", "--num_machines", "2", "--machine_rank", "1",
                                  "--main_process_ip", "10.1.2.3")
    assert kind == "deepspeed" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("8", "2", 1)
    assert args.rdzv_endpoint == "10.1.2.3:29500"


@pytest.mark.parametrize("name", ["multi_gpu", "zero2", "zero3", "fsdp2", "multi_node"])
def test_with_a_config_file_accelerate_does_not_infer_the_process_count(name):
    # Verified behaviour (accelerate/commands/launch.py, _validate_launch_command): with a config file the count
    # comes from the file or the flag, never from the visible GPUs; an omitted key loads as -1 and is refused.
    with pytest.raises(ValueError, match="manually pass in `--num_processes`"):
        _launch_env(name)


def test_without_a_config_file_accelerate_infers_the_count_from_the_gpus(monkeypatch, tmp_path):
    # ...and only a launch with no config file at all (none given, no default one) counts the GPUs.
    import accelerate.commands.launch as acc_launch
    import torch

    monkeypatch.setattr(acc_launch, "default_config_file", str(tmp_path / "none.yaml"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    if hasattr(acc_launch, "get_torch_accelerator_backend"):  # accelerate >= 1.16 asks torch which accelerator it has
        monkeypatch.setattr(acc_launch, "get_torch_accelerator_backend", lambda *a, **k: ("cuda", torch.cuda))
    args = launch_command_parser().parse_args(["train.py"])
    args, defaults, _ = _validate_launch_command(args)
    assert defaults is None and args.num_processes == 4


PROBE = """
import torch, torch.distributed as dist
from accelerate import Accelerator
acc = Accelerator()
t = torch.tensor([acc.process_index + 1])
dist.all_reduce(t)
print(f"RANK={acc.process_index} WORLD={acc.num_processes} TYPE={acc.distributed_type.value} "
      f"BACKEND={acc.state.backend} SUM={int(t)}", flush=True)
# Destroys the process group. Exiting with a live gloo group aborts the process now and then ("terminate called
# without an active exception", exit -6): about one run in four here without this line. Trainer.end() does the same.
acc.end_training()
"""


@pytest.mark.e2e
def test_cpu_ddp_runs_two_gloo_processes_through_grpo_recipes_launch(tmp_path, capfd, monkeypatch):
    # The real thing on this machine: the launcher's plan for cpu_ddp.yaml, run by its executor, starts two
    # Accelerate workers that form one gloo group (1 + 2 = 3 after all_reduce).
    from grpo_recipes.launch import Layout, execute, plan

    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)  # the plan must set it itself
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    launch_plan = plan(Layout(str(probe), accelerate_config="accelerate_configs/cpu_ddp.yaml", vllm_mode="off"))
    assert execute(launch_plan, poll_s=0.1, grace_s=10) == 0
    # Both workers share one stdout, so their lines can interleave: match the records, not the lines.
    lines = sorted(re.findall(r"RANK=\d+ WORLD=\d+ TYPE=\w+ BACKEND=\w+ SUM=\d+", capfd.readouterr().out))
    assert lines == [
        "RANK=0 WORLD=2 TYPE=MULTI_CPU BACKEND=gloo SUM=3",
        "RANK=1 WORLD=2 TYPE=MULTI_CPU BACKEND=gloo SUM=3",
    ]
