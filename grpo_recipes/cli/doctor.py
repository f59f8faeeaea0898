"""`grpo-recipes doctor`: check this machine, the installed packages and a recipe config before a long run.

    grpo-recipes doctor                                      # the math recipe's default config
    grpo-recipes doctor --recipe agent
    grpo-recipes doctor --config my_task.yaml --accelerate-config cpu_ddp -- --use_vllm true

Prints one row per check (ok, warn or FAIL, the detail, and the fix under each one that is not ok) and exits 1 when a
check fails, 0 otherwise. What each check does: docs/reliability.md, "Before a run: grpo-recipes doctor".

Each check is a function that returns one `Row` (check, status ok/warn/FAIL, detail, fix), so tests call them one by
one with faked conditions; `diagnose` runs them all for a config and `render` prints the table.

The config goes through the start-up's own path (runner.prepare: parsing, the start-up checks, the data, the
rewards), so its errors read as they do at start-up; no weights load (the model's size comes from its config.json).
The vLLM server is tried for VLLM_TIMEOUT_S, not the start-up's `vllm_server_timeout`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import torch
from accelerate.commands.config import default_config_file
from packaging.requirements import Requirement
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import get_json_schema

from .. import bundled, sandbox
from ..config.batching import batch_problems
from ..config.files import read_yaml
from ..config.resolve import resolve
from ..errors import ConfigError
from ..rewards import registry
from ..run.runner import prepare
from ..state import tracking
from ..state.models import tokenizer_source
from ..tasks.data import load_splits
from ..tools import registry as tools
from ..tools.templates import prepare_tokenizer
from ..vllm.support import (
    CPU_ENGINE_ENV,
    HEALTH_PATH,
    OPENER,
    WORKER_EXTENSION_ARGS,
    probe_health,
    server_url,
    vllm_install_problems,
)

DIST = "grpo-recipes"
VLLM_TIMEOUT_S = 2.0
GB = 1e9
# A process's memory besides the model's (the imports, the rows, the trainer, tokenizer, evaluation and tracking; on a
# GPU its CUDA context), as fits the peaks measured on CPU (docs/reliability.md).
RUNTIME_BYTES = {"cpu": 1.0e9, "gpu": 0.5e9}
LOGIT_COPIES = 4  # fp32 logits, their log-softmax and the two gradients, per token, in the loss's forward/backward


@dataclass
class Row:
    check: str
    status: str  # ok | warn | FAIL
    detail: str
    fix: str = ""


# ------------------------------------------------------------ the machine (the tests replace these functions)


def gpus_present() -> int:
    """NVIDIA GPUs the driver sees, whatever torch was built for (a CPU build of torch cannot count them)."""
    return len(list(Path("/proc/driver/nvidia/gpus").glob("*")))


def visible_gpus() -> int:
    return torch.cuda.device_count()


def machine_memory(on_gpu: bool) -> tuple[int, int, str]:
    """(available, total, what): the smallest visible GPU's free and total memory, or this machine's RAM (its
    cgroup's limit when lower)."""
    if on_gpu:
        free, total = min(torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count()))
        return free, total, "GPU memory"
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available, total = (int(info[k].split()[0]) * 1024 for k in ("MemAvailable", "MemTotal"))
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.is_file() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text()))
        available = min(available, total)
    return available, total, "RAM"


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


# -------------------------------------------------------------------------------------------- the checks


def versions_row(use_vllm: bool, trackio: bool, on_cpu: bool) -> Row:
    """The installed packages against grpo-recipes' own pins (its distribution metadata: pyproject.toml's
    dependencies, and the `vllm` extra when the config uses vLLM)."""
    try:
        pins = [Requirement(r) for r in metadata.requires(DIST) or ()]
    except metadata.PackageNotFoundError:
        return Row("versions", "FAIL", f"{DIST} is not installed, so its pins cannot be read",
                   "pip install -e . (in the checkout)")
    pins = [r for r in pins if (r.marker is None or use_vllm and r.marker.evaluate({"extra": "vllm"}))
            and (trackio or r.name != "trackio")]
    seen, bad, fixes = [], [], []
    for pin in pins:
        try:
            version = metadata.version(pin.name)
        except metadata.PackageNotFoundError:
            if pin.name != "vllm":  # vllm_install_problems names the right install for this device
                bad.append(f"{pin.name} is not installed")
                fixes.append(f"'{pin.name}{pin.specifier}'")
            continue
        seen.append(f"{pin.name} {version}")
        if not pin.specifier.contains(version, prereleases=True):
            bad.append(f"{pin.name} {version} is not {pin.specifier}")
            fixes.append(f"'{pin.name}{pin.specifier}'")
    problems = vllm_install_problems(on_cpu) if use_vllm else []  # each names its install
    if bad or problems:
        fix = f"pip install {' '.join(fixes)}" if fixes else "as the message says"
        return Row("versions", "FAIL", "\n".join(bad + problems), fix)
    return Row("versions", "ok", f"{', '.join(seen)}: within the pins of {DIST}")


