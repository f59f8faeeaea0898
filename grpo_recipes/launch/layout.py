"""What the launcher plans from and what it plans: the `Layout` (GPUs, vLLM mode, parallel sizes, nodes, the recipe
and its arguments) and the `LaunchPlan` of processes (`Proc`) it turns into.

A Layout's `check` refuses arguments that make no sense on their own; plan.py refuses combinations.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import LaunchError
from ..vllm.support import VLLM_MODES

OFF = "off"  # the launcher's own mode: generate with transformers (use_vllm false)
MODES = (*VLLM_MODES, OFF)
ROLES = ("all", "server", "trainer")
DEFAULT_PORT = 8000
DEFAULT_MAIN_PORT = 29500
# A first start downloads the weights and captures CUDA graphs; several minutes is normal for a 7B model. On CPU a
# cold start compiles the model with inductor: 4-6.5 minutes for SmolLM2-135M on a busy 2-core machine.
DEFAULT_READY_TIMEOUT_S = 900.0
# Between SIGTERM and SIGKILL: the recipe saves a checkpoint at the end of its current step when it gets SIGTERM.
DEFAULT_STOP_TIMEOUT_S = 60.0
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
# The launcher's own options (cli/launch.py defines them): after the recipe path one would reach the recipe instead.
LAUNCHER_FLAGS = (
    "--accelerate-config", "--vllm-mode", "--gpus", "--vllm-gpus", "--tensor-parallel-size", "--data-parallel-size",
    "--host", "--bind-host", "--port", "--gpu-memory-utilization", "--max-model-len", "--model", "--role", "--nnodes",
    "--node-rank", "--main-process-ip", "--main-process-port", "--ready-timeout", "--stop-timeout", "--dry-run",
)
_WRAP = 100  # width of the printed commands; flags are never separated from their values


@dataclass
class Layout:
    """Where the vLLM server and the trainer run.

    gpu_ids: the GPU ids this node may use, as CUDA_VISIBLE_DEVICES values (the first ones go to the server).
    vllm_mode: "server" (a `trl vllm-serve` on its own GPUs, or on CPU on this machine), "colocate" (vLLM inside
        each trainer process) or "off" (generate with transformers). vLLM with a CPU accelerate config needs the
        CPU build (scripts/install_vllm_cpu.sh).
    role: "all" runs both on this node; on a cluster, "server" runs only the server (on the server node) and
        "trainer" only the trainer (on each of `num_nodes` trainer nodes, `node_rank` 0..num_nodes-1).
    host: the address the trainer connects to; bind_host: the address the server listens on (default: host
        for role "all", so a single-node server stays on loopback; 0.0.0.0 for role "server").
    recipe_args: the recipe's own arguments (`--config X.yaml`, ...), passed through unchanged.
    accelerate_settings / recipe_settings: the parsed YAML files; read from disk when None.
    """

    recipe: str
    accelerate_config: str
    gpu_ids: Sequence[str] = ()
    vllm_mode: str = "server"
    vllm_gpus: int | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    host: str = "127.0.0.1"
    bind_host: str | None = None
    port: int = DEFAULT_PORT
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    model: str | None = None
    role: str = "all"
    num_nodes: int = 1
    node_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int = DEFAULT_MAIN_PORT
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    recipe_args: Sequence[str] = ()
    accelerate_settings: Mapping[str, Any] | None = None
    recipe_settings: Mapping[str, Any] | None = None

    def check(self) -> None:
        """LaunchError for an argument that makes no sense on its own."""
        if self.vllm_mode not in MODES:
            raise LaunchError(f"--vllm-mode: {self.vllm_mode!r} is not one of {', '.join(MODES)}")
        if self.role not in ROLES:
            raise LaunchError(f"--role: {self.role!r} is not one of {', '.join(ROLES)}")
        for flag, value in (("--tensor-parallel-size", self.tensor_parallel_size),
                            ("--data-parallel-size", self.data_parallel_size), ("--nnodes", self.num_nodes)):
            if not isinstance(value, int) or value < 1:
                raise LaunchError(f"{flag}: must be a whole number >= 1, got {value!r}")
        if not 0 <= self.node_rank < self.num_nodes:
            raise LaunchError(f"--node-rank: must be in 0..{self.num_nodes - 1} for --nnodes {self.num_nodes}, got "
                              f"{self.node_rank}")
        for flag, value in (("--port", self.port), ("--main-process-port", self.main_process_port)):
            if not 1 <= int(value) <= 65535:
                raise LaunchError(f"{flag}: {value} is not a TCP port (1-65535)")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise LaunchError(f"--gpu-memory-utilization: a fraction in (0, 1], got {self.gpu_memory_utilization}")
        for arg in self.recipe_args:
            flag = arg.split("=")[0]
            if flag in LAYOUT_FLAGS:
                raise LaunchError(
                    f"recipe argument {flag}: the launcher sets it from the layout; use the launcher's "
                    "--vllm-mode / --host / --port / --tensor-parallel-size (before the recipe path) instead"
                )
            if flag in LAUNCHER_FLAGS:
                raise LaunchError(
                    f"{flag} comes after the recipe path, so it would be passed to the recipe: put "
                    "launcher options before it (grpo-recipes launch [launcher options] RECIPE.py [recipe args])"
                )


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
    # vLLM on CPU: the launcher checks that the CPU build is installed before starting anything, and serves the
    # local folder of `server_model` (resolved as the recipe resolves it: vLLM runs offline here), not its id.
    vllm_on_cpu: bool = False
    server_model: str | None = None

    def serving(self, folder: str) -> LaunchPlan:
        """This plan with the server's `--model` replaced by `folder`."""
        assert self.server is not None and self.server_model is not None
        argv = list(self.server.argv)
        i = argv.index("--model") + 1
        argv[i] = folder
        return replace(self, server=replace(self.server, argv=argv), server_model=None)

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
