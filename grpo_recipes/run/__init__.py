"""The composition root: runner.py runs a recipe's stages in one process, one output folder and one Trackio run."""
