"""The run's configuration: the schema (schema.py), reading the file and the flags (files.py, parsing.py), resolving
them once (resolve.py), the stages' configs (stages.py), the start-up checks (checks.py), the batch rule (batching.py)."""
