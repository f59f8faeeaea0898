"""CPU cost of the held-out evaluation by prompts per generate call (`eval_generation_batch_size`), as ratios
against the default's 16, measured in the same process, settings in turn (round-robin).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python bench/eval_batch.py [--sizes 16 50 100 200] [--rounds 2]

CPU seconds of this process (time.process_time, one OpenMP thread), so other load on the machine changes the wall
time, not the figure. Also the greedy answers' agreement with the default's: left padding differs with the batch's
longest prompt, which can move a float rounding and so a greedy token.
"""

from __future__ import annotations

import argparse
import statistics
import time

from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_recipes import bundled
from grpo_recipes.evaluate import EvalSettings, eos_token_ids, evaluate, reward_roles
from grpo_recipes.models import resolve_model
from grpo_recipes.runner import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 50, 100, 200])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    prepared = prepare("math", ["--config", str(bundled.recipe_config("math")), "--model_name_or_path", args.model],
                       for_training=False)
    path, _ = resolve_model(args.model, prepared.recipe.model_cache_dir)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    rows = prepared.held_out.to_list()
    correctness, fmt = reward_roles(prepared.recipe, prepared.funcs)
    settings = EvalSettings.from_configs(prepared.recipe, prepared.training)
    cpu, answers = {n: [] for n in args.sizes}, {}
    for _ in range(args.rounds):
        for n in args.sizes:
            settings.batch_size = n
            start = time.process_time()
            records, _ = evaluate(model, tokenizer, rows, correctness, fmt, settings, eos_token_ids(model, tokenizer))
            cpu[n].append(time.process_time() - start)
            answers[n] = [r["completion"] for r in records]
    base = statistics.median(cpu[args.sizes[0]])
    print(f"{len(rows)} held-out rows, greedy, {args.rounds} rounds; CPU seconds (median) and ratio to batch "
          f"{args.sizes[0]}; greedy completions equal to batch {args.sizes[0]}'s")
    for n in args.sizes:
        same = sum(a == b for a, b in zip(answers[n], answers[args.sizes[0]]))
        print(f"  batch {n:4d}: {statistics.median(cpu[n]):7.1f} s  x{statistics.median(cpu[n]) / base:.2f}  "
              f"{same}/{len(rows)} same")


if __name__ == "__main__":
    main()
