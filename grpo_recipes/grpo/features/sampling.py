"""Sampling that keeps GRPO's groups informative (recipe `dynamic_sampling`, `curriculum`): dynamic sampling and an
online difficulty curriculum, their start-up checks, their trainer hooks, metrics (sampling/*) and alert.

A group whose completions all score alike has advantage zero: it costs a generation and teaches nothing.
- Dynamic sampling (DAPO, arXiv:2503.14476): after TRL scores a generation batch, each process replaces its
  equal groups (by `signal`: the correctness reward, or the total; `uninformative`) with groups of newly drawn
  prompts, generated and scored by TRL's own step, round after round until every slot holds a group that differs or
  `max_rounds` extra rounds are spent (the `refilled` hook). Every process decides from the gathered rewards (the
  same on all of them), and every round generates a full batch on every process, so TRL's collectives stay in step.
  Advantages are TRL's, computed in each round per group: exact for scale_rewards group/none, which the start-up
  checks require.
- Curriculum: per-question pass rates from the run's own rollouts (`PassRates`). Before generation (the
  `scoring_batch` hook), a group whose question is shelved (its pass rate at or below `low`, or at or above `high`,
  after at least one group of samples) is swapped for a drawn prompt that is not; a shelved question is let through
  with probability `recheck`, so one the model could not solve is tried again now and then.
Both draw prompts from `PromptPool`: a seeded order of the training rows per process, read by a cursor. The pool and
the pass rates are saved in every checkpoint (`SamplingState`), so a resumed run draws what a straight run draws."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from ...tasks.data import question_key
from ..alerts import MISSING, Detector, _value
from ..groups import correctness_index, equal_reward_groups
from .base import TrainerFeature

logger = logging.getLogger("grpo_recipes")

STATE_FILE = "sampling_state_{process}.json"
# Per-token tensors of TRL's scored batch and their padding (right side); prompts are padded on the left.
SIGNALS = ("correctness", "reward")  # dynamic_sampling_signal: what must differ within a kept group
RIGHT_PAD = {"completion_mask": 0, "old_per_token_logps": 0.0, "ref_per_token_logps": 0.0,
             "sampling_per_token_logps": 0.0, "tool_mask": 1, "importance_sampling_ratio": 1.0}


@dataclass(frozen=True)
class SamplingSpec:
    """What RecipeTrainer samples: RecipeArguments' dynamic_sampling* and curriculum* settings."""

    dynamic: bool = False
    max_rounds: int = 4
    signal: str = "correctness"
    curriculum: bool = False
    low: float = 0.0
    high: float = 1.0
    recheck: float = 0.1

    @classmethod
    def from_recipe(cls, recipe) -> SamplingSpec | None:
        if not (recipe.dynamic_sampling or recipe.curriculum):
            return None
        return cls(recipe.dynamic_sampling, recipe.dynamic_sampling_max_rounds, recipe.dynamic_sampling_signal,
                   recipe.curriculum, recipe.curriculum_low, recipe.curriculum_high, recipe.curriculum_recheck)


def blockers(args, per_process_rows: int, group: int) -> list[str]:
    """Why dynamic sampling or the curriculum cannot work as built in this run (none: they can)."""
    reasons = []
    if args.scale_rewards == "batch":
        reasons.append("scale_rewards batch normalises advantages over the whole batch, which a refill changes; use "
                       "group or none")
    if args.multi_objective_aggregation != "sum_then_normalize":
        reasons.append(f"multi_objective_aggregation {args.multi_objective_aggregation} normalises over the batch; "
                       "use sum_then_normalize")
    if per_process_rows % group:
        reasons.append(f"each process's generation batch ({per_process_rows} rows) must hold whole groups of "
                       f"num_generations {group}: make per_device_train_batch_size x steps_per_generation a multiple")
    return reasons


