"""Multi-turn tool rollouts outside the trainer (held-out evaluation, measurements), built the way TRL 1.16's
GRPOTrainer._tool_call_loop builds them, so what is evaluated is what is trained:
- token ids are concatenated (prompt + completion + tool suffix), never re-tokenised;
- the tool suffix is the template's rendering of the tool messages after an EOS-trimmed dummy call
  (GRPOTrainer._get_tool_suffix_ids);
- max_completion_length bounds the model's and the tools' tokens together; a tool result that would cross it is
  dropped and the episode ends there (TRL rolls it back the same way);
- at most max_iterations rounds of tool calls.
- each turn is parsed with TRL's own `parse_response` (the tokenizer's parser: tool_templates' for chatml_tools).
Greedy by default; `sample=True` uses the given temperature. Standalone tools only: an environment's methods need
per-rollout instances (TRL's environment_factory), which this loop does not build.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from trl.chat_template_utils import parse_response

from ..tools.registry import invalid_call_handler
from ..tools.templates import INVALID_CALL


def tool_suffix_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    prefix = prefix[: eos[-1] + 1] if eos else prefix
    if full[: len(prefix)] != prefix:
        raise ValueError("chat template is not prefix-preserving around tool messages")
    return full[len(prefix):]


def dispatch(tools: list[Callable], known_names: list[str]) -> dict[str, Callable]:
    table = {t.__name__: t for t in tools}
    table[INVALID_CALL] = invalid_call_handler(lambda: known_names)
    return table


def run_calls(calls: list[dict], table: dict[str, Callable]) -> list[dict]:
    out = []
    for call in calls:
        fn = call["function"]
        name = fn["name"]
        func = table.get(name) or table[INVALID_CALL]
        args = fn["arguments"] if name in table else {"problem": f"no tool named '{name}'", "kind": "unknown_tool"}
        out.append({"role": "tool", "name": name, "content": str(func(**args))})
    return out


@torch.no_grad()
def _generate(model, tokenizer, seqs: list[list[int]], max_new: list[int], sample: bool, temperature: float):
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(max_new), pad_token_id=pad,
                         eos_token_id=tokenizer.eos_token_id, **kw)
    res = []
    for row, budget in zip(out[:, width:].tolist(), max_new, strict=True):
        cut = next((i + 1 for i, t in enumerate(row) if t == tokenizer.eos_token_id), len(row))
        res.append(row[: min(cut, budget)])
    return res


def rollout(model, tokenizer, prompts: list[list[dict]], tools: list[Callable], *, max_completion_length: int = 128,
            max_iterations: int = 2, batch_size: int = 16, sample: bool = False, temperature: float = 1.0,
            chat_template_kwargs: dict | None = None, progress: Callable[[int], object] | None = None) -> list[dict]:
    """-> one record per prompt: {"messages": completion messages, "completion_ids": model and tool tokens,
    "model_tokens": int, "tool_tokens": int}. The caller sets eval mode and seeds the RNG (heldout.evaluate);
    `progress` hears of each batch's prompts once they are done."""
    table = dispatch(tools, [t.__name__ for t in tools])
    records = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        prompt_ids = [tokenizer.apply_chat_template(p, tools=tools or None, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False, **(chat_template_kwargs or {})) for p in batch]
        comp = [[] for _ in batch]  # completion ids (model + tool tokens)
        msgs = [[] for _ in batch]
        tool_tokens = [0] * len(batch)
        active = list(range(len(batch)))
        for iteration in range(max_iterations + 1):
            budgets = [max_completion_length - len(comp[i]) for i in active]
            new = _generate(model, tokenizer, [prompt_ids[i] + comp[i] for i in active], budgets, sample, temperature)
            nxt = []
            for i, ids in zip(active, new, strict=True):
                message = parse_response(tokenizer, ids, prefix=prompt_ids[i] + comp[i], tools=tools)
                comp[i] += ids
                msgs[i].append(message)
                ended = ids[-1:] == [tokenizer.eos_token_id]
                if not message.get("tool_calls") or not ended or iteration == max_iterations:
                    continue
                results = run_calls(message["tool_calls"], table)
                suffix = tool_suffix_ids(tokenizer, results)
                if len(comp[i]) + len(suffix) >= max_completion_length:
                    continue  # TRL drops a tool result that would not fit, and the episode ends
                msgs[i] += results
                comp[i] += suffix
                tool_tokens[i] += len(suffix)
                nxt.append(i)
            active = nxt
            if not active:
                break
        records += [{"messages": m, "completion_ids": c, "model_tokens": len(c) - t, "tool_tokens": t}
                    for m, c, t in zip(msgs, comp, tool_tokens, strict=True)]
        if progress is not None:
            progress(len(batch))
    return records
