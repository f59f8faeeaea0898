"""Detectors of common GRPO failures over the logged metric stream, and the callback that raises them as alerts.

Each detector watches one pattern in the `logs` dicts the trainer emits (TRL names: `entropy`,
`frac_reward_zero_std`, `rewards/<name>/mean`, `completions/mean_length`, ...; held-out: `eval_pass@1`).
`update(step, metrics)` returns an Alert the first time the pattern has held for `patience` consecutive logs, then
stays silent until the metric is healthy again: one alert per episode, not one per step. A log without the
detector's metrics (an evaluation-only log, a step with no generation) neither extends nor ends an episode.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass

from transformers import TrainerCallback

from ..config.schema import AlertArguments
from ..state import tracking

logger = logging.getLogger("grpo_recipes.grpo.alerts")


@dataclass(frozen=True)
class Alert:
    name: str
    step: int
    title: str
    text: str
    level: str = "warn"  # trackio.AlertLevel value


class _Missing:
    """The log lacks the detector's metrics: not evidence either way."""


MISSING = _Missing()


class Detector:
    """Base: subclasses say whether the pattern holds in one log (`observe`); this class handles episodes."""

    name = ""
    title = ""
    advice = ""

    def __init__(self, cfg: AlertArguments, patience: int | None = None):
        self.cfg = cfg
        self.patience = cfg.alert_patience if patience is None else patience
        self._streak = 0
        self._fired = False

    def observe(self, metrics: dict) -> str | None | _Missing:
        """A description of the problem when the pattern holds now, None when healthy, MISSING when unknown."""
        raise NotImplementedError

    def update(self, step: int, metrics: dict) -> Alert | None:
        seen = self.observe(metrics)
        if seen is MISSING:
            return None
        if seen is None:  # healthy: the episode, if any, is over and the next one may alert again
            self._streak, self._fired = 0, False
            return None
        self._streak += 1
        if self._streak < self.patience or self._fired:
            return None
        self._fired = True
        return Alert(self.name, step, self.title, f"step {step}: {seen}. {self.advice}")


def _value(metrics: dict, key: str) -> float | None:
    v = metrics.get(key)
    return None if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v != v else float(v)


class Baseline:
    """Mean of the first `n` values of a metric; None until it has them."""

    def __init__(self, n: int):
        self.n, self.values = max(n, 1), []

    def feed(self, v: float) -> float | None:
        if len(self.values) < self.n:
            self.values.append(v)
            return None
        return sum(self.values) / self.n


class EntropyCollapse(Detector):
    name, title = "entropy_collapse", "Entropy collapse"
    advice = "The policy has become near-deterministic and will stop exploring: lower the learning rate, raise " \
             "temperature, or add an entropy bonus; compare with pass@k."

    def __init__(self, cfg, patience=None):
        super().__init__(cfg, patience)
        self.baseline = Baseline(cfg.alert_baseline_steps)

    def observe(self, metrics):
        e = _value(metrics, "entropy")
        if e is None:
            return MISSING
        base = self.baseline.feed(e)
        if base is None:
            return MISSING
        limit = max(self.cfg.alert_entropy_floor, self.cfg.alert_entropy_collapse_frac * base)
        return f"entropy {e:.4f} < {limit:.4f} (baseline {base:.4f})" if e < limit else None


class EntropyBlowup(Detector):
    name, title = "entropy_blowup", "Entropy blow-up"
    advice = "Sampling is turning into noise (often a too-high learning rate or a broken reward): lower the " \
             "learning rate, check the completions table."
    # A near-deterministic start (baseline ~0.05 nats) tripling is still a confident policy: judge against >= 0.5 nats.
    MIN_BASE = 0.5

    def __init__(self, cfg, patience=None):
        super().__init__(cfg, patience)
        self.baseline = Baseline(cfg.alert_baseline_steps)

    def observe(self, metrics):
        e = _value(metrics, "entropy")
        if e is None:
            return MISSING
        base = self.baseline.feed(e)
        if base is None:
            return MISSING
        limit = self.cfg.alert_entropy_blowup_factor * max(base, self.MIN_BASE)
        return f"entropy {e:.3f} > {limit:.3f} (baseline {base:.3f})" if e > limit else None


