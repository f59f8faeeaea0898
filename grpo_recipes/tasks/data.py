"""Dataset source -> disjoint train / held-out splits of chat prompts with the gold answer in `answer`.

What is generic: the sources (reasoning_gym, hub, file), the gold-answer column, the prompt template and the split.
What a task knows (its own rows, held-out set, demonstrations and row checks) comes from its task file (task.py).

Disjointness is by construction: rows are grouped by normalised question text and every group goes wholly to one
side, so the same question can never be trained on and evaluated on, even when a source repeats it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import string
from pathlib import Path

import reasoning_gym
from datasets import Dataset, load_dataset

from .registry import Task

logger = logging.getLogger("grpo_recipes")

SOURCES = ("reasoning_gym", "hub", "file")
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def question_key(question: str) -> str:
    return " ".join(str(question).split()).lower()


def _stable_hash(text: str, seed: int) -> str:
    return hashlib.sha1(f"{seed}:{text}".encode()).hexdigest()


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def check_data_args(args) -> list[str]:
    """Problems found without loading anything."""
    problems = []
    if args.dataset_source not in SOURCES:
        problems.append(f"dataset_source: '{args.dataset_source}' is not one of {', '.join(SOURCES)}")
    if args.dataset_source == "hub" and not args.dataset_name:
        problems.append("dataset_name: required when dataset_source is hub (e.g. openai/gsm8k)")
    if args.dataset_source == "file":
        for name in ("dataset_path", "eval_path"):
            value = getattr(args, name)
            if name == "dataset_path" and not value:
                problems.append("dataset_path: required when dataset_source is file")
            elif value and not Path(value).is_file():
                problems.append(f"{name}: no such file {value}")
            elif value and Path(value).suffix not in FILE_FORMATS:
                problems.append(f"{name}: unsupported format {Path(value).suffix}; use one of {', '.join(FILE_FORMATS)}")
    if args.dataset_source == "reasoning_gym":
        if args.gym_task not in reasoning_gym.factory.DATASETS:
            problems.append(f"gym_task: unknown reasoning-gym task '{args.gym_task}' (e.g. basic_arithmetic, chain_sum)")
    try:
        fields_ = template_fields(args.prompt_template)
    except ValueError as exc:
        problems.append(f"prompt_template: {exc}; literal braces are written {{{{ and }}}}")
    else:
        if "question" not in fields_:
            problems.append("prompt_template: must contain {question}")
    if args.answer_regex:
        try:
            if re.compile(args.answer_regex).groups < 1:
                problems.append("answer_regex: needs one capture group around the answer, e.g. '#### (.*)$'")
        except re.error as exc:
            problems.append(f"answer_regex: not a valid regex ({exc})")
    if args.train_size < 1 or args.eval_size < 0:
        problems.append("train_size/eval_size: train_size must be >= 1 and eval_size >= 0")
    return problems


def _gym_rows(args) -> list[dict]:
    # Generate extra rows: small tasks repeat questions, and repeats are dropped by the split.
    size = 2 * (args.train_size + args.eval_size)
    data = reasoning_gym.create_dataset(args.gym_task, size=size, seed=args.split_seed, **args.gym_params)
    return [
        {"question": e["question"], "answer": str(e["answer"]), "gym_entry": json.dumps(e, default=str)} for e in data
    ]


def _hub_rows(args, split: str) -> list[dict]:
    return list(load_dataset(args.dataset_name, args.dataset_config, split=split))


def _file_rows(path: str) -> list[dict]:
    kind = FILE_FORMATS[Path(path).suffix]
    return list(load_dataset(kind, data_files=str(path), split="train"))


def _normalise(row: dict, args) -> dict | None:
    row = dict(row)
    if args.question_field not in row:
        raise KeyError(f"question_field: the dataset has no column '{args.question_field}' (columns: {sorted(row)})")
    row["question"] = str(row[args.question_field])
    if args.answer_field:
        if args.answer_field not in row:
            raise KeyError(f"answer_field: the dataset has no column '{args.answer_field}' (columns: {sorted(row)})")
        gold = str(row[args.answer_field])
        if args.answer_regex:
            match = re.search(args.answer_regex, gold, re.M | re.S)
            if match is None:
                return None  # counted by the caller: a row without a gold answer cannot be scored
            gold = match.group(1).strip()
        row["answer"] = gold
    return row


def _user_turn(row: dict, args) -> str:
    try:
        return args.prompt_template.format_map(row)
    except KeyError as exc:
        raise KeyError(f"prompt_template: the row has no column {exc} (columns: {sorted(row)})") from None


def to_prompt(row: dict, args) -> list[dict]:
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt is not None else []
    for ex in args.few_shot or ():
        messages += [{"role": "user", "content": _user_turn(ex, args)}, {"role": "assistant", "content": ex["completion"]}]
    return [*messages, {"role": "user", "content": _user_turn(row, args)}]


def split_rows(rows: list[dict], eval_rows: list[dict] | None, args) -> tuple[list[dict], list[dict]]:
    """Disjoint by question: held-out questions are chosen by a seeded hash, or come from a given eval source."""
    if eval_rows is None:
        keys = sorted({question_key(r["question"]) for r in rows}, key=lambda k: _stable_hash(k, args.split_seed))
        held_out = set(keys[: args.eval_size])
        eval_pool = [r for r in rows if question_key(r["question"]) in held_out]
    else:
        eval_pool = eval_rows
    eval_out, seen = [], set()
    for r in eval_pool:  # one row per question: duplicates would weight a question twice in accuracy
        k = question_key(r["question"])
        if k not in seen and len(eval_out) < args.eval_size:
            seen.add(k)
            eval_out.append(r)
    excluded = {question_key(r["question"]) for r in eval_pool}
    train = [r for r in rows if question_key(r["question"]) not in excluded][: args.train_size]
    return train, eval_out


def _prepared(rows: list[dict], args, task: Task | None) -> list[dict]:
    rows = [r for r in (_normalise(r, args) for r in rows) if r is not None]
    if task is None:
        return rows
    kept = [r for r in (task.prepare(r, args) for r in rows) if r is not None]
    if len(kept) < len(rows):
        logger.info("task %s: dropped %d of %d rows", args.task, len(rows) - len(kept), len(rows))
    return kept


def load_splits(args, task: Task | None):
    """-> (train, eval) as datasets.Dataset with `prompt` (chat messages), `question`, `answer` and source columns.
    The configured task's own rows, held-out set and row preparation (`task`, the resolved config's) take the
    generic ones' place."""
    own = task.rows(args) if task is not None else None
    if own is not None:
        rows, eval_rows = own, None
    elif args.dataset_source == "reasoning_gym":
        rows, eval_rows = _gym_rows(args), None
    elif args.dataset_source == "hub":
        rows = _hub_rows(args, args.dataset_split)
        eval_rows = _hub_rows(args, args.eval_split) if args.eval_split else None
    else:
        rows = _file_rows(args.dataset_path)
        eval_rows = _file_rows(args.eval_path) if args.eval_path else None
    held_out = task.held_out(args) if task is not None else None
    if held_out is not None:
        eval_rows = held_out
    rows = _prepared(rows, args, task)
    if eval_rows is not None:
        eval_rows = _prepared(eval_rows, args, task)
    train, held_out = split_rows(rows, eval_rows, args)
    leaked = {question_key(ex["question"]) for ex in args.few_shot or ()} & {question_key(r["question"]) for r in held_out}
    if leaked:
        raise ValueError(f"few_shot: the example question(s) {sorted(leaked)} are held-out questions, so the held-out "
                         "score would count questions answered in the prompt; pick other examples")
    if not train:
        raise ValueError("dataset: no training rows left after removing held-out questions; raise train_size or "
                         "check question_field/answer_regex")
    for r in (*train, *held_out):
        r["prompt"] = to_prompt(r, args)
    return Dataset.from_list(_jsonable(train)), Dataset.from_list(_jsonable(held_out)) if held_out else None


def _jsonable(rows: list[dict]) -> list[dict]:
    # Arrow needs one type per column; nested structures of mixed types are kept as JSON text.
    out = []
    for r in rows:
        out.append({k: (json.dumps(v) if isinstance(v, dict) and k != "prompt" else v) for k, v in r.items()})
    return out

