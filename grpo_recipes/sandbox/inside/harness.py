"""The program's side of a job: run the program, then each test's steps (or the program as a script, per case).

Everything here is imported by the zygote before any program exists, and nothing is imported later: a program
that plants modules in sys.modules or files on sys.path cannot reach the harness's code through an import.

Tests arrive already split by the host (grpo_recipes/sandbox/split.py). A test in host mode is a list of steps:
statements to run and expressions whose values go back to the host, encoded as plain data (codec.py). The host
holds the expected values and decides. A test the host could not split arrives as code, runs here, and its
verdict is this harness's report: that is the weaker, "sandbox" mode.

Records go to fd 3, one line each: `<nonce> <json>`. The program can write there too; for host-mode tests that
only lets it report values it could have returned anyway.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import sys
import traceback

from . import codec

# Bound before any program runs. A program can still rebind module attributes or walk frames to reach these:
# in host mode that gains nothing, in sandbox mode it is the documented weakness.
_write, _exec, _eval, _compile, _BaseException, _iter = os.write, exec, eval, compile, BaseException, iter
_print_exception, _dumps, _encode, _decode = traceback.print_exception, json.dumps, codec.encode, codec.decode
PRISTINE_BUILTINS = dict(builtins.__dict__)
_BUILTIN_NAMES = frozenset(PRISTINE_BUILTINS)


def _report(exc: BaseException) -> None:
    try:
        _print_exception(type(exc), exc, exc.__traceback__)
    except _BaseException:
        pass


class _Channel:
    def __init__(self, nonce: str, fd: int = 3):
        self.prefix, self.fd = nonce + " ", fd

    def emit(self, *record) -> None:
        data = (self.prefix + _dumps(record, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[_write(self.fd, view):]


def _flush() -> bool:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        return True
    except _BaseException:
        return False


def fresh_namespace(program_ns: dict, program_names: bool = False) -> dict:
    """A test's globals: the program's names, except any that shadow a builtin (unless the host split the test to
    call the program's own `sum`: `program_names`), and an untouched builtins copy.

    Each test gets its own, so a test (or the program) cannot leave a rebound `type` or `isinstance` for the next.
    """
    ns = {k: v for k, v in program_ns.items()
          if (program_names or k not in _BUILTIN_NAMES) and not k.startswith("__")}
    ns["__builtins__"] = dict(PRISTINE_BUILTINS)
    ns["__name__"] = "__test__"
    return ns


def _run_step(step: tuple, ns: dict, filename: str) -> object:
    kind, source, bindings, target = step[:4]
    for name, tokens in bindings:
        ns[name] = _decode(tokens)
    if kind == "exec":
        _exec(_compile(source, filename, "exec"), ns)
        return None
    value = _eval(_compile(source, filename, "eval"), ns)
    if target is not None:
        names, unpack = target
        if unpack:
            items = tuple(_iter(value))
            if len(items) != len(names):
                raise ValueError("cannot unpack %d values into %d names" % (len(items), len(names)))
            for name, item in zip(names, items):
                ns[name] = item
        else:
            ns[names[0]] = value
    return value


def run_tests(job: dict, channel: _Channel) -> int:
    channel.emit("ready")
    program_ns = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        _exec(_compile(job["program"], "<program>", "exec"), program_ns)
        loaded = True
    except _BaseException as exc:
        _report(exc)
        loaded = False
    channel.emit("load", loaded)
    for i, (mode, body, program_names) in enumerate(job["tests"] if loaded else ()):
        ns = fresh_namespace(program_ns, program_names)
        filename = "<test %d>" % i
        if mode == "sandbox":
            ok = False
            try:
                _exec(_compile(body, filename, "exec"), ns)
                ok = True
            except _BaseException as exc:
                _report(exc)
            channel.emit("verdict", i, ok)
            continue
        for j, step in enumerate(body):
            try:
                value = _run_step(step, ns, filename)
            except _BaseException as exc:
                _report(exc)
                channel.emit("raised", i, j, type(exc).__name__)
                if step[5]:  # the test stops here, as it would in Python; a short-circuited operand may not
                    break
                continue
            if not step[4]:  # the host does not need this value
                channel.emit("ran", i, j)
                continue
            try:
                tokens = _encode(value)
            except _BaseException as exc:
                channel.emit("opaque", i, j, str(exc)[:200])
                continue
            channel.emit("value", i, j, tokens)
        channel.emit("end", i)
    _flush()
    channel.emit("done")
    return 0


def run_script(job: dict, channel: _Channel) -> int:
    """What `python main.py` does: run it, turn SystemExit into the exit code, wait for threads, run atexit."""
    channel.emit("ready")
    os.close(channel.fd)
    sys.argv = ["main.py"]
    code = 0
    try:
        _exec(_compile(job["program"], "main.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except _BaseException as exc:
        _report(exc)
        code = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
    except _BaseException as exc:
        _report(exc)
    return code if _flush() else 120


def run(job: dict) -> int:
    channel = _Channel(job["nonce"])
    os.set_inheritable(channel.fd, False)  # programs it execs need not see the channel
    return run_script(job, channel) if job["kind"] == "io" else run_tests(job, channel)