def torch_row(present: int, visible: int, cuda_build: bool, cpu_wanted: bool) -> Row:
    """torch's build against the GPUs: a CPU build on a GPU machine trains on the CPU without a word."""
    version = torch.__version__
    base = version.split("+")[0]
    if present and not visible and not cpu_wanted:
        why = ("is a CPU build" if not cuda_build else
               "sees none of them (CUDA_VISIBLE_DEVICES, or a driver older than this CUDA build)")
        return Row("torch build", "FAIL", f"{present} NVIDIA GPU(s) present, but torch {version} {why}: the run "
                   "would train on the CPU",
                   f"pip install torch=={base} --index-url https://download.pytorch.org/whl/cuNNN (NNN: a CUDA "
                   "version the driver supports, nvidia-smi), or use_cpu: true to train on the CPU on purpose")
    if cuda_build and not visible:
        return Row("torch build", "warn", f"torch {version} is a CUDA build and no GPU is visible: it runs on the CPU",
                   f"pip install torch=={base} --index-url https://download.pytorch.org/whl/cpu (GBs smaller)")
    return Row("torch build", "ok", f"torch {version}, {visible} GPU(s) visible" if visible else
               f"torch {version}, CPU only (no GPU present)")


def accelerate_row(acc: dict | None, path: str | None, gpus: int, training=None, explicit=frozenset()) -> Row:
    """The Accelerate config in use against the visible GPUs, and the batch geometry at its process count."""
    cpu = bool(acc and acc.get("use_cpu"))
    if acc is None:
        processes, where = max(gpus, 1), "no Accelerate config file (`accelerate launch` decides from the hardware)"
    else:
        n = acc.get("num_processes")
        n = None if n in (None, -1) else int(n)
        dist = acc.get("distributed_type", "NO")
        where = f"{path}: {dist}, " + (f"num_processes {n}" if n else "num_processes unset (pass --num_processes)")
        if cpu:
            processes = n or 1
        elif not gpus:
            return Row("accelerate", "FAIL", f"{where}, on GPUs (use_cpu false), but no GPU is visible",
                       "train on the CPU: --accelerate-config cpu (cpu_ddp for two "
                       "processes), or make the GPUs visible (CUDA_VISIBLE_DEVICES)")
        elif n and n > gpus:
            return Row("accelerate", "FAIL", f"{where}, but only {gpus} GPU(s) are visible",
                       f"--num_processes {gpus} (or num_processes: {gpus} in {path}), or make more GPUs visible")
        else:
            processes = n or gpus
        if dist == "NO" and processes > 1:
            return Row("accelerate", "FAIL", f"{where}: distributed_type NO runs one process",
                       "--accelerate-config multi_gpu (or zero2, zero3, fsdp2), or num_processes: 1")
        if dist == "MULTI_GPU" and processes < 2 and not cpu:
            return Row("accelerate", "FAIL", f"{where}: Accelerate refuses MULTI_GPU with one process",
                       "--accelerate-config single_gpu")
    if training is not None and hasattr(training, "num_generations"):
        # The values the config set: GRPOConfig.__post_init__ fills generation_batch_size and steps_per_generation.
        keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "eval_strategy",
                "per_device_eval_batch_size", "num_generations_eval")
        values = {k: getattr(training, k) for k in keys}
        values |= {k: getattr(training, k) for k in ("generation_batch_size", "steps_per_generation")
                   if k in explicit}
        problems = batch_problems(values, processes)
        if problems:
            return Row("accelerate", "FAIL", f"{where}; with {processes} process(es): " + "; ".join(problems),
                       "the batch sizes named above, or another process count")
    idle = f"; {gpus - processes} GPU(s) idle (a vLLM server's, in server mode)" if gpus > processes and acc else ""
    where += f"; {processes} process(es) on the CPU" if cpu or not gpus else f"; {processes} process(es), {gpus} GPU(s)"
    return Row("accelerate", "warn" if idle and not cpu else "ok", where + ("" if cpu else idle))


