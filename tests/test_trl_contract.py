"""The TRL (and transformers) internals grpo_recipes relies on, checked against the installed versions:
grpo_recipes/trl_internals.py's CONTRACT, one test per entry. A failure names the entry, the installed versions and
what breaks without it. The checks are first shown to fail on fakes and on a monkeypatched TRL; then the table is
checked against what trl_internals.py really uses, and the hooks against TRL's own names."""

from __future__ import annotations

import ast
import contextlib
import inspect

import pytest
import trl
from trl import GRPOTrainer
from trl.generation import vllm_generation as trl_vllm_generation
from trl.trainer import grpo_trainer as trl_grpo_trainer

from grpo_recipes import trl_internals
from grpo_recipes.trl_internals import (
    ATTRIBUTE,
    CONTRACT,
    FIELDS,
    FORWARD_KEYWORDS,
    METHOD,
    MODULE_NAME,
    Entry,
    HookedGRPOTrainer,
    HookedVLLMGeneration,
    contract_problem,
    private_names,
)


@pytest.mark.parametrize("entry", CONTRACT, ids=lambda e: e.label)
def test_the_installed_trl_has_what_the_contract_relies_on(entry):
    problem = contract_problem(entry)
    assert problem is None, problem


# ----------------------------------------------------------------------------------------- the checks can fail


def entry(name: str, kind: str | None = None) -> Entry:
    return next(e for e in CONTRACT if e.name == name and (kind is None or e.kind == kind))


def test_a_method_trl_removed_is_reported_with_the_version_and_what_breaks(monkeypatch):
    monkeypatch.delattr(GRPOTrainer, "_generate")
    problem = contract_problem(entry("_generate"))
    assert problem.startswith("trl.trainer.grpo_trainer.GRPOTrainer._generate (callable): is gone")
    assert f"TRL {trl.__version__}" in problem and "INVALID_CALL" in problem  # the version, what breaks
    assert "grpo_recipes/trl_internals.py" in problem


def test_a_renamed_or_reordered_parameter_is_reported():
    class Renamed:
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids):
            pass

    class Reordered:
        def _get_per_token_logps_and_entropies(self, model, attention_mask, input_ids, logits_to_keep, **kwargs):
            pass

    class NoKeyword:
        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch=None):
            pass

    assert "takes (inputs, prompts, completions, completion_ids), not (inputs, prompts, completions, " \
           "completion_ids_list, ...) first" in contract_problem(entry("_calculate_rewards"), owner=Renamed)
    assert "takes (model, attention_mask" in contract_problem(entry("_get_per_token_logps_and_entropies"),
                                                               owner=Reordered)
    assert "takes no keyword compute_entropy" in contract_problem(entry("_get_per_token_logps_and_entropies"),
                                                                  owner=NoKeyword)
    assert contract_problem(entry("_generate"), owner=type("Attr", (), {"_generate": 3})).count("no longer callable")


def test_an_attribute_no_longer_set_is_reported():
    class Trainer:
        def __init__(self):
            self.metrics = {}

    class Kept:
        def __init__(self):
            self._metrics, self.other = {}, None

    problem = contract_problem(entry("_metrics"), owner=Trainer)
    assert "_metrics (attribute): is no longer set on the instances" in problem and "diag/*" in problem
    assert contract_problem(entry("_metrics"), owner=Kept) is None


def test_missing_fields_a_moved_module_name_and_a_forward_keyword_are_reported(monkeypatch):
    class Sampler:
        def __init__(self, seed):
            self.seed, self.shuffle = seed, True

    module = type("Module", (), {"RepeatSampler": Sampler})
    assert "has no field num_samples, generator" in contract_problem(entry("RepeatSampler"), owner=module)

    monkeypatch.setattr(trl_grpo_trainer, "VLLMGeneration", type("Other", (), {}))
    assert "no longer trl.generation.vllm_generation.VLLMGeneration" in contract_problem(
        entry("VLLMGeneration", MODULE_NAME))

    def add_fused_lm_head(model):
        def forward(self, *args, labels=None, shift_labels=None, **kwargs):
            pass

        model.forward = forward

    problem = contract_problem(entry("fused_lm_head"), owner=add_fused_lm_head)
    assert "installs a forward without the keyword fused_lm_head" in problem and "share_prompt_forward" in problem


def test_a_name_that_cannot_be_looked_up_is_reported():
    gone = Entry("_gone", "trl.trainer.no_such_module:GRPOTrainer", METHOD, breaks="nothing here")
    assert "cannot be looked up (ModuleNotFoundError" in contract_problem(gone)


# --------------------------------------------------------------------------------- the table and the code agree


def trl_defines(name: str) -> bool:
    """Whether one of the TRL classes trl_internals reaches into defines `name` (or sets it on its instances)."""
    owners = [GRPOTrainer, trl_vllm_generation.VLLMGeneration, trl.distributed.DistributedBackend]
    return any(hasattr(o, name) or trl_internals._sets_on_self(o, name) for o in owners)


def internals_tree() -> ast.Module:
    return ast.parse(inspect.getsource(trl_internals))


def test_every_private_trl_name_trl_internals_uses_is_in_the_contract():
    tree = internals_tree()
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    used |= {f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
             if isinstance(f, ast.FunctionDef)}
    private = {n for n in used if n.startswith("_") and not n.startswith("__") and trl_defines(n)}
    assert {"_metrics", "_generate", "_iter_named_params"} <= private  # the scan sees them
    assert private - private_names() == set(), "add these to trl_internals.CONTRACT"


def test_every_private_name_of_the_contract_is_used_by_trl_internals():
    tree = internals_tree()
    spelled = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    spelled |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    spelled |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword)}
    spelled |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert private_names() - spelled == set(), "a stale CONTRACT entry: remove it"
    assert {e.kind for e in CONTRACT} == {METHOD, ATTRIBUTE, FIELDS, MODULE_NAME, FORWARD_KEYWORDS}