def uninformative(rewards_per_func: torch.Tensor, weights: torch.Tensor, group: int, signal: str,
                  correctness: int) -> torch.Tensor:
    """One flag per group: nothing in it for dynamic sampling to keep. `reward`: the total rewards are all equal (zero
    advantage). `correctness`: the correctness reward's are, so a group of wrong answers that differ only in format
    counts as equal: its spread teaches the format at most, and once the format is learnt it ranks wrong answers
    above a wrong one that is also badly formatted."""
    if signal == "correctness":
        rewards_per_func, weights = rewards_per_func[:, correctness:correctness + 1], weights.new_ones(1)
    return equal_reward_groups(rewards_per_func, weights, group)


@dataclass
class PassRates:
    """Solved and tried samples per question (question_key), from the gathered rewards of every generation batch."""

    solved: dict[str, int] = field(default_factory=dict)
    tried: dict[str, int] = field(default_factory=dict)

    def update(self, keys: list[str], solved: list[int], group: int) -> None:
        for key, n in zip(keys, solved, strict=True):
            self.solved[key] = self.solved.get(key, 0) + n
            self.tried[key] = self.tried.get(key, 0) + group

    def rate(self, key: str) -> float | None:
        tried = self.tried.get(key, 0)
        return self.solved.get(key, 0) / tried if tried else None


@dataclass
class PromptPool:
    """Training rows to draw from: a seeded shuffle per process and pass, read by a cursor. With `rates`, a row whose
    question is shelved is passed over, unless a draw with probability `recheck` lets it through."""

    size: int
    seed: int
    keys: list[str]  # question_key of each training row
    rates: PassRates | None = None
    low: float = 0.0
    high: float = 1.0
    recheck: float = 0.1
    min_tried: int = 1
    cursor: int = 0
    passes: int = 0
    _order: list[int] = field(default_factory=list, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)
        self._reshuffle()

    def _reshuffle(self) -> None:
        self._order = list(range(self.size))
        random.Random(f"{self.seed}:{self.passes}").shuffle(self._order)

    def shelved(self, key: str) -> str | None:
        """"hard" or "easy" for a shelved question, None for one to train on."""
        if self.rates is None or self.rates.tried.get(key, 0) < self.min_tried:
            return None
        rate = self.rates.rate(key)
        return "hard" if rate <= self.low else "easy" if rate >= self.high else None

    def lets_through(self, key: str) -> bool:
        return self.shelved(key) is None or self._rng.random() < self.recheck

    def draw(self, n: int) -> list[int]:
        """`n` row indices, in the pool's order, shelved ones passed over (at most one pass is searched for each)."""
        out: list[int] = []
        while len(out) < n:
            for _ in range(self.size):
                if self.cursor >= self.size:
                    self.cursor, self.passes = 0, self.passes + 1
                    self._reshuffle()
                index = self._order[self.cursor]
                self.cursor += 1
                if self.lets_through(self.keys[index]):
                    break
            out.append(index)  # a whole pass shelved: the last one read, rather than none
        return out

    def state_dict(self) -> dict:
        state = self._rng.getstate()
        return {"cursor": self.cursor, "passes": self.passes, "rng": [state[0], list(state[1]), state[2]]}

    def load_state_dict(self, state: dict) -> None:
        self.cursor, self.passes = state["cursor"], state["passes"]
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._reshuffle()


@dataclass
class Refill:
    """Which group of which round fills each slot of the batch, for every process (slots in the batch's order)."""

    sources: list[list[tuple[int, int]]]  # [process][slot] -> (round, gathered group index)
    needed: list[list[int]]  # [process] -> slots still holding an equal-reward group

    @classmethod
    def start(cls, equal: list[bool], processes: int) -> Refill:
        per = len(equal) // processes
        sources = [[(0, p * per + j) for j in range(per)] for p in range(processes)]
        return cls(sources, [[j for j in range(per) if equal[p * per + j]] for p in range(processes)])

    def fill(self, round_: int, equal: list[bool]) -> None:
        """Each process's slots filled, in order, from its own groups of this round whose rewards differ."""
        per = len(equal) // len(self.sources)
        for p, needed in enumerate(self.needed):
            fresh = [p * per + j for j in range(per) if not equal[p * per + j]]
            while needed and fresh:
                self.sources[p][needed.pop(0)] = (round_, fresh.pop(0))

    @property
    def unfilled(self) -> int:
        return sum(len(n) for n in self.needed)


