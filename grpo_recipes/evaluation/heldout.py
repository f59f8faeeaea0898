"""Held-out evaluation with the recipe's own verifier: greedy pass@1, sampled pass@k, format rate, mean length.

Used three ways, all through `evaluate`:
- during training, `HeldOutEvalCallback` evaluates the policy at the run's start (a resumed run takes over the
  evaluations its checkpoint recorded instead), every `eval_every_steps` and at the end of each stage, logs
  `eval_pass@1` etc. through the trainer (Trackio shows `eval/pass@1`), and writes `eval_summary.json`;
- `grpo-recipes eval --recipe math --model PATH` (cli/eval.py) evaluates any checkpoint on a recipe's held-out split.
Prompts are tokenised as TRL's GRPOTrainer tokenises them for generation, so what is evaluated is what is trained.

Only the held-out split is ever evaluated (data.load_splits keeps it disjoint from training by question).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import GenerationConfig, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.models import unwrap_model_for_generation

from ..grpo.features.prefill import prefill
from ..grpo.groups import correctness_index, pass_at_k
from ..tools.episodes import read_episode, transcript
from ..trl_internals import summon_full_params
from .rollout import rollout

logger = logging.getLogger("grpo_recipes.evaluation.heldout")


@dataclass
class EvalSettings:
    k: int = 4  # sampled completions per prompt for pass@k; 0: greedy only
    max_new_tokens: int = 48
    batch_size: int = 16  # prompts per generate call
    share_prefix: bool = True  # the batch's common prompt prefix prefilled once (generate_greedy_and_sampled)
    temperature: float = 1.0  # sampling settings: the training ones, so pass@k measures what GRPO explores
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    threshold: float = 1.0  # solved when the correctness reward is at least this
    seed: int = 0  # sampling is seeded in a forked RNG: evaluating never shifts the training run's random stream
    chat_template_kwargs: dict | None = None
    tools: list | None = None  # the run's guarded tools: multi-turn rollouts (rollout.py) instead of one generation
    max_tool_iterations: int | None = None  # rounds of tool calls per episode (GRPOConfig.max_tool_calling_iterations)

    @classmethod
    def from_configs(cls, recipe, grpo, k: int | None = None) -> EvalSettings:
        """From the recipe and the run's GRPOConfig; an sft-only run's SFTConfig has no generation settings: the
        sampling ones are then TRL's GRPO defaults and the length is eval_max_new_tokens (checks.py requires it)."""
        return cls(
            k=recipe.eval_k if k is None else k,
            max_new_tokens=recipe.eval_max_new_tokens or grpo.max_completion_length,
            batch_size=recipe.eval_generation_batch_size,
            temperature=getattr(grpo, "temperature", 1.0),
            top_p=getattr(grpo, "top_p", 1.0),
            top_k=getattr(grpo, "top_k", 0),
            min_p=getattr(grpo, "min_p", None),
            repetition_penalty=getattr(grpo, "repetition_penalty", 1.0),
            threshold=recipe.correctness_threshold,
            seed=grpo.seed,
            chat_template_kwargs=getattr(grpo, "chat_template_kwargs", None),
            max_tool_iterations=getattr(grpo, "max_tool_calling_iterations", None),
        )


@dataclass
class EvalResult:
    pass_at_1: float | None  # greedy
    pass_at_k: float | None  # unbiased estimate from k samples per prompt
    pass_at_1_sampled: float | None  # mean accuracy of the samples: compare with the training reward
    format_rate: float | None  # mean format reward of the greedy completions (for a 0/1 reward: the share passing)
    mean_length: float  # greedy completion tokens, EOS included (as TRL's completions/mean_length)
    k: int
    rows: int
    unscorable: int  # rows whose greedy completion the verifier could not score (None)
    seconds: float = 0.0
    tool_call_rate: float | None = None  # greedy episodes that made at least one tool call (runs with tools)

    def as_logs(self) -> dict[str, float]:
        """Trainer log keys: the `eval_` prefix becomes `eval/` in Trackio and the other report_to backends."""
        logs = {"eval_pass@1": self.pass_at_1, "eval_pass@k": self.pass_at_k,
                "eval_pass@1_sampled": self.pass_at_1_sampled, "eval_format_rate": self.format_rate,
                "eval_mean_length": self.mean_length, "eval_tool_call_rate": self.tool_call_rate}
        return {k: v for k, v in logs.items() if v is not None}  # undefined is absent, never a fake 0