@pytest.mark.parametrize("hooked, base", [(HookedGRPOTrainer, GRPOTrainer),
                                          (HookedVLLMGeneration, trl_vllm_generation.VLLMGeneration)])
def test_no_hook_shadows_a_name_of_trl(hooked, base):
    """A public hook that TRL (or transformers' Trainer) also defined would silently replace TRL's."""
    hooks = {name for name in vars(hooked) if not name.startswith("_")}
    assert {"metrics", "tool_tables", "scored_batch"} <= hooks or {"start_engine", "named_params"} <= hooks
    clashes = {name for name in hooks if hasattr(base, name) or trl_internals._sets_on_self(base, name)}
    assert clashes == set(), f"{base.__name__} of {trl_internals.versions()} defines these too: rename the hooks"


# ---------------------------------------------------------------------------------------- the hooks are called


class Recorder(HookedGRPOTrainer):
    """A HookedGRPOTrainer without GRPOTrainer.__init__: only the hook wiring."""

    def __init__(self):
        self.calls = []

    def before_generation(self, prompts):
        self.calls.append(("before_generation", prompts))

    @contextlib.contextmanager
    def generating(self):
        self.calls.append(("generating",))
        yield
        self.calls.append(("generating done",))

    def generated(self, prompts, output):
        self.calls.append(("generated", prompts, output))
        return output + "+hooked"

    def scored_rewards(self, inputs, prompts, completions, completion_ids, rewards):
        self.calls.append(("scored_rewards", inputs, prompts, completions, completion_ids, rewards))
        return rewards * 2

    def scoring_batch(self, inputs):
        self.calls.append(("scoring_batch", inputs))

    def scored_batch(self, inputs, output):
        self.calls.append(("scored_batch", inputs, output))
        return {**output, "hooked": True}

    def shared_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        self.calls.append(("shared_logps", model, input_ids, attention_mask, logits_to_keep, compute_entropy))
        return ("shared", None, None) if model == "share" else None


def test_trls_private_steps_call_the_hooks(monkeypatch):
    monkeypatch.setattr(GRPOTrainer, "_generate", lambda self, prompts: "out")
    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", lambda self, *args: 10)
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: {"a": 1})
    trl_calls = []
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies",
                        lambda self, *args, **kwargs: trl_calls.append((args, kwargs)) or "trl")
    t = Recorder()
    assert t._generate(["p"]) == "out+hooked"
    assert t._calculate_rewards(["i"], ["p"], ["c"], [[1]]) == 20
    assert t.trl_rewards(["i"], ["p"], ["c"], [[1]]) == 10  # TRL's own, no hook
    assert t._generate_and_score_completions(["i"]) == {"a": 1, "hooked": True}
    assert t._get_per_token_logps_and_entropies("share", "ids", "mask", 3, compute_entropy=True) == ("shared", None,
                                                                                                     None)
    assert trl_calls == []
    assert t._get_per_token_logps_and_entropies("m", "ids", "mask", 3, 8, compute_entropy=False) == "trl"
    assert trl_calls == [(("m", "ids", "mask", 3, 8), {"compute_entropy": False})]
    assert [c[0] for c in t.calls] == ["before_generation", "generating", "generating done", "generated",
                                       "scored_rewards", "scoring_batch",
                                       "scored_batch", "shared_logps", "shared_logps"]
    assert t.calls[4] == ("scored_rewards", ["i"], ["p"], ["c"], [[1]], 10)


def test_reward_logging_is_muted_only_inside_the_block_and_tool_tables_fail_loudly():
    t = Recorder()
    t._pending_metrics, t._pending_extra_logs = {"m": []}, {"c": []}
    with t.reward_logging_muted():
        t._log_metric("m", 1.0)
        t._log_completion_extra("c", [1])
    assert t._pending_metrics == {"m": []} and t._pending_extra_logs == {"c": []}
    assert "_log_metric" not in vars(t) and "_log_completion_extra" not in vars(t)  # TRL's methods again
    with pytest.raises(KeyError), t.reward_logging_muted():
        raise KeyError("boom")
    assert "_log_metric" not in vars(t)
    with pytest.raises(RuntimeError, match="no longer builds _sync_tool_dicts; update tool_tables in "
                                           "grpo_recipes/trl_internals.py"):
        t.tool_tables()
    t._sync_tool_dicts = [{"calc": print}]
    assert t.tool_tables() == [{"calc": print}]
    t._metrics = {"train": {"x": [1.0]}}
    assert t.metrics("train") == {"x": [1.0]}


def test_the_fused_head_scores_only_labelled_positions_on_cpu_with_the_same_loss_and_gradient(tiny_model_dir,
                                                                                               monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer import utils as trl_utils

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    scored, apply = [], trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                        lambda hidden, *rest: scored.append(hidden.size(0)) or apply(hidden, *rest))
    ids = torch.randint(5, 200, (2, 12))
    labels = ids.clone()
    labels[0, :7], labels[1, :9] = -100, -100  # prompts of 7 and 9 tokens: 5 + 3 labelled positions

    def step():
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        return out, [p.grad.clone() for p in model.parameters()]

    every, every_grads = step()
    with trl_internals.fused_head_on_labels():
        labelled, labelled_grads = step()
    step()
    assert scored == [2 * 11, 5 + 3, 2 * 11]  # every shifted position, the labelled ones, every one again
    assert torch.allclose(labelled.loss, every.loss)
    for name in ("log_probs", "entropy", "is_top1"):
        assert torch.allclose(getattr(labelled, name).float(), getattr(every, name).float(), atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(labelled_grads, every_grads))
