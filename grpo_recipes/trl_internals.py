"""Every private TRL name grpo_recipes relies on, and the transformers cache internals prompt sharing needs: here only.

The rest of the package uses public names. What it needs from TRL's internals it reaches through this module:
- `HookedGRPOTrainer`, GRPOTrainer whose private steps call public hooks (RecipeTrainer implements them), with small
  helpers for the private state those hooks read or write:

      TRL's private step                               hook(s), called with the same arguments
      _generate(prompts)                               before_generation(prompts); generating(): a context
                                                       TRL's generation runs in; generated(prompts, output)
      _calculate_rewards(inputs, prompts, ...)         scored_rewards(inputs, prompts, completions, completion_ids,
                                                       rewards)
      _generate_and_score_completions(inputs)          scoring_batch(inputs); refilled(inputs, output);
                                                       scored_batch(inputs, output)
      _get_per_token_logps_and_entropies(model, ...)   shared_logps(model, input_ids, attention_mask,
                                                       logits_to_keep, compute_entropy): TRL's result, or None

      metrics(mode)            self._metrics[mode], the lists TRL's `log` averages over the logging window
      log_extra_column(n, v)   self._log_completion_extra: a column of TRL's completions table
      reward_logging_muted()   while it lasts, reward functions' log_metric / log_extra go nowhere
      trl_rewards(...)         TRL's reward step itself, without the scored_rewards hook
      tool_tables()            self._sync_tool_dicts, the per-rollout tool tables TRL builds before `_generate`
      trl_generate_and_score(rows)  TRL's generation and scoring step for more rows (dynamic sampling's rounds)
      completion_rows(), set_completion_rows(rows)  self._logs: the completions table's rows of the last batch
      loss_mask_count(output)  num_items_in_batch, as TRL's step counts it, for a batch built from several
- `summon_full_params(trainer)`: the FSDP parameter gathering TRL's own generation runs under (`trainer._dist`);
- `HookedVLLMGeneration` and `vllm_backend_built_by(factory)`: the start-up and weight iterator of TRL's vLLM backend,
  and the module-level name GRPOTrainer.__init__ builds that backend through (vllm_cpu_sync.py);
- `seeded_repeat_sampler(dataloader)`, `set_epoch_order(sampler, epoch)`: TRL's RepeatSampler (checkpoint.py);
- `prompt_key_values`, `fused_logps_after`, `non_full_attention_cache`: the model's key/value cache layers
  (transformers' DynamicCache / DynamicLayer) and TRL's fused LM head (prompt_sharing.py);
- `fused_head_on_labels()`: TRL's fused LM head scoring only the positions with a label on CPU too (runner.py);
- `PROFILED_BLOCKS`: what each block TRL times (its `profiling/Time taken: <Trainer>.<name>` rows) is, in a public
  word: the Trackio key it is logged under (tracking.py).

CONTRACT lists each internal name relied on: where it lives, what is relied on (a signature's parameters, an
attribute, a module-level name, a class's fields), and what breaks without it. tests/test_trl_contract.py checks every
entry against the installed TRL and transformers (`contract_problem`); tests/test_layering.py checks that no other
module of the package names one (`private_names`, `INTERNAL_MODULES`). A TRL upgrade means re-reading this module.
Where a change in TRL would silently do nothing (an attribute no longer set, a step no longer called), the code here
or its caller fails loudly instead.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import transformers
import trl
from transformers.cache_utils import DynamicCache, DynamicLayer
from trl import GRPOTrainer
from trl.generation import vllm_generation as trl_vllm_generation
from trl.trainer import grpo_trainer as trl_grpo_trainer
from trl.trainer.utils import RepeatSampler

# ------------------------------------------------------------------------------------------------ the contract

METHOD = "callable"  # a function or method (a class: its constructor): `params` lead its parameters (after self),
#                      in order; `keywords` are accepted by name (or by **kwargs)
ATTRIBUTE = "attribute"  # set on the owner's instances: `self.NAME = ...` in the source of the class or of a base
FIELDS = "fields"  # the class NAME of the owner module has these instance fields (`params`): dataclass fields,
#                    class attributes or `self.X = ...` in its source or a base's
MODULE_NAME = "module name"  # the owner module has NAME, the very object at `same_as`
FORWARD_KEYWORDS = "forward keyword"  # NAME is a keyword of the forward the owner function installs on a model (a
#                    function nested in it), with `keywords` beside it

GRPO = "trl.trainer.grpo_trainer:GRPOTrainer"
VLLM = "trl.generation.vllm_generation:VLLMGeneration"


@dataclass(frozen=True)
class Entry:
    name: str  # as the code spells it
    owner: str  # "module" or "module:Class": where the name is looked up
    kind: str  # METHOD | ATTRIBUTE | FIELDS | MODULE_NAME | FORWARD_KEYWORDS
    breaks: str  # what stops working without it
    params: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    same_as: str = ""

    @property
    def label(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name} ({self.kind})"


CONTRACT = (
    Entry("_generate", GRPO, METHOD, params=("prompts",),
          breaks="the INVALID_CALL answer to malformed tool calls (tool_tables is read right before it) and "
                 "demonstration_field (demonstrations replace unsolved groups' last completions in its output)"),
    Entry("_calculate_rewards", GRPO, METHOD, params=("inputs", "prompts", "completions", "completion_ids_list"),
          breaks="diag/* metrics, skip_zero_advantage_batches, tool metrics and the `episode` column, and "
                 "demonstration_field's quiet scoring of the sampled completions"),
    Entry("_generate_and_score_completions", GRPO, METHOD, params=("inputs",),
          breaks="diag/* metrics (the batch's advantages), skip_zero_advantage_batches and share_prompt_forward "
                 "(batch keys that travel with each row), demonstration_field (the batch's rows), dynamic sampling "
                 "and the curriculum (more rounds of it; its output's keys and padding: sampling.merge)"),
    Entry("_get_per_token_logps_and_entropies", GRPO, METHOD,
          params=("model", "input_ids", "attention_mask", "logits_to_keep"), keywords=("compute_entropy",),
          breaks="share_prompt_forward (the loss's log-probabilities from the group's shared prompt cache)"),
    Entry("_metrics", GRPO, ATTRIBUTE,
          breaks="every metric the recipes add (diag/*, tools/*, frac_rows_skipped, frac_rows_prompt_shared, "
                 "demonstrations/*, the policy's own reward means in place of the trained batch's): TRL's `log` "
                 "averages this dict of lists"),
    Entry("_log_completion_extra", GRPO, METHOD, params=("column", "values"),
          breaks="the `episode` and `demonstration` columns of the completions table, and muting reward functions' "
                 "log_extra while demonstration_field scores quietly"),
    Entry("_log_metric", GRPO, METHOD, params=("name", "value"),
          breaks="muting reward functions' log_metric while demonstration_field scores quietly (metrics twice)"),
    Entry("_logs", GRPO, ATTRIBUTE,
          breaks="dynamic sampling's completions table: the rows of the batch trained on in place of the last "
                 "refill round's (completion_rows / set_completion_rows read and rewrite its deques)"),
    Entry("_sync_tool_dicts", GRPO, ATTRIBUTE,
          breaks="the INVALID_CALL tool added to each rollout's tool table: a malformed call would end its episode "
                 "silently (tool_tables raises instead)"),
    Entry("_prepare_inputs", GRPO, METHOD, params=("generation_batch",),
          breaks="nothing but a name on the dashboard: TRL times this step as `_prepare_inputs`, logged as "
                 "walltime/prepare_batch (PROFILED_BLOCKS); renamed, it shows under its new name"),
    Entry("_dist", GRPO, ATTRIBUTE,
          breaks="held-out evaluation under FSDP (v1): parameters gathered as TRL's generation gathers them"),
    Entry("summon_full_params", "trl.distributed:DistributedBackend", METHOD, params=("module",),
          keywords=("recurse",), breaks="held-out evaluation under FSDP (v1) (trainer._dist.summon_full_params)"),
    Entry("VLLMGeneration", "trl.trainer.grpo_trainer", MODULE_NAME, same_as=VLLM,
          breaks="vLLM on a CPU trainer: GRPOTrainer.__init__ builds its vLLM backend through this module-level "
                 "name, which vllm_backend_built_by swaps for vllm_cpu_sync's factory (it raises instead)"),
    Entry("VLLMGeneration", "trl.generation.vllm_generation", METHOD, keywords=("accelerator",),
          breaks="vLLM on a CPU trainer: vllm_cpu_sync's factory picks the backend class by the accelerator's device"),
    Entry("VLLMGeneration", "trl.generation.vllm_generation", FIELDS,
          params=("accelerator", "mode", "tensor_parallel_size", "server_base_url", "server_host", "server_port",
                  "group_port", "server_timeout"),
          breaks="vLLM on a CPU trainer: CPUVLLMGeneration's start-up reads TRL's settings"),
    Entry("_init_vllm", VLLM, METHOD,
          breaks="vLLM on a CPU trainer: its start-up (server mode without NCCL, colocate's CPU engine settings)"),
    Entry("_iter_named_params", VLLM, METHOD,
          breaks="vLLM on a CPU trainer: the weight sync (each parameter under vLLM's name, PEFT adapters merged)"),
    Entry("VLLMClient", "trl.generation.vllm_generation", METHOD,
          keywords=("base_url", "group_port", "connection_timeout"),
          breaks="vLLM server mode on a CPU trainer: the client CPUVLLMGeneration builds as TRL does"),
    Entry("RepeatSampler", "trl.trainer.utils", FIELDS, params=("shuffle", "seed", "num_samples", "generator"),
          breaks="a resumed run's data order: checkpoint.py re-derives the sampler's generator for the epoch"),
    Entry("fused_lm_head", "trl.trainer.utils:add_fused_lm_head", FORWARD_KEYWORDS, keywords=("shift_labels",),
          breaks="share_prompt_forward: a row's log-probabilities from the fused LM head GRPOTrainer adds"),
    Entry("_use_triton", "trl.trainer.utils", MODULE_NAME, same_as="trl.kernels.chunked_logprob:_use_triton",
          breaks="fused_head_on_labels: the fused LM head scores every position on CPU again (a slower sft stage, "
                 "the same loss)"),
    Entry("FusedCausalLMOutput", "trl.trainer.utils", FIELDS, params=("log_probs", "entropy"),
          breaks="share_prompt_forward: the fused forward's per-token log-probabilities and entropies"),
    Entry("DynamicCache", "transformers.cache_utils", METHOD, params=("ddp_cache_data",), keywords=("config",),
          breaks="share_prompt_forward: a cache built from the group's prompt keys and values; its start-up check"),
    Entry("DynamicCache", "transformers.cache_utils", FIELDS, params=("layers",),
          breaks="share_prompt_forward: the prompt's keys and values, layer by layer; its start-up check"),
    Entry("DynamicLayer", "transformers.cache_utils", FIELDS, params=("keys", "values"),
          breaks="share_prompt_forward: a plain full-attention cache layer (anything else turns sharing off)"),
)

# Modules whose names are TRL's internals: importing from them happens here only (tests/test_layering.py), unless the
# name imported is one `trl` itself exports.
INTERNAL_MODULES = ("trl.trainer", "trl.generation", "trl.distributed")


def private_names(contract=CONTRACT) -> set[str]:
    """The internal names no other module may spell (tests/test_layering.py): the contract's private names, and the
    keyword TRL adds to the model's forward."""
    return {e.name for e in contract if e.name.startswith("_") or e.kind == FORWARD_KEYWORDS}


