"""CPU cost of the held-out evaluation by prompts per generate call (`eval_generation_batch_size`) and with or
without the batch's common prompt prefix prefilled once (`EvalSettings.share_prefix`), as ratios against the first
setting, measured in the same process, settings in turn (round-robin).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python bench/eval_batch.py [--sizes 64 16] [--share off on] [--rounds 2]

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
from grpo_recipes.evaluation.heldout import EvalSettings, eos_token_ids, evaluate, reward_roles
from grpo_recipes.run.runner import prepare
from grpo_recipes.state.models import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64])
    ap.add_argument("--share", choices=["off", "on"], nargs="+", default=["off", "on"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    prepared = prepare("math", ["--config", str(bundled.recipe_config("math")), "--model_name_or_path", args.model],
                       for_training=False)
    path, _ = resolve_model(args.model, prepared.recipe.model_cache_dir)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    rows = prepared.held_out.to_list()
    correctness, fmt = reward_roles(prepared.recipe, prepared.funcs)
    settings = EvalSettings.from_configs(prepared.recipe, prepared.training)
    arms = [(n, share) for n in args.sizes for share in args.share]
    cpu, answers = {arm: [] for arm in arms}, {}
    for _ in range(args.rounds):
        for arm in arms:
            settings.batch_size, settings.share_prefix = arm[0], arm[1] == "on"
            start = time.process_time()
            records, _ = evaluate(model, tokenizer, rows, correctness, fmt, settings, eos_token_ids(model, tokenizer))
            cpu[arm].append(time.process_time() - start)
            answers[arm] = [r["completion"] for r in records]
    base = statistics.median(cpu[arms[0]])
    print(f"{len(rows)} held-out rows, greedy (k {settings.k}), {args.rounds} rounds; CPU seconds (median) and ratio "
          f"to batch {arms[0][0]} with prefix sharing {arms[0][1]}; greedy completions equal to that setting's")
    for arm in arms:
        same = sum(a == b for a, b in zip(answers[arm], answers[arms[0]]))
        print(f"  batch {arm[0]:4d}, shared prefix {arm[1]:3s}: {statistics.median(cpu[arm]):7.1f} s  "
              f"x{statistics.median(cpu[arm]) / base:.2f}  {same}/{len(rows)} same")


if __name__ == "__main__":
    main()
