"""grpo-recipes: thin GRPO recipes and trustworthy rewards on top of Hugging Face TRL."""

__version__ = "0.1.0"
