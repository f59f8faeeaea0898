"""The `distill` stage: the student learns from a teacher, in the mode its entry sets (docs/distillation.md).

- traces: the teacher samples `teacher_samples` completions of each training prompt (transformers generate in each
  process, or an OpenAI-compatible vLLM server that serves it); the run's strict verifier (correctness_reward at
  correctness_threshold, as in the held-out evaluation) keeps the correct ones, and the sft stage's code
  (sft.SFTStage: TRL's SFTTrainer) fine-tunes the student on them. The samples are written as they come (TraceStore),
  so `--resume` samples only the prompts not yet done.
- logits: TRL's DistillationTrainer. In TRL 1.16 it is on-policy: the student samples each completion and learns
  the teacher's next-token distribution on it (generalized JSD, `beta`). Training on the teacher's own samples
  (off-policy, sequence level) is mode traces; TRL's token-level mix of the two (GKD's `lmbda`) is in
  trl.experimental and is not wired here.

The teacher is a model folder, a Hub id or an earlier stage's output (`stage:N`, `stage:NAME`). It does not train, so
it is evaluated once, on the run's held-out rows with the run's evaluation (evaluate.py: the same prompts, settings and
verifier as the student's). That, the acceptance of its samples and the student's NLL on kept traces (at the stage's
start and end) are logged as distill/* and written to distill_summary.json in the stage's folder, with the student's
held-out accuracy at the stage's start and end and the stage's CPU seconds: `distill_cpu_seconds`, the teacher's
sampling plus the student's training steps, all processes, the evaluations not counted (as max_cpu_minutes counts).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Trainer
from trl import DistillationTrainer, get_peft_config

from .. import bundled
from ..config.files import read_yaml
from ..config.schema import DistillLogitsConfig
from ..config.stages import StageSpec
from ..errors import ConfigError
from ..evaluation.heldout import (
    EvalSettings,
    HeldOutEvalCallback,
    cut_at_eos,
    eos_token_ids,
    evaluate,
    generation_config,
    prompt_token_ids,
    reward_roles,
    score,
    scored_records,
    summarise,
)
from ..grpo.alerts import MISSING, AlertCallback, Detector, _value
from ..rewards import registry
from ..state import budget, models
from ..state.budget import StepClock
from ..state.checkpoint import CheckpointCallback, stage_dir
from ..tasks.data import question_key
from ..vllm import support as vllm_support
from .base import Stage
from .sft import SFTStage

logger = logging.getLogger("grpo_recipes")

TRACES, PROMPTS, SUMMARY = "distill_traces.jsonl", "distill_prompts.jsonl", "distill_summary.json"
STAGE_REF = "stage:"


# ------------------------------------------------------------------------------------------------- the teacher


def teacher_stage(teacher: str, entries: list[dict], index: int) -> tuple[int | None, str | None]:
    """`stage:N` or `stage:NAME` -> (that earlier stage's index, None) or (None, the problem); (None, None) for a
    teacher that names no stage (a folder or a Hub id)."""
    if not teacher.startswith(STAGE_REF):
        return None, None
    ref = teacher[len(STAGE_REF):]
    earlier = [e["name"] for e in entries[:index]]
    listed = ", ".join(f"{i}: {n}" for i, n in enumerate(earlier)) or "none"
    matches = [int(ref)] if ref.isdigit() and int(ref) < index else [i for i, n in enumerate(earlier) if n == ref]
    if len(matches) == 1:
        return matches[0], None
    why = "names two earlier stages; use its number" if matches else "is not an earlier stage"
    return None, f"teacher: {teacher} {why} (this is stages[{index}]; earlier: {listed})"


def teacher_path(run, spec: StageSpec) -> str:
    """The teacher's local folder: an earlier stage's, or the model resolved as the student's is (models.py)."""
    n, _ = teacher_stage(spec.training.teacher, run.recipe.stages, spec.index)
    if n is not None:
        return str(stage_dir(run.training.output_dir, n, run.recipe.stages[n]["name"]))
    with PartialState().main_process_first():
        path, source = models.resolve_model(spec.training.teacher, run.recipe.model_cache_dir)
    logger.info("teacher %s from %s (%s)", spec.training.teacher, source, path)
    return path


def _trained_by(teacher: str) -> str:
    """When the teacher is where a shipped recipe config saves its model: the command that trains it."""
    for config in sorted((bundled.recipes_dir() / "configs").glob("*.yaml")):
        out = read_yaml(config).get("output_dir")
        if out and Path(out) == Path(teacher):
            command = ("`make run`" if config.name == "math_cpu.yaml"
                       else f"`accelerate launch recipes/train.py --config recipes/configs/{config.name}`")
            return f"It is where recipes/configs/{config.name} saves its model: train it first, {command} from the " \
                   "repository root."
    return "Fix: a saved model folder, a Hub id, or an earlier stage (`stage:N`)."


def teacher_problems(cfg, index: int, recipe) -> list[str]:
    """The teacher setting: present, an earlier stage or a model this machine can load. Loads nothing."""
    if not cfg.teacher:
        return ["teacher: the distill stage needs one: a model folder, a Hub id, or an earlier stage (`stage:N`)"]
    n, problem = teacher_stage(cfg.teacher, recipe.stages, index)
    if problem:
        return [problem]
    if n is not None:
        if getattr(cfg, "use_vllm", False) and not isinstance(cfg, DistillLogitsConfig):
            return [f"use_vllm: a vLLM server must serve the teacher before the run starts, and {cfg.teacher} is "
                    "trained by this run; set use_vllm: false, or serve a saved teacher folder"]
        return []
    path = Path(cfg.teacher).expanduser()
    if path.is_dir():
        return [] if (path / "config.json").is_file() else [
            f"teacher: {path} is a folder without config.json; name a saved model folder"]
    if models.tokenizer_source(cfg.teacher, recipe.model_cache_dir) is None:
        return [f"teacher: no model at '{cfg.teacher}': no such folder (from {Path.cwd()}), not in the Hugging Face "
                f"cache, and no reachable Hub has it. {_trained_by(cfg.teacher)}"]
    return []


def _tokenizer_and_width(name: str, cache_dir: str | None):
    folder, kwargs = models.tokenizer_source(name, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    return tokenizer, AutoConfig.from_pretrained(folder, **kwargs).get_text_config().vocab_size


def vocabulary_problem(student: str, teacher: str, cache_dir: str | None = None) -> str | None:
    """Mode logits compares full next-token distributions, so the teacher needs the student's tokenizer and an output
    layer as wide (TRL checks the width only once both models are loaded). Reads tokenizers and configs only."""
    missing = [n for n in (student, teacher) if models.tokenizer_source(n, cache_dir) is None]
    if missing:
        return f"teacher: cannot read the tokenizer of {', '.join(missing)} to compare vocabularies; fix the path"
    (s_tok, s_width), (t_tok, t_width) = (_tokenizer_and_width(n, cache_dir) for n in (student, teacher))
    s_vocab, t_vocab = s_tok.get_vocab(), t_tok.get_vocab()
    if s_vocab != t_vocab:
        token = next((t for t, i in sorted(s_vocab.items(), key=lambda x: x[1]) if t_vocab.get(t) != i), None)
        token = token if token is not None else next(t for t in t_vocab if t not in s_vocab)
        return (f"teacher: mode logits needs the student's vocabulary, and the tokenizers differ: the student's, "
                f"{student} ({type(s_tok).__name__}, {len(s_tok)} tokens), and the teacher's, {teacher} "
                f"({type(t_tok).__name__}, {len(t_tok)} tokens); e.g. {token!r} is id {s_vocab.get(token)} in the "
                f"student's and {t_vocab.get(token)} in the teacher's. Fix: a teacher of the student's family, or "
                "mode: traces (text: any tokenizer)")
    if s_width != t_width:
        return (f"teacher: mode logits compares distributions over the output layer: {teacher} has {t_width} rows "
                f"(config.json vocab_size) and the student {student} {s_width}, with the same tokenizer; TRL's "
                "DistillationTrainer refuses the pair once both are loaded. Fix: a teacher as wide, or mode: traces")
    return None


# ---------------------------------------------------------------------------------------------------- the traces


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    out = []
    for n, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if n < len(lines):  # only the last line can be cut by a kill
                raise RuntimeError(f"{path}:{n} is not JSON; the file was edited or corrupted") from None
    return out


def _write_jsonl(path: Path, records: list[dict], mode: str) -> None:
    with open(path, mode) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


class TraceStore:
    """A traces stage's samples in its folder: the kept traces (TRACES, one {row, question, answer, completion,
    score} a line: an sft stage can read the file as its sft_traces_path) and every sampled prompt (PROMPTS, one
    {row, question, samples, kept, scores} a line), each batch's prompts written after its traces. A prompt is done
    once its PROMPTS line is on disk; `repair` drops the traces of one that is not, so a resumed run samples each
    prompt once and keeps each of its traces once."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.traces_path, self.prompts_path = self.folder / TRACES, self.folder / PROMPTS

    def reset(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in (self.traces_path, self.prompts_path):
            path.write_text("")

    def repair(self) -> int:
        """After a kill: the torn last line of either file and the traces of prompts without their line go.
        -> the number of traces dropped (they are sampled again)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        prompts, traces = self.prompts(), self.traces()
        done = {p["row"] for p in prompts}
        kept = [t for t in traces if t["row"] in done]
        for path, records in ((self.prompts_path, prompts), (self.traces_path, kept)):
            tmp = path.with_suffix(".tmp")
            _write_jsonl(tmp, records, "w")
            os.replace(tmp, path)
        return len(traces) - len(kept)

    def prompts(self) -> list[dict]:
        return _read_jsonl(self.prompts_path)

    def traces(self) -> list[dict]:
        return _read_jsonl(self.traces_path)

    def append(self, prompts: list[dict], traces: list[dict]) -> None:
        _write_jsonl(self.traces_path, traces, "a")
        _write_jsonl(self.prompts_path, prompts, "a")


def verified(rows: dict[int, dict], texts: list[str], scores: list[float | None], k: int,
             threshold: float) -> tuple[list[dict], list[dict]]:
    """The rejection filter: of each row's k samples (in order, k a row), those the verifier scored at or above the
    threshold; an unscorable one (None) is rejected. -> (a record per prompt, a trace per kept sample)."""
    prompts, traces = [], []
    for n, (index, row) in enumerate(rows.items()):
        mine = list(zip(texts[n * k : (n + 1) * k], scores[n * k : (n + 1) * k], strict=True))
        kept = [(t, s) for t, s in mine if s is not None and s >= threshold]
        answer = None if row.get("answer") is None else str(row["answer"])
        prompts.append({"row": index, "question": row["question"], "samples": k, "kept": len(kept),
                        "scores": [s for _, s in mine]})
        traces += [{"row": index, "question": row["question"], "answer": answer, "completion": t, "score": s}
                   for t, s in kept]
    return prompts, traces


def acceptance(prompts: list[dict]) -> dict[str, float]:
    """The distill/* metrics of the sampled prompts."""
    samples, kept = sum(p["samples"] for p in prompts), sum(p["kept"] for p in prompts)
    return {"distill/prompts": len(prompts), "distill/acceptance_rate": kept / samples if samples else 0.0,
            "distill/traces_per_prompt": kept / len(prompts) if prompts else 0.0,
            "distill/prompts_without_trace": sum(p["kept"] == 0 for p in prompts)}


class LocalTeacher:
    """A teacher model in this process, sampled with transformers generate."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.eos = eos_token_ids(model, tokenizer)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos[0]

    @classmethod
    def load(cls, path: str, dtype: str | None) -> LocalTeacher:
        dtype = getattr(torch, dtype) if dtype not in (None, "auto") else dtype
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(PartialState().device).eval()
        return cls(model, AutoTokenizer.from_pretrained(path))

    @torch.no_grad()
    def sample(self, prompt_ids: list[list[int]], settings: EvalSettings) -> list[list[int]]:
        """settings.k samples of each prompt, prompt by prompt, up to the first EOS."""
        width = max(len(p) for p in prompt_ids)
        device = self.model.device
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompt_ids], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
        out = self.model.generate(input_ids=ids.repeat_interleave(settings.k, dim=0),
                                  attention_mask=mask.repeat_interleave(settings.k, dim=0),
                                  generation_config=generation_config(settings, True, self.pad, self.eos))
        return cut_at_eos(out[:, width:].tolist(), self.eos)

    def evaluate(self, rows: list[dict], correctness, fmt, settings: EvalSettings) -> list[dict]:
        return evaluate(self.model, self.tokenizer, rows, correctness, fmt, settings, self.eos)[0]

    def close(self) -> None:
        del self.model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class ServerTeacher:
    """The teacher behind an OpenAI-compatible vLLM server (`vllm serve TEACHER`): /v1/completions with the prompts'
    token ids; the samples' token ids are decoded here with the teacher's tokenizer, as in LocalTeacher."""

    def __init__(self, cfg, cache_dir: str | None):
        self.url = vllm_support.server_url(cfg.vllm_server_host, cfg.vllm_server_port, cfg.vllm_server_base_url)
        ok, why = vllm_support.poll_health(self.url + vllm_support.HEALTH_PATH, cfg.vllm_server_timeout)
        if not ok:
            raise ConfigError([f"use_vllm: no server answers at {self.url} ({why}); start one that serves the "
                               f"teacher, e.g. `vllm serve {cfg.teacher} --port {cfg.vllm_server_port}`"])
        self.served = self._post("/v1/models", None)["data"][0]["id"]
        if Path(self.served.rstrip("/")).name != Path(cfg.teacher.rstrip("/")).name:
            raise ConfigError([f"use_vllm: the server at {self.url} serves {self.served}, not the teacher "
                               f"{cfg.teacher}; serve the teacher, or set `teacher` to the served model"])
        folder, kwargs = models.tokenizer_source(cfg.teacher, cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)

    def _post(self, path: str, body: dict | None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with vllm_support.OPENER.open(request, timeout=600) as response:  # never through a proxy
            return json.loads(response.read())

    def _complete(self, prompt_ids: list[list[int]], n: int, temperature: float, settings: EvalSettings):
        body = {"model": self.served, "prompt": prompt_ids, "n": n, "temperature": temperature,
                "top_p": settings.top_p, "max_tokens": settings.max_new_tokens, "return_token_ids": True}
        choices = sorted(self._post("/v1/completions", body)["choices"], key=lambda c: c["index"])  # prompt-major
        return [c["token_ids"] for c in choices]

    def sample(self, prompt_ids: list[list[int]], settings: EvalSettings) -> list[list[int]]:
        return self._complete(prompt_ids, settings.k, settings.temperature, settings)

    def evaluate(self, rows: list[dict], correctness, fmt, settings: EvalSettings) -> list[dict]:
        records = []
        for start in range(0, len(rows), settings.batch_size):
            batch = rows[start : start + settings.batch_size]
            ids = prompt_token_ids(self.tokenizer, [r["prompt"] for r in batch], settings)
            greedy = self._complete(ids, 1, 0.0, settings)
            sampled = self._complete(ids, settings.k, settings.temperature, settings) if settings.k else []
            records += scored_records(self.tokenizer, batch, greedy, sampled, correctness, fmt, settings.k)
        return records

    def close(self) -> None:
        pass


def sample_settings(cfg, threshold: float) -> EvalSettings:
    return EvalSettings(k=cfg.teacher_samples, max_new_tokens=cfg.teacher_max_new_tokens,
                        temperature=cfg.teacher_temperature, top_p=cfg.teacher_top_p, threshold=threshold,
                        seed=cfg.seed)


def sample_traces(teacher, rows: list[dict], todo: list[int], store: TraceStore, correctness, settings: EvalSettings,
                  batch_size: int) -> None:
    """Sample the rows `todo` (indices into `rows`), `batch_size` a process at a time; after each batch the main
    process appends what the verifier kept. A batch's seed is its first row's: a run resumed after a whole batch
    samples what an uninterrupted run samples."""
    state = PartialState()
    per_call = batch_size * state.num_processes
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    kept = sampled = 0
    start_time = time.perf_counter()
    for start in range(0, len(todo), per_call):
        chunk = todo[start : start + per_call]
        mine = {i: rows[i] for i in chunk[state.process_index :: state.num_processes]}
        result = ([], [])
        if mine:
            ids = prompt_token_ids(teacher.tokenizer, [r["prompt"] for r in mine.values()], settings)
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(settings.seed + 7919 * chunk[0] + state.process_index)
                completions = teacher.sample(ids, settings)
            texts = teacher.tokenizer.batch_decode(completions, skip_special_tokens=True)
            scores = score(correctness, list(mine.values()), completions, texts, settings.k)
            result = verified(mine, texts, scores, settings.k, settings.threshold)
        parts = gather_object([result]) if state.num_processes > 1 else [result]
        prompts = sorted((p for part in parts for p in part[0]), key=lambda p: p["row"])
        traces = sorted((t for part in parts for t in part[1]), key=lambda t: t["row"])
        if state.is_main_process:
            store.append(prompts, traces)
        kept, sampled = kept + len(traces), sampled + settings.k * len(prompts)
        if state.is_main_process:
            logger.info("distill: sampled %d of %d prompts, kept %d of %d samples (%.0fs)", start + len(chunk),
                        len(todo), kept, sampled, time.perf_counter() - start_time)
    state.wait_for_everyone()


# ------------------------------------------------------------------------------------------------- the summary


def read_summary(folder: str | os.PathLike) -> dict:
    path = Path(folder) / SUMMARY
    return json.loads(path.read_text()) if path.is_file() else {}


def write_summary(folder: str | os.PathLike, summary: dict) -> None:
    if PartialState().is_main_process:
        path = Path(folder) / SUMMARY
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, path)


def all_processes(seconds: float) -> float:
    """A per-process figure summed over the run's processes (a collective: every process calls it)."""
    return sum(gather_object([seconds])) if PartialState().num_processes > 1 else seconds


def record_teacher_evaluation(teacher, run, summary: dict) -> None:
    """The teacher's held-out evaluation and its CPU seconds (all processes), into `summary`."""
    start = budget.cpu_seconds()
    summary["teacher_eval"] = teacher_evaluation(teacher, run)
    summary["teacher_eval_cpu_seconds"] = all_processes(budget.cpu_seconds() - start)


def teacher_evaluation(teacher, run) -> dict:
    """The teacher on the run's held-out rows, each process its share, as the run's evaluation scores the student."""
    state = PartialState()
    correctness, fmt = reward_roles(run.recipe, run.funcs)
    settings = EvalSettings.from_configs(run.recipe, run.training)
    rows = run.held_out.to_list()
    start = time.perf_counter()
    mine = rows[state.process_index :: state.num_processes]
    records = teacher.evaluate(mine, correctness, fmt, settings) if mine else []
    records = gather_object(records) if state.num_processes > 1 else records
    result = asdict(summarise(records, settings, fmt is not None, time.perf_counter() - start))
    logger.info("distill: the teacher's held-out evaluation: pass@1 %s in %.1fs", result["pass_at_1"],
                result["seconds"])
    return result


def evaluates(run) -> bool:
    return bool(run.recipe.eval_heldout and run.held_out is not None and len(run.held_out))


@torch.no_grad()
def nll(model, tokenizer, traces: list[dict], prompts: list) -> tuple[float, int]:
    """(summed NLL, tokens) of each trace's completion after its prompt, tokenised as SFTTrainer tokenises a
    prompt-completion conversation (the completion's tokens: those after the prompt with its generation header)."""
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for trace, prompt in zip(traces, prompts, strict=True):
            head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
            full = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": trace["completion"]}],
                                                 tokenize=True, return_dict=True)
            head, full = list(head["input_ids"]), list(full["input_ids"])
            if full[: len(head)] != head:
                raise RuntimeError("distill: the chat template does not extend a prompt by its completion; the "
                                   "student's NLL on traces cannot be measured (set nll_traces: 0)")
            ids = torch.tensor([full], device=model.device)
            logits = model(input_ids=ids).logits[0, len(head) - 1 : -1].float()
            target = ids[0, len(head):]
            total += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
            tokens += len(target)
    finally:
        model.train(was_training)
    return total, tokens


# ---------------------------------------------------------------------------------------------------- the stage


class DistillStage(Stage):
    """What both modes share: the teacher's checks and resolution, the summary, the start and end metrics."""

    name = "distill"

    def problems(self, config) -> list[str]:
        recipe, cfg = config.recipe, self.spec.training
        out = teacher_problems(cfg, self.spec.index, recipe)
        if recipe.uses_tools:
            out.append("tools: a distill stage samples and trains single completions, not tool episodes; drop the "
                       "stage or the tools")
        out += self.mode_problems(recipe, config.model, settled=not out and cfg.learning_rate > 0)
        return [self.where() + m for m in out]

    def mode_problems(self, recipe, model_args, settled: bool) -> list[str]:
        """The mode's own problems; `settled`: none found so far, so the slow checks (a server, tokenizers) run."""
        return []

    def start(self, run) -> None:
        """On the main process: a fresh stage starts its files over, a resumed one keeps them."""
        folder = Path(self.spec.training.output_dir)
        if PartialState().is_main_process:
            folder.mkdir(parents=True, exist_ok=True)
            if not run.recipe.resume:
                (folder / SUMMARY).unlink(missing_ok=True)
            if not read_summary(folder):
                write_summary(folder, {"mode": self.spec.training.mode, "teacher": self.spec.training.teacher})
        PartialState().wait_for_everyone()

    def callbacks(self, trainer, run) -> list:
        return [DistillCallback(trainer, self, run)]


class TracesStage(DistillStage, SFTStage):
    """Mode traces: the teacher's verified samples (TraceStore), then SFTStage's SFTTrainer on them."""

    def describe(self, run) -> str:
        cfg = self.spec.training
        prompts = min(cfg.teacher_prompts or len(run.train), len(run.train))
        return (f"distill (traces): {prompts} training prompts x {cfg.teacher_samples} samples of {cfg.teacher}, "
                f"kept by {reward_roles(run.recipe, run.funcs)[0].__name__}, then {cfg.max_steps} sft steps of "
                f"{cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps} traces a process at lr "
                f"{cfg.learning_rate:g}")

    def mode_problems(self, recipe, model_args, settled: bool) -> list[str]:
        cfg = self.spec.training
        out = [f"{name}: must be >= 1, got {getattr(cfg, name)}" for name in
               ("teacher_samples", "teacher_max_new_tokens", "teacher_batch_size") if getattr(cfg, name) < 1]
        if cfg.teacher_prompts is not None and cfg.teacher_prompts < 1:
            out.append(f"teacher_prompts: must be >= 1 or unset (all), got {cfg.teacher_prompts}")
        if not cfg.teacher_temperature > 0:
            out.append(f"teacher_temperature: {cfg.teacher_temperature:g}; sampling needs a temperature > 0")
        if cfg.nll_traces < 0:
            out.append(f"nll_traces: must be >= 0 (0: not measured), got {cfg.nll_traces}")
        if self.spec.last and recipe.eval_heldout and recipe.eval_max_new_tokens is None:
            out.append("eval_max_new_tokens: a run that ends with a traces distill stage has no "
                       "max_completion_length to evaluate with; set it, or eval_heldout: false")
        if cfg.use_vllm and settled:  # the server check waits: only for an otherwise sound entry
            url = vllm_support.health_url(cfg.vllm_server_host, cfg.vllm_server_port, cfg.vllm_server_base_url)
            ok, why = vllm_support.poll_health(url, cfg.vllm_server_timeout)
            if not ok:
                out.append(f"use_vllm: no teacher server answers at {url} ({why}, waited "
                           f"{cfg.vllm_server_timeout:g}s); start one, e.g. `vllm serve {cfg.teacher} --port "
                           f"{cfg.vllm_server_port}`, or set use_vllm: false")
        return out

    def data_problems(self, config, train) -> list[str]:
        # The verifier reads the training rows' columns here (the held-out rows' elsewhere).
        recipe = config.recipe
        known = registry.available(recipe.reward_dirs or ())
        return [self.where() + m for m in registry.check_specs(recipe.reward_specs, known, columns=train.column_names)]

    @property
    def store(self) -> TraceStore:
        return TraceStore(self.spec.training.output_dir)

    def make_trainer(self, run, model_path: str):
        self.start(run)
        self.sample(run)
        return super().make_trainer(run, model_path)

    def sample(self, run) -> None:
        """Sample the prompts not yet in the store (and evaluate the teacher once), then free the teacher."""
        cfg, store, state = self.spec.training, self.store, PartialState()
        if state.is_main_process:
            if not run.recipe.resume:
                store.reset()
            elif dropped := store.repair():
                logger.warning("distill: dropped %d traces of a batch a kill cut short; sampling it again", dropped)
        state.wait_for_everyone()
        rows = run.train.to_list()[: cfg.teacher_prompts]
        done = store.prompts()
        for p in done:
            if p["row"] >= len(rows) or rows[p["row"]]["question"] != p["question"]:
                raise ConfigError([f"{self.where()}resume: {store.prompts_path} has row {p['row']} sampled for "
                                   f"{p['question']!r}, which is not that training row now: the data settings "
                                   "changed. Fix: the earlier settings, or --overwrite_output_dir"])
        todo = sorted(set(range(len(rows))) - {p["row"] for p in done})
        summary = read_summary(cfg.output_dir)
        evaluate_teacher = evaluates(run) and "teacher_eval" not in summary
        if done:
            logger.info("distill: resuming: %d of %d prompts already sampled", len(done), len(rows))
        if not (todo or evaluate_teacher):
            return
        path = teacher_path(run, self.spec)
        clock, wall = budget.cpu_seconds(), time.perf_counter()
        teacher = ServerTeacher(cfg, run.recipe.model_cache_dir) if cfg.use_vllm else \
            LocalTeacher.load(path, run.model_args.dtype)
        try:
            if evaluate_teacher:
                record_teacher_evaluation(teacher, run, summary)
                write_summary(cfg.output_dir, summary)
            correctness, _ = reward_roles(run.recipe, run.funcs)
            settings = sample_settings(cfg, run.recipe.correctness_threshold)
            sample_traces(teacher, rows, todo, store, correctness, settings, cfg.teacher_batch_size)
        finally:
            teacher.close()
        # Not charged to max_cpu_minutes (training steps only); the sampling is part of distill_cpu_seconds.
        used = all_processes(budget.cpu_seconds() - clock)
        evaluation = summary.get("teacher_eval_cpu_seconds", 0.0) if evaluate_teacher else 0.0
        summary["teacher_cpu_seconds"] = summary.get("teacher_cpu_seconds", 0.0) + used
        summary["teacher_sampling_cpu_seconds"] = summary.get("teacher_sampling_cpu_seconds", 0.0) + used - evaluation
        summary["teacher_seconds"] = summary.get("teacher_seconds", 0.0) + time.perf_counter() - wall
        write_summary(cfg.output_dir, summary)

    def dataset(self, run):
        """The kept traces as SFT examples: each with its training row's prompt, exactly as the other stages see it."""
        rows = run.train.to_list()
        held_out = {question_key(q) for q in run.held_out["question"]} if run.held_out is not None else set()
        traces = self.store.traces()
        leaked = [t["question"] for t in traces if question_key(t["question"]) in held_out]
        if leaked:  # load_splits guarantees this; checked again because training on eval questions is silent otherwise
            raise RuntimeError(f"distill traces include {len(leaked)} held-out question(s), e.g. {leaked[0]!r}")
        if not traces:
            prompts = self.store.prompts()
            raise ConfigError([f"{self.where()}teacher: the verifier kept none of its "
                               f"{sum(p['samples'] for p in prompts)} samples of {len(prompts)} prompts: nothing to "
                               "train on. Fix: a stronger teacher, more teacher_samples, a longer "
                               "teacher_max_new_tokens, or mode: logits"])
        return Dataset.from_list([{"question": t["question"], "answer": t["answer"], "prompt": rows[t["row"]]["prompt"],
                                   "completion": [{"role": "assistant", "content": t["completion"]}]} for t in traces])

    def callbacks(self, trainer, run) -> list:
        alerts = [AlertCallback([TeacherAcceptance(run.recipe)])] if run.recipe.alerts else []
        return super().callbacks(trainer, run) + alerts


class LogitsStage(DistillStage):
    """Mode logits: TRL's DistillationTrainer, on-policy, with the teacher loaded by TRL."""

    before_save = SFTStage.before_save  # a LoRA adapter is merged: the next stage loads a full model folder

    def describe(self, run) -> str:
        cfg = self.spec.training
        return (f"distill (logits): {cfg.max_steps} steps of TRL's DistillationTrainer from {cfg.teacher} (on-policy, "
                f"beta {cfg.beta:g}, completions of up to {cfg.max_completion_length} tokens), {len(run.train)} train "
                "prompts")

    def mode_problems(self, recipe, model_args, settled: bool) -> list[str]:
        cfg = self.spec.training
        out = []
        if cfg.teacher_model_name_or_path:
            out.append("teacher_model_name_or_path: the distill stage's teacher is `teacher`; move the value there")
        if cfg.use_vllm and not torch.cuda.is_available():
            out.append("use_vllm: TRL's DistillationTrainer generates with vLLM on GPUs only here; set use_vllm: "
                       "false on CPU")
        n, _ = teacher_stage(cfg.teacher or "", recipe.stages, self.spec.index)
        if settled and n is None and model_args is not None:  # an earlier stage has the student's tokenizer
            problem = vocabulary_problem(model_args.model_name_or_path, cfg.teacher, recipe.model_cache_dir)
            out += [problem] if problem else []
        return out

    def make_trainer(self, run, model_path: str):
        self.start(run)
        cfg = self.spec.training
        return DistillationTrainer(model=model_path, teacher_model=teacher_path(run, self.spec), args=cfg,
                                   train_dataset=run.train, peft_config=get_peft_config(run.model_args))


def distill_stage(spec: StageSpec) -> DistillStage:
    """The stage of a distill entry, by its mode."""
    return (LogitsStage if isinstance(spec.training, DistillLogitsConfig) else TracesStage)(spec)


class DistillCallback(StepClock):
    """The distill/* metrics: at the stage's start the teacher's held-out evaluation, the traces' acceptance and the
    student's NLL on kept traces; at its end the NLL again and distill_summary.json with the student's held-out
    accuracy at the stage's start and end. Logged once: a resumed stage finds them in the summary. Its step clock
    counts the student's training steps; it is added before the held-out evaluation's callback (runner.py), so the
    evaluation at a step's end is not in it."""

    def __init__(self, trainer, stage: DistillStage, run):
        super().__init__()
        self.trainer, self.stage, self.run = trainer, stage, run
        self.folder = stage.spec.training.output_dir

    def _log(self, logs: dict) -> None:
        Trainer.log(self.trainer, logs)  # not the trainer's own log: that would flush its pending training metrics

    def _nll(self) -> float | None:
        cfg = self.stage.spec.training
        if not isinstance(self.stage, TracesStage) or not cfg.nll_traces:
            return None
        state = PartialState()
        traces = self.stage.store.traces()[: cfg.nll_traces]
        rows = self.run.train.to_list()
        mine = traces[state.process_index :: state.num_processes]
        part = nll(self.trainer.model, self.trainer.processing_class, mine, [rows[t["row"]]["prompt"] for t in mine])
        parts = gather_object([part]) if state.num_processes > 1 else [part]
        tokens = sum(n for _, n in parts)
        return sum(t for t, _ in parts) / tokens if tokens else None

    def _interrupted(self) -> bool:
        return any(isinstance(c, CheckpointCallback) and c.stopped_at is not None
                   for c in self.trainer.callback_handler.callbacks)

    def on_train_begin(self, args, state, control, **kwargs):
        summary = read_summary(self.folder)
        if "start" in summary:
            return
        if evaluates(self.run) and "teacher_eval" not in summary:  # logits: TRL loaded the teacher
            teacher = self.trainer.accelerator.unwrap_model(self.trainer.teacher_model)
            record_teacher_evaluation(LocalTeacher(teacher, self.trainer.processing_class), self.run, summary)
        logs = {}
        if "teacher_eval" in summary:
            logs["distill/teacher_pass@1"] = summary["teacher_eval"]["pass_at_1"]
            if summary["teacher_eval"]["format_rate"] is not None:
                logs["distill/teacher_format_rate"] = summary["teacher_eval"]["format_rate"]
        if isinstance(self.stage, TracesStage):
            logs.update(acceptance(self.stage.store.prompts()))
        nll_start = self._nll()
        if nll_start is not None:
            logs["distill/student_nll"] = nll_start
        summary["start"] = {k.removeprefix("distill/"): v for k, v in logs.items()}
        write_summary(self.folder, summary)
        self._log(logs)

    def on_train_end(self, args, state, control, **kwargs):
        summary = read_summary(self.folder)
        # This session's steps; a resumed stage adds its own (a process killed outright records none).
        steps = summary.get("student_train_cpu_seconds", 0.0) + all_processes(self.used_s)
        summary["student_train_cpu_seconds"] = steps
        summary["distill_cpu_seconds"] = summary.get("teacher_sampling_cpu_seconds", 0.0) + steps
        if self._interrupted():  # the resumed stage ends it; a stage the CPU budget ended is over: summed up below
            write_summary(self.folder, summary)
            return
        if state.is_world_process_zero:
            logger.info("distill: %.0f CPU-s: teacher sampling %.0f + student steps %.0f (not counted: the teacher's "
                        "held-out evaluation, %.0f, and the student's)", summary["distill_cpu_seconds"],
                        summary.get("teacher_sampling_cpu_seconds", 0.0), steps,
                        summary.get("teacher_eval_cpu_seconds", 0.0))
        nll_end = self._nll()
        if nll_end is not None:
            summary["end"] = {"student_nll": nll_end}
            self._log({"distill/student_nll": nll_end})
        evaluation = next((c for c in self.trainer.callback_handler.callbacks if isinstance(c, HeldOutEvalCallback)),
                          None)
        if evaluation is not None and evaluation.history:
            offset = self.stage.offset
            before = [h for h in evaluation.history if h["step"] <= offset]
            start, end = (before[-1] if before else None), evaluation.history[-1]
            summary["student"] = {"start": _brief(start), "end": _brief(end)}
            teacher = summary.get("teacher_eval", {}).get("pass_at_1")
            if start and teacher is not None and start["pass_at_1"] is not None and end["pass_at_1"] is not None:
                gap = teacher - start["pass_at_1"]
                summary["teacher_gain"] = gap
                summary["student_gain"] = end["pass_at_1"] - start["pass_at_1"]
                summary["share_of_teacher_gain"] = summary["student_gain"] / gap if gap > 0 else None
        write_summary(self.folder, summary)


def _brief(evaluation: dict | None) -> dict | None:
    return None if evaluation is None else {k: evaluation[k] for k in ("step", "pass_at_1", "format_rate", "rows")}


class TeacherAcceptance(Detector):
    name, title = "teacher_acceptance", "The teacher fails its own verifier"
    advice = "Few verified traces, from the prompts the teacher already solves: a stronger teacher, more " \
             "teacher_samples, a longer teacher_max_new_tokens (samples cut short fail), a prompt the teacher was " \
             "trained with, or mode: logits."

    def __init__(self, cfg, patience=1):  # logged once, when the stage's traces are all sampled
        super().__init__(cfg, patience)

    def observe(self, metrics):
        rate = _value(metrics, "distill/acceptance_rate")
        if rate is None:
            return MISSING
        if rate < self.cfg.alert_teacher_acceptance:
            return f"the verifier kept {rate:.0%} of the teacher's samples (alert below " \
                   f"{self.cfg.alert_teacher_acceptance:.0%})"
        return None
