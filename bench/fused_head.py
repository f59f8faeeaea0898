"""CPU cost of an sft micro-batch of the math default with TRL's fused LM head scoring every position (TRL on CPU)
against scoring only the positions with a label (`trl_internals.fused_head_on_labels`, which every stage's training
runs inside), alternating, in the same process; and the two losses and gradients, which must agree.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python bench/fused_head.py [--rounds 3] [--micro_batches 8]

The rows are the default's sft rows (the chat template, the few-shot turn, the question, then the worked solution;
the loss on the solution only), 2 a micro-batch, right-padded, as SFTTrainer batches them. CPU seconds of this
process (time.process_time), so other load on the machine moves wall time, not the figure.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.utils import add_fused_lm_head

from grpo_recipes import bundled
from grpo_recipes.config.schema import SFTStageConfig
from grpo_recipes.run.runner import prepare
from grpo_recipes.stages.sft import build_examples
from grpo_recipes.state.models import resolve_model
from grpo_recipes.trl_internals import fused_head_on_labels


def micro_batches(tokenizer, rows, size: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for start in range(0, size * count, size):
        ids, labels = [], []
        for row in rows[start:start + size]:
            prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]
            full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True,
                                                 return_dict=True)["input_ids"]
            ids.append(full)
            labels.append([-100] * len(prompt) + full[len(prompt):])
        width = max(map(len, ids))
        pad = tokenizer.pad_token_id
        out.append((torch.tensor([r + [pad] * (width - len(r)) for r in ids]),
                    torch.tensor([r + [-100] * (width - len(r)) for r in labels])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro_batches", type=int, default=8)
    args = ap.parse_args()
    prepared = prepare("math", ["--config", str(bundled.recipe_config("math")), "--model_name_or_path", args.model],
                       for_training=False)
    path, _ = resolve_model(args.model, prepared.recipe.model_cache_dir)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # SFTTrainer's fields
    cfg = SFTStageConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    rows = build_examples(prepared.recipe, cfg, prepared.train, prepared.held_out).to_list()
    batches = micro_batches(tokenizer, rows, 2, args.micro_batches)
    labelled = sum(int((lab[:, 1:] != -100).sum()) for _, lab in batches)
    positions = sum(lab[:, 1:].numel() for _, lab in batches)

    def run() -> tuple[float, float, torch.Tensor]:
        model.zero_grad()
        start, total = time.process_time(), 0.0
        for ids, lab in batches:
            loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=lab,
                         fused_lm_head=True).loss
            loss.backward()
            total += float(loss)
        return time.process_time() - start, total, model.model.layers[0].mlp.down_proj.weight.grad.clone()

    cpu = {"every position (TRL on CPU)": [], "labelled positions only": []}
    for _ in range(args.rounds):
        every_s, every_loss, every_grad = run()
        with fused_head_on_labels():
            only_s, only_loss, only_grad = run()
        cpu["every position (TRL on CPU)"].append(every_s)
        cpu["labelled positions only"].append(only_s)
    base = statistics.median(cpu["every position (TRL on CPU)"])
    print(f"{args.micro_batches} sft micro-batches of 2 rows ({labelled} of {positions} positions labelled), "
          f"{args.rounds} rounds, CPU seconds (median) and ratio")
    for name, values in cpu.items():
        print(f"  {name:28s} {statistics.median(values):6.2f} s  x{statistics.median(values) / base:.2f}")
    print(f"  loss sums {every_loss:.6f} / {only_loss:.6f}; largest gradient difference (layer 0 down_proj) "
          f"{float((every_grad - only_grad).abs().max()):.2e}")


if __name__ == "__main__":
    main()
