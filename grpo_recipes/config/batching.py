"""Batch geometry: a generation batch must hold whole groups of num_generations completions of one prompt.

One rule, for the recipe's start-up check (parsing.py runs it on the raw values) and the launcher (which knows the
process count before any GPU is touched). Light on purpose: no imports beyond the standard library.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any


def num_processes() -> int:
    """Training processes: WORLD_SIZE is set by `accelerate launch` and torchrun, and absent for a plain `python`."""
    return max(int(os.environ.get("WORLD_SIZE", "1")), 1)


def _divisors(n: int, lo: int = 2) -> list[int]:
    return [d for d in range(lo, n + 1) if n % d == 0]


def batch_problems(v: Mapping[str, Any], processes: int) -> list[str]:
    """The generation batch must hold whole groups of num_generations completions of the same prompt.

    generation batch = per_device_train_batch_size × processes × steps_per_generation (steps_per_generation defaults
    to gradient_accumulation_steps), or generation_batch_size when that is given instead. GRPOConfig.__post_init__
    checks the divisibility (with WORLD_SIZE processes) but does not say what to change; the evaluation batch is
    checked only when evaluation is on.
    """
    problems = []
    ng = v.get("num_generations")
    pdb = v.get("per_device_train_batch_size") or 0
    gas = v.get("gradient_accumulation_steps") or 0
    gbs, spg = v.get("generation_batch_size"), v.get("steps_per_generation")
    for name, value in (("per_device_train_batch_size", pdb), ("gradient_accumulation_steps", gas)):
        if value < 1:
            problems.append(f"{name}: {value}; it must be at least 1")
    if ng is None or ng < 2:
        problems.append(
            f"num_generations: {ng}; GRPO needs at least 2 completions per prompt to compute group-relative "
            "advantages. Use 4-16 (e.g. --num_generations 8)"
        )
    if problems:
        return problems
    if gbs is not None and spg is not None:
        return [
            "generation_batch_size, steps_per_generation: both set; set only one, the other follows from "
            "generation_batch_size = per_device_train_batch_size × processes × steps_per_generation"
        ]
    global_batch = pdb * processes
    if gbs is not None:
        if gbs % global_batch:
            up = math.ceil(gbs / global_batch) * global_batch
            return [
                f"generation_batch_size: {gbs} is not a multiple of per_device_train_batch_size × processes = "
                f"{pdb} × {processes} = {global_batch}; use {up} (or unset it and set steps_per_generation)"
            ]
        generation, how = gbs, f"generation_batch_size {gbs}"
    else:
        steps = spg or gas
        generation = global_batch * steps
        source = "steps_per_generation" if spg else "gradient_accumulation_steps"
        how = (f"per_device_train_batch_size {pdb} × {processes} process{'es' if processes > 1 else ''} × "
               f"{source} {steps} = {generation}")
    if generation % ng:
        per_step = generation // max(pdb, 1)  # completions per unit of per_device_train_batch_size
        better_pdb = next(p for p in range(pdb, pdb * ng + 1) if (p * per_step) % ng == 0)
        fits = [d for d in _divisors(generation) if d <= max(ng * 2, 16)]
        alt = f" or num_generations to one of {fits}" if fits else ""
        problems.append(
            f"num_generations: the generation batch ({how}) is not a multiple of num_generations {ng}, so a "
            f"prompt's completions would be split across batches. Fix: set per_device_train_batch_size to "
            f"{better_pdb}{alt}"
        )
    strategy = v.get("eval_strategy") or "no"
    if str(getattr(strategy, "value", strategy)) != "no":  # TrainingArguments turns do_eval on exactly then
        ng_eval = v.get("num_generations_eval") or ng
        eval_batch = (v.get("per_device_eval_batch_size") or 0) * processes
        if ng_eval and eval_batch % ng_eval:
            problems.append(
                f"per_device_eval_batch_size: the evaluation batch ({eval_batch} = per_device_eval_batch_size × "
                f"processes) is not a multiple of num_generations_eval {ng_eval}; use a multiple of {ng_eval}"
            )
    return problems
