"""Tools and their guard: every failure is a tool message the model reads, never an exception in the trainer."""

import threading

import pytest
from transformers.utils import get_json_schema

from grpo_recipes.tools import registry as T
from grpo_recipes.tools.episodes import classify
from grpo_recipes.tools.registry import ToolError, guarded, invalid_call_handler, tool
from grpo_recipes.tools.templates import INVALID_CALL


def _def(func, timeout_s=5.0):
    tool(timeout_s=timeout_s)(func)
    return guarded(T.registered()[func.__name__], {})


@pytest.fixture
def calc(tools):
    return tools[0]


@pytest.fixture
def python(tools):
    return tools[1]


# ---- calculator -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, want", [
    ("95 - 21 / 21", "94"), ("-7 - -45 * -90", "-4057"), ("( 56 + -33 ) - 84", "-61"), ("478 / 1 + -682", "-204"),
    ("2^10", "1024"), ("3 × 4 ÷ 6", "2"), ("0.1 + 0.2", "0.3"), ("1/3", "0.3333333333 (rounded; exactly 1/3)"),
    ("12345678901234567890 * 98765432109876543210", str(12345678901234567890 * 98765432109876543210)),
    ("7 // 2 + 7 % 2", "4"), ("2 ** -2", "0.25"), ("1 + 2 =", "3"),
])
def test_calculator_is_exact(calc, expr, want):
    assert calc(expression=expr) == want


@pytest.mark.parametrize("expr, problem", [
    ("Calculate 1 + 2", "cannot parse"), ("1 / 0", "division by zero"), ("0 ** -1", "division by zero"),
    ("2 ** 0.5", "whole numbers"), ("9 ** 9 ** 9", "whole numbers"), ("99999999999 ** 60", "too large"),
    ("__import__('os').system('true')", "unsupported element"), ("(1).__class__", "unsupported element"),
    ("x + 1", "unsupported element"), ("[1, 2]", "unsupported element"), ("'a' * 3", "unsupported element"),
    ("1 + " * 60 + "1", "longer than"), ("", "non-empty"), ("True + 1", "unsupported element"),
    ("(" * 120 + "1" + ")" * 60, "cannot parse"), ("1\x00+1", "cannot parse"), ("-" * 199 + "1", None),
])
def test_calculator_refuses_with_a_message(calc, expr, problem):
    out = calc(expression=expr)
    if problem is None:  # deep but valid: answered, not an error
        assert out == "-1"
        return
    assert out.startswith("error (tool_error): ") and problem in out


def test_calculator_bounds_intermediate_size(calc):
    # each step squares: the bound stops it long before the numbers get expensive
    out = calc(expression="((((((((2**60)**2)**2)**2)**2)**2)**2)**2)")
    assert out.startswith("error (tool_error): ") and "too large" in out


# ---- the guard ------------------------------------------------------------------------------------------------

def test_bad_arguments_are_reported_with_the_signature(calc):
    for kwargs in ({}, {"expr": "1"}, {"expression": "1", "extra": 2}):
        out = calc(**kwargs)
        assert out.startswith("error (bad_arguments): calculator:") and "arguments are: expression" in out
    assert calc(expression=12) == "12"  # a number where a string is expected is converted, losslessly


def test_a_raising_tool_is_an_exception_message():
    def crashes(x: int) -> str:
        """Crash.

        Args:
            x: anything
        """
        raise KeyError("boom")

    assert _def(crashes)(x=1) == "error (exception): KeyError: 'boom'"


def test_tool_error_kind_is_kept():
    def picky(x: int) -> str:
        """Refuse.

        Args:
            x: anything
        """
        raise ToolError("no", kind="program_error")

    assert _def(picky)(x=1) == "error (program_error): no"
    with pytest.raises(ValueError, match="kind must be one of"):
        ToolError("x", kind="whatever")


def test_a_hanging_tool_times_out_and_training_goes_on():
    release = threading.Event()

    def hangs(x: int) -> str:
        """Hang until released.

        Args:
            x: anything
        """
        release.wait()
        return "late"

    before = T.hung_calls()
    assert _def(hangs, timeout_s=0.2)(x=1) == "error (timeout): hangs did not answer within 0.2s"
    assert T.hung_calls() == before + 1  # counted: the thread is still blocked
    release.set()


def test_results_are_strings_and_capped():
    def big(n: int) -> str:
        """Big output.

        Args:
            n: size
        """
        return "x" * n

    g = _def(big)
    assert g(n=10) == "x" * 10
    out = g(n=T.MAX_RESULT_CHARS + 500)
    assert len(out) < T.MAX_RESULT_CHARS + 40 and out.endswith("[500 chars cut]")


