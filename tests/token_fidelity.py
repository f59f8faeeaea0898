"""Token fidelity of multi-turn tool episodes (issue 36): the ids the GRPO loss trains on are the ids the policy
sampled, token for token, and the loss mask covers the sampled ids and nothing else.

Shared by tests/test_token_fidelity.py (transformers generation, in process) and tests/test_vllm_cpu.py (vLLM
colocate, in its own process: `python token_fidelity.py --out records.json -- AGENT RECIPE ARGS`).

- `Recording.attach(trainer)` records at the two ends, never from TRL's own bookkeeping: what comes out of the
  generator (`model.generate`, or the colocated engine's `LLM.generate`): each row's context ids and the ids it
  sampled, up to and including the first EOS (what follows is padding); and what `compute_loss` receives, after
  TRL's shuffle and split into micro-batches: each row's prompt ids, completion ids and masks.
- `episodes(calls)`: a row whose context extends the whole sequence of an episode continued in the previous call
  (by the tool suffix between them) continues that episode; any other row starts one.
- `problems(recording, max_completion_length)`: every trained row must be one episode, each episode trained once:
  the same prompt ids, then the same completion ids (every turn's sampled ids and the suffixes between them, cut only
  where TRL cuts: at max_completion_length, inside the last turn), with loss mask (completion_mask x tool_mask) 1 on
  the sampled ids and 0 on everything else: tool results, template tokens, padding. Assumes TRL's
  mask_truncated_completions is off (the recipes' setting): a row it masks would train on nothing.
- `Retokenise`: the pipeline the check must fail on (both tests run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grpo_recipes.grpo.features.base import TrainerFeature

AGENT_CONFIG = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "agent_cpu.yaml"


def _until_eos(ids: list[int], eos: set[int]) -> list[int]:
    return next((ids[: i + 1] for i, t in enumerate(ids) if t in eos), ids)


@dataclass
class Recording:
    calls: list[list[tuple[list[int], list[int]]]] = field(default_factory=list)  # per call: (context, sampled)
    rows: list[dict] = field(default_factory=list)  # per trained row: prompt, completion, completion_mask, tool_mask

    def attach(self, trainer) -> Recording:
        eos = set(trainer.eos_token_ids)
        if trainer.use_vllm:
            if trainer.vllm_mode != "colocate":
                raise ValueError("Recording reads the colocated engine; vLLM server mode generates in another process")
            self._wrap_vllm(trainer.vllm_generation.llm, eos)
        else:
            self._wrap_generate(trainer.model, eos)
        original = trainer.compute_loss

        def compute_loss(model, inputs, *args, **kwargs):
            prompt_mask = inputs["prompt_mask"].bool()
            tool_mask = inputs.get("tool_mask")
            for i in range(len(prompt_mask)):
                self.rows.append({
                    "prompt": inputs["prompt_ids"][i][prompt_mask[i]].tolist(),
                    "completion": inputs["completion_ids"][i].tolist(),
                    "completion_mask": inputs["completion_mask"][i].tolist(),
                    "tool_mask": tool_mask[i].tolist() if tool_mask is not None else None,
                })
            return original(model, inputs, *args, **kwargs)

        trainer.compute_loss = compute_loss
        return self

    def _wrap_generate(self, model, eos: set[int]) -> None:
        original = model.generate

        def generate(*args, **kwargs):
            out = original(*args, **kwargs)
            ids, mask = kwargs["input_ids"], kwargs["attention_mask"].bool()  # TRL passes both by name, left-padded
            width = ids.size(1)
            self.calls.append([(row[m].tolist(), _until_eos(o[width:].tolist(), eos))
                               for row, m, o in zip(ids, mask, out, strict=True)])
            return out

        model.generate = generate

    def _wrap_vllm(self, llm, eos: set[int]) -> None:
        original = llm.generate

        def generate(prompts, *args, **kwargs):
            outputs = original(prompts, *args, **kwargs)
            self.calls.append([(list(p["prompt_token_ids"]), _until_eos(list(c.token_ids), eos))
                               for p, o in zip(prompts, outputs, strict=True) for c in o.outputs])
            return outputs

        llm.generate = generate

    def to_json(self) -> dict:
        return {"calls": self.calls, "rows": self.rows}

    @classmethod
    def from_json(cls, data: dict) -> Recording:
        return cls([[(list(c), list(s)) for c, s in call] for call in data["calls"]], data["rows"])


@dataclass(eq=False)  # identity: two episodes may hold the same ids (a group's scripted rows)
class Episode:
    prompt: list[int]
    ids: list[int] = field(default_factory=list)  # after the prompt: sampled turns and the suffixes between them
    sampled: list[bool] = field(default_factory=list)  # per id: sampled by the policy
    turns: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each sampled turn in `ids`

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.ids

    def add_turn(self, context: list[int], out: list[int]) -> None:
        between = context[len(self.sequence):]  # the tool suffix, outside the model's turns
        self.ids += between + out
        self.sampled += [False] * len(between) + [True] * len(out)
        start = len(self.ids) - len(out)
        self.turns.append((start, len(self.ids)))


def episodes(calls) -> list[Episode]:
    found: list[Episode] = []
    previous: list[Episode] = []  # continued or started in the previous call: only these can go on
    for call in calls:
        current = []
        for context, out in call:
            parent = next((e for e in previous if e not in current and len(context) > len(e.sequence)
                           and context[: len(e.sequence)] == e.sequence), None)
            if parent is None:
                parent = Episode(prompt=list(context))
                found.append(parent)
            parent.add_turn(context, out)
            current.append(parent)
        previous = current
    return found


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def problems(recording: Recording, max_completion_length: int, decode=None) -> list[str]:
    """Everything that breaks fidelity, one line each (none: the loss trained on exactly what was sampled).
    `decode` (ids -> text) adds the text of the ids each line shows."""

    def show(ids: list[int]) -> str:
        return f"{ids} {decode(ids)!r}" if decode else str(ids)

    eps = episodes(recording.calls)
    trained = [False] * len(eps)
    found = []
    for r, row in enumerate(recording.rows):
        cm, tm = row["completion_mask"], row["tool_mask"] or [1] * len(row["completion"])
        n = sum(cm)
        if cm != [1] * n + [0] * (len(cm) - n):
            found.append(f"row {r}: completion_mask is not one run of ones then padding: {cm}")
            continue
        completion, loss_mask = row["completion"][:n], [c * t for c, t in zip(cm, tm, strict=True)]
        same_prompt = [i for i, e in enumerate(eps) if not trained[i] and e.prompt == row["prompt"]]
        # A whole episode first: a shorter one's ids may begin a longer one's
        match = next((i for i in same_prompt if eps[i].ids == completion),
                     next((i for i in same_prompt if eps[i].ids[:n] == completion), None))
        if match is None:
            if not same_prompt:
                found.append(f"row {r}: no untrained sampled episode has its prompt: {show(row['prompt'][-8:])}")
                continue
            best = max(same_prompt, key=lambda i: _first_difference(eps[i].ids, completion))
            at = _first_difference(eps[best].ids, completion)
            found.append(f"row {r}: trained ids differ from the sampled episode's at completion token {at} of {n}: "
                         f"trained {show(completion[at:at + 6])}, sampled {show(eps[best].ids[at:at + 6])}")
            continue
        trained[match] = True
        ep = eps[match]
        if n < len(ep.ids) and (n != max_completion_length or n <= ep.turns[-1][0]):
            found.append(f"row {r}: trains {n} of the episode's {len(ep.ids)} ids: a cut other than TRL's (at "
                         f"max_completion_length {max_completion_length}, inside the last turn)")
        expected = [int(s) for s in ep.sampled[:n]] + [0] * (len(cm) - n)
        if loss_mask != expected:
            wrong = [i for i, (m, e) in enumerate(zip(loss_mask, expected)) if m != e]
            found.append(f"row {r}: loss mask wrong at {len(wrong)} positions (first: {wrong[0]}, mask "
                         f"{loss_mask[wrong[0]]}, sampled {bool(expected[wrong[0]])}): "
                         f"{show(row['completion'][wrong[0]:wrong[0] + 6])}")
    found += [f"episode {i} was sampled but never trained ({len(e.turns)} turns): {show(e.ids[:8])}"
              for i, e in enumerate(eps) if not trained[i]]
    return found


class Retokenise(TrainerFeature):
    """A pipeline that renders each episode through the chat template and tokenises it again, its loss mask from
    the template's {% generation %} markers, cut after the last EOS (as the sampled ids end). It has no sampler
    log-probabilities for the ids it made: vLLM's become NaN, which TRL leaves out of its importance-sampling
    correction (without this their lengths no longer match, and TRL fails before the loss)."""

    def generated(self, trainer, prompts, output):
        prompt_ids, completion_ids, tool_mask, completions, logprobs, *rest = output
        tok = trainer.processing_class
        for i, (prompt, messages) in enumerate(zip(prompts, completions, strict=True)):
            full = tok.apply_chat_template(prompt + messages, tools=trainer.tools, tokenize=True, return_dict=True,
                                           return_assistant_tokens_mask=True)
            ids, mask = full["input_ids"], full["assistant_masks"]
            end = max(j for j, t in enumerate(ids) if t == tok.eos_token_id) + 1
            completion_ids[i], tool_mask[i] = ids[len(prompt_ids[i]):end], mask[len(prompt_ids[i]):end]
            if logprobs is not None:
                logprobs[i] = [float("nan")] * len(completion_ids[i])
        return (prompt_ids, completion_ids, tool_mask, completions, logprobs, *rest)


def main(argv: list[str]) -> int:
    """Train the agent recipe through the project's runner (vLLM-colocate test), recording as above; with
    --retokenise, through the re-tokenising pipeline."""
    from grpo_recipes.run import runner

    split = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--retokenise", action="store_true")
    a = p.parse_args(argv[:split])
    run = runner.prepare("agent", argv[split + 1:], AGENT_CONFIG)
    trainer = runner.build_trainer(run)
    if a.retokenise:
        trainer.features.append(Retokenise())
    recording = Recording().attach(trainer)
    code = runner.train_and_save(trainer, run)
    Path(a.out).write_text(json.dumps({**recording.to_json(),
                                       "max_completion_length": run.training.max_completion_length}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