class NoLearningSignal(Detector):
    name, title = "no_learning_signal", "No learning signal"
    advice = "Most groups have identical rewards, so advantages are zero: the task is too hard or too easy for the " \
             "model. Change the data difficulty, raise num_generations, or add a denser reward."

    def observe(self, metrics):
        # diag/frac_equal_groups (diagnostics on) counts groups of equal rewards exactly; TRL's frac_reward_zero_std
        # misses those whose rewards float32 cannot average exactly (diagnostics.equal_reward_groups), such as
        # the math default's all-wrong, all-boxed groups (8 x 0.2).
        key = "diag/frac_equal_groups" if "diag/frac_equal_groups" in metrics else "frac_reward_zero_std"
        z = _value(metrics, key)
        if z is None:
            return MISSING
        return f"{key} {z:.2f} >= {self.cfg.alert_zero_std_frac}" if z >= self.cfg.alert_zero_std_frac else None


class FormatHacking(Detector):
    """A format (or any auxiliary) reward saturates while correctness stays where it started."""

    name, title = "format_hacking", "Format reward saturated, correctness flat"
    advice = "The policy is collecting the format reward without solving the task: lower the format weight, gate " \
             "it on correctness (e.g. think_format_if_correct), and read the completions table."

    def __init__(self, cfg, correctness: str, watched: list[str], patience=None):
        super().__init__(cfg, patience)
        self.correctness, self.watched = correctness, list(watched)
        self.baseline = Baseline(cfg.alert_baseline_steps)
        self.recent = deque(maxlen=max(cfg.alert_baseline_steps, 1))  # smooths the noisy per-step correctness

    def observe(self, metrics):
        c = _value(metrics, f"rewards/{self.correctness}/mean")
        formats = {n: _value(metrics, f"rewards/{n}/mean") for n in self.watched}
        if c is None or any(v is None for v in formats.values()):
            return MISSING
        base = self.baseline.feed(c)
        self.recent.append(c)
        if base is None:
            return MISSING
        now = sum(self.recent) / len(self.recent)
        saturated = [f"{n}={v:.2f}" for n, v in formats.items() if v >= self.cfg.alert_format_saturation]
        # Both saturated is success, not hacking: only a correctness below the saturation level can be "flat".
        flat = now - base < self.cfg.alert_correctness_gain and now < self.cfg.alert_format_saturation
        if saturated and flat:
            return f"{', '.join(saturated)} while {self.correctness} is {now:.2f} (baseline {base:.2f})"
        return None


class TrainUpEvalDown(Detector):
    """Train reward rising while held-out pass@1 falls from its best: overfitting or reward hacking."""

    name, title = "train_up_eval_down", "Train reward up, held-out accuracy down"
    advice = "Gains on the training reward do not transfer: read the completions for hacks, check the verifier, " \
             "keep the best checkpoint (save_steps), lower the learning rate."

    def __init__(self, cfg, patience=1):  # evaluations are rare: one bad evaluation is the signal
        super().__init__(cfg, patience)
        self.rewards: list[float] = []
        self.best_eval: float | None = None

    def observe(self, metrics):
        r = _value(metrics, "reward")
        if r is not None:  # train logs only feed the reward history; the verdict comes with an evaluation
            self.rewards.append(r)
        ev = _value(metrics, "eval_pass@1")
        if ev is None:
            return MISSING
        best, self.best_eval = self.best_eval, ev if self.best_eval is None else max(self.best_eval, ev)
        n = max(self.cfg.alert_baseline_steps, 1)
        if best is None or len(self.rewards) < 2 * n:  # first n rewards: baseline; last n: now, no overlap
            return None
        rise = sum(self.rewards[-n:]) / n - sum(self.rewards[:n]) / n
        drop = best - ev
        if rise >= self.cfg.alert_train_rise and drop >= self.cfg.alert_eval_drop:
            return (f"train reward +{rise:.3f} over its baseline while held-out pass@1 {ev:.3f} is {drop:.3f} "
                    "below its best")
        return None


