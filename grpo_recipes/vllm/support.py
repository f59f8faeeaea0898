"""What grpo-recipes knows about vLLM, in one leaf shared by the start-up checks and the launcher: the vLLM modes,
the server's health URL and its polling, and `check_vllm`, which runs before the model loads so a bad setting fails
in seconds, not minutes.

Standard library only: the launcher imports it and must start in a blink. vLLM itself is never imported (importing it
initialises CUDA and takes seconds); `importlib.util.find_spec` is enough to know whether it is installed, and its
distribution's version whether it is the CPU build ("+cpu", scripts/install_vllm_cpu.sh) or a GPU one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

# TRL 1.16 supports these vLLM releases (trl/import_utils.py: is_vllm_available); pyproject's `vllm` extra pins the same.
VLLM_SUPPORTED = "0.22–0.31"
# GRPOConfig.vllm_mode's values. The launcher adds its own "off" (generate with transformers: use_vllm false).
VLLM_MODES = ("server", "colocate")
# vLLM's own OpenAI server answers GET /health with 200 once the engine is up. TRL 1.16's `trl vllm-serve` only
# execs `vllm serve`, and TRL's VLLMClient.check_server polls `{base_url}/health` (no trailing slash).
HEALTH_PATH = "/health"
# vLLM on CPU: the one supported install, and the version label it gives the `vllm` distribution (vLLM's own
# convention for its CPU build; the script writes it, see there).
CPU_INSTALL = "sh scripts/install_vllm_cpu.sh"
CPU_BUILD_LABEL = "+cpu"
# Environment of a vLLM engine on CPU (the launcher's server; vllm_cpu_sync.py sets the same for colocate):
# VLLM_CPU_KVCACHE_SPACE (GiB) sizes the KV cache explicitly, because vLLM-CPU otherwise reserves
# `gpu_memory_utilization` of the machine's RAM and refuses to start when that much is not free (1 GiB holds ~46k
# SmolLM2-135M tokens); VLLM_USE_AOT_COMPILE=0 because vLLM 0.31's AOT compile cache cannot reload a model compiled
# for CPU and would recompile on every start, while inductor's own cache (TORCHINDUCTOR_CACHE_DIR) is reused.
CPU_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0"}
# What a vLLM server on CPU must be started with, so that the trainer's weight sync can re-pack a tied output head
# (grpo_recipes/vllm/cpu_worker.py says why).
WORKER_EXTENSION_ARGS = ("--worker-extension-cls", "grpo_recipes.vllm.cpu_worker.CPUSyncWorkerExtension")
# On CPU the trainer hands the weights to the server through a folder on this machine (vllm_cpu_sync.py).
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0", "", "::", "[::]")

# A direct opener: a proxy from HTTP_PROXY/http_proxy must never see (or swallow) a request for a server that is
# on this machine or this cluster's network, and loopback requests through a proxy fail in confusing ways.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def connect_host(host: str) -> str:
    """The address to connect to for a server bound to `host`: a wildcard bind address is not a destination."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::", "[::]") else host


def server_url(host: str, port: int, base_url: str | None = None) -> str:
    """The server's root URL (no trailing slash): `base_url` when set, else host:port to connect to."""
    if base_url:
        return base_url.rstrip("/")
    host = connect_host(host)
    if ":" in host and not host.startswith("["):  # a bare IPv6 address needs brackets in a URL
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


def health_url(host: str, port: int, base_url: str | None = None) -> str:
    return server_url(host, port, base_url) + HEALTH_PATH


def probe_health(url: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """One GET of a health URL: (True, "") on HTTP 200, else (False, why)."""
    try:
        with OPENER.open(url, timeout=max(timeout_s, 0.1)) as resp:
            if resp.status == 200:
                return True, ""
            return False, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:  # the server is up but not healthy (e.g. 503 while loading)
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason) or type(exc).__name__


def poll_health(url: str, timeout_s: float, interval_s: float = 1.0,
                check: Callable[[], None] | None = None) -> tuple[bool, str]:
    """Poll until the URL answers 200 or `timeout_s` has passed (at least one try, even with timeout 0): (True, "")
    or (False, why the last try failed). `check()` runs before every try and may raise to give up early (the
    launcher's: the server process died, or a signal came)."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        if check is not None:
            check()
        remaining = deadline - time.monotonic()
        ok, why = probe_health(url, timeout_s=min(5.0, max(remaining, 0.5)))
        if ok:
            return True, ""
        if time.monotonic() + interval_s > deadline:
            return False, why
        time.sleep(interval_s)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_version(dist: str = "vllm") -> str | None:
    """The installed version of a distribution (e.g. "0.31.0+cpu" for the CPU build), None when absent."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_install_problems(on_cpu: bool) -> list[str]:
    """Whether the installed vLLM fits the trainer's device: the CPU build on a CPU trainer, a GPU build on a GPU."""
    if not vllm_installed():
        fix = (f"On CPU run `{CPU_INSTALL}` (vllm-cpu set up for this project, one command)" if on_cpu else
               f"Install it with `pip install 'grpo-recipes[vllm]'` (TRL 1.16 supports vllm {VLLM_SUPPORTED}; this "
               f"needs a CUDA GPU; on CPU use `{CPU_INSTALL}`)")
        return [f"use_vllm: true, but vLLM is not installed in this environment. {fix}, or set `use_vllm: false` "
                "(`--use_vllm false`) to generate with transformers instead."]
    version = vllm_version()
    if version is None:
        cpu = vllm_version("vllm-cpu")
        what = f"vllm-cpu {cpu} is installed" if cpu else "a `vllm` package is importable"
        return [f"use_vllm: true, but {what} without `vllm` distribution metadata, which `trl vllm-serve` and this "
                f"check read: run `{CPU_INSTALL}`, which sets it up (and fixes vllm-cpu's CUDA torchvision)."]
    is_cpu_build = version.endswith(CPU_BUILD_LABEL)
    if on_cpu and not is_cpu_build:
        return [f"use_vllm: true on a CPU trainer, but vllm {version} is a GPU build. Use the CPU build: "
                f"`{CPU_INSTALL}` in an environment without the GPU vllm, or set `use_vllm: false`."]
    if not on_cpu and is_cpu_build:
        return [f"use_vllm: true on a CUDA GPU, but vllm {version} is the CPU build, and on a GPU TRL syncs the "
                "weights over NCCL into a CUDA vLLM. Install `pip install 'grpo-recipes[vllm]'` in a GPU environment, "
                "or train on CPU (`use_cpu: true`)."]
    return []