def versions() -> str:
    return f"TRL {trl.__version__}, transformers {transformers.__version__}"


def resolve(path: str) -> Any:
    module, _, qualified = path.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, qualified.split(".")):
        obj = getattr(obj, part)
    return obj


def _sets_on_self(cls: type, name: str) -> bool:
    """`self.NAME = ...` (or annotated, or augmented) in the source of `cls` or of one of its bases."""
    return any(name in _self_attributes(klass) for klass in inspect.getmro(cls)
               if klass is not object and klass.__module__ != "builtins")


@functools.lru_cache(maxsize=None)
def _self_attributes(klass: type) -> frozenset[str]:
    """The names a class's own source assigns on `self` (parsed once: Trainer's source is thousands of lines)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return frozenset(names)


def _has_field(cls: type, name: str) -> bool:
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    return hasattr(cls, name) or _sets_on_self(cls, name)


def _signature_problem(func, params: tuple[str, ...], keywords: tuple[str, ...]) -> str | None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        return f"has no readable signature ({exc})"
    names = [p.name for p in signature.parameters.values()]
    if inspect.isfunction(func) and names[:1] == ["self"]:  # looked up on the class: drop self
        names = names[1:]
    kinds = {p.name: p.kind for p in signature.parameters.values()}
    if names[: len(params)] != list(params):
        return f"takes ({', '.join(names)}), not ({', '.join(params)}, ...) first"
    open_kwargs = inspect.Parameter.VAR_KEYWORD in kinds.values()
    missing = [k for k in keywords if k not in kinds and not open_kwargs]
    missing += [k for k in keywords if kinds.get(k) == inspect.Parameter.POSITIONAL_ONLY]
    if missing:
        return f"takes no keyword {', '.join(missing)} (its parameters: {', '.join(names)})"
    return None


def _nested_keywords(func) -> set[str]:
    """Keyword names of the functions defined inside `func` (the forward it installs)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    outer = tree.body[0]
    found = set()
    for node in ast.walk(outer):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not outer:
            args = node.args
            found |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    return found


