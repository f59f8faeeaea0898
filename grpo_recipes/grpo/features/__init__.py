"""RecipeTrainer's features, one file each (base.TrainerFeature; stages/grpo.py FEATURES lists them in order)."""
