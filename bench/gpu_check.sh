#!/usr/bin/env bash
# GPU check (bench/README.md, "GPU check"): the math recipe with every trainer feature on a random SmolLM2-135M-shaped
# model, checkpoint and resume, step time, tokens/s and peak memory.
#
#   bench/gpu_check.sh prepare          here, once: wheels and model files into .gpu-check/, the 64 MiB budget checked
#   bench/gpu_check.sh --device cpu     here: the CPU baseline (bench/results/gpu_check_cpu.json holds the last one)
#   bench/gpu_check.sh --device cuda    on the GPU machine, carrying .gpu-check: installs the wheels, runs the check
#
# Options after --device go to `bench/gpu_check.py run` (--steps, --resume-steps, --sft-steps, --out, -- FLAGS...);
# results go to $OUT when it is set. Python: $PYTHON, else .venv/bin/python here (cpu, prepare), python3 there (cuda).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

case "${1:-}" in
    prepare)
        shift
        exec env PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-.venv/bin/python}" bench/gpu_check.py prepare "$@" ;;
    --device)
        device=${2:-}
        [ -n "$device" ] || { echo "error: --device needs cuda or cpu" >&2; exit 2; }
        shift 2 ;;
    -h|--help)
        usage; exit 0 ;;
    *)
        usage >&2; echo "error: expected prepare or --device cuda|cpu, got '${1:-}'" >&2; exit 2 ;;
esac

case "$device" in
    cpu)
        python=${PYTHON:-.venv/bin/python}
        site= ;;
    cuda)
        python=${PYTHON:-python3}
        # The image lacks TRL and has older transformers: the carried wheels go first on the path, without their
        # dependencies (the image's torch, tokenizers, pyarrow... stay).
        [ -d .gpu-check/wheels ] || { echo "error: no .gpu-check/wheels: run 'bench/gpu_check.sh prepare' here and carry .gpu-check" >&2; exit 2; }
        site=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            .gpu-check/wheels/*.whl
        # compiled ones published only as source (pycosat): built here with the image's compiler and setuptools
        for sdist in .gpu-check/wheels/*.tar.gz; do
            [ -e "$sdist" ] || continue
            "$python" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
                --target "$site" "$sdist" || { echo "error: could not build $sdist on this machine" >&2; exit 2; }
        done ;;
    *)
        echo "error: --device must be cuda or cpu, got '$device'" >&2; exit 2 ;;
esac

export PYTHONPATH="$REPO${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -n "${OUT:-}" ]; then  # the whole log comes back with the results, even when the run is cut short
    mkdir -p "$OUT"
    "$python" bench/gpu_check.py run --device "$device" "$@" 2>&1 | tee "$OUT/gpu_check_$device.log"
    exit
fi
exec "$python" bench/gpu_check.py run --device "$device" "$@"