def merge(outputs: list[dict], picks: list[tuple[int, int]], group: int, pad_id: int) -> dict:
    """This process's batch from `picks` ((round, local group index) per slot) of each round's TRL output."""
    rows = [(r, g * group + i) for r, g in picks for i in range(group)]
    first, merged = outputs[0], {}
    for key, value in first.items():
        if key == "num_items_in_batch" or not isinstance(value, torch.Tensor):
            continue
        parts = [outputs[r][key][i] for r, i in rows]
        if value.dim() == 2 and key in ("prompt_ids", "prompt_mask"):
            width = max(p.size(0) for p in parts)
            fill = pad_id if key == "prompt_ids" else 0
            merged[key] = torch.stack([torch.cat([p.new_full((width - p.size(0),), fill), p]) for p in parts])
        elif value.dim() == 2 and value.size(1) == first["completion_ids"].size(1) or key == "completion_ids":
            width = max(p.size(0) for p in parts)
            fill = pad_id if key == "completion_ids" else RIGHT_PAD.get(key, 0)
            merged[key] = torch.stack([torch.cat([p, p.new_full((width - p.size(0),), fill)]) for p in parts])
        else:
            merged[key] = torch.stack(parts)
    for key, value in first.items():  # lists of rows, in TRL's output of other versions: picked the same way
        if isinstance(value, list) and len(value) == len(first["advantages"]):
            merged[key] = [outputs[r][key][i] for r, i in rows]
    return merged


def merge_gathered(tensors: list[torch.Tensor | None], refill: Refill, group: int) -> torch.Tensor | None:
    """A gathered (all processes') per-row tensor of the merged batch, from each round's gathered tensor."""
    if tensors[0] is None:
        return None
    rows = [tensors[r][g * group:(g + 1) * group] for slots in refill.sources for r, g in slots]
    return torch.cat(rows)


def merge_table(tables: list[dict], refill: Refill, group: int) -> dict:
    """The completions table of the merged batch (every process's rows), from each round's table."""

    def pick(column: str, name: str | None = None) -> list:
        out = []
        for slots in refill.sources:
            for r, g in slots:
                values = tables[r][column] if name is None else tables[r][column].get(name)
                out += values[g * group:(g + 1) * group] if values is not None else [None] * group
        return out

    names = {part: sorted({n for t in tables for n in t[part]}) for part in ("rewards", "extra")}
    return {"prompt": pick("prompt"), "completion": pick("completion"), "advantages": pick("advantages"),
            **{part: {n: pick(part, n) for n in names[part]} for part in names}}


# ------------------------------------------------------------------------------------------- saved with the run


class SamplingState(TrainerCallback):
    """Saves the pool's place and the pass rates in every checkpoint (one file per process), and takes them back when
    a run resumes from one, so that a resumed run draws the prompts a straight run draws."""

    def __init__(self, pool: PromptPool, rates: PassRates | None, process: int):
        self.pool, self.rates, self.process = pool, rates, process

    def _path(self, args, step: int) -> Path:
        return Path(args.output_dir) / f"checkpoint-{step}" / STATE_FILE.format(process=self.process)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            return
        path = self._path(args, state.global_step)
        if not path.is_file():
            logger.warning("sampling: no %s in the checkpoint resumed from; the pool and pass rates start afresh",
                           path.name)
            return
        saved = json.loads(path.read_text())
        self.pool.load_state_dict(saved["pool"])
        if self.rates is not None:
            self.rates.solved, self.rates.tried = saved["rates"]["solved"], saved["rates"]["tried"]

    def on_save(self, args, state, control, **kwargs):
        # Before checkpoint.CheckpointCallback.on_save (added later) marks the checkpoint complete.
        path = self._path(args, state.global_step)
        rates = {"solved": self.rates.solved, "tried": self.rates.tried} if self.rates is not None else None
        path.write_text(json.dumps({"pool": self.pool.state_dict(), "rates": rates}))