def _is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def prompt_token_ids(tokenizer, prompts: list, settings: EvalSettings, chat_template=None) -> list[list[int]]:
    """Tokenised exactly as TRL's GRPOTrainer tokenises prompts for generation."""
    if _is_conversational(prompts[0]):
        out = tokenizer.apply_chat_template(
            conversation=prompts, chat_template=chat_template, add_generation_prompt=True, tokenize=True,
            return_dict=True, **(settings.chat_template_kwargs or {}),
        )
        return [list(ids) for ids in out["input_ids"]]
    return [list(ids) for ids in tokenizer(text=prompts)["input_ids"]]


def generation_config(settings: EvalSettings, sample: bool, pad_id: int, eos_ids: list[int]) -> GenerationConfig:
    # Every sampling field is set: generate() fills unset ones from the checkpoint's generation_config (SmolLM2
    # ships temperature 0.2), which would silently change what is measured. Greedy ignores them all.
    common = dict(max_new_tokens=settings.max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_ids, use_cache=True,
                  repetition_penalty=settings.repetition_penalty)
    if not sample:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=settings.temperature, top_p=settings.top_p,
                            top_k=settings.top_k, min_p=settings.min_p, **common)


def cut_at_eos(sequences: list[list[int]], eos_ids: list[int]) -> list[list[int]]:
    eos = set(eos_ids)
    return [seq[: next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))] for seq in sequences]


@torch.no_grad()
def generate_greedy_and_sampled(model, prompt_ids: list[list[int]], greedy: GenerationConfig,
                                sampled: GenerationConfig, k: int, eos_ids: list[int], share_prefix: bool = True):
    """-> (one greedy completion per prompt, k sampled completions per prompt, prompt by prompt), token ids up to
    the first EOS.

    generate() would prefill every prompt in full, once per returned sequence: k + 1 times. Here the prompts are
    prefilled once (prefill.py: the batch's common prefix once, each prompt's rest once) and the cache is copied for
    the greedy pass and for each of k sampling passes, one sample per prompt each: the tokens of generate() called
    the same way, for less CPU (bench/eval_batch.py). A pass holds as many rows as the greedy one, so the batch size
    bounds the KV cache whatever k is. `share_prefix=False` runs each prompt in full, once.
    """
    ready = prefill(model, prompt_ids, greedy.pad_token_id, share_prefix, always=k > 0)
    start = ready.ids.size(1)
    everyone = torch.arange(len(prompt_ids), device=ready.ids.device)
    ids, mask, cache = ready.rows(everyone) if k > 0 else (ready.ids, ready.mask, ready.cache)
    g = model.generate(input_ids=ids, attention_mask=mask, cache=cache, generation_config=greedy)
    passes = []
    for _ in range(k):
        ids, mask, cache = ready.rows(everyone)
        s = model.generate(input_ids=ids, attention_mask=mask, cache=cache, generation_config=sampled)
        passes.append(cut_at_eos(s[:, start:].tolist(), eos_ids))
    return cut_at_eos(g[:, start:].tolist(), eos_ids), [p[i] for i in range(len(prompt_ids)) for p in passes]


