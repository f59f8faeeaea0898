"""What grpo-recipes knows about vLLM, in one leaf shared by the start-up checks and the launcher: the vLLM modes,
the server's health URL and its polling, and `check_vllm`, which runs before the model loads so a bad setting fails
in seconds, not minutes.

Standard library only: the launcher imports it and must start in a blink. vLLM itself is never imported (importing it
initialises CUDA and takes seconds); `importlib.util.find_spec` is enough to know whether it is installed.
"""

from __future__ import annotations

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

# A direct opener: a proxy from HTTP_PROXY/http_proxy must never see (or swallow) a request for a server that is
# on this machine or this cluster's network, and loopback requests through a proxy fail in confusing ways.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def connect_host(host: str) -> str:
    """The address to connect to for a server bound to `host`: a wildcard bind address is not a destination."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::", "[::]") else host


def health_url(host: str, port: int, base_url: str | None = None) -> str:
    if base_url:
        return base_url.rstrip("/") + HEALTH_PATH
    host = connect_host(host)
    if ":" in host and not host.startswith("["):  # a bare IPv6 address needs brackets in a URL
        host = f"[{host}]"
    return f"http://{host}:{int(port)}{HEALTH_PATH}"


def probe_health(url: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """One GET of a health URL: (True, "") on HTTP 200, else (False, why)."""
    try:
        with _OPENER.open(url, timeout=max(timeout_s, 0.1)) as resp:
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
) -> list[str]:
    """Everything that would stop vLLM generation from working, as messages naming the field and the fix.

    Empty when `use_vllm` is false or all is well. `host`/`port`/`base_url` are GRPOConfig's `vllm_server_host`,
    `vllm_server_port` and `vllm_server_base_url` (base_url wins, as in TRL); they matter only in server mode,
    where the server is polled for up to `timeout_s` seconds (once only when another problem is already found).
    `model` only makes the suggested command concrete. `cuda_available`: whether the trainer sees a CUDA GPU
    (`torch.cuda.is_available()`, which the caller has imported: this module stays light for the launcher).
    """
    if not use_vllm:
        return []
    problems: list[str] = []
    if mode not in VLLM_MODES:
        problems.append(
            f"vllm_mode: {mode!r} is not one of {', '.join(map(repr, VLLM_MODES))}. Use 'colocate' to run vLLM "
            "inside the trainer processes, or 'server' to use a `trl vllm-serve` started on other GPUs."
        )
    if not vllm_installed():
        problems.append(
            "use_vllm: true, but vLLM is not installed in this environment. Install it with "
            f"`pip install 'grpo-recipes[vllm]'` (TRL 1.16 supports vllm {VLLM_SUPPORTED}; it needs a CUDA GPU), "
            "or set `use_vllm: false` (`--use_vllm false`) to generate with transformers instead."
        )
    if not cuda_available:
        problems.append(
            "use_vllm: true, but no CUDA GPU is visible to the trainer. Colocate mode runs vLLM inside the trainer "
            "processes, and server mode pushes the trained weights to the server over NCCL from the trainer's GPU, "
            "so both need one. On CPU set `use_vllm: false`; on a GPU machine check CUDA_VISIBLE_DEVICES."
        )
    if mode == "server":
        url = health_url(host, port, base_url)
        # Already failing (no vLLM, no GPU): one try, so those messages come now and not after the whole wait.
        waited = timeout_s if not problems else 0.0
        ok, why = poll_health(url, waited)
        if not ok:
            where = base_url or f"{host}:{port}"
            serve_host = urlsplit(url).hostname or host
            serve_port = urlsplit(url).port or port
            problems.append(
                f"vllm_mode: server, but no vLLM server answers at {where} ({url}: {why}, waited {waited:g}s). "
                "Start one on GPUs the trainer does not use, with the same model, e.g. "
                f"`CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model {model or '<model_name_or_path>'} "
                f"--host {serve_host} --port {serve_port}`, or let `grpo-recipes launch` start the server and the "
                "trainer together (docs/scaling.md). Otherwise fix `vllm_server_host`/`vllm_server_port` "
                "(or `vllm_server_base_url`), or set `vllm_mode: colocate`."
            )
    return problems
