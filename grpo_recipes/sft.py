"""SFT warm-up before GRPO: teach the answer format on the recipe's own training split, then hand the saved model
to a GRPO recipe as `--model_name_or_path`.

It runs on the GRPO runner's skeleton (runner.main with `WarmupStage`): the same parsing, start-up checks, run
naming, rewards from the config, complete checkpoints, SIGTERM handling and resume. Before and after training the
model greedily answers the held-out split, generated and scored by evaluate.py as in GRPO's held-out evaluation,
with the configured rewards (correctness_reward, format_reward).

Examples are the TRAIN split of `load_splits` with the gold answer rendered in the target format (for a tool
recipe, `tool_trajectory`: a call to the first configured tool with the row's expression, the tool's real result,
the boxed answer), or distilled traces from a JSONL file. Either way no held-out question is ever trained on: the
held-out split is computed with the same data settings the GRPO recipe uses, so those settings must match between
the two configs. Examples are prompt-completion conversations, so TRL computes the loss on the assistant turn only
(tool episodes: on the assistant turns, `assistant_only_loss`, never on the tool results).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from datasets import Dataset
from transformers.utils import get_json_schema
from trl import SFTTrainer, get_peft_config

from . import runner, tools, tracking
from .config import SFT_FORMATS, RecipeArguments, WarmupConfig
from .data import load_splits, question_key, row_expression, to_prompt
from .evaluate import EvalSettings, eos_token_ids, evaluate, reward_roles, summarise

logger = logging.getLogger("grpo_recipes")


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
    raise ValueError(f"sft_format: '{fmt}' is not one of {', '.join(SFT_FORMATS)}")


def tool_trajectory(row: dict, tool) -> list[dict] | None:
    """A call to `tool` with the row's expression -> the tool's REAL result -> the boxed answer; None when the row has
    no expression or the tool disagrees with the gold (the row would teach a wrong answer or a made-up result)."""
    expression = row_expression(row)
    if expression is None:
        return None
    result = tool(expression)
    if result.strip() != str(row["answer"]).strip():
        return None
    name = tool.__name__
    arg = next(iter(get_json_schema(tool)["function"]["parameters"]["properties"]))
    return [
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {arg: expression}}}]},
        {"role": "tool", "name": name, "content": result},
        {"role": "assistant", "content": f"The answer is \\boxed{{{row['answer']}}}."},
    ]


def trajectory_examples(train, recipe: RecipeArguments) -> list[dict]:
    """sft_format tool_trajectory: one gold episode per training row, with the tools' schemas in a `tools` column
    (TRL's SFTTrainer renders them into the prompt as the GRPO trainer does)."""
    built = tools.build_tools(recipe.tools, tools.available(recipe.tool_dirs or ()))
    schemas = json.dumps([get_json_schema(t) for t in built])
    rows, dropped = [], 0
    for r in train:
        episode = tool_trajectory(r, built[0])
        if episode is None:
            dropped += 1
            continue
        rows.append({"question": r["question"], "answer": r["answer"], "prompt": r["prompt"], "completion": episode,
                     "tools": schemas})
    if dropped:
        logger.warning("sft_format tool_trajectory: dropped %d row(s) without an expression or whose gold %s "
                       "disagrees with", dropped, built[0].__name__)
    if not rows:
        raise ValueError(f"sft_format: tool_trajectory found no row whose expression {built[0].__name__} answers "
                         "with the gold; check the data settings and gold_check_tool")
    return rows


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
    if not cfg.sft_traces_path and not recipe.answer_field:  # checks.warmup_problems says so before anything loads
        raise ValueError("answer_field: rendered SFT targets need gold answers; set answer_field or pass "
                         "sft_traces_path")
    train, held_out = load_splits(recipe)
    held_out_keys = {question_key(q) for q in held_out["question"]} if held_out is not None else set()
    if cfg.sft_format == "tool_trajectory" and not cfg.sft_traces_path:
        data = trajectory_examples(train, recipe)
        leaked = [r["question"] for r in data if question_key(r["question"]) in held_out_keys]
        if leaked:  # load_splits guarantees this; checked again because training on eval questions is silent otherwise
            raise RuntimeError(f"SFT examples include {len(leaked)} held-out question(s), e.g. {leaked[0]!r}")
        return Dataset.from_list(data), held_out
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


def format_eval(trainer, run: runner.Run) -> dict:
    """Greedy answers to every held-out prompt, scored with the configured correctness and format rewards."""
    cfg, recipe = run.training, run.recipe
    model = trainer.accelerator.unwrap_model(trainer.model)
    tokenizer = trainer.processing_class
    correctness, fmt = reward_roles(recipe, run.funcs)
    settings = EvalSettings(k=0, max_new_tokens=cfg.format_eval_max_new_tokens, batch_size=cfg.format_eval_batch_size,
                            threshold=recipe.correctness_threshold, seed=cfg.seed,
                            tools=trainer_tools(run), max_tool_iterations=cfg.format_eval_max_tool_iterations)
    rows = run.held_out.to_list()
    records, seconds = evaluate(model, tokenizer, rows, correctness, fmt, settings, eos_token_ids(model, tokenizer))
    result = summarise(records, settings, fmt is not None, seconds)
    return {"n": result.rows, "format_rate": result.format_rate, "accuracy": result.pass_at_1,
            "tool_call_rate": result.tool_call_rate,
            "accuracy_scored": result.rows - result.unscorable, "mean_length": result.mean_length,
            "correctness_reward": correctness.__name__, "format_reward": fmt.__name__ if fmt else None,
            "samples": [{"question": r["question"], "completion": rec["completion"]}
                        for r, rec in zip(rows[:5], records[:5])]}


def trainer_tools(run: runner.Run) -> list | None:
    """The run's tools, guarded as in GRPO, for multi-turn held-out episodes; None without tools."""
    if not run.recipe.tools:
        return None
    return tools.build_tools(run.recipe.tools, tools.available(run.recipe.tool_dirs or ()))


def _summary(result: dict) -> str:
    fmt, acc = (("n/a" if v is None else f"{v:.3f}") for v in (result["format_rate"], result["accuracy"]))
    calls = "" if result.get("tool_call_rate") is None else f" tool_call_rate={result['tool_call_rate']:.3f}"
    return f"format_rate={fmt} accuracy={acc}{calls} (n={result['n']})"


class WarmupStage(runner.Stage):
    """SFT on rendered answers or traces (SFTTrainer), with the held-out format check around training."""

    training_cls = WarmupConfig

    def __init__(self) -> None:
        self.before: dict | None = None

    def load_data(self, recipe, cfg):
        return build_examples(recipe, cfg)

    def run_label(self, cfg) -> list[str]:
        return [cfg.sft_format, f"lr{cfg.learning_rate:g}", f"seed{cfg.seed}"]

    def describe(self, run) -> str:
        held_out = len(run.held_out) if run.held_out is not None else 0
        source = run.training.sft_traces_path or f"rendered {run.training.sft_format}"
        return f"SFT: {len(run.train)} examples ({source}), {held_out} held-out rows never trained on"

    def configure(self, run) -> None:
        pass

    def make_trainer(self, run, model_path: str):
        extra = {"processing_class": runner.tool_tokenizer(run.recipe, model_path)} if run.recipe.uses_tools else {}
        return SFTTrainer(model=model_path, args=run.training, train_dataset=run.train,
                          peft_config=get_peft_config(run.model_args), **extra)

    def callbacks(self, trainer, run) -> list:
        return []  # GRPO's alerts watch GRPO's own metrics; the format check runs around training instead

    def _evaluates(self, trainer, run) -> bool:
        return bool(run.training.format_eval and run.held_out is not None and trainer.accelerator.is_main_process)

    def before_train(self, trainer, run) -> None:
        if run.training.format_eval and run.held_out is None:
            logger.warning("format_eval: skipped, there is no held-out split (eval_size is 0)")
        if self._evaluates(trainer, run):
            self.before = format_eval(trainer, run)

    def before_save(self, trainer, run) -> None:
        if hasattr(trainer.model, "merge_and_unload"):  # a LoRA adapter folder has no config.json: GRPO could not load it
            trainer.model = trainer.model.merge_and_unload()

    def after_save(self, trainer, run) -> None:
        cfg, acc = run.training, trainer.accelerator
        if self._evaluates(trainer, run):
            after = format_eval(trainer, run)
            report = {"sft_format": cfg.sft_format, "max_new_tokens": cfg.format_eval_max_new_tokens,
                      "before": self.before, "after": after}
            Path(cfg.output_dir, "format_eval.json").write_text(json.dumps(report, indent=2))
            # eval_* keys land under eval/ in Trackio. The callback closed the run at train end; logging reopens it
            # (resume="allow"), so it is closed again here rather than left to the exit hook.
            logs = {f"eval_{k}_{when}": report[when][k] for when in ("before", "after")
                    for k in ("format_rate", "accuracy", "tool_call_rate")}
            trainer.log({k: v for k, v in logs.items() if v is not None})
            if tracking.enabled(cfg):
                tracking.finish()
            acc.print(f"held-out before SFT: {_summary(self.before)}\nheld-out after SFT:  {_summary(after)}")
        acc.wait_for_everyone()
        acc.print(f"train GRPO from it with --model_name_or_path {cfg.output_dir}")


def main(recipe_name: str, default_config: Path | None = None, argv: list[str] | None = None) -> int:
    """The warm-up recipe's entry point: runner.main with the warm-up stage."""
    return runner.main(recipe_name, default_config, argv, stage=WarmupStage)