def score(func, rows: list[dict], completion_ids: list[list[int]], texts: list[str], per_row: int,
          trainer_state=None, messages: list[list[dict]] | None = None) -> list[float | None]:
    """Call a TRL-style reward function the way GRPOTrainer does: columns repeated per completion.

    `func` is the training run's own compiled reward, so a reward that raises on held-out completions is recorded in
    reward_faults.jsonl and counts towards max_reward_failure_rate just as in training: a broken verifier is broken.
    """
    if func is None:
        return [None] * len(texts)
    expanded = [row for row in rows for _ in range(per_row)]
    prompts = [row["prompt"] for row in expanded]
    conversational = _is_conversational(prompts[0])
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    if messages is not None:  # a tool episode: the messages, as TRL hands them to rewards in training
        completions = messages
    columns = {key: [row[key] for row in expanded] for key in rows[0] if key not in ("prompt", "completion")}
    # Reward-internal metrics and table columns belong to the training logs: an evaluation must not mix into them.
    scores = func(prompts=prompts, completions=completions, completion_ids=completion_ids, trainer_state=trainer_state,
                  log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
    return [None if s is None or s != s else float(s) for s in scores]


def evaluate_episodes(model, tokenizer, rows: list[dict], correctness, fmt, settings: EvalSettings,
                      trainer_state=None) -> list[dict]:
    """evaluate_rows for a run with tools: multi-turn greedy episodes (and k sampled ones), built as TRL builds them."""
    max_iter = 8 if settings.max_tool_iterations is None else settings.max_tool_iterations  # None: TRL's unlimited
    common = dict(max_completion_length=settings.max_new_tokens, max_iterations=max_iter,
                  batch_size=settings.batch_size, chat_template_kwargs=settings.chat_template_kwargs)
    prompts = [r["prompt"] for r in rows]
    with progress_bar(len(rows) * (1 + settings.k)) as bar:
        greedy = rollout(model, tokenizer, prompts, settings.tools, progress=bar.update, **common)
        sampled = rollout(model, tokenizer, [p for p in prompts for _ in range(settings.k)], settings.tools,
                          sample=True, temperature=settings.temperature, progress=bar.update,
                          **common) if settings.k else []

    def scored(func, episodes, per_row):
        texts = [transcript(e["messages"]) for e in episodes]
        ids = [e["completion_ids"] for e in episodes]
        return score(func, rows, ids, texts, per_row, trainer_state, [e["messages"] for e in episodes])

    g_correct, g_format = scored(correctness, greedy, 1), scored(fmt, greedy, 1)
    s_correct = scored(correctness, sampled, settings.k) if settings.k else []
    return [{"greedy": g_correct[i], "format": g_format[i], "length": greedy[i]["model_tokens"],
             "samples": s_correct[i * settings.k : (i + 1) * settings.k], "completion": transcript(e["messages"]),
             "tool_calls": len(read_episode(e["messages"]).calls)} for i, e in enumerate(greedy)]


def evaluate_rows(model, tokenizer, rows: list[dict], correctness, fmt, settings: EvalSettings,
                  eos_ids: list[int], chat_template=None, trainer_state=None) -> list[dict]:
    """Per-row records: greedy correctness/format/length/text and the k sampled correctness values."""
    if settings.tools:
        return evaluate_episodes(model, tokenizer, rows, correctness, fmt, settings, trainer_state)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    greedy_cfg = generation_config(settings, False, pad_id, eos_ids)
    sample_cfg = generation_config(settings, True, pad_id, eos_ids)
    records = []
    with progress_bar(len(rows)) as bar:
        for start in range(0, len(rows), settings.batch_size):
            batch = rows[start : start + settings.batch_size]
            ids = prompt_token_ids(tokenizer, [r["prompt"] for r in batch], settings, chat_template)
            greedy, sampled = generate_greedy_and_sampled(model, ids, greedy_cfg, sample_cfg, settings.k, eos_ids,
                                                          settings.share_prefix)
            records += scored_records(tokenizer, batch, greedy, sampled, correctness, fmt, settings.k,
                                      trainer_state)
            bar.update(len(batch))
    return records


def progress_bar(rows: int) -> tqdm:
    """The held-out rows done, with the time left, on this machine's main process; shown once an evaluation has
    run for two seconds (a short one stays silent)."""
    return tqdm(total=rows, desc="held-out evaluation", unit="row", delay=2, leave=False, dynamic_ncols=True,
                disable=not PartialState().is_local_main_process)


def scored_records(tokenizer, batch: list[dict], greedy: list[list[int]], sampled: list[list[int]], correctness, fmt,
                   k: int, trainer_state=None) -> list[dict]:
    """A batch's greedy and k sampled completions (token ids; any generator's) -> evaluate_rows' per-row records."""
    g_text = tokenizer.batch_decode(greedy, skip_special_tokens=True)
    s_text = tokenizer.batch_decode(sampled, skip_special_tokens=True)
    g_correct = score(correctness, batch, greedy, g_text, 1, trainer_state)
    g_format = score(fmt, batch, greedy, g_text, 1, trainer_state)
    s_correct = score(correctness, batch, sampled, s_text, k, trainer_state) if k else []
    return [{"greedy": g_correct[i], "format": g_format[i], "length": len(greedy[i]),
             "samples": s_correct[i * k : (i + 1) * k], "completion": g_text[i]} for i in range(len(batch))]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(records: list[dict], settings: EvalSettings, has_format: bool, seconds: float = 0.0) -> EvalResult:
    t, k = settings.threshold, settings.k
    greedy = [r["greedy"] for r in records if r["greedy"] is not None]
    counts = [sample_counts(r, t) for r in records]
    return EvalResult(
        pass_at_1=_mean([float(g >= t) for g in greedy]),
        pass_at_k=_mean([pass_at_k(n, c, k) for n, c in counts if n >= k]) if k else None,
        pass_at_1_sampled=_mean([c / n for n, c in counts if n]),
        format_rate=_mean([r["format"] for r in records if r["format"] is not None]) if has_format else None,
        mean_length=_mean([r["length"] for r in records]) or 0.0,
        k=k,
        rows=len(records),
        unscorable=len(records) - len(greedy),
        seconds=seconds,
        tool_call_rate=_mean([float(r["tool_calls"] > 0) for r in records if "tool_calls" in r]),
    )


def evaluate(model, tokenizer, rows: list[dict], correctness, fmt, settings: EvalSettings, eos_ids: list[int],
             chat_template=None, trainer_state=None) -> tuple[list[dict], float]:
    """Evaluate `rows` in eval mode with a seeded, forked RNG; restores the model's mode. -> (records, seconds)."""
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(settings.seed)
            records = evaluate_rows(model, tokenizer, rows, correctness, fmt, settings, eos_ids, chat_template,
                                    trainer_state)
    finally:
        model.train(was_training)
    return records, time.perf_counter() - start


def reward_by_name(funcs, name: str | None):
    if name is None:
        return None
    matches = [f for f in funcs if f.__name__ == name]
    if not matches:
        raise ValueError(f"no configured reward named '{name}' (have: {', '.join(f.__name__ for f in funcs)})")
    return matches[0]


def reward_roles(recipe, funcs):
    """-> (correctness reward, format reward or None) as the recipe names them."""
    names = [f.__name__ for f in funcs]
    return funcs[correctness_index(names, recipe.correctness_reward)], reward_by_name(funcs, recipe.format_reward)


def eos_token_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


class HeldOutEvalCallback(TrainerCallback):
    """Evaluates the training policy on the held-out rows at the run's start, every N steps and at the end of each
    stage (stages.py), at the run's steps: the stage's own step plus `offset`, the steps of the stages before it.

    The evaluations so far (`carried`: the history, the first one's per-row records and each stage end's) travel
    with the run: into each checkpoint (HISTORY_FILE) and a finished stage's marker. A resumed stage, or the next
    stage, takes them over (`carry`) instead of evaluating again at its start: the earlier evaluations are in Trackio
    already (checkpoint.start removes only those after the resumed step). The last stage's end writes
    eval_summary.json, with the paired gain over the run and over each stage, and eval_completions.jsonl.
    """

    HISTORY_FILE = "heldout_evaluations.json"

    def __init__(self, trainer, rows: list[dict], correctness, fmt, settings: EvalSettings, every: int,
                 output_dir: str, resume_from: str | Path | None = None, *, offset: int = 0,
                 carry: dict | None = None, stage: str = "grpo", last: bool = True):
        self.trainer, self.rows, self.correctness, self.fmt = trainer, rows, correctness, fmt
        self.settings, self.every, self.output_dir = settings, every, Path(output_dir)
        self.resume_from = Path(resume_from) if resume_from else None
        self.offset, self.stage, self.last = offset, stage, last
        self.history: list[dict] = []
        self._first: list[dict] | None = None  # per-row records of the first and the latest evaluation, for the paired
        self._latest: list[dict] | None = None  # gain and the completions file written at the end
        self._stage_ends: list[dict] = []  # {"stage", "step", "records"} at the end of each finished stage
        self._carry = carry
        self._done = False

    @classmethod
    def from_recipe(cls, trainer, recipe, held_out, funcs, resume_from: str | Path | None = None, *,
                    training=None, tools: list | None = None, **kwargs) -> HeldOutEvalCallback:
        """`training`: the config whose sampling settings the evaluation uses (the last stage's; default the
        trainer's own)."""
        correctness, fmt = reward_roles(recipe, funcs)
        settings = EvalSettings.from_configs(recipe, training or trainer.args)
        # GRPOTrainer.tools: the guarded tools (None without); a stand-in trainer may not have the attribute at all,
        # and an sft stage's trainer has none: `tools` then gives the run's
        settings.tools = tools or list(getattr(trainer, "tools", None) or []) or None
        return cls(trainer, held_out.to_list(), correctness, fmt, settings, recipe.eval_every_steps,
                   (training or trainer.args).output_dir, resume_from, **kwargs)

    def carried(self) -> dict:
        return {"history": self.history, "first_records": self._first, "latest_records": self._latest,
                "stage_ends": self._stage_ends}

    def _take_over(self, kept: dict) -> None:
        self.history, self._first = kept["history"], kept["first_records"]
        self._latest = kept.get("latest_records") or self._first
        self._stage_ends = kept.get("stage_ends") or []

    def on_train_begin(self, args, state, control, **kwargs):
        saved = self.resume_from / self.HISTORY_FILE if self.resume_from else None
        if saved is not None and saved.is_file():
            self._take_over(json.loads(saved.read_text()))
        elif self._carry is not None:
            self._take_over(self._carry)
        else:
            self._evaluate(state, "start")

    def on_save(self, args, state, control, **kwargs):
        # Before checkpoint.CheckpointCallback.on_save (added after this callback) marks the checkpoint complete.
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}" / self.HISTORY_FILE
            path.write_text(json.dumps(self.carried(), indent=1, ensure_ascii=False) + "\n")

    def on_step_end(self, args, state, control, **kwargs):
        final = control.should_training_stop or state.global_step >= state.max_steps
        step = self.offset + state.global_step
        if self._done or not (final or (self.every > 0 and step % self.every == 0)):
            return
        should_log = control.should_log
        self._evaluate(state, ("end" if self.last else f"end of {self.stage}") if final else "periodic")
        control.should_log = should_log  # logging the evaluation resets it: the step's training log must still happen
        if final:
            self._done = True
            self._stage_ends.append({"stage": self.stage, "step": step, "records": self._latest})
            if self.last and state.is_world_process_zero:
                self._write_summary()

    def _evaluate(self, state, when: str) -> None:
        tr = self.trainer
        acc = tr.accelerator
        mine = self.rows[acc.process_index :: acc.num_processes]  # each process evaluates its share
        # The same unwrapping (DeepSpeed ZeRO-3 gathering, FSDP full params) as TRL's own generation step. With
        # ds3_gather_for_generation=False, ZeRO-3 forwards are collective and uneven shares would hang: not supported.
        gather = getattr(tr.args, "ds3_gather_for_generation", True)
        with (
            unwrap_model_for_generation(tr.model_wrapped, acc, gather_deepspeed3_params=gather) as model,
            summon_full_params(tr),
        ):
            eos = getattr(tr, "eos_token_ids", None) or eos_token_ids(model, tr.processing_class)
            records, seconds = evaluate(model, tr.processing_class, mine, self.correctness, self.fmt, self.settings,
                                        eos, getattr(tr, "chat_template", None), state) if mine else ([], 0.0)
        records = gather_object(records) if acc.num_processes > 1 else records
        if self._first is None:
            self._first = records
        self._latest = records
        result = summarise(records, self.settings, self.fmt is not None, seconds)
        step = self.offset + state.global_step
        self.history.append({"step": step, "when": when, **asdict(result)})
        logger.info("held-out eval (%s, step %d): %s in %.1fs", when, step, result.as_logs(), seconds)
        log = getattr(tr, "log_now", None)  # RecipeTrainer's: leaves TRL's pending training metrics alone
        log(result.as_logs()) if log else Trainer.log(tr, result.as_logs())

    def _write_summary(self) -> None:
        start, end = self.history[0], self.history[-1]
        t = self.settings.threshold
        gain = paired_gain(self._first, self._latest, t)
        sampled = paired_gain(self._first, self._latest, t, solved_sampled)  # None when greedy only (eval_k 0)
        summary = {"rows": end["rows"], "k": self.settings.k, "start": start, "end": end, "greedy_gain": gain,
                   "sampled_gain": sampled, "evaluations": self.history}
        if len(self._stage_ends) > 1:  # what each stage added, paired by question
            before, start_step, stages = self._first, start["step"], []
            for end_ in self._stage_ends:
                stages.append({"stage": end_["stage"], "from_step": start_step, "to_step": end_["step"],
                               "greedy_gain": paired_gain(before, end_["records"], t),
                               "sampled_gain": paired_gain(before, end_["records"], t, solved_sampled)})
                before, start_step = end_["records"], end_["step"]
            summary["stages"] = stages
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "eval_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        # What the model learned, question by question: the greedy completions before and after (and with eval_k,
        # the share of the samples that solve it).
        def side(record: dict, evaluation: dict) -> dict:
            share = {"sampled": solved_sampled(record, t)} if self.settings.k else {}
            return {"step": evaluation["step"], "correct": record["greedy"], "completion": record["completion"],
                    **share}

        acc = self.trainer.accelerator
        rows = [r for p in range(acc.num_processes) for r in self.rows[p :: acc.num_processes]]  # gather order
        with open(self.output_dir / "eval_completions.jsonl", "w") as f:
            for row, a, b in zip(rows, self._first, self._latest, strict=True):
                f.write(json.dumps({"question": row.get("question"), "answer": row.get("answer"),
                                    "start": side(a, start), "end": side(b, end)}, ensure_ascii=False) + "\n")
        self.trainer.accelerator.print(format_before_after(start, end, gain, sampled))
        for s in summary.get("stages", ()):
            parts = [f"{label} {g['gain']:+.3f} +- {g['se']:.3f} SE" for label, g in
                     (("pass@1", s["greedy_gain"]), ("pass@1 (sampled)", s["sampled_gain"])) if g is not None]
            if parts:
                self.trainer.accelerator.print(f"  stage {s['stage']:<5} steps {s['from_step']}-{s['to_step']}: "
                                               f"{', '.join(parts)} (paired)")


