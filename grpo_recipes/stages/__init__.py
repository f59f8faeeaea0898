"""The kinds of stage, one file each, each by TRL's own trainer: sft.py (SFTTrainer), distill.py (SFTTrainer on a
teacher's verified traces, or DistillationTrainer), grpo.py (grpo/trainer.RecipeTrainer); base.py, their interface."""