def row_keys(dataset) -> list[str]:
    return [question_key(q) for q in dataset["question"]]


class Sampling(TrainerFeature):
    reads_rewards = True

    def __init__(self, spec: SamplingSpec, correctness: tuple[int, float] = (0, 1.0)):
        self.spec = spec
        self.correctness, self.threshold = correctness  # which reward, at what score, means solved
        self._rates: PassRates | None = None
        self._pool: PromptPool | None = None

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        spec = SamplingSpec.from_recipe(recipe)
        if spec is None:
            return None
        return cls(spec, (correctness_index(reward_names, recipe.correctness_reward), recipe.correctness_threshold))

    @classmethod
    def detectors(cls, recipe) -> list[Detector]:
        return [BatchNotFilled(recipe)] if recipe.dynamic_sampling else []

    @classmethod
    def problems(cls, recipe, args) -> list[str]:
        """The sampling settings, checked at start-up (GRPOStage.problems) with the fix for each."""
        if not (recipe.dynamic_sampling or recipe.curriculum):
            return []
        reasons = []
        if recipe.dynamic_sampling and recipe.dynamic_sampling_signal not in SIGNALS:
            reasons.append(f"dynamic_sampling_signal: {recipe.dynamic_sampling_signal!r}; one of "
                           f"{', '.join(SIGNALS)}")
        if recipe.dynamic_sampling and recipe.dynamic_sampling_max_rounds < 1:
            reasons.append(f"dynamic_sampling_max_rounds: {recipe.dynamic_sampling_max_rounds}; at least 1 extra "
                           "round, or dynamic_sampling: false")
        if recipe.curriculum and not 0 <= recipe.curriculum_low < recipe.curriculum_high <= 1:
            reasons.append(f"curriculum_low, curriculum_high: {recipe.curriculum_low:g}, {recipe.curriculum_high:g};"
                           " pass rates with 0 <= low < high <= 1 (0 and 1: shelve the never and the always solved)")
        if recipe.curriculum and not 0 <= recipe.curriculum_recheck <= 1:
            reasons.append(f"curriculum_recheck: {recipe.curriculum_recheck:g}; a probability between 0 and 1")
        what = "dynamic_sampling" if recipe.dynamic_sampling else "curriculum"
        rows = args.per_device_train_batch_size * args.steps_per_generation
        return reasons + [f"{what}: {b}" for b in blockers(args, rows, args.num_generations)]

    def attach(self, trainer) -> bool:
        spec = self.spec
        self._rates = PassRates() if spec.curriculum else None
        # Each process draws its own prompts (its own seed); a resumed run takes the pool's place back.
        process = trainer.accelerator.process_index
        self._pool = PromptPool(len(trainer.train_dataset), trainer.args.seed * 1009 + process,
                                row_keys(trainer.train_dataset), self._rates, spec.low, spec.high,
                                spec.recheck, min_tried=trainer.num_generations)
        trainer.add_callback(SamplingState(self._pool, self._rates, process))
        return True

    def scoring_batch(self, trainer, inputs) -> None:
        if self.spec.curriculum and trainer.model.training:
            self._swap_shelved(trainer, inputs)

    def _swap_shelved(self, trainer, inputs: list[dict]) -> None:
        """The curriculum: a group whose question is shelved gives its place to a drawn prompt (in place: TRL
        generates for this list)."""
        group, swapped = trainer.num_generations, 0
        for start in range(0, len(inputs), group):
            if not self._pool.lets_through(question_key(inputs[start]["question"])):
                row = trainer.train_dataset[self._pool.draw(1)[0]]
                inputs[start:start + group] = [dict(row) for _ in range(group)]
                swapped += 1
        trainer.metrics("train")["sampling/frac_groups_swapped"].append(swapped * group / len(inputs))

    def _observe(self, trainer, inputs: list[dict], rewards: torch.Tensor) -> None:
        """The curriculum's pass rates, from a scored round: every process's groups (gathered), the same table on
        every process."""
        group = trainer.num_generations
        keys = [question_key(inputs[i]["question"]) for i in range(0, len(inputs), group)]
        if trainer.accelerator.num_processes > 1:
            keys = gather_object(keys)
        solved = (rewards[:, self.correctness] >= self.threshold).view(-1, group).sum(dim=1).tolist()
        self._rates.update(keys, [int(n) for n in solved], group)

    def _equal(self, trainer, rewards: torch.Tensor) -> list[bool]:
        return uninformative(rewards, trainer.reward_weights, trainer.num_generations, self.spec.signal,
                             self.correctness).tolist()

    def refilled(self, trainer, inputs, output: dict) -> dict:
        if not trainer.model.training:
            return output
        group, processes = trainer.num_generations, trainer.accelerator.num_processes
        first, first_lengths = trainer.captured_rewards()
        rewards, lengths = [first], [first_lengths]
        if self._rates is not None:
            self._observe(trainer, inputs, rewards[0])
        if not self.spec.dynamic:
            return output
        per = len(inputs) // group
        equal = self._equal(trainer, rewards[0])
        refill, outputs, tables, rounds = Refill.start(equal, processes), [output], [trainer.completion_rows()], 0
        while refill.unfilled and rounds < self.spec.max_rounds:
            rounds += 1
            rows = [dict(trainer.train_dataset[i]) for i in self._pool.draw(per) for _ in range(group)]
            outputs.append(trainer.generate_and_score(rows))
            tables.append(trainer.completion_rows())
            round_rewards, round_lengths = trainer.captured_rewards()
            rewards.append(round_rewards)
            lengths.append(round_lengths)
            if self._rates is not None:
                self._observe(trainer, rows, rewards[-1])
            refill.fill(rounds, self._equal(trainer, rewards[-1]))
        process = trainer.accelerator.process_index
        mine = [(r, g - process * per) for r, g in refill.sources[process]]
        merged = merge(outputs, mine, group, trainer.processing_class.pad_token_id)
        merged["num_items_in_batch"] = trainer.loss_mask_count(merged)
        trainer.keep_rewards(merge_gathered(rewards, refill, group), merge_gathered(lengths, refill, group))
        if trainer.log_completions:  # the table shows the batch trained on, not the last round's
            trainer.set_completion_rows(merge_table(tables, refill, group))
        train = trainer.metrics("train")
        train["sampling/rounds"].append(float(rounds))
        train["sampling/prompts_drawn"].append(float(rounds * per * processes))
        train["sampling/groups_discarded"].append(float(rounds * per * processes))
        train["sampling/frac_equal_groups_sampled"].append(sum(equal) / len(equal))
        train["sampling/groups_unfilled"].append(float(refill.unfilled))
        return merged


class BatchNotFilled(Detector):
    name, title = "batch_not_filled", "Dynamic sampling could not fill the batch"
    advice = "Groups of equal rewards were trained on after dynamic_sampling_max_rounds extra rounds: most prompts " \
             "are too hard or too easy for the model now. Raise dynamic_sampling_max_rounds or num_generations, " \
             "add a curriculum (curriculum: true), or change the data difficulty."

    def __init__(self, cfg, patience=1):  # each unfilled batch is the event
        super().__init__(cfg, patience)

    def observe(self, metrics):
        left = _value(metrics, "sampling/groups_unfilled")
        if left is None:
            return MISSING
        return f"{left:g} groups a step left with equal rewards after the refill rounds" if left > 0 else None
