"""SFT warm-up before GRPO: teach the answer format on the recipe's own training split, then hand the saved model
to a GRPO recipe as `--model_name_or_path`.

Examples are the TRAIN split of `load_splits` with the gold answer rendered in the target format, or distilled
traces from a JSONL file. Either way no held-out question is ever trained on: the held-out split is computed with
the same data settings the GRPO recipe uses, so those settings must match between the two configs.
Examples are prompt-completion conversations, so TRL computes the loss on the assistant turn only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import SFTConfig

from . import registry
from .config import ConfigError, RecipeArguments, parse_recipe_args
from .data import check_data_args, load_splits, question_key, to_prompt

logger = logging.getLogger("grpo_recipes")

FORMATS = ("boxed", "think_boxed")


@dataclass
class WarmupConfig(SFTConfig):
    """SFTConfig plus the warm-up's own settings (they concern only this stage, so they live here)."""

    sft_format: str = field(
        default="boxed",
        metadata={"help": "Target format: `boxed` (a reasoning line, then \\boxed{answer}) or `think_boxed` "
                          "(the line inside <think>...</think>, then \\boxed{answer})."},
    )
    sft_traces_path: str | None = field(
        default=None,
        metadata={"help": "JSONL of distilled traces ({question, completion} per line) to train on instead of "
                          "rendered gold answers; held-out questions are dropped."},
    )
    format_eval: bool = field(
        default=True, metadata={"help": "Greedy-decode the held-out split before and after SFT; write format_eval.json."}
    )
    format_eval_max_new_tokens: int = field(default=48, metadata={"help": "Generation budget per held-out prompt."})
    format_eval_batch_size: int = field(default=16, metadata={"help": "Prompts generated together in format eval."})


def check_warmup(cfg: WarmupConfig) -> list[str]:
    problems = []
    if cfg.sft_format not in FORMATS:
        problems.append(f"sft_format: '{cfg.sft_format}' is not one of {', '.join(FORMATS)}")
    if cfg.sft_traces_path and not Path(cfg.sft_traces_path).is_file():
        problems.append(f"sft_traces_path: no such file {cfg.sft_traces_path}")
    if cfg.format_eval_max_new_tokens < 1 or cfg.format_eval_batch_size < 1:
        problems.append("format_eval_max_new_tokens/format_eval_batch_size: must be >= 1")
    return problems


def reasoning_line(row: dict) -> str:
    # reasoning-gym rows keep the expression in their metadata; restating it as an equation is the one line of work
    # a one-step problem needs. Other sources have no worked solution, so the line only announces the answer.
    entry = row.get("gym_entry")
    meta = (json.loads(entry) if isinstance(entry, str) else entry or {}).get("metadata") or {}
    expression = meta.get("expression")
    return f"{expression} = {row['answer']}" if expression else f"The answer is {row['answer']}."


def render_completion(row: dict, fmt: str) -> str:
    box = f"\\boxed{{{row['answer']}}}"
    if fmt == "boxed":
        return f"{reasoning_line(row)}\n{box}"
    if fmt == "think_boxed":  # the newline layout think_format(strict=True) asks for
        return f"<think>\n{reasoning_line(row)}\n</think>\n{box}"
    raise ValueError(f"sft_format: '{fmt}' is not one of {', '.join(FORMATS)}")


def read_traces(path: str, recipe: RecipeArguments, held_out_keys: set[str]) -> list[dict]:
    """Trace rows with the recipe's prompt; rows whose question is held out are dropped (and counted)."""
    rows, dropped = [], 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"sft_traces_path: {path}:{n} is not JSON ({exc})") from None
            missing = [k for k in ("question", "completion") if not isinstance(row.get(k), str)]
            if missing:
                raise ValueError(f"sft_traces_path: {path}:{n} lacks string field(s) {missing}")
            if question_key(row["question"]) in held_out_keys:
                dropped += 1
                continue
            rows.append({**row, "prompt": to_prompt(row, recipe)})
    if dropped:
        logger.warning("sft_traces_path: dropped %d trace(s) whose question is in the held-out split", dropped)
    if not rows:
        raise ValueError(f"sft_traces_path: {path} has no usable traces outside the held-out split")
    return rows


def build_examples(recipe: RecipeArguments, cfg: WarmupConfig):
    """-> (SFT dataset with prompt/completion/question/answer columns, held-out dataset or None)."""
    from datasets import Dataset

    if not cfg.sft_traces_path and not recipe.answer_field:
        raise ValueError("answer_field: rendered SFT targets need gold answers; set answer_field or pass "
                         "sft_traces_path")
    train, held_out = load_splits(recipe)
    held_out_keys = {question_key(q) for q in held_out["question"]} if held_out is not None else set()
    if cfg.sft_traces_path:
        rows = [{"question": r["question"], "prompt": r["prompt"], "text": r["completion"],
                 "answer": None if r.get("answer") is None else str(r["answer"])}
                for r in read_traces(cfg.sft_traces_path, recipe, held_out_keys)]
    else:
        rows = [{"question": r["question"], "prompt": r["prompt"], "text": render_completion(r, cfg.sft_format),
                 "answer": r["answer"]} for r in train]
    leaked = [r["question"] for r in rows if question_key(r["question"]) in held_out_keys]
    if leaked:  # load_splits guarantees this; checked again because training on eval questions is silent otherwise
        raise RuntimeError(f"SFT examples include {len(leaked)} held-out question(s), e.g. {leaked[0]!r}")
    data = [{"question": r["question"], "answer": r["answer"], "prompt": r["prompt"],
             "completion": [{"role": "assistant", "content": r["text"]}]} for r in rows]
    return Dataset.from_list(data), held_out


