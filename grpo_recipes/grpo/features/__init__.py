"""RecipeTrainer's features, one module each (base.TrainerFeature; grpo_stage.FEATURES lists them in order)."""
