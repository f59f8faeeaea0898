"""What one kind of stage does (stages/grpo.py, sft.py, distill.py): its dataset, its TRL trainer and what it does around
training. The run runs them one after the other, in one process, one output folder and one Trackio run
(run/runner.py); a stage's steps are counted after the previous stage's last one (its offset), so Trackio's step axis
and the held-out evaluations continue across stages. How stages are configured: config/stages.py."""

from __future__ import annotations

from transformers import AutoTokenizer

from ..config.stages import StageSpec
from ..errors import ConfigError
from ..tools.templates import ToolTemplateError, prepare_tokenizer


class Stage:
    """What one kind of stage does (grpo.GRPOStage, sft.SFTStage, distill.py's): its dataset, its TRL trainer and what
    it does around training. One instance serves one stage of one run (`spec`), so it may keep state between its
    hooks."""

    name = ""

    def __init__(self, spec: StageSpec):
        self.spec = spec
        self.offset = 0  # the run's steps before this stage (set by the runner when the stage starts)

    def where(self) -> str:
        """What this stage's messages start with: nothing for the last stage (the flat keys), `stages[i] (name): `
        for an earlier one (its entry)."""
        return "" if self.spec.last else f"stages[{self.spec.index}] ({self.name}): "

    def dataset(self, run):
        """The stage's training dataset, built from the run's training rows."""
        return run.train

    def describe(self, run) -> str:
        return f"{self.name}: {len(run.train)} train rows"

    def problems(self, config) -> list[str]:
        """The start-up problems of what this kind of stage needs of the resolved config (config/resolve.Config): the
        recipe's settings it reads, its features'. Loads no weights. The values of its own training config are
        config/checks.py's."""
        return []

    def data_problems(self, config, train) -> list[str]:
        """Those that only the loaded training rows show."""
        return []

    def make_trainer(self, run, model_path: str):
        raise NotImplementedError(f"{type(self).__name__}.make_trainer")

    def callbacks(self, trainer, run) -> list:
        return []

    def before_save(self, trainer, run) -> None:
        """Right before the stage's model is saved."""


def tool_tokenizer(recipe, model_path: str):
    """The tokenizer with the configured tool template and parser: on every start (also from an SFT'd folder or a
    checkpoint), because the parser is an instance attribute that a saved tokenizer does not keep."""
    try:
        return prepare_tokenizer(AutoTokenizer.from_pretrained(model_path), recipe.tool_template)
    except ToolTemplateError as exc:
        raise ConfigError([str(exc)]) from None