def cpu_problems(mode: str, host: str, base_url: str | None, tensor_parallel_size: int) -> list[str]:
    """What vLLM on CPU supports here: one engine per trainer process, and a server on this machine."""
    problems = []
    if tensor_parallel_size != 1:
        problems.append(f"vllm_tensor_parallel_size: {tensor_parallel_size}, but vLLM on CPU runs with 1 here (one "
                        "engine per trainer process): set it to 1.")
    where = urlsplit(base_url).hostname if base_url else host
    if mode == "server" and where not in LOCAL_HOSTS:
        field = "vllm_server_base_url" if base_url else "vllm_server_host"
        problems.append(f"{field}: {base_url or host!r} is not this machine, but on CPU the trainer hands the trained "
                        "weights to the vLLM server through a folder on this machine (grpo_recipes/vllm/cpu_sync.py): "
                        "run the server here and use 127.0.0.1 (`grpo-recipes launch --accelerate-config "
                        "accelerate_configs/cpu.yaml --vllm-mode server` does both).")
    return problems


def check_vllm(
    use_vllm: bool,
    mode: str,
    host: str,
    port: int,
    timeout_s: float,
    *,
    base_url: str | None = None,
    model: str | None = None,
    cuda_available: bool,
    tensor_parallel_size: int = 1,
) -> list[str]:
    """Everything that would stop vLLM generation from working, as messages naming the field and the fix.

    Empty when `use_vllm` is false or all is well. `host`/`port`/`base_url` are GRPOConfig's `vllm_server_host`,
    `vllm_server_port` and `vllm_server_base_url` (base_url wins, as in TRL); they matter only in server mode,
    where the server is polled for up to `timeout_s` seconds (once only when another problem is already found).
    `model` only makes the suggested command concrete. `cuda_available`: whether the trainer runs on a CUDA GPU
    (`torch.cuda.is_available()` and not `use_cpu`; the caller has imported torch: this module stays light for the
    launcher). Without one, vLLM runs on CPU when its CPU build is installed (scripts/install_vllm_cpu.sh), with
    `tensor_parallel_size` 1 and the server on this machine.
    """
    if not use_vllm:
        return []
    problems: list[str] = []
    on_cpu = not cuda_available
    if mode not in VLLM_MODES:
        problems.append(
            f"vllm_mode: {mode!r} is not one of {', '.join(map(repr, VLLM_MODES))}. Use 'colocate' to run vLLM "
            "inside the trainer processes, or 'server' to use a `trl vllm-serve` started on other GPUs."
        )
    problems += vllm_install_problems(on_cpu)
    if on_cpu:
        problems += cpu_problems(mode, host, base_url, tensor_parallel_size)
    if mode == "server":
        url = health_url(host, port, base_url)
        # Already failing (no vLLM, wrong build): one try, so those messages come now and not after the whole wait.
        waited = timeout_s if not problems else 0.0
        ok, why = poll_health(url, waited)
        if not ok:
            where = base_url or f"{host}:{port}"
            serve_host = urlsplit(url).hostname or host
            serve_port = urlsplit(url).port or port
            if on_cpu:
                env = " ".join(f"{k}={v}" for k, v in CPU_ENGINE_ENV.items())
                start = (f"Start one on this machine with the same model (a local folder), e.g. `{env} trl vllm-serve "
                         f"--model {model or '<model folder>'} --host {serve_host} --port {serve_port} "
                         f"{' '.join(WORKER_EXTENSION_ARGS)}`, or let "
                         "`grpo-recipes launch --accelerate-config accelerate_configs/cpu.yaml --vllm-mode server` "
                         "start the server and the trainer together (docs/scaling.md).")
            else:
                start = ("Start one on GPUs the trainer does not use, with the same model, e.g. "
                         f"`CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model {model or '<model_name_or_path>'} "
                         f"--host {serve_host} --port {serve_port}`, or let `grpo-recipes launch` start the server "
                         "and the trainer together (docs/scaling.md).")
            problems.append(
                f"vllm_mode: server, but no vLLM server answers at {where} ({url}: {why}, waited {waited:g}s). "
                f"{start} Otherwise fix `vllm_server_host`/`vllm_server_port` (or `vllm_server_base_url`), or set "
                "`vllm_mode: colocate`."
            )
    return problems
