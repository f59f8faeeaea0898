"""The GRPO trainer: trainer.py (RecipeTrainer: TRL's GRPOTrainer through trl_internals' hooks), features/ (one file
a feature: its checks, hooks, metrics and alerts), alerts.py (the detectors every run has), groups.py (a batch as
groups)."""
