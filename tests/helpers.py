"""Helpers the test modules share (fixtures are conftest.py's): the repository, the tiny model, the flags that
shrink a recipe to seconds, and a run's Trackio metrics."""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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


def trackio_metrics(trackio_dir, project):
    db = trackio_dir / f"{project}.db"
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, metrics FROM metrics").fetchall()
    return [(step, m.decode() if isinstance(m, bytes) else m) for step, m in rows]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_checkpoint(out: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint folder with the files the Trainer writes (contents are irrelevant to the marker)."""
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "model.safetensors").write_bytes(b"w" * 1000)
    (path / "optimizer.pt").write_bytes(b"o" * 2000)
    if complete:
        from grpo_recipes.state.checkpoint import mark_complete

        mark_complete(path, step)
    return path
