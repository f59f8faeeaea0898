"""The `sft` stage: supervised fine-tuning with TRL's SFTTrainer, before GRPO in the same run (stages.py) or alone
(`stages: [sft]`, recipes/sft_warmup.py).

Examples are the run's TRAIN rows (data.load_splits) with a correct completion: the row's `demonstration_field`
column (sft_format `demonstration`), the gold answer rendered in a target format (`boxed`, `think_boxed`), a tool
episode (`tool_trajectory`: a call to the first configured tool with the row's expression, the tool's real result,
the boxed answer), or distilled traces from a JSONL file. Either way no held-out question is ever trained on. Examples
are prompt-completion conversations, so TRL computes the loss on the assistant turn only (tool episodes: on the
assistant turns, `assistant_only_loss`, never on the tool results). The run's held-out evaluation scores the stage
at its start and end (evaluate.HeldOutEvalCallback).
"""

from __future__ import annotations

import json
import logging

from datasets import Dataset
from transformers.utils import get_json_schema
from trl import SFTTrainer, get_peft_config

from ..config.checks import demonstration_column
from ..config.schema import SFT_FORMATS, RecipeArguments, SFTStageConfig
from ..tasks.data import question_key, to_prompt
from ..tools import registry as tools
from .base import Stage, tool_tokenizer

logger = logging.getLogger("grpo_recipes")


def reasoning_line(row: dict) -> str:
    # A row's task may give its expression (task: arithmetic); restating it as an equation is the one line of work a
    # one-step problem needs. Without one, the line only announces the answer.
    expression = row.get("expression")
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
    expression = row.get("expression")  # a column the row's task adds (task: arithmetic)
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
    built = tools.recipe_tools(recipe)
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


def build_examples(recipe: RecipeArguments, cfg: SFTStageConfig, train, held_out) -> Dataset:
    """The run's training rows (datasets) -> the SFT dataset, with prompt/completion/question/answer columns."""
    held_out_keys = {question_key(q) for q in held_out["question"]} if held_out is not None else set()
    if cfg.sft_format == "tool_trajectory" and not cfg.sft_traces_path:
        data = trajectory_examples(train, recipe)
        leaked = [r["question"] for r in data if question_key(r["question"]) in held_out_keys]
        if leaked:  # load_splits guarantees this; checked again because training on eval questions is silent otherwise
            raise RuntimeError(f"SFT examples include {len(leaked)} held-out question(s), e.g. {leaked[0]!r}")
        return Dataset.from_list(data)
    if cfg.sft_traces_path:
        rows = [{"question": r["question"], "prompt": r["prompt"], "text": r["completion"],
                 "answer": None if r.get("answer") is None else str(r["answer"])}
                for r in read_traces(cfg.sft_traces_path, recipe, held_out_keys)]
    elif cfg.sft_format == "demonstration":  # SFTStage.data_problems: every row has one
        rows = [{"question": r["question"], "prompt": r["prompt"], "text": r[recipe.demonstration_field],
                 "answer": r.get("answer")} for r in train]
    else:
        rows = [{"question": r["question"], "prompt": r["prompt"], "text": render_completion(r, cfg.sft_format),
                 "answer": r["answer"]} for r in train]
    leaked = [r["question"] for r in rows if question_key(r["question"]) in held_out_keys]
    if leaked:  # load_splits guarantees this; checked again because training on eval questions is silent otherwise
        raise RuntimeError(f"SFT examples include {len(leaked)} held-out question(s), e.g. {leaked[0]!r}")
    data = [{"question": r["question"], "answer": r["answer"], "prompt": r["prompt"],
             "completion": [{"role": "assistant", "content": r["text"]}]} for r in rows]
    return Dataset.from_list(data)


class SFTStage(Stage):
    """Supervised fine-tuning by TRL's SFTTrainer on the run's training rows (build_examples)."""

    name = "sft"

    def dataset(self, run):
        return build_examples(run.recipe, self.spec.training, run.train, run.held_out)

    def describe(self, run) -> str:
        cfg = self.spec.training
        source = cfg.sft_traces_path or (f"'{run.recipe.demonstration_field}'" if cfg.sft_format == "demonstration"
                                         else f"rendered {cfg.sft_format}")
        return (f"sft: {cfg.max_steps} steps of {cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps} "
                f"examples a process at lr {cfg.learning_rate:g}, from {source}")

    def problems(self, config) -> list[str]:
        """What its examples need of the recipe: a demonstration column, a gold answer, a tool to call."""
        recipe, cfg = config.recipe, self.spec.training
        if cfg.sft_traces_path:
            return []
        out = []
        if cfg.sft_format == "demonstration" and not recipe.demonstration_field:
            out.append("demonstration_field: the sft stage trains on it (sft_format demonstration), and it is unset. "
                       "Fix: a task that sets it (task: arithmetic sets worked_solution), a column of correct "
                       "completions, another sft_format, or sft_traces_path")
        elif cfg.sft_format != "demonstration" and not recipe.answer_field:
            out.append(f"answer_field: sft_format {cfg.sft_format} renders gold answers; set answer_field or pass "
                       "sft_traces_path")
        if cfg.sft_format == "tool_trajectory" and not recipe.tools:
            out.append("sft_format: tool_trajectory renders a call to the first configured tool; set `tools`")
        if cfg.sft_format == "tool_trajectory" and not cfg.assistant_only_loss:
            out.append("assistant_only_loss: must be true with sft_format tool_trajectory, or the tool results "
                       "(which the model never writes) are trained on as its own text")
        return [self.where() + m for m in out]

    def data_problems(self, config, train) -> list[str]:
        cfg, field_ = self.spec.training, config.recipe.demonstration_field
        if cfg.sft_traces_path or cfg.sft_format != "demonstration" or not field_:
            return []
        return [self.where() + m for m in demonstration_column(field_, train)]

    def make_trainer(self, run, model_path: str):
        extra = {"processing_class": tool_tokenizer(run.recipe, model_path)} if run.recipe.uses_tools else {}
        return SFTTrainer(model=model_path, args=self.spec.training, train_dataset=self.dataset(run),
                          peft_config=get_peft_config(run.model_args), **extra)

    def callbacks(self, trainer, run) -> list:
        return []  # GRPO's alerts watch GRPO's own metrics

    def before_save(self, trainer, run) -> None:
        if hasattr(trainer.model, "merge_and_unload"):  # a LoRA adapter folder has no config.json: GRPO could not load it
            trainer.model = trainer.model.merge_and_unload()
