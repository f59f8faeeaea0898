"""CPU cost of the loss's forward and backward for one group, TRL's way against share_prompt_forward.

    python bench/prompt_sharing.py                    # the math default's model, prompts and group size, 5 rounds
    python bench/prompt_sharing.py --model /path/tiny --rounds 2

Rows are the default recipe's own: its chat prompt (few-shot turn included) for held-out questions, and completions
in the form the model writes ("a + b = c. \\boxed{c}", ~16 tokens), left- and right-padded as TRL pads them. Each
round runs one group both ways, alternating which goes first, one thread, and times CPU seconds (process time), so
a busy machine slows both sides alike. Prints the median per side and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.utils import add_fused_lm_head

from grpo_recipes.grpo.features.sharing import PromptSharing
from grpo_recipes.run import runner
from grpo_recipes.state.models import prepare_model

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "recipes" / "configs" / "math_cpu.yaml"


def group_rows(tokenizer, row: dict, size: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """`size` rows of one prompt, as TRL's loss receives them: (input_ids, attention_mask, completion width)."""
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    answer = int(row["answer"])
    completions = [tokenizer(f"{row['question'].removeprefix('Calculate ').rstrip('.')} = {answer + d}. "
                             f"\\boxed{{{answer + d}}}<|im_end|>", add_special_tokens=False).input_ids
                   for d in range(size)]
    width, pad_left = max(map(len, completions)), 4  # the batch's longest prompt is a few tokens longer
    rows = []
    for c in completions:
        ids = torch.cat([torch.zeros(pad_left, dtype=torch.long), prompt, torch.tensor(c),
                         torch.zeros(width - len(c), dtype=torch.long)])
        mask = torch.cat([torch.zeros(pad_left), torch.ones(len(prompt) + len(c)), torch.zeros(width - len(c))])
        rows.append((ids[None], mask.long()[None], width))
    return rows


def trl_side(model, rows) -> None:
    for ids, mask, width in rows:
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-width] = -100
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs[:, -width:] * mask[:, -width:]).sum().backward()


def shared_side(model, rows) -> None:
    sharing = PromptSharing(len(rows))
    for ids, mask, width in rows:
        logps, _ = sharing.row(model, 0, ids, mask, width, compute_entropy=True)
        (logps * mask[:, -width:]).sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the math default's, converted offline)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    argv = ["--report_to", "none", "--output_dir", tempfile.mkdtemp()]
    argv += ["--model_name_or_path", args.model] if args.model else []
    run = runner.prepare("math", argv, CONFIG)
    path = prepare_model(run.model_args, run.recipe.model_cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    sides = {"trl": trl_side, "shared": shared_side}
    times = {name: [] for name in sides}
    for r in range(args.rounds):
        rows = group_rows(tokenizer, run.held_out[r], run.training.num_generations)
        tokens = int(rows[0][1].sum())
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            model.zero_grad()
            start = time.process_time()
            sides[name](model, rows)
            times[name].append(time.process_time() - start)
    trl, shared = statistics.median(times["trl"]), statistics.median(times["shared"])
    print(f"groups of {run.training.num_generations} rows, prompt + completion {tokens} tokens a row, {args.rounds} "
          f"rounds, CPU s per group (median): trl {trl:.2f}, shared {shared:.2f}, shared/trl {shared / trl:.2f}")


if __name__ == "__main__":
    main()
