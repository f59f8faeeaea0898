"""vLLM: its modes and the start-up check (support.py), the weight sync on a CPU trainer (cpu_sync.py), and what runs in
vLLM's CPU worker (cpu_worker.py)."""