def contract_problem(entry: Entry, owner: Any = None) -> str | None:
    """What the installed TRL / transformers lacks of `entry` (None: nothing). `owner` replaces the object the entry
    names as its owner (tests check fakes with it)."""
    try:
        problem = _problem(entry, resolve(entry.owner) if owner is None else owner)
    except (ImportError, AttributeError) as exc:
        problem = f"cannot be looked up ({exc!r})"
    if problem is None:
        return None
    return (f"{entry.label}: {problem}. Installed: {versions()}. Without it: {entry.breaks}. "
            "Re-check grpo_recipes/trl_internals.py against this version.")


def _problem(entry: Entry, owner: Any) -> str | None:
    if entry.kind == FORWARD_KEYWORDS:
        missing = [k for k in (entry.name, *entry.keywords) if k not in _nested_keywords(owner)]
        return f"installs a forward without the keyword {', '.join(missing)}" if missing else None
    if not hasattr(owner, entry.name):
        if entry.kind == ATTRIBUTE and isinstance(owner, type):
            return None if _sets_on_self(owner, entry.name) else "is no longer set on the instances"
        return "is gone"
    obj = getattr(owner, entry.name)
    if entry.kind == ATTRIBUTE:  # a class attribute of that name (a default) counts as well
        return None
    if entry.kind == METHOD:
        if not callable(obj):
            return f"is no longer callable ({type(obj).__name__})"
        return _signature_problem(obj, entry.params, entry.keywords)
    if entry.kind == FIELDS:
        if not isinstance(obj, type):
            return f"is no longer a class ({type(obj).__name__})"
        missing = [f for f in entry.params if not _has_field(obj, f)]
        return f"has no field {', '.join(missing)}" if missing else None
    if entry.kind == MODULE_NAME:
        expected = resolve(entry.same_as)
        return None if obj is expected else f"is {obj!r}, no longer {entry.same_as.replace(':', '.')}"
    raise ValueError(f"unknown contract kind {entry.kind!r}")