def solved_greedy(record: dict, threshold: float) -> float | None:
    return None if record["greedy"] is None else float(record["greedy"] >= threshold)


def sample_counts(record: dict, threshold: float) -> tuple[int, int]:
    """(scored samples, solving samples) of a row: unscorable (None) samples count in neither."""
    scored = [s for s in record["samples"] if s is not None]
    return len(scored), sum(s >= threshold for s in scored)


def solved_sampled(record: dict, threshold: float) -> float | None:
    """The share of the row's scored samples that solve it; None without any (greedy only, or none scorable)."""
    n, solved = sample_counts(record, threshold)
    return solved / n if n else None


def paired_gain(first: list[dict], last: list[dict], threshold: float, solved=solved_greedy) -> dict | None:
    """Pass@1 gain from the first to the last evaluation over the rows both scored, with its standard error: greedy,
    or with `solved=solved_sampled` the rows' sampled accuracy (what GRPO's reward optimises; greedy decoding can
    hide a policy that samples right more often, and a gain on the trained questions only).

    The rows are the same questions both times, so the per-row differences are paired: their spread (not that of two
    independent proportions) is the noise of the gain. -> {"gain", "se", "rows"} or None when nothing was scored."""
    pairs = [(solved(a, threshold), solved(b, threshold)) for a, b in zip(first, last, strict=True)]
    diffs = [b - a for a, b in pairs if a is not None and b is not None]
    if not diffs:
        return None
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return {"gain": mean, "se": (var / n) ** 0.5, "rows": n}


def format_before_after(start: dict, end: dict, gain: dict | None = None, sampled: dict | None = None) -> str:
    lines = [f"held-out evaluation, {end['rows']} rows (step {start['step']} -> step {end['step']}):"]
    for key, label in (("pass_at_1", "pass@1 (greedy)"), ("pass_at_k", f"pass@{end['k']}"),
                       ("pass_at_1_sampled", "pass@1 (sampled)"), ("format_rate", "format rate"),
                       ("tool_call_rate", "tool-call rate"), ("mean_length", "mean length")):
        a, b = start.get(key), end.get(key)
        if a is None and b is None:
            continue
        delta = f"{b - a:+.3f}" if a is not None and b is not None else "n/a"
        paired = {"pass_at_1": gain, "pass_at_1_sampled": sampled}.get(key)
        if paired is not None:
            delta += f" +- {paired['se']:.3f} SE, paired over {paired['rows']} rows"
        fa, fb = ("n/a" if v is None else f"{v:.3f}" for v in (a, b))
        lines.append(f"  {label:<18} {fa:>8} -> {fb:>8}  ({delta})")
    return "\n".join(lines)
