"""Run untrusted Python programs against tests, each in its own throwaway sandbox. Design and limits: docs/sandbox.md.

    run_tests(program, ["assert f(2) == 4"])            -> SandboxResult(passed, total, status, ..., modes)
    run_io_tests(program, [("1 2\\n", "3\\n")])          -> the program reads stdin; its stdout is compared here
    run_many([Job(...), ...], max_workers=8)            -> many jobs in parallel over a bounded pool
    run_program(code, stdin="...")                      -> ProgramResult(status, returncode, stdout, stderr, ...)

The host decides every verdict it can: tests are split (split.py) so that the program's calls run in the sandbox
and their values come back as plain data, while the comparisons and expected values stay here. Each job runs
under a supervisor that is PID 1 of fresh pid and mount namespaces (each run of the program in its own ipc
namespace), in a network namespace with no connectivity and unix sockets only, inside a minimal read-only root
(the interpreter and its standard library, as inodes of the zygote's own), as a unique unprivileged uid, in a
per-job cgroup, under a seccomp filter. Jobs are forked from pre-started interpreters ("zygotes"). Where the
machine lacks a protection, `isolation()` says which at start-up; $GRPO_SANDBOX_REQUIRE makes the sandbox
refuse to run without it.

Layout: host.py (API, pool, detection), split.py (tests -> host-judged plans), verdict.py (records -> results),
judge.py (the process that reads a job's program and judges its values, under a CPU and memory budget), inside/
(everything that runs in the sandbox's interpreter: zygote, jail, harness, codec, seccomp, cgroup).
"""

from .host import (
    DISK_MB,
    ENV_ISOLATION,
    ENV_REQUIRE,
    IO_OUTPUT_CAP,
    MAX_WORKERS,
    NOFILE,
    NPROC,
    OUTPUT_CAP,
    PROTECTIONS,
    SANDBOX_MODE_TESTS,
    STATUSES,
    Isolation,
    Job,
    ProgramResult,
    SandboxResult,
    default_workers,
    isolation,
    run_io_tests,
    run_many,
    run_program,
    run_tests,
    shutdown,
)

__all__ = [
    "DISK_MB", "ENV_ISOLATION", "ENV_REQUIRE", "IO_OUTPUT_CAP", "MAX_WORKERS", "NOFILE", "NPROC", "OUTPUT_CAP",
    "PROTECTIONS", "SANDBOX_MODE_TESTS", "STATUSES", "Isolation", "Job", "ProgramResult", "SandboxResult",
    "default_workers", "isolation", "run_io_tests", "run_many", "run_program", "run_tests", "shutdown",
]