# ------------------------------------------------------------------------------------------------ GRPOTrainer


class HookedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose private steps call public hooks. Every default hook leaves TRL's behaviour as it is."""

    # -- hooks

    def before_generation(self, prompts) -> None:
        """Right before TRL generates for `prompts` (its per-rollout tool tables are built: tool_tables())."""

    def generating(self):
        """A context manager TRL's generation for the prompts of before_generation runs inside."""
        return nullcontext()

    def generated(self, prompts, output):
        """TRL's generation output for `prompts` (prompt_ids, completion_ids, tool_mask, completions, logprobs,
        ...), as the scoring will read it."""
        return output

    def scored_rewards(self, inputs, prompts, completions, completion_ids, rewards: torch.Tensor) -> torch.Tensor:
        """TRL's rewards (rows gathered over all processes, one column per reward function) for the batch."""
        return rewards

    def scoring_batch(self, inputs) -> None:
        """Before TRL generates and scores the generation batch `inputs` (this process's rows)."""

    def refilled(self, inputs, output: dict) -> dict:
        """TRL's scored batch, right after TRL's step, before scored_batch: a batch to train on in its place (built
        with trl_generate_and_score for more rows) or the same one."""
        return output

    def scored_batch(self, inputs, output: dict) -> dict:
        """TRL's scored batch (this process's slice: ids, masks, advantages, ...)."""
        return output

    def shared_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        """The (log-probabilities, entropies, aux loss) TRL would compute, worked out another way; None: TRL's."""
        return None

    # -- TRL's private state

    def metrics(self, mode: str) -> dict[str, list]:
        """name -> values of the logging window, for `mode` ("train" / "eval"); TRL's `log` averages them."""
        return self._metrics[mode]

    def log_extra_column(self, name: str, values: list) -> None:
        """A column of TRL's completions table, one value per row of this process's batch."""
        self._log_completion_extra(name, values)

    @contextmanager
    def reward_logging_muted(self):
        """While it lasts, the log_metric and log_extra that TRL hands reward functions go nowhere."""
        self._log_metric = self._log_completion_extra = lambda *args, **kwargs: None
        try:
            yield
        finally:
            del self._log_metric, self._log_completion_extra  # the instance attributes: TRL's methods again

    def trl_rewards(self, inputs, prompts, completions, completion_ids) -> torch.Tensor:
        """TRL's own reward step (gathered over all processes), without the scored_rewards hook."""
        return GRPOTrainer._calculate_rewards(self, inputs, prompts, completions, completion_ids)

    def completion_rows(self) -> dict:
        """The completions table's rows of the last scored batch, every process's (what TRL's `log` writes): prompt,
        completion, advantages, and rewards and extra columns by name."""
        logs = self._logs
        return {"prompt": list(logs["prompt"]), "completion": list(logs["completion"]),
                "advantages": list(logs["advantages"]), "rewards": {k: list(v) for k, v in logs["rewards"].items()},
                "extra": {k: list(v) for k, v in logs["extra"].items()}}

    def set_completion_rows(self, rows: dict) -> None:
        """`rows` (completion_rows' shape) in place of the completions table's rows."""
        logs = self._logs
        for key in ("prompt", "completion", "advantages"):
            logs[key].clear()
            logs[key].extend(rows[key])
        for part in ("rewards", "extra"):
            logs[part].clear()
            for name, values in rows[part].items():
                logs[part][name].extend(values)

    def tool_tables(self) -> list[dict]:
        """name -> function, one table per rollout of the batch being generated (sync tools): TRL builds them right
        before generating, so read them in before_generation."""
        tables = getattr(self, "_sync_tool_dicts", None)
        if tables is None:  # TRL changed its internals: fail loudly rather than let malformed calls end episodes
            raise RuntimeError(f"{type(self).__name__}: GRPOTrainer no longer builds _sync_tool_dicts; update "
                               "tool_tables in grpo_recipes/trl_internals.py (the INVALID_CALL hook)")
        return tables

    # -- TRL's private steps, each calling its hooks

    def _generate(self, prompts):
        self.before_generation(prompts)
        with self.generating():
            output = super()._generate(prompts)
        return self.generated(prompts, output)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self.scored_rewards(inputs, prompts, completions, completion_ids_list, rewards)

    def _generate_and_score_completions(self, inputs):
        self.scoring_batch(inputs)
        output = self.refilled(inputs, super()._generate_and_score_completions(inputs))
        return self.scored_batch(inputs, output)

    def trl_generate_and_score(self, rows) -> dict:
        """TRL's generation and scoring step for `rows` (this process's), its generation and reward hooks included,
        without scoring_batch, refilled and scored_batch."""
        return GRPOTrainer._generate_and_score_completions(self, rows)

    def loss_mask_count(self, output: dict) -> torch.Tensor:
        """num_items_in_batch as TRL's step computes it: the loss mask's tokens, summed over every process."""
        mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            mask = mask * output["tool_mask"]
        return self.accelerator.gather(mask.sum()).sum()

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args,
                                           compute_entropy=False, **kwargs):
        shared = self.shared_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy)
        if shared is not None:
            return shared
        return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args,
                                                          compute_entropy=compute_entropy, **kwargs)