def test_settings_are_hidden_from_the_schema_and_set_from_params():
    def scaled(x: int, *, factor: int = 2) -> str:
        """Scale.

        Args:
            x: the number
        """
        return str(x * factor)

    tool(scaled)
    d = T.registered()["scaled"]
    schema = get_json_schema(guarded(d, {}))["function"]
    assert list(schema["parameters"]["properties"]) == ["x"]
    assert guarded(d, {"factor": 10})(x=3) == "30"
    assert guarded(d, {})(x=3, factor=10).startswith("error (bad_arguments)")  # the model cannot set a setting
    with pytest.raises(ValueError, match="no setting \\['fator'\\]"):
        guarded(d, {"fator": 1})


@pytest.mark.parametrize("src, problem", [
    ("def f(x: int) -> str:\n    return ''", "no docstring"),
    ("def f(x) -> str:\n    '''D.\n\n    Args:\n        x: y\n    '''", "missing a type hint"),
    ("def f(x: int) -> str:\n    '''D.'''", "no description for the argument 'x'"),
    ("def invalid_tool_call(x: int) -> str:\n    '''D.\n\n    Args:\n        x: y\n    '''", "reserved"),
    ("def f(*args: int) -> str:\n    '''D.'''", "hide the contract"),
])
def test_bad_tools_fail_at_registration(src, problem):
    ns = {}
    exec(src, ns)  # noqa: S102 - test fixtures: small function definitions
    func = next(v for k, v in ns.items() if callable(v) and k != "__builtins__")
    with pytest.raises(Exception, match=problem):
        tool(func)


def test_invalid_call_handler_explains():
    h = invalid_call_handler(lambda: ["calculator", "python"])
    assert h.__name__ == INVALID_CALL
    out = h(problem="not valid JSON", text="{", kind="malformed")
    assert classify(out) == "malformed" and '<tool_call>' in out
    out = h(problem="no tool named 'calc'", kind="unknown_tool")
    assert classify(out) == "unknown_tool" and "calculator, python" in out


def test_classify():
    assert classify("94") is None
    assert classify("error (timeout): x") == "timeout"
    assert classify("{'error': 'Tool x not found.'}") == "unguarded"
    assert classify("the error (timeout): is not at the start") is None


# ---- the python tool: the sandbox's limits reach the model as messages ---------------------------------------

def test_python_prints(python):
    assert python(code="print(95 - 21 // 21)") == "94"
    assert python(code="x = 1").startswith("(the program printed nothing")


def test_python_error_shows_the_program_traceback_only(python):
    out = python(code="1/0")
    assert out.startswith("error (program_error): ") and "ZeroDivisionError" in out
    assert 'File "<string>"' not in out  # the harness's frames are not the model's business


def test_python_timeout(python):  # the tools fixture sets timeout_s 2 for python
    assert python(code="while True: pass") == "error (timeout): the program ran longer than 2s and was stopped"


def test_python_memory_limit(python):
    out = python(code="x = bytearray(2 * 1024**3)\nprint(len(x))")
    assert out.startswith("error (program_error): ") and "MemoryError" in out


def test_python_cannot_reach_the_trainer_filesystem(python, tmp_path):
    target = tmp_path / "pwned"
    out = python(code=f"open({str(target)!r}, 'w').write('x')\nprint('wrote')")
    assert not target.exists()
    assert out.startswith("error (program_error): ")


def test_python_output_is_capped(python):
    out = python(code="print('y' * 100000)")
    assert len(out) <= T.MAX_RESULT_CHARS + 40


# ---- environments ------------------------------------------------------------------------------------------------

def test_environment_methods_are_guarded_tools_and_trl_sees_them():
    import inspect as _inspect

    from grpo_recipes.tools.registry import environment, environments

    @environment("counter_t", timeout_s=1)
    class Counter:
        def reset(self, **row):  # TRL passes every dataset column, `prompt` included
            self.n, self.calls = 0, []

        def add(self, k: int) -> str:
            """Add k.

            Args:
                k: how much
            """
            if k < 0:
                raise ToolError("k must be >= 0")
            self.n += k
            self.calls.append(k)
            return str(self.n)

        def get_reward(self) -> float:
            return float(self.n == 3)

    env = Counter()
    env.reset(prompt=[], answer="3")
    assert get_json_schema(env.add)["function"]["parameters"]["properties"] == {"k": {"type": "integer",
                                                                                    "description": "how much"}}
    assert (env.add(k=1), env.add(k=2), env.add(k=-1), env.add()) == (
        "1", "3", "error (tool_error): k must be >= 0",
        "error (bad_arguments): add: missing a required argument: 'k'; its arguments are: k")
    assert env.get_reward() == 1.0 and env.calls == [1, 2]
    # what GRPOTrainer.__init__ lists as the environment's tools (reset/get_reward/_private excluded there)
    assert [m for m, _ in _inspect.getmembers(Counter, predicate=_inspect.isfunction)
            if m not in ("reset", "get_reward") and not m.startswith("_")] == ["add"]
    assert environments()["counter_t"] is Counter


def test_environment_without_reset_is_refused():
    from grpo_recipes.tools.registry import environment

    with pytest.raises(TypeError, match="needs a reset"):
        environment("bad_t")(type("Bad", (), {}))