def score_completions(completions: list[str], answers: list[str], fmt: str, reward_dirs=()) -> dict:
    """Format rate (answer in the target format) and accuracy, using the same rewards GRPO trains with."""
    rewards = registry.available(reward_dirs)
    boxed = rewards["boxed_format"].func(completions)
    ok = boxed
    if fmt == "think_boxed":
        think = rewards["think_format"].func(completions, strict=True)
        ok = [b * t for b, t in zip(boxed, think, strict=True)]
    correct = rewards["math_correctness"].func(completions, answers, lambda *_: None)
    scored = [c for c in correct if c is not None]  # None: a gold answer math-verify cannot parse
    n = max(len(completions), 1)
    return {"n": len(completions), "format_rate": sum(ok) / n, "boxed_rate": sum(boxed) / n,
            "accuracy": sum(scored) / max(len(scored), 1), "accuracy_scored": len(scored)}


def generate_greedy(model, tokenizer, prompts: list[list[dict]], max_new_tokens: int, batch_size: int) -> list[str]:
    import torch

    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only batches must end on the prompt so generation continues from it
    was_training = model.training
    model.eval()
    out = []
    try:
        for i in range(0, len(prompts), batch_size):
            texts = tokenizer.apply_chat_template(prompts[i : i + batch_size], add_generation_prompt=True,
                                                  tokenize=False)
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                     top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id)
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


def format_eval(trainer, held_out, cfg: WarmupConfig, reward_dirs=()) -> dict:
    model = trainer.accelerator.unwrap_model(trainer.model)
    texts = generate_greedy(model, trainer.processing_class, list(held_out["prompt"]),
                            cfg.format_eval_max_new_tokens, cfg.format_eval_batch_size)
    result = score_completions(texts, list(held_out["answer"]), cfg.sft_format, reward_dirs)
    result["samples"] = [{"question": q, "completion": t} for q, t in zip(held_out["question"][:5], texts[:5])]
    return result


def prepare(recipe_name: str, argv: list[str] | None, default_config: Path | None):
    recipe, cfg, model_args, _ = parse_recipe_args(argv, default_config, training_cls=WarmupConfig)
    problems = check_data_args(recipe) + check_warmup(cfg)
    if problems:
        raise ConfigError(problems)
    try:
        dataset, held_out = build_examples(recipe, cfg)
    except (KeyError, ValueError) as exc:
        raise ConfigError([str(exc).strip("'\"")]) from None
    if cfg.project == "huggingface":  # TrainingArguments' placeholder: one Trackio project per recipe
        cfg.project = f"grpo-recipes-{recipe_name}"
    if not cfg.run_name:
        model = Path(model_args.model_name_or_path.rstrip("/")).name
        cfg.run_name = f"{recipe_name}-{model}-{cfg.sft_format}-lr{cfg.learning_rate:g}-seed{cfg.seed}"
    if recipe.trackio_dir:
        os.environ["TRACKIO_DIR"] = str(Path(recipe.trackio_dir).expanduser().resolve())
    return recipe, cfg, model_args, dataset, held_out


def build_trainer(recipe, cfg, model_args, dataset):
    from trl import SFTTrainer, get_peft_config

    from .models import prepare_model

    model_path = prepare_model(model_args, cfg, recipe.model_cache_dir)
    return SFTTrainer(model=model_path, args=cfg, train_dataset=dataset, peft_config=get_peft_config(model_args))


def _summary(result: dict) -> str:
    return f"format_rate={result['format_rate']:.3f} accuracy={result['accuracy']:.3f} (n={result['n']})"


def main(recipe_name: str, default_config: Path | None = None, argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        recipe, cfg, model_args, dataset, held_out = prepare(recipe_name, argv, default_config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logger.info("SFT: %d examples (%s), %d held-out rows never trained on", len(dataset),
                cfg.sft_traces_path or f"rendered {cfg.sft_format}", len(held_out) if held_out is not None else 0)
    trainer = build_trainer(recipe, cfg, model_args, dataset)
    acc = trainer.accelerator
    evaluate = cfg.format_eval and held_out is not None and "answer" in held_out.column_names
    if cfg.format_eval and not evaluate:
        logger.warning("format_eval: skipped, there is no held-out split with gold answers")
    before = format_eval(trainer, held_out, cfg, recipe.reward_dirs or ()) if evaluate and acc.is_main_process else None
    trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint)
    if hasattr(trainer.model, "merge_and_unload"):  # a LoRA adapter folder has no config.json: GRPO could not load it
        trainer.model = trainer.model.merge_and_unload()
    trainer.save_model(cfg.output_dir)
    if evaluate and acc.is_main_process:
        after = format_eval(trainer, held_out, cfg, recipe.reward_dirs or ())
        report = {"sft_format": cfg.sft_format, "max_new_tokens": cfg.format_eval_max_new_tokens,
                  "before": before, "after": after}
        Path(cfg.output_dir, "format_eval.json").write_text(json.dumps(report, indent=2))
        # eval_* keys land under eval/ in Trackio. The callback closed the run at train end; logging reopens it
        # (resume="allow"), so it is closed again here rather than left to the exit hook.
        trainer.log({f"eval_{k}_{when}": report[when][k] for when in ("before", "after")
                     for k in ("format_rate", "accuracy")})
        if "trackio" in (cfg.report_to or []):
            import trackio

            trackio.finish()
        acc.print(f"held-out before SFT: {_summary(before)}\nheld-out after SFT:  {_summary(after)}")
    acc.wait_for_everyone()
    acc.print(f"model saved to {cfg.output_dir}; train GRPO from it with --model_name_or_path {cfg.output_dir}")
    trainer.end()
    if acc.num_processes > 1:
        from .runner import exit_without_teardown

        exit_without_teardown(0)  # while `trainer` still holds the DDP wrapper (see there)
    return 0