class LengthCollapse(Detector):
    name, title = "length_collapse", "Completion length collapsing"
    advice = "Completions are shrinking towards nothing (a length-sensitive reward or loss is being gamed): check " \
             "loss_type and any length penalty, read the completions."

    def __init__(self, cfg, patience=None):
        super().__init__(cfg, patience)
        self.baseline = Baseline(cfg.alert_baseline_steps)

    def observe(self, metrics):
        n = _value(metrics, "completions/mean_length")
        if n is None:
            return MISSING
        base = self.baseline.feed(n)
        if base is None:
            return MISSING
        limit = self.cfg.alert_length_collapse_frac * base
        return f"mean length {n:.1f} < {limit:.1f} (baseline {base:.1f})" if n < limit else None


class LengthAtLimit(Detector):
    name, title = "length_at_limit", "Completions hitting max_completion_length"
    advice = "Truncated completions usually score as wrong and bias the loss: raise max_completion_length, ask for " \
             "shorter answers in the prompt, or set mask_truncated_completions."

    def observe(self, metrics):
        c = _value(metrics, "completions/clipped_ratio")
        if c is None:
            return MISSING
        return f"clipped_ratio {c:.2f} >= {self.cfg.alert_clipped_ratio}" if c >= self.cfg.alert_clipped_ratio else None


class ClipRatioSpike(Detector):
    name, title = "clip_ratio_spike", "Clipped-ratio spike"
    advice = "Many tokens hit the PPO clip at once: the policy moved far in one update. Lower the learning rate or " \
             "steps_per_generation/num_iterations; check max_grad_norm."

    def __init__(self, cfg, patience=1):  # a spike is a single event
        super().__init__(cfg, patience)
        self.history = deque(maxlen=20)

    def observe(self, metrics):
        c = _value(metrics, "clip_ratio/region_mean")
        if c is None:
            return MISSING
        history = list(self.history)
        self.history.append(c)
        if len(history) < self.cfg.alert_baseline_steps:
            return MISSING
        limit = max(self.cfg.alert_clip_ratio_min, self.cfg.alert_clip_spike_factor * statistics.median(history))
        return f"clip_ratio/region_mean {c:.3f} > {limit:.3f}" if c > limit else None


def default_detectors(cfg: AlertArguments, reward_names: list[str], correctness: str, format_reward: str | None):
    """All detectors. Format hacking watches `format_reward`, or every non-correctness reward when none is named."""
    watched = [format_reward] if format_reward else [n for n in reward_names if n != correctness]
    detectors = [EntropyCollapse(cfg), EntropyBlowup(cfg), NoLearningSignal(cfg), TrainUpEvalDown(cfg),
                 LengthCollapse(cfg), LengthAtLimit(cfg), ClipRatioSpike(cfg)]
    if watched:
        detectors.append(FormatHacking(cfg, correctness, watched))
    return detectors


class AlertCallback(TrainerCallback):
    """Feeds every log to the detectors; an alert becomes a log warning, and a Trackio alert when a run is open."""

    def __init__(self, detectors: list[Detector]):
        self.detectors = detectors
        self.fired: list[Alert] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        for detector in self.detectors:
            alert = detector.update(state.global_step, logs)
            if alert is not None:
                self.raise_alert(alert)

    def raise_alert(self, alert: Alert) -> None:
        self.fired.append(alert)
        logger.warning("ALERT %s: %s", alert.title, alert.text)
        if tracking.active():
            tracking.alert(alert.title, alert.text, alert.level)
