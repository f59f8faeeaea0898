"""Held-out evaluation: heldout.py (generation, scoring, the paired gain and the callback every stage gets) and
rollout.py (multi-turn tool episodes)."""