def vllm_server_row(training, on_cpu: bool, timeout_s: float = VLLM_TIMEOUT_S) -> Row:
    """Server mode: the server answers, exposes its dev endpoints, and can take the trainer's weights: on a CPU
    trainer through this project's worker extension (the re-pack call the trainer makes at start-up, harmless to
    repeat), on a GPU through a weight-transfer engine (TRL's NCCL sync)."""
    if not (training.use_vllm and training.vllm_mode == "server"):
        return Row("vLLM server", "ok", "not used" if not training.use_vllm else "colocate: no server")
    base = server_url(training.vllm_server_host, training.vllm_server_port, training.vllm_server_base_url)
    url = base + HEALTH_PATH
    up, why = probe_health(url, timeout_s)
    if not up:
        env = " ".join(f"{k}={v}" for k, v in CPU_ENGINE_ENV.items()) + " " if on_cpu else ""
        ext = " " + " ".join(WORKER_EXTENSION_ARGS) if on_cpu else ""
        return Row("vLLM server", "FAIL", f"no vLLM server answers at {url} ({why}, waited {timeout_s:g} s)",
                   f"start one: `{env}trl vllm-serve --model MODEL --host {urlsplit(url).hostname} --port "
                   f"{urlsplit(url).port}{ext}`, or let `grpo-recipes launch --vllm-mode server` start it with the "
                   "trainer; or fix vllm_server_host/port (vllm_server_base_url)")
    try:
        with OPENER.open(f"{base}/server_info?config_format=json", timeout=timeout_s) as resp:
            info = json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Row("vLLM server", "FAIL", f"{base} answers /health but not /server_info ({exc})",
                   "restart it with VLLM_SERVER_DEV_MODE=1 in its environment (`trl vllm-serve` sets it): TRL's "
                   "weight sync uses its dev endpoints")
    if on_cpu:
        req = urllib.request.Request(f"{base}/collective_rpc", method="POST",
                                     data=json.dumps({"method": "repack_tied_lm_head", "kwargs": {}}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            OPENER.open(req, timeout=max(timeout_s, 30.0)).close()
        except (urllib.error.URLError, OSError) as exc:
            return Row("vLLM server", "FAIL", f"{base} has no weight-sync extension (repack_tied_lm_head: {exc}): "
                       "it would keep generating with the untrained output head",
                       f"restart it with `{' '.join(WORKER_EXTENSION_ARGS)}` (grpo-recipes launch passes it)")
    elif (info.get("vllm_config") or {}).get("weight_transfer_config") is None:
        return Row("vLLM server", "FAIL", f"{base} has no weight-transfer engine: TRL cannot sync the weights",
                   """restart it with `--weight-transfer-config '{"backend": "nccl"}'`""")
    return Row("vLLM server", "ok", f"{base} answers and takes weight syncs")


def count_parameters(config) -> int:
    with torch.device("meta"):  # shapes only: no memory, no weights read
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def param_bytes(model_args, config) -> int:
    """Bytes per weight as TRL loads the model: ModelConfig.dtype (float32 by default; auto: the checkpoint's)."""
    return 2 if "16" in str(getattr(config, "dtype", None) if model_args.dtype == "auto" else model_args.dtype) else 4


def estimate_memory(config, params: int, stages: dict, model_args, prompt_tokens: int, completion_tokens: int, *,
                    on_gpu: bool, processes: int = 1, gpu_total: int = 0, acc: dict | None = None) -> tuple[float, str]:
    """(peak bytes, where they go) of the largest stage (`stages`: name -> its training config): per GPU on a GPU,
    for the whole machine on the CPU.

    docs/scaling.md's rules: weights, gradients and AdamW's two moments in the weights' dtype (16 bytes/param in
    fp32; the weights only with LoRA; split across the `processes` GPUs by ZeRO-3 and FSDP, all but the weights by
    ZeRO-2: the Accelerate config `acc`), the reference model when beta > 0, the activations and fp32 logits of one
    micro-batch (per_device_train_batch_size x (the longest prompt + the completion budget)), the KV cache of a
    transformers generation batch, and vLLM's share: its weights and VLLM_CPU_KVCACHE_SPACE on CPU, colocated
    `vllm_gpu_memory_utilization` of the GPU. A server on other GPUs costs the trainer nothing."""
    p_bytes = param_bytes(model_args, config)
    layers, hidden, vocab = config.num_hidden_layers, config.hidden_size, config.vocab_size
    inner = getattr(config, "intermediate_size", None) or 4 * hidden
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_width = 2 * (getattr(config, "num_key_value_heads", None) or heads) * head_dim  # K and V, per layer and token
    states = params * p_bytes * (1 if model_args.use_peft else 4)
    acc = acc or {}
    zero = (acc.get("deepspeed_config") or {}).get("zero_stage")
    if on_gpu and (acc.get("distributed_type") == "FSDP" or zero == 3):
        states /= processes
    elif on_gpu and zero == 2:
        states = params * p_bytes + (states - params * p_bytes) / processes
    peak, parts = 0.0, ""
    for name, t in stages.items():
        act = 2 if (t.bf16 or t.fp16 or p_bytes == 2) else 4
        seq = prompt_tokens + completion_tokens
        seq = min(seq, t.max_length) if getattr(t, "max_length", None) else seq
        saved_layers = 1 if t.activation_checkpointing else layers  # checkpointed: one layer's at a time
        per_token = (layers * hidden + saved_layers * (6 * hidden + 4 * inner)) * act + LOGIT_COPIES * vocab * 4
        sizes = {"weights+optimiser": states,
                 "activations": t.per_device_train_batch_size * seq * per_token,
                 "runtime": RUNTIME_BYTES["gpu" if on_gpu else "cpu"]}
        cpu_vllm = 0.0  # vLLM on CPU: once per process colocated, once as a server (on this machine too)
        if hasattr(t, "num_generations"):  # GRPO: a reference model, and generation
            sizes["reference"] = params * p_bytes if t.beta > 0 and not model_args.use_peft else 0
            if not t.use_vllm:
                sequences = t.per_device_train_batch_size * t.steps_per_generation
                sizes["generation"] = sequences * seq * layers * kv_width * act
            elif not on_gpu:
                space = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_ENGINE_ENV["VLLM_CPU_KVCACHE_SPACE"]))
                cpu_vllm = (params * 2 + space * 2**30) * (processes if t.vllm_mode == "colocate" else 1)
            elif t.vllm_mode == "colocate":
                sizes["vLLM"] = t.vllm_gpu_memory_utilization * gpu_total
        total = sum(sizes.values()) * (1 if on_gpu else processes) + cpu_vllm
        if total > peak:
            shown = {**sizes, "vLLM": cpu_vllm} if cpu_vllm else sizes
            each = ", ".join(f"{k} {v / GB:.2f}" for k, v in shown.items() if v)
            scale = f", x {processes} processes" if processes > 1 and not on_gpu else ""
            peak = total
            parts = f"{name}: {each} GB{scale}; {params / 1e6:.0f}M params, {seq}-token sequences"
    return peak, parts