def summon_full_params(trainer):
    """The context TRL's own generation runs the wrapped model under: full FSDP (v1) parameters, a no-op otherwise.
    A trainer that is no GRPOTrainer (an sft stage's SFTTrainer) has no such helper: a no-op."""
    if not isinstance(trainer, GRPOTrainer):
        return nullcontext()
    return trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False)


# ------------------------------------------------------------------------------------------------ vLLM


class HookedVLLMGeneration(trl_vllm_generation.VLLMGeneration):
    """TRL's vLLM backend with public names for the private start-up and weight iterator a subclass uses."""

    def _init_vllm(self):
        return self.start_engine()

    def start_engine(self):
        """Start the colocated engine or connect to the server (TRL's own start-up unless overridden)."""
        return super()._init_vllm()

    def named_params(self):
        """Each parameter under the name vLLM expects, PEFT adapters merged. Gathering is collective: every process
        iterates."""
        return self._iter_named_params()

    def server_client(self, base_url: str):
        """TRL's client for a vLLM server, built as TRL builds it (without joining its NCCL group)."""
        return trl_vllm_generation.VLLMClient(base_url=base_url, group_port=self.group_port,
                                              connection_timeout=self.server_timeout)


def trl_vllm_class() -> type:
    """TRL's own vLLM backend class."""
    return trl_vllm_generation.VLLMGeneration


