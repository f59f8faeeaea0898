"""Recipe configuration dataclasses: RecipeArguments (what a recipe trains on, in which stages, and how it is
scored), SFTStageConfig (TRL's SFTConfig plus what an `sft` stage trains on) and the `distill` stage's configs
(DistillTracesConfig, DistillLogitsConfig: TRL's SFTConfig or DistillationConfig, plus DistillSettings). Dataclasses
only: reading YAML and flags into them is parsing.py's job, checking their values together is checks.py's, building
each stage's config is stages.py's.

A recipe's YAML is flat, as in TRL: every key is a field of RecipeArguments, of the last stage's training config
(GRPOConfig, SFTStageConfig for a run whose last stage is `sft`, a distill config by its `mode`) or of ModelConfig.
`rewards:` is a list of {name, weight, params}; `stages:` a list of {name, ...settings of that stage's trainer}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trl import DistillationConfig, GRPOConfig, SFTConfig

from ..rewards.registry import RewardSpec

SFT_FORMATS = ("demonstration", "boxed", "think_boxed", "tool_trajectory")


@dataclass
class TaskArguments:
    """What the model is asked: the task, its data source and split, the prompt (grpo_recipes/tasks/,
    docs/tasks.md)."""

    task: str | None = field(
        default=None,
        metadata={"help": "A task by name (tasks/*.py, `task_dirs`; docs/tasks.md): its data source, prompt, "
                          "demonstrations, rewards and held-out set, as defaults the config's own keys override. "
                          "Unset: the data settings below alone."},
    )
    task_dirs: list[str] | None = field(
        default=None, metadata={"help": "Extra folders of task files, searched before ./tasks and the shipped ones."}
    )
    dataset_source: str = field(
        default="reasoning_gym",
        metadata={"help": "Where prompts come from: `reasoning_gym` (procedural), `hub` (a Hub dataset) or `file`."},
    )
    gym_task: str = field(default="basic_arithmetic", metadata={"help": "reasoning-gym task name (dataset_source=reasoning_gym)."})
    gym_params: dict | str | None = field(
        default=None, metadata={"help": "reasoning-gym task parameters, e.g. {min_terms: 2, max_terms: 2}."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset id (dataset_source=hub)."})
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    dataset_split: str = field(default="train", metadata={"help": "Split that training rows come from."})
    eval_split: str | None = field(
        default=None,
        metadata={"help": "Split for held-out rows (hub). Unset: held-out rows are carved out of dataset_split."},
    )
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local .jsonl/.json/.parquet/.csv file (dataset_source=file)."}
    )
    eval_path: str | None = field(
        default=None, metadata={"help": "Separate local file of held-out rows (dataset_source=file)."}
    )
    question_field: str = field(default="question", metadata={"help": "Column holding the question text."})
    answer_field: str | None = field(
        default="answer", metadata={"help": "Column holding the gold answer; copied to the `answer` column."}
    )
    answer_regex: str | None = field(
        default=None, metadata={"help": "Regex whose group 1 extracts the gold answer (GSM8K: '#### (.*)$')."}
    )
    train_size: int = field(default=1000, metadata={"help": "At most this many training rows."})
    eval_size: int = field(default=100, metadata={"help": "Held-out rows, disjoint from training by question text."})
    split_seed: int = field(default=0, metadata={"help": "Seed for procedural generation and the train/eval split."})
    gold_check_tool: str | None = field(
        default=None,
        metadata={"help": "Drop rows whose gold answer this tool disagrees with: the tool is called with the row's "
                          "`expression` (reasoning-gym: from its metadata). reasoning-gym floors some divisions, so a "
                          "correct calculator answer would score 0 there. The number dropped is logged. Read by the "
                          "task that knows its rows' expressions (task: arithmetic)."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message. null: the chat template's own (SmolLM2's default names the model, 16 "
                          "tokens); \"\" sends an empty one."},
    )
    prompt_template: str = field(
        default="{question}", metadata={"help": "User message; `{column}` placeholders are filled from the row."}
    )
    few_shot: list | str | None = field(
        default=None,
        metadata={"help": "Worked examples, as earlier chat turns before each question: a list of {question, "
                          "completion}; the user turn is prompt_template filled from the example. An example's "
                          "question must not be a held-out question."},
    )

    def __post_init__(self) -> None:
        self.gym_params = _json_field("gym_params", self.gym_params, dict) or {}
        self.few_shot = _json_field("few_shot", self.few_shot, list) or []
        for i, ex in enumerate(self.few_shot):
            if not (isinstance(ex, dict) and isinstance(ex.get("question"), str) and isinstance(ex.get("completion"), str)):
                raise ValueError(f"few_shot[{i}]: expected a mapping with string `question` and `completion`, got {ex!r}")
        if isinstance(self.task_dirs, str):
            self.task_dirs = [self.task_dirs]
        _next_post_init(self, TaskArguments)


@dataclass
class RewardArguments:
    """How completions are scored: the rewards, which one says solved, which one is the format's, and when a failing
    reward stops the run (grpo_recipes/rewards/, docs/rewards.md)."""

    rewards: list | str | None = field(
        default=None, metadata={"help": "Rewards: list of {name, weight, params}; see `grpo-recipes rewards list`."}
    )
    reward_dirs: list[str] | None = field(
        default=None, metadata={"help": "Extra folders of reward files, searched before ./rewards and the shipped ones."}
    )
    correctness_reward: str | None = field(
        default=None,
        metadata={"help": "Reward that says a completion is solved (diag/solve_*, pass@k, held-out eval). Default: the first reward."},
    )
    correctness_threshold: float = field(
        default=1.0, metadata={"help": "A completion counts as solved when its correctness reward is at least this."}
    )
    format_reward: str | None = field(
        default=None,
        metadata={"help": "Format reward: eval/format_rate, and the one the format-hacking alert watches "
                          "(unset: the one configured reward registered with role='format', if exactly one; otherwise no "
                          "format rate, and the alert watches every reward but the correctness one)."},
    )
    max_reward_failure_rate: float = field(
        default=0.1,
        metadata={"help": "Stop the run when a reward raises on more than this share of the last "
                          "reward_failure_window completions (1: never stop)."},
    )
    reward_failure_window: int = field(
        default=64, metadata={"help": "Completions over which each reward's failure rate is measured."}
    )

    def __post_init__(self) -> None:
        self.reward_specs = reward_specs(self.rewards)
        if isinstance(self.reward_dirs, str):
            self.reward_dirs = [self.reward_dirs]
        _next_post_init(self, RewardArguments)


@dataclass
class EvalArguments:
    """The held-out evaluation at the run's start, at each stage's end and every eval_every_steps
    (grpo_recipes/evaluation/)."""

    eval_heldout: bool = field(
        default=True, metadata={"help": "Evaluate on the held-out split at train start, every eval_every_steps and at the end."}
    )
    eval_every_steps: int = field(
        default=0, metadata={"help": "Held-out evaluation every N optimiser steps; 0: only at train start and end."}
    )
    eval_k: int = field(
        default=4,
        metadata={"help": "Held-out samples per prompt (training temperature) for eval/pass@k; 0: greedy pass@1 only "
                          "(a fifth of the cost). Also the k of diag/pass@k (0 there: num_generations)."},
    )
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Completion length limit for held-out evaluation (default max_completion_length)."}
    )
    eval_generation_batch_size: int = field(
        default=16, metadata={"help": "Held-out prompts per generate call: the greedy pass and each of the eval_k "
                                      "sampling passes (one sample per prompt each) hold this many rows, which bounds "
                                      "the evaluation's memory."}
    )


@dataclass
class FeatureArguments:
    """The GRPO trainer's features, each one file of grpo_recipes/grpo/features/ (its checks, hooks, metrics and
    alerts)."""

    diagnostics: bool = field(default=True, metadata={"help": "Log diag/* metrics for every generation batch."})
    skip_zero_advantage_batches: bool = field(
        default=False,
        metadata={"help": "Skip the forward and backward of a training micro-batch whose rows all come from groups "
                          "whose completions scored alike: their advantage is zero (up to TRL's float rounding), so "
                          "with beta 0 they carry no gradient. Pair it with per_device_train_batch_size 1 so each "
                          "such row skips on its own. Exact only with beta 0, no entropy bonus, "
                          "multi_objective_aggregation sum_then_normalize, no MoE router loss, and one process: "
                          "otherwise it is off, and the start-up log says why."},
    )
    share_prompt_forward: bool = field(
        default=False,
        metadata={"help": "In the loss, run each group's prompt forward and backward once for all of its "
                          "completions instead of once per row (grpo_recipes/grpo/prompt_sharing.py): the same loss and "
                          "gradient up to float rounding, for a fraction of the compute when prompts are long "
                          "against completions. Needs per_device_train_batch_size 1, one process, no activation "
                          "checkpointing and a plain full-attention model: otherwise it is off, and the start-up log "
                          "says why."},
    )
    share_prompt_prefill: bool = field(
        default=False,
        metadata={"help": "In generation (transformers, not vLLM, whose prefix caching does this), prefill each "
                          "distinct prompt once for all of its completions, and the batch's common prefix once "
                          "(grpo_recipes/grpo/prefill.py): generate()'s tokens up to float rounding, for less compute when "
                          "prompts are long against completions. Generation then uses a dynamic cache "
                          "(cache_implementation is ignored). Off where it cannot work, and the start-up log says "
                          "why."},
    )
    demonstration_field: str | None = field(
        default=None,
        metadata={"help": "A training-row column holding a correct completion (`worked_solution`: the arithmetic "
                          "task builds it for each row from its expression, "
                          "`-(5 + 2) = -(7) = -7. \\boxed{-7}`). A group that none of its sampled completions "
                          "solves (correctness_reward at correctness_threshold) gets the demonstration in place of "
                          "its last completion, so a question the policy never solves still teaches (off-policy "
                          "guidance, as in LUFFY, arXiv:2504.14945). rewards/*, reward and diag/* stay the policy's "
                          "own samples'; the trained batch's means are demonstrations/*, the completions table marks "
                          "the demonstrations. Each sampled completion is scored twice. Not with tools or dynamic "
                          "sampling; demonstrate_unsolved_groups: false keeps GRPO on-policy."},
    )
    demonstrate_unsolved_groups: bool = field(
        default=True,
        metadata={"help": "With demonstration_field: put the demonstration in place of a completion in every group "
                          "none of whose completions solves its question (above). False keeps GRPO on-policy and "
                          "leaves the column to an sft stage (`stages`)."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "After each generation batch is scored, replace its groups whose completions all scored "
                          "alike (zero advantage) with groups of newly drawn prompts, generated and scored the same "
                          "way, until every group's rewards differ or dynamic_sampling_max_rounds extra rounds are "
                          "spent (DAPO's dynamic sampling). Logged as sampling/*; an alert when a batch stays "
                          "unfilled. Needs scale_rewards group or none."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=4, metadata={"help": "Extra generation rounds a step may spend refilling (each a full generation "
                                     "batch on every process)."}
    )
    dynamic_sampling_signal: str = field(
        default="correctness",
        metadata={"help": "What must differ within a group for dynamic sampling to keep it: `correctness`, the "
                          "correctness reward alone (correctness_reward, else the first reward; DAPO keeps groups "
                          "whose accuracy is neither 0 nor 1), so a group of wrong answers that differ only in format "
                          "is replaced; `reward`, the weighted total."},
    )
    curriculum: bool = field(
        default=False,
        metadata={"help": "Keep each training question's pass rate from the run's own rollouts (saved in "
                          "checkpoints), and give a group's place to another prompt when its question's pass rate is "
                          "at or below curriculum_low or at or above curriculum_high (shelved), except with "
                          "probability curriculum_recheck."},
    )
    curriculum_low: float = field(default=0.0, metadata={"help": "Curriculum: shelved as too hard at or below this "
                                                                  "pass rate."})
    curriculum_high: float = field(default=1.0, metadata={"help": "Curriculum: shelved as too easy at or above this "
                                                                   "pass rate."})
    curriculum_recheck: float = field(
        default=0.1, metadata={"help": "Curriculum: the chance that a shelved question is trained on anyway, so one "
                                       "the model could not solve is tried again now and then."}
    )


@dataclass
class ToolArguments:
    """Tool calls in multi-turn rollouts (grpo_recipes/tools/, docs/agent.md)."""

    tools: list | str | None = field(
        default=None,
        metadata={"help": "Tools the model may call: a list of {name, params} (or names); see tools/*.py. Turns on "
                          "multi-turn tool rollouts (GRPOConfig.max_tool_calling_iterations bounds the rounds)."},
    )
    environment: dict | str | None = field(
        default=None,
        metadata={"help": "An environment class ({name, params}), one instance per rollout: its public methods are "
                          "tools, reset(**row) starts an episode (TRL environment_factory)."},
    )
    tool_dirs: list[str] | None = field(
        default=None, metadata={"help": "Extra folders of tool files, searched before ./tools and the shipped ones."}
    )
    tool_template: str = field(
        default="model",
        metadata={"help": "Chat template for tool calls: `model` (the model's own; TRL must know how to parse it) or "
                          "`chatml_tools` (ChatML models without tool support, such as SmolLM2)."},
    )

    def __post_init__(self) -> None:
        self.tools = _json_field("tools", self.tools, list) or []
        if isinstance(self.environment, str) and self.environment.lstrip().startswith("{"):
            self.environment = _json_field("environment", self.environment, dict)
        if isinstance(self.tool_dirs, str):
            self.tool_dirs = [self.tool_dirs]
        _next_post_init(self, ToolArguments)

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools or self.environment)


@dataclass
class RunArguments:
    """The run as a whole: its stages, the model's local copy, the CPU budget, resume, Trackio (grpo_recipes/run/,
    state/; docs/reliability.md)."""

    stages: list | str | None = field(
        default=None,
        metadata={"help": "The run's stages, in order, each by TRL's own trainer: a list of {name, ...} with name "
                          "`sft` (SFTTrainer on demonstration_field, sft_traces_path or sft_format targets), "
                          "`distill` (a teacher's verified traces or its logits: docs/distillation.md) or `grpo`. "
                          "The flat keys configure the last stage; an earlier stage takes the flat training "
                          "settings its config shares (seed, logging, saving, precision; not the learning rate, "
                          "schedule, batch size or steps) and its entry sets the rest, e.g. "
                          "[{name: sft, max_steps: 24, learning_rate: 3e-5}, {name: grpo}]. Unset: [{name: grpo}]."},
    )
    model_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where the offline default model is converted to (default $GRPO_RECIPES_CACHE or ~/.cache)."},
    )
    peft_learning_rate: float | None = field(
        default=1.0e-4,
        metadata={"help": "Learning rate used instead of learning_rate when use_peft is true (LoRA adapters want "
                          "~10x a full fine-tune's); null keeps learning_rate."},
    )
    max_cpu_minutes: float | None = field(
        default=None,
        metadata={"help": "Stop training after this much CPU time spent in training steps (for fixed-budget "
                          "comparisons; held-out evaluation and checkpointing are not charged); the final save "
                          "and evaluation still run."},
    )
    resume: bool = field(
        default=False,
        metadata={"help": "Continue from the latest complete checkpoint in output_dir, same Trackio run "
                          "(from step 0 if there is none)."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Discard the checkpoints (and this run's Trackio metrics) an earlier run left in output_dir."},
    )
    trackio_dir: str | None = field(
        default=None, metadata={"help": "Local Trackio storage folder (default $TRACKIO_DIR or ~/.cache/huggingface/trackio)."}
    )
    trackio_group: str | None = field(
        default=None,
        metadata={"help": "Trackio run group, e.g. one sweep: the dashboard shows, hides and compares a group's runs "
                  "together. Needs report_to: trackio."},
    )

    def __post_init__(self) -> None:
        self.stages = _json_field("stages", self.stages, list) or [{"name": "grpo"}]
        for i, entry in enumerate(self.stages):
            if isinstance(entry, str):
                self.stages[i] = entry = {"name": entry}
            if not (isinstance(entry, dict) and entry.get("name") in STAGE_CONFIGS):
                raise ValueError(f"stages[{i}]: expected a mapping with `name` one of {', '.join(STAGE_CONFIGS)}, "
                                 f"got {entry!r}")
        _next_post_init(self, RunArguments)


@dataclass
class AlertArguments:
    """The alerts on failure patterns and their thresholds (grpo_recipes/grpo/alerts.py; docs/reading_curves.md says
    what each one means)."""

    alerts: bool = field(default=True, metadata={"help": "Raise alerts (log warning + Trackio alert) on failure patterns."})
    alert_patience: int = field(default=5, metadata={"help": "Alerts: consecutive bad logs before a sustained-failure alert."})
    alert_baseline_steps: int = field(
        default=3, metadata={"help": "Alerts: the first N logged values of a metric set its baseline."}
    )
    alert_entropy_floor: float = field(
        default=0.03, metadata={"help": "Alerts: entropy collapse when per-token entropy falls below this (nats)."}
    )
    alert_entropy_collapse_frac: float = field(
        default=0.1, metadata={"help": "Alerts: entropy collapse also when entropy falls below this share of its baseline."}
    )
    alert_entropy_blowup_factor: float = field(
        default=3.0, metadata={"help": "Alerts: entropy blow-up when entropy exceeds this multiple of max(baseline, 0.5)."}
    )
    alert_zero_std_frac: float = field(
        default=0.9, metadata={"help": "Alerts: no learning signal when the share of groups with equal rewards "
                                        "(diag/frac_equal_groups; TRL's frac_reward_zero_std without diagnostics) "
                                        "stays at or above this."}
    )
    alert_format_saturation: float = field(
        default=0.9, metadata={"help": "Alerts: a format reward mean at or above this counts as saturated."}
    )
    alert_correctness_gain: float = field(
        default=0.05, metadata={"help": "Alerts: format hacking when correctness has gained less than this over its baseline."}
    )
    alert_train_rise: float = field(
        default=0.05, metadata={"help": "Alerts: train reward counts as rising when up this much over its baseline."}
    )
    alert_eval_drop: float = field(
        default=0.1, metadata={"help": "Alerts: held-out pass@1 counts as falling when this far below its best."}
    )
    alert_length_collapse_frac: float = field(
        default=0.3, metadata={"help": "Alerts: length collapse when mean completion length < this share of its baseline."}
    )
    alert_clipped_ratio: float = field(
        default=0.5, metadata={"help": "Alerts: completions hit the length limit when clipped_ratio stays at or above this."}
    )
    alert_clip_ratio_min: float = field(
        default=0.05, metadata={"help": "Alerts: a clip_ratio/region_mean below this is never a spike."}
    )
    alert_clip_spike_factor: float = field(
        default=5.0, metadata={"help": "Alerts: clip-ratio spike when region_mean exceeds this multiple of its recent median."}
    )
    alert_tools_abandoned_frac: float = field(
        default=0.5, metadata={"help": "Alerts: tools abandoned when tools/call_rate falls below this share of its "
                                       "baseline (and below 0.05 absolute at least)."}
    )
    alert_tool_result_used_min: float = field(
        default=0.3, metadata={"help": "Alerts: tool results ignored when a fifth or more of episodes call a tool but fewer "
                                       "than this share of those answer with a tool's result."}
    )
    alert_teacher_acceptance: float = field(
        default=0.2, metadata={"help": "Alerts: a distill stage's teacher is too weak for its traces when the verifier "
                                       "keeps less than this share of its samples (distill/acceptance_rate)."}
    )


@dataclass
class RecipeArguments(AlertArguments, RunArguments, ToolArguments, FeatureArguments, EvalArguments, RewardArguments,
                      TaskArguments):
    """What a recipe trains on and how it is scored, by concern (the base classes, in `--help`'s order: task,
    rewards, evaluation, GRPO features, tools, the run, alerts). GRPO/optimiser settings live in GRPOConfig. A YAML
    config and the flags stay flat: every key is one field."""



def _next_post_init(obj, cls: type) -> None:
    """The next concern's normalisation, in RecipeArguments' order (each concern normalises its own fields)."""
    nxt = getattr(super(cls, obj), "__post_init__", None)
    if nxt is not None:
        nxt()


def reward_specs(rewards: Any) -> list[RewardSpec]:
    """A `rewards` value (a list, or its JSON on the command line) -> its entries; ValueError naming a bad one."""
    return [RewardSpec.parse(e, i) for i, e in enumerate(_json_field("rewards", rewards, list) or [])]


def _json_field(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: could not read {value!r} as JSON ({exc}); on the command line pass JSON") from exc
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{name}: expected a {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


@dataclass
class SFTStageConfig(SFTConfig):
    """SFTConfig plus what an `sft` stage trains on (grpo_recipes/stages/sft.py, docs/sft.md)."""

    sft_format: str = field(
        default="demonstration",
        metadata={"help": "Target of each training row: `demonstration` (the row's demonstration_field column), "
                          "`boxed` (a reasoning line, then \\boxed{answer}), `think_boxed` (the line inside "
                          "<think>...</think>, then \\boxed{answer}) or `tool_trajectory` (a call to the first "
                          "configured tool with the row's expression, its real result, then \\boxed{answer}; needs "
                          "`tools`). Ignored with sft_traces_path."},
    )
    sft_traces_path: str | None = field(
        default=None,
        metadata={"help": "JSONL of distilled traces ({question, completion} per line) to train on instead of "
                          "the rows' targets; held-out questions are dropped."},
    )


_MODE_HELP = ("`traces`: the teacher samples completions of the training prompts, the run's verifier "
              "(correctness_reward at correctness_threshold) keeps the correct ones, and the student is fine-tuned on "
              "them by TRL's SFTTrainer. `logits`: TRL's DistillationTrainer, the student matching the teacher's "
              "next-token distribution on its own samples; the teacher must share the student's vocabulary.")


@dataclass
class DistillSettings:
    """What a `distill` stage adds to its mode's TRL config, in both modes (grpo_recipes/stages/distill.py,
    docs/distillation.md)."""

    mode: str = field(
        default="traces",
        metadata={"help": _MODE_HELP},
    )
    teacher: str | None = field(
        default=None,
        metadata={"help": "The teacher: a model folder (relative to where you run, like output_dir), a Hub id, or "
                          "an earlier stage's output, `stage:N` (N its 0-based place in `stages`) or `stage:NAME`."},
    )


@dataclass
class DistillTracesConfig(DistillSettings, SFTConfig):
    """A `distill` stage in mode traces: TRL's SFTConfig (the student's supervised steps on the kept traces) plus how
    the teacher samples them."""

    teacher_samples: int = field(default=4, metadata={"help": "Completions the teacher samples per training prompt."})
    teacher_prompts: int | None = field(
        default=None,
        metadata={"help": "At most this many training prompts (the first in the training order) are sampled; unset: "
                          "all of them."},
    )
    teacher_temperature: float = field(
        default=0.7, metadata={"help": "The teacher's sampling temperature (open-r1 sampled DeepSeek-R1 at 0.6)."}
    )
    teacher_top_p: float = field(default=1.0, metadata={"help": "The teacher's top-p."})
    teacher_max_new_tokens: int = field(
        default=256, metadata={"help": "Length limit of each teacher sample, in tokens; a sample cut there is kept "
                                       "only when the verifier accepts it as it is."}
    )
    teacher_batch_size: int = field(
        default=16, metadata={"help": "Prompts per teacher generate call, in each process (x teacher_samples "
                                      "sequences); also how often the traces are written."}
    )
    use_vllm: bool = field(
        default=False,
        metadata={"help": "Sample the teacher through an OpenAI-compatible vLLM server that already serves it (e.g. "
                          "`vllm serve TEACHER`), at vllm_server_base_url or vllm_server_host:vllm_server_port, "
                          "instead of transformers generate in each process. Not with a `stage:` teacher."},
    )
    vllm_server_base_url: str | None = field(
        default=None, metadata={"help": "With use_vllm: the teacher server's URL (wins over host and port)."}
    )
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "With use_vllm: the teacher server's host."})
    vllm_server_port: int = field(default=8000, metadata={"help": "With use_vllm: the teacher server's port."})
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "With use_vllm: seconds to wait at start-up for the teacher server."}
    )
    nll_traces: int = field(
        default=64, metadata={"help": "Kept traces on which the student's mean token NLL is measured at the stage's "
                                      "start and end (distill/student_nll); 0: not measured."}
    )


@dataclass
class DistillLogitsConfig(DistillSettings, DistillationConfig):
    """A `distill` stage in mode logits: TRL's DistillationConfig (on-policy generalized JSD, `beta`; the student's
    samples: max_completion_length, temperature, use_vllm) plus the teacher. TRL's own
    teacher_model_name_or_path is replaced by `teacher`."""

    mode: str = field(default="logits", metadata={"help": _MODE_HELP})


# The stage names, each with its trainer's config (the one list of them; grpo_recipes/stages/ has a kind for each). A
# distill stage's config is its mode's: TRL's SFTConfig for traces, DistillationConfig for logits.
STAGE_CONFIGS: dict[str, type] = {"sft": SFTStageConfig, "distill": DistillTracesConfig, "grpo": GRPOConfig}
DISTILL_CONFIGS: dict[str, type] = {"traces": DistillTracesConfig, "logits": DistillLogitsConfig}
