"""What a run keeps outside its process: checkpoints and stage folders (checkpoint.py), the signals that stop it
(signals.py), its Trackio run (tracking.py), its CPU budget (budget.py) and the model's local copy (models.py)."""