def memory_row(peak: float, parts: str, machine: tuple[int, int, str]) -> Row:
    available, total, what = machine
    detail = f"estimated peak {peak / GB:.1f} GB ({parts}); {what} {available / GB:.1f} GB free of {total / GB:.1f}"
    fix = ("lower per_device_train_batch_size (raise gradient_accumulation_steps to keep the batch), "
           "max_completion_length, or set activation_checkpointing: true or use_peft: true")
    if peak > total:
        return Row("memory", "FAIL", detail, fix)
    if peak > available:
        return Row("memory", "warn", detail + ": more than is free now", "stop other jobs, or " + fix)
    return Row("memory", "ok", detail)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def template_row(tokenizer, prompt: list[dict], tool_specs=None) -> Row:
    """With tools: an assistant turn with a tool call renders, its tokens (as sampled: after the generation prompt,
    up to end of turn) parse back to the call, and appending the tool's result keeps every earlier token, which
    TRL's multi-turn loop relies on when it appends the result's tokens to the sampled ones. Without tools: the
    prompts render."""
    ids = lambda messages, gen: tokenizer.apply_chat_template(  # noqa: E731
        messages, tools=tool_specs, add_generation_prompt=gen, tokenize=True, return_dict=False)
    head = ids(prompt, True)
    if not tool_specs:
        return Row("chat template", "ok", f"no tools; the prompts render ({len(head)} tokens)")
    fn = tool_specs[0]["function"]
    args = {k: "1 + 2" for k in list(fn["parameters"].get("properties", {}))[:1]}
    turn = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": fn["name"], "arguments": args}}]}
    with_turn = ids(prompt + [turn], False)
    eos = tokenizer.eos_token_id
    fix = ("tool_template: chatml_tools (prefix-preserving, parsed by this project), or a template that renders "
           "each turn the same whatever follows it (no `loop.last` tests, no reasoning dropped from earlier turns)")
    if with_turn[:len(head)] != head:
        return Row("chat template", "FAIL", "the assistant turn does not start where the generation prompt ends "
                   f"(token {_first_difference(head, with_turn)})", fix)
    sampled = with_turn[len(head):]
    sampled = sampled[:sampled.index(eos) + 1] if eos in sampled else sampled
    parsed = tokenizer.parse_response(sampled)
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls") or ()]
    if calls != [(fn["name"], args)]:
        return Row("chat template", "FAIL", f"a rendered tool call does not parse back: {tokenizer.decode(sampled)!r} "
                   f"-> {calls}", fix)
    kept = head + sampled
    after = ids(prompt + [turn, {"role": "tool", "name": fn["name"], "content": "3"}], True)
    if after[:len(kept)] != kept:
        i = _first_difference(kept, after)
        return Row("chat template", "FAIL", f"appending a tool result re-renders the earlier turns: token {i} was "
                   f"{tokenizer.decode(kept[i:i + 4])!r}, is now {tokenizer.decode(after[i:i + 4])!r}", fix)
    return Row("chat template", "ok", f"a '{fn['name']}' call renders and parses back; appending its result keeps "
               f"the {len(kept)} earlier tokens")


