"""The rewards: what a reward file (rewards/*.py) imports. Discovery, contracts and compilation into TRL
reward functions: registry.py; reading answers: answers.py, arithmetic.py; the hack catalog: hacks.py;
`grpo-recipes rewards check`: check.py."""

from ..values import Range
from .registry import reward

__all__ = ["Range", "reward"]
