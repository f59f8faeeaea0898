"""CPU generation speed of the options TRL offers, as completions/s ratios against TRL's default path.

    python bench/generation_speed.py                 # real SmolLM2-135M, default math prompts
    python bench/generation_speed.py --rounds 5

Generation is called exactly as GRPOTrainer calls it on CPU (same GenerationConfig fields, left-padded prompt
ids, num_generations copies of each prompt). Settings are run round-robin, so a machine that slows down mid-run
slows every setting alike; each setting reports the median over rounds.
- default:        TRL's path as configured by the recipe (2 prompts x 8 completions per generate call).
- static_cache:   `cache_implementation: static`.
- gen_batch_32/64: `steps_per_generation: 2/4`, i.e. one generate call for 2/4 optimiser steps. Faster per
  completion, but it changes training: later steps learn from completions of an older policy (off-policy).
- paged:          `use_transformers_paged: true` (transformers continuous batching, `generate_batch`).
- shared_prefill: `share_prompt_prefill: true` (grpo_recipes/grpo/prefill.py: each distinct prompt prefilled once, the
  batch's common prefix once; a dynamic cache).
Times are CPU seconds of this process (one OpenMP thread unless OMP_NUM_THREADS says otherwise), so other load on the
machine does not move them.

    python bench/generation_speed.py --threads [--busy 2]

compares OpenMP settings for the default path instead: 1 thread, 2 threads that spin while waiting (OpenMP's
ACTIVE policy, the default without grpo_recipes) and 2 passive threads (what grpo_recipes sets), each in its own
process (OpenMP reads them at start-up), alternating; `--busy N` keeps N other processes spinning meanwhile, as
a busy machine does (training beside evaluation, the sandbox, other users).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "recipes" / "configs" / "math_cpu.yaml"


def load(model_arg: str | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_recipes.config.resolve import resolve
    from grpo_recipes.state.models import resolve_model
    from grpo_recipes.tasks.data import load_splits

    argv = ["--model_name_or_path", model_arg] if model_arg else []
    config = resolve(argv, CONFIG)
    recipe, grpo, model_args = config.recipe, config.training, config.model
    train, _ = load_splits(recipe, config.task)
    path, _ = resolve_model(model_args.model_name_or_path, recipe.model_cache_dir)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
               for p in train["prompt"][:64]]
    prompts = [p["input_ids"] if isinstance(p, dict) else p for p in prompts]
    return model, tok, grpo, prompts


def gen_config(tok, grpo, cache: str | None):
    from transformers import GenerationConfig

    eos = tok.eos_token_id
    return GenerationConfig(max_new_tokens=grpo.max_completion_length, do_sample=True, pad_token_id=tok.pad_token_id,
                            bos_token_id=tok.bos_token_id, eos_token_id=[eos], temperature=grpo.temperature,
                            top_p=grpo.top_p, top_k=grpo.top_k, min_p=grpo.min_p,
                            repetition_penalty=grpo.repetition_penalty, cache_implementation=cache,
                            disable_compile=True)


def run_generate(model, tok, prompt_ids, config, count_tokens: bool = False, shared: bool = False) -> int:
    """-> completions made, or with count_tokens the tokens generated up to each completion's EOS. `shared`: as
    share_prompt_prefill generates."""
    from trl.trainer.utils import pad

    from grpo_recipes.evaluation.heldout import cut_at_eos
    from grpo_recipes.grpo.features.prefill import generate_prefilled

    tensors = [torch.tensor(p) for p in prompt_ids]
    ids = pad(tensors, padding_value=tok.pad_token_id, padding_side="left")
    mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left")
    with torch.no_grad():
        if shared:
            out = generate_prefilled(model, model.generate, ids, mask, config, tok.pad_token_id)
        else:
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    if not count_tokens:
        return len(prompt_ids)
    return sum(len(c) for c in cut_at_eos(out[:, ids.shape[1]:].tolist(), [tok.eos_token_id]))


def run_paged(model, tok, prompt_ids, config) -> int:
    with torch.no_grad():
        out = model.generate_batch(prompt_ids, generation_config=config, progress_bar=False)
    return len(out)


THREAD_SETTINGS = {
    "1 thread": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"},
    "2 threads, active": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
    "2 threads, passive": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
}


def spin() -> None:
    while True:
        pass


def compare_threads(args) -> None:
    busy = [subprocess.Popen([sys.executable, "-c", f"import runpy; runpy.run_path({__file__!r})['spin']()"])
            for _ in range(args.busy)]
    rates: dict[str, list[float]] = {k: [] for k in THREAD_SETTINGS}
    try:
        for r in range(args.rounds):
            for name, env in THREAD_SETTINGS.items():
                cmd = [sys.executable, __file__, "--worker", "--rounds", "1"] + (["--model", args.model] if args.model else [])
                out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
                rates[name].append(json.loads(out.splitlines()[-1])["tokens_per_s"])
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in rates.items()), flush=True)
    finally:
        for b in busy:
            b.kill()
    base = statistics.median(rates["1 thread"])
    print(f"\n{'setting':<20} {'tokens/s':>9} {'ratio vs 1 thread':>18}   ({args.busy} busy processes)")
    for name, values in rates.items():
        print(f"{name:<20} {statistics.median(values):>9.1f} {statistics.median(values) / base:>18.2f}")


def worker(args) -> None:
    """One process, one OpenMP setting: tokens/s of the default generate call (the recipe's batch)."""
    torch.manual_seed(0)
    model, tok, grpo, prompts = load(args.model)
    g = grpo.num_generations
    batch = [ids for ids in prompts[: grpo.generation_batch_size // g] for _ in range(g)]
    config = gen_config(tok, grpo, grpo.cache_implementation)
    run_generate(model, tok, batch[:g], config)  # warm-up, not timed
    start = time.perf_counter()
    tokens = run_generate(model, tok, batch, config, count_tokens=True)
    print(json.dumps({"tokens_per_s": tokens / (time.perf_counter() - start), "threads": torch.get_num_threads()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", action="store_true", help="compare OpenMP thread settings (see above)")
    p.add_argument("--busy", type=int, default=0, help="with --threads: spinning processes beside the measurement")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        return compare_threads(args)
    if args.worker:
        return worker(args)
    torch.manual_seed(0)
    model, tok, grpo, prompts = load(args.model)
    g = grpo.num_generations
    per_step = grpo.generation_batch_size // g  # prompts per optimiser step

    def batch(n_prompts):
        return [ids for ids in prompts[:n_prompts] for _ in range(g)]

    settings = {
        "default": lambda: run_generate(model, tok, batch(per_step), gen_config(tok, grpo, grpo.cache_implementation)),
        "static_cache": lambda: run_generate(model, tok, batch(per_step), gen_config(tok, grpo, "static")),
        "gen_batch_32": lambda: run_generate(model, tok, batch(2 * per_step), gen_config(tok, grpo, None)),
        "gen_batch_64": lambda: run_generate(model, tok, batch(4 * per_step), gen_config(tok, grpo, None)),
        "paged": lambda: run_paged(model, tok, batch(per_step), gen_config(tok, grpo, None)),
        "shared_prefill": lambda: run_generate(model, tok, batch(per_step), gen_config(tok, grpo, None), shared=True),
    }
    rates: dict[str, list[float]] = {k: [] for k in settings}
    errors: dict[str, str] = {}
    run_generate(model, tok, batch(1), gen_config(tok, grpo, None))  # warm-up, not timed
    for r in range(args.rounds):
        for name, fn in settings.items():
            if name in errors:
                continue
            start = time.process_time()
            try:
                n = fn()
            except Exception as exc:  # an option this transformers/CPU combination does not support is a result
                errors[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
                continue
            rates[name].append(n / (time.process_time() - start))
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}/s" for k, v in rates.items() if v), flush=True)
    base = statistics.median(rates["default"])
    print(f"\n{'setting':<14} {'completions/s':>14} {'ratio vs default':>17}")
    for name, values in rates.items():
        if name in errors:
            print(f"{name:<14} {'failed':>14}  {errors[name]}")
        else:
            med = statistics.median(values)
            print(f"{name:<14} {med:>14.2f} {med / base:>17.2f}")


if __name__ == "__main__":
    main()