@contextmanager
def vllm_backend_built_by(factory):
    """Make `GRPOTrainer.__init__`, run inside this block, build its vLLM backend with `factory` (called with TRL's
    arguments). Only the module-level name that GRPOTrainer.__init__ looks up is replaced, and only for the block.
    Fails loudly if TRL stops building its vLLM backend through that name."""
    original = getattr(trl_grpo_trainer, "VLLMGeneration", None)
    if original is not trl_vllm_generation.VLLMGeneration:
        raise RuntimeError("trl.trainer.grpo_trainer no longer builds trl.generation.vllm_generation.VLLMGeneration "
                           "by that name: grpo_recipes/trl_internals.py and vllm_cpu_sync.py must be re-checked "
                           "against this TRL version")
    trl_grpo_trainer.VLLMGeneration = factory
    try:
        yield
    finally:
        trl_grpo_trainer.VLLMGeneration = original


# ------------------------------------------------------------------------------------------------ RepeatSampler


def _find_repeat_sampler(obj: Any, depth: int = 0):
    if isinstance(obj, RepeatSampler):
        return obj
    if obj is None or depth > 4:
        return None
    for attr in ("sampler", "batch_sampler", "base_dataloader"):
        found = _find_repeat_sampler(getattr(obj, attr, None), depth + 1)
        if found is not None:
            return found
    return None


def seeded_repeat_sampler(dataloader) -> RepeatSampler | None:
    """TRL's RepeatSampler behind `dataloader` when it shuffles from a seed (so its order can be replayed)."""
    sampler = _find_repeat_sampler(dataloader)
    if sampler is None or not sampler.shuffle or sampler.seed is None:
        return None
    return sampler