def sandbox_row(iso: sandbox.Isolation, needed: bool) -> Row:
    """The sandbox's own probe (sandbox.isolation()): which protections a program really gets on this machine."""
    if iso.mode == "unavailable":
        return Row("sandbox", "FAIL" if needed else "warn", iso.describe() + ("" if needed else " (this config "
                   "runs no model-written code)"), "docs/sandbox.md, 'Modes, detection and degradation': run as "
                   "root, or allow unprivileged user namespaces")
    if iso.missing():
        return Row("sandbox", "warn", iso.describe(), f"docs/sandbox.md; ${sandbox.ENV_REQUIRE} refuses to run "
                   "without the protections it names")
    return Row("sandbox", "ok", iso.describe() + ("" if needed else " (not used by this config)"))


def folder_row(check: str, path: Path, need: float) -> Row:
    """Whether the run can create files under `path` (tried: mode bits say nothing to root or a read-only mount),
    and whether its disk has `need` bytes free."""
    existing = Path(path).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    fix = f"choose another {check} (a folder you can write), or fix the permissions of {existing}"
    if not existing.is_dir():
        return Row(check, "FAIL", f"{path}: {existing} is a file, not a folder", fix)
    try:
        fd, name = tempfile.mkstemp(dir=existing, prefix=".grpo-recipes-doctor-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return Row(check, "FAIL", f"{path}: cannot write in {existing} ({exc.strerror})", fix)
    free = disk_free(existing)
    detail = f"{path}: writable, {free / GB:.1f} GB free" + (f", the run writes ~{need / GB:.1f} GB" if need else "")
    if free < need:
        return Row(check, "FAIL", detail, "free disk space, lower save_total_limit, or write elsewhere")
    return Row(check, "ok", detail)


def output_need(params: int, p_bytes: int, stages: dict, model_args) -> float:
    """Bytes a run writes: each stage's model, and the last stage's checkpoints (weights and AdamW's moments; the
    adapter's only with LoRA, counted as the weights) kept at once: save_total_limit, plus the one being written."""
    t = list(stages.values())[-1]
    saves = 0
    if getattr(t.save_strategy, "value", t.save_strategy) != "no":
        every = t.save_steps if t.save_steps >= 1 else max(t.max_steps, 1) * t.save_steps  # < 1: a fraction
        saves = math.ceil(t.max_steps / max(every, 1)) if t.max_steps > 0 else 1
        saves = min(saves, t.save_total_limit + 1) if t.save_total_limit else saves
    checkpoint = params * p_bytes * (1 if model_args.use_peft else 3)
    return len(stages) * params * p_bytes + saves * checkpoint


# --------------------------------------------------------------------------------------------- the whole run


def find_model(name: str, cache_dir: str | None = None) -> dict:
    """from_pretrained arguments for the model's config and tokenizer (models.tokenizer_source: where
    resolve_model looks, no weights downloaded or converted). ConfigError when it is nowhere."""
    found = tokenizer_source(name, cache_dir)
    if found is None:
        raise ConfigError([f"model_name_or_path: cannot find '{name}': not a local folder, not in the Hugging Face "
                           "cache, and the Hub is unreachable"])
    folder, kwargs = found
    return {"pretrained_model_name_or_path": folder, **kwargs}


def uses_sandbox(recipe) -> bool:
    """Whether a configured reward's or tool's module runs code in the sandbox (imports from it)."""
    rewards = {s.name for s in recipe.reward_specs}
    funcs = [d.func for n, d in registry.available(recipe.reward_dirs or ()).items() if n in rewards]
    names = {t if isinstance(t, str) else t.get("name") for t in recipe.tools or ()}
    funcs += [d.func for n, d in tools.available(recipe.tool_dirs or ()).items() if n in names]
    return any(getattr(value, "__module__", "").startswith(sandbox.__name__)
               for f in funcs for value in f.__globals__.values())


def diagnose(recipe_name: str | None, argv: list[str], accelerate_config: str | None = None) -> list[Row]:
    """Every check for the config `argv` names (`--config X` and flags), as the run would see it."""
    default = default_config_file if Path(default_config_file).is_file() else None
    acc_path = str(bundled.accelerate_config(accelerate_config)) if accelerate_config else default
    try:
        acc = read_yaml(acc_path, "--accelerate-config") if acc_path else None
    except ConfigError as exc:
        return [Row("accelerate", "FAIL", "; ".join(exc.problems),
                    "an existing file, or a shipped config's name: " + ", ".join(bundled.accelerate_config_names()))]
    cpu_wanted = bool(acc and acc.get("use_cpu"))
    present, gpus, cuda_build = gpus_present(), visible_gpus(), torch.version.cuda is not None
    try:
        config = resolve(argv, name=recipe_name)
    except ConfigError as exc:  # nothing config-specific can be checked: the machine alone
        return [Row("config", "FAIL", "\n".join(exc.problems), "each line names its field and its fix"),
                versions_row(False, True, not gpus), torch_row(present, gpus, cuda_build, cpu_wanted),
                accelerate_row(acc, acc_path, gpus)]
    recipe, training, model_args = config.recipe, config.training, config.model
    grpo = hasattr(training, "num_generations")
    use_vllm = grpo and training.use_vllm
    try:  # the start-up's own checks; the vLLM server is tried once here, and in its own row below
        run = prepare(recipe_name, argv + (["--vllm_server_timeout", "0"] if use_vllm else []))
        recipe, training, train = run.recipe, run.training, run.train
        stages = {s.spec.label: s.spec.training for s in run.stages}
        rows = [Row("config", "ok", f"{config.path}: checked as at start-up; {len(train)} training rows, stages "
                    f"{' -> '.join(s.name for s in run.stages)}")]
    except ConfigError as exc:
        stages, train = {"last stage": training}, _rows_anyway(config)
        rows = [Row("config", "FAIL", "\n".join(exc.problems), "each line names its field and its fix")]
    on_gpu = bool(gpus) and not (training.use_cpu or cpu_wanted)
    rows += [versions_row(use_vllm, tracking.enabled(training), not on_gpu),
             torch_row(present, gpus, cuda_build, cpu_wanted or training.use_cpu),
             accelerate_row(acc, acc_path, gpus, training, config.explicit)]
    if grpo:
        rows.append(vllm_server_row(training, not on_gpu))
    try:
        source = find_model(model_args.model_name_or_path, recipe.model_cache_dir)
        config, tokenizer = AutoConfig.from_pretrained(**source), AutoTokenizer.from_pretrained(**source)
    except (ConfigError, OSError, ValueError) as exc:
        problem = "; ".join(exc.problems) if isinstance(exc, ConfigError) else str(exc)
        rows.append(Row("model", "FAIL", problem, "a local model folder: --model_name_or_path PATH"))
    else:
        params, p_bytes = count_parameters(config), param_bytes(model_args, config)
        rows.append(Row("model", "ok", f"{model_args.model_name_or_path}: {params / 1e6:.0f}M parameters, from "
                        f"{source['pretrained_model_name_or_path']} (config and tokenizer only)"))
        prompts = train.select(range(min(len(train), 256)))["prompt"] if train is not None else []
        specs = None
        try:
            if recipe.uses_tools:
                tokenizer = prepare_tokenizer(tokenizer, recipe.tool_template)
                built = tools.recipe_tools(recipe)
                specs = [get_json_schema(f) for f in built] or [get_json_schema(_placeholder_tool)]
            rows.append(template_row(tokenizer, prompts[0] if prompts else [{"role": "user", "content": "2 + 1?"}],
                                     specs))
        except ValueError as exc:  # ToolTemplateError, or tools the config row has already refused
            rows.append(Row("chat template", "FAIL", str(exc), "as the message says"))
        lengths = [len(tokenizer.apply_chat_template(p, tools=specs, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False)) for p in prompts]
        machine = machine_memory(on_gpu)
        processes = int((acc or {}).get("num_processes") or -1)  # -1: unset, one per GPU
        processes = processes if processes > 0 else max(gpus, 1)
        peak, parts = estimate_memory(config, params, stages, model_args, max(lengths, default=0),
                                      training.max_completion_length if grpo else recipe.eval_max_new_tokens or 0,
                                      on_gpu=on_gpu,
                                      processes=processes, gpu_total=machine[1], acc=acc)
        if not lengths:
            parts += "; prompts not counted (no training rows)"
        rows += [memory_row(peak, parts, machine),
                 folder_row("output_dir", Path(training.output_dir), output_need(params, p_bytes, stages,
                                                                                 model_args))]
    if tracking.enabled(training):
        trackio = Path(recipe.trackio_dir) if recipe.trackio_dir else tracking.project_db(training.project).parent
        rows.append(folder_row("trackio_dir", trackio, 0))
    rows.append(sandbox_row(sandbox.isolation(), uses_sandbox(recipe)))
    return rows


def _rows_anyway(config):
    """The training rows of a config the start-up refused for another reason (an earlier run in output_dir, ...):
    the memory estimate reads the prompts' lengths from them. None when they do not load either."""
    try:
        return load_splits(config.recipe, config.task)[0]
    except (KeyError, ValueError, OSError):  # the config row already says why
        return None


def _placeholder_tool(x: str) -> str:
    """A tool for the template check of a config whose tools come from an environment class.

    Args:
        x: any text
    """
    return x


def render(rows: list[Row]) -> str:
    """The table: check, status, detail (one line per problem), and the fix under a failing or warning row."""
    width = max(len(r.check) for r in rows) + 2
    out = [f"{'check':<{width}}{'status':<8}detail"]
    for r in rows:
        lines = r.detail.splitlines() or [""]
        out.append(f"{r.check:<{width}}{r.status:<8}{lines[0]}")
        out += [" " * (width + 8) + line for line in lines[1:]]
        if r.fix and r.status != "ok":
            out.append(" " * (width + 8) + f"fix: {r.fix}")
    failed = sum(r.status == "FAIL" for r in rows)
    out.append(f"\n{failed} check(s) failed: a run would fail." if failed else "\nno check failed.")
    return "\n".join(out)


DEFAULT_RECIPE = "math"


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="check the machine, the installed versions and a config before a run",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", help=f"recipe name: {', '.join(bundled.recipe_names())} (its config: "
                                    f"recipes/configs/<name>_cpu.yaml; default {DEFAULT_RECIPE})")
    p.add_argument("--config", help="recipe YAML to check instead of the recipe's default config")
    p.add_argument("--accelerate-config", help="the Accelerate config the run will use (default: Accelerate's "
                                               "own default file, when there is one)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="recipe config flags, after --")
    p.set_defaults(func=run)


def run(args) -> int:
    recipe = args.recipe or (None if args.config else DEFAULT_RECIPE)
    config = Path(args.config) if args.config else bundled.recipe_config(recipe)
    if not config.is_file():
        print(f"error: no config {config} (recipes: {', '.join(bundled.recipe_names())}); pass --config YAML",
              file=sys.stderr)
        return 2
    overrides = [a for a in args.overrides if a != "--"]
    rows = diagnose(recipe, ["--config", str(config), *overrides], args.accelerate_config)
    print(render(rows))
    return 1 if any(r.status == "FAIL" for r in rows) else 0