def set_epoch_order(sampler: RepeatSampler, epoch: int) -> None:
    """Put the sampler's generator where an uninterrupted run's stands at the start of `epoch` (0-based).

    RepeatSampler draws one permutation per epoch from a generator seeded once: re-derive it for this epoch."""
    generator = torch.Generator()
    generator.manual_seed(sampler.seed)
    for _ in range(epoch):
        torch.randperm(sampler.num_samples, generator=generator)
    sampler.generator = generator


# ------------------------------------------------------------------------------------------------ prompt sharing


def _cache_names(model) -> tuple[str, str]:
    """The forward's cache argument and output attribute: `cache` from transformers ~5.20, `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the model
    if "cache" in inspect.signature(type(base).forward).parameters:
        return "cache", "cache"
    return "past_key_values", "past_key_values"


def non_full_attention_cache(config) -> list[str]:
    """The kinds of the cache layers of a model whose cache is not plain full attention (DynamicLayer), else []."""
    layers = DynamicCache(config=config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return sorted({type(layer).__name__ for layer in layers}) or ["none"]
    return []


def prompt_key_values(model, input_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run `input_ids` (1, n) with a cache: each layer's keys and values, in the forward's graph."""
    _, attr = _cache_names(model)
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in getattr(out, attr).layers]


def fused_logps_after(model, key_values, input_ids: torch.Tensor, labels: torch.Tensor):
    """(log-probabilities, entropies) of `labels`, each the next token of `input_ids` (both (1, n)), run after the
    cache `key_values`, through the fused LM head GRPOTrainer adds to the model (TRL's temperature, no logits)."""
    arg, _ = _cache_names(model)
    out = model(input_ids=input_ids, **{arg: DynamicCache(key_values)}, shift_labels=labels, fused_lm_head=True)
    return out.log_probs, out.entropy


# ---------------------------------------------------------------------------------------------- the fused LM head


@contextmanager
def fused_head_on_labels():
    """While it lasts, TRL's fused LM head (add_fused_lm_head: SFTTrainer's loss, GRPOTrainer's log-probabilities)
    projects only the positions that have a label onto the vocabulary, on CPU as on Triton devices.

    TRL scores every position elsewhere than on Triton devices, so that tile shapes stay fixed for compilers (Neuron).
    On CPU nothing compiles, and a position without a label (a prompt token: most of a math default sft row) is a
    vocabulary projection whose result is masked to zero. Scoring the labelled positions alone gives the same loss,
    entropy, accuracy and gradient (tests/test_trl_contract.py) for less CPU (bench/fused_head.py). Which positions are scored is decided by this one name in
    trl.trainer.utils; the kernels read their own.
    """
    module = importlib.import_module("trl.trainer.utils")
    original = module._use_triton
    module._use_triton = lambda device: device.type == "cpu" or original(device)
    try:
        yield
    finally:
        module._use_triton = original


# ------------------------------------------------------------------------------------------ TRL's profiled blocks

# TRL's profiling_decorator and profiling_context log the seconds a block took as `profiling/Time taken:
# <Trainer class>.<name>`, named after a private method or a reward function. What each named block times, in the
# word tracking.py logs it under (walltime/<word>; a reward function's own block: walltime/rewards/<its name>). A block
# TRL adds or renames is logged under its own name, underscores stripped: reading TRL's profiling_* uses again after
# an upgrade keeps the names public (tests/test_dashboard.py lists a run's timings).
PROFILED_BLOCKS = {
    "transformers.generate": "generation", "transformers.generate_batch": "generation", "vLLM.generate": "generation",
    "sync_weights": "weight_sync",  # the policy's weights sent to vLLM
    "_prepare_inputs": "prepare_batch",  # each micro-batch: the generation and scoring when a new batch is due
    "_calculate_rewards": "rewards",  # every reward function of a batch
    "_get_per_token_logps_and_entropies": "logprobs",  # a forward pass for per-token log-probs (and entropies)
    "_get_last_hidden_state": "hidden_states",  # a DistillationTrainer forward pass
    "compute_loss": "loss",  # the loss's forward pass (its backward is not timed)
}
