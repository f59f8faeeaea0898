"""Split a test so that the host judges it: the program's calls run in the sandbox, the comparisons run here.

    plan = split_test("assert f(2) == 4")
    plan.steps     -> (("eval", "f(2)", (), None, True, True),)    what the sandbox runs: calls and their inputs
    plan.actions   -> (env, (("assert", <f(2) == 4 with f(2) a placeholder>, "f(2) == 4"),))   what the host evaluates

The expected values (`4`) never leave the host: the sandbox sends back f(2)'s value as plain data
(inside/codec.py), and the host evaluates `value == 4` itself, with real builtins. A program therefore cannot
see the answer, cannot rig `==` (it sends an int, not an object), and cannot shadow `type` or `isinstance`
(the host's are used).

What is split: statement lists of `assert`, assignments, imports, expression statements, `if` on values the host
knows, `for` loops over values the host knows (unrolled), and HumanEval's `def check(candidate): ...` +
`check(f)` (inlined with candidate -> f). In an expression, the host evaluates constants, containers, arithmetic,
comparisons, boolean logic, indexing, comprehensions, a set of pure builtins (abs, len, sorted, next, ...), a few
standard modules the test imports (math, random with a private generator, collections, itertools, string, copy,
heapq), and common methods of their values. Any other part that involves a program name (a call of a program
function, a program global, an attribute of a program value) becomes a probe: it is evaluated in the sandbox.
A probe receives only inputs: each part of it the host can evaluate is evaluated here and sent as a value
(`f(t[0])` sends t[0], not t). A comprehension over values the host knows is unrolled into one probe per item.

Values the program may change stay where it can change them: a list the test passes to the program lives in the
sandbox from then on, and the host reads it back after the call when it needs it (`f(a); assert a == [1, 2, 3]`).

A test the host cannot split this way runs whole in the sandbox, and its verdict is the harness's:
`Plan.mode == "sandbox"`, with the reason (a Job can refuse those instead: host.py). Splitting never sends a
host-only expression into the sandbox: that would leak what it computes.
"""

from __future__ import annotations

import ast
import builtins
import collections
import copy
import functools
import heapq
import itertools
import math
import operator
import pickle
import random
import re
import reprlib
import string
import symtable
import threading
from dataclasses import dataclass

from .inside import codec

MAX_STEPS = 5000  # sandbox steps per test (unrolled loops and comprehensions multiply them)
MAX_UNROLL = 10_000  # statements and comprehension items visited while unrolling a test
MAX_ITERATIONS = 1_000_000  # host evaluation: comprehension and itertools items, range lengths
MAX_BITS = 1 << 20  # host evaluation: size of ints from ** and <<
MAX_LEN = 1 << 20  # host evaluation: size of sequences from *, bytes(n), growth by mutation, int() of strings
# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: a parse that a thread
# switch interrupts (a finalizer runs Python code mid-parse) while another thread parses ends in "SystemError: AST
# constructor recursion depth mismatch" (cpython gh-106905). run_many splits tests in worker threads: one at a time.
_SPLIT_LOCK = threading.Lock()
_PY_BUILTINS = frozenset(dir(builtins))


class Unsplittable(Exception):
    """The test cannot be judged on the host; the message says why. It runs in the sandbox instead."""


class Raised:
    """The value of a step that raised in the sandbox: evaluating it on the host raises again."""

    def __init__(self, name: str):
        self.name = name


class Opaque:
    """The value of a step that was not plain data (an object of a program class, a socket, ...)."""

    def __init__(self, why: str):
        self.why = why


class _Failed:
    """A host-only expression that raised when the host evaluated it while splitting: using it raises again.
    Only its message is kept: a plan travels to the judging process (judge.py) as a pickle."""

    def __init__(self, exc: Exception):
        self.why = str(exc) if isinstance(exc, HostJudgeError) else "raised %s on the host: %s" % (
            type(exc).__name__, safe_text(exc))


class HostJudgeError(Exception):
    pass


def safe_text(value, limit: int = 200, show=str) -> str:
    """show(value) cut to `limit` characters, for a message: never raises, whatever the program sent (str() of a
    16,000-bit int raises ValueError; a KeyError shows its key)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return "<an int of %d bits>" % value.bit_length()
    try:
        return show(value)[:limit]
    except Exception:  # noqa: BLE001 - a part too large to show (an int inside a KeyError, a list of huge ints)
        return "<%s that cannot be shown>" % type(value).__name__


@dataclass(frozen=True)
class Plan:
    mode: str  # "host": the host judges; "sandbox": the test runs whole in the sandbox (weaker); "refused"
    steps: tuple = ()  # (kind, source, bindings, target, want, strict): see inside/harness.py
    actions: tuple = ()  # (env, actions): what the host evaluates once the values are back, in order
    reason: str = ""  # why "sandbox" or "refused"
    source: str = ""  # the test as written
    program_names: bool = False  # the steps see the program's own definitions of builtin names (sum, len, ...)

    @functools.cached_property
    def pickled(self) -> bytes:
        """What the judging process needs of it (judge.py), pickled once: a plan serves every completion."""
        return pickle.dumps(Plan(self.mode, self.steps, self.actions, self.reason), pickle.HIGHEST_PROTOCOL)

    def wire(self) -> tuple:
        if self.mode == "host":
            return ("host", list(self.steps), self.program_names)
        if self.mode == "refused":
            return ("host", [], False)  # nothing of it enters the sandbox
        return ("sandbox", self.source, False)


def refused(plan: Plan) -> Plan:
    """A sandbox-mode plan that is not run: its verdict is a failure that says why."""
    return Plan("refused", reason="refused: the host cannot judge it (%s), and a verdict reached in the sandbox "
                "can be forged by the program" % plan.reason, source=plan.source)


# ---- what the host may evaluate


class _Facade:
    """A module as the host evaluator sees it: a fixed set of pure members."""

    def __init__(self, name: str, members: dict):
        self.name, self.members = name, members

    def __reduce__(self):  # unpickled, a static module's members are the judging process's own (_CALLABLE)
        return (_facade, (self.name,)) if self.name in _STATIC_FACADES else (_Facade, (self.name, self.members))


class _Bounded:
    """An itertools function whose output the host draws at most MAX_ITERATIONS items of (permutations(range(20))).
    No function arguments (accumulate's func): a builtin handed over that way would run unguarded (pow)."""

    def __init__(self, make):
        self.make, self.__name__ = make, make.__name__

    def __call__(self, *args, **kwargs):
        make = self.make
        if kwargs.get("repeat", 1) > 100 or "func" in kwargs or (make is itertools.accumulate and len(args) > 1):
            raise HostJudgeError("%s() with these arguments is not evaluated on the host" % make.__name__)
        return _Capped(make(*args, **kwargs), make.__name__)

    def __reduce__(self):  # the judging process's own instance: the one its _CALLABLE knows
        return _itertools_member, (self.__name__,)


def _itertools_member(name: str) -> _Bounded:
    return _STATIC_FACADES["itertools"][name]


class _Capped:
    """The items of an itertools iterator, at most MAX_ITERATIONS of them; unlike a generator, it pickles."""

    def __init__(self, items, name: str):
        self.items, self.name, self.drawn = items, name, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.drawn >= MAX_ITERATIONS:
            raise HostJudgeError("more than %d items from %s on the host" % (MAX_ITERATIONS, self.name))
        self.drawn += 1
        return next(self.items)


_MATH = ("fabs", "isclose", "sqrt", "isqrt", "floor", "ceil", "trunc", "isnan", "isinf", "isfinite", "exp", "log",
         "log2", "log10", "log1p", "pow", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "hypot", "degrees",
         "radians", "copysign", "fsum", "gcd", "pi", "e", "tau", "inf", "nan", "fmod", "remainder", "modf", "frexp")
_RANDOM = ("randint", "random", "uniform", "choice", "randrange", "sample", "choices", "gauss", "shuffle", "seed")
_ITERTOOLS = ("permutations", "combinations", "combinations_with_replacement", "product", "chain", "accumulate",
              "islice", "zip_longest", "groupby", "count", "cycle", "repeat", "pairwise", "compress")
_STATIC_FACADES = {
    "math": {n: getattr(math, n) for n in _MATH if hasattr(math, n)},
    "collections": {"Counter": collections.Counter, "OrderedDict": collections.OrderedDict,
                    "deque": collections.deque},
    "itertools": {n: _Bounded(getattr(itertools, n)) for n in _ITERTOOLS if hasattr(itertools, n)},
    "string": {n: getattr(string, n) for n in ("ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits",
                                               "hexdigits", "octdigits", "punctuation", "printable", "whitespace",
                                               "capwords")},
    "copy": {"copy": copy.copy, "deepcopy": copy.deepcopy},
    "heapq": {"nlargest": heapq.nlargest, "nsmallest": heapq.nsmallest, "heappush": heapq.heappush,
              "heappop": heapq.heappop, "heapify": heapq.heapify},
}
HOST_MODULES = ("random", *_STATIC_FACADES)
# Functions that change their argument or a generator's state: only while splitting, on the test's own values,
# once and in order; never while judging (a plan, and its values, serve every completion of a prompt).
_MUTATING_FUNCTIONS = {"shuffle", "seed", "heappush", "heappop", "heapify", "randint", "random", "uniform", "choice",
                       "randrange", "sample", "choices", "gauss"}


def _facade(name: str) -> _Facade:
    if name == "random":
        rng = random.Random()  # the test's own generator: never the trainer's global random state
        members = {n: getattr(rng, n) for n in _RANDOM}
        members["Random"] = random.Random
        return _Facade("random", members)
    return _Facade(name, _STATIC_FACADES[name])


def _checked_range(*args, **kwargs):
    r = range(*args, **kwargs)
    if len(r) > MAX_ITERATIONS:
        raise HostJudgeError("range longer than %d on the host" % MAX_ITERATIONS)
    return r


def _checked_int(*args, **kwargs):
    if args and isinstance(args[0], (str, bytes)) and len(args[0]) > 5000:
        raise HostJudgeError("int() of a string longer than 5000 characters on the host")
    return int(*args, **kwargs)


def _checked_pow(a, b, *mod):
    if not mod:
        _check_pow(a, b)
    return pow(a, b, *mod)


def _checked_size(kind):
    def make(*args, **kwargs):
        if args and isinstance(args[0], int) and args[0] > MAX_LEN:
            raise HostJudgeError("%s(%d) on the host" % (kind.__name__, args[0]))
        return kind(*args, **kwargs)

    return make


def _checked_iter(value):  # iter(callable, sentinel) would call a host function until it gives up: never
    return iter(value)


def _checked_format(value, spec=""):
    if not isinstance(spec, str) or len(spec) > 40 or any(int(d) > 10_000 for d in re.findall(r"\d+", spec)):
        raise HostJudgeError("format spec too large to evaluate on the host")
    return format(value, spec)


def _holds_text(value) -> bool:
    return isinstance(value, (str, bytes)) or (isinstance(value, (tuple, frozenset)) and any(map(_holds_text, value)))


def _checked_hash(value):
    if _holds_text(value):  # randomized per process: the host's would not be the program's
        raise HostJudgeError("hash() of str or bytes differs between processes: not evaluated on the host")
    return hash(value)


# Pure builtins the host evaluates. Any other builtin (print, open, ...) is not a program name either: a part of a
# test that uses one on values the host knows is not split at all (sending it in would leak what it computes).
HOST_BUILTINS = {f.__name__: f for f in (
    abs, all, any, bool, chr, dict, divmod, enumerate, float, frozenset, isinstance, len, list, max, min, ord, repr,
    reversed, round, set, sorted, str, sum, tuple, type, zip, bytes, complex, hex, bin, oct, filter, map, range, int,
    pow, bytearray, next, iter, format, hash, slice)}
_GUARDED = {range: _checked_range, int: _checked_int, pow: _checked_pow, bytes: _checked_size(bytes),
            bytearray: _checked_size(bytearray), iter: _checked_iter, format: _checked_format, hash: _checked_hash}
_CALLABLE = frozenset(id(f) for f in HOST_BUILTINS.values()) | frozenset(
    id(f) for members in _STATIC_FACADES.values() for f in members.values() if callable(f)) | {id(random.Random)}
_METHODS = {
    str: {"startswith", "endswith", "lower", "upper", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
          "count", "find", "rfind", "index", "rindex", "isdigit", "isalpha", "isalnum", "isspace", "islower",
          "isupper", "istitle", "isdecimal", "isnumeric", "title", "capitalize", "swapcase", "casefold",
          "partition", "rpartition", "join", "encode"},
    bytes: {"decode", "startswith", "endswith", "count", "find", "hex", "lower", "upper", "strip", "split"},
    bytearray: {"decode", "startswith", "endswith", "count", "find", "hex", "lower", "upper", "strip", "split"},
    list: {"count", "index", "copy"}, tuple: {"count", "index"}, dict: {"keys", "values", "items", "get", "copy"},
    set: {"issubset", "issuperset", "isdisjoint", "union", "intersection", "difference", "symmetric_difference",
          "copy"},
    frozenset: {"issubset", "issuperset", "isdisjoint", "union", "intersection", "difference"},
    int: {"bit_length"}, float: {"is_integer"}, complex: {"conjugate"},
    collections.Counter: {"most_common", "total"}, collections.deque: {"count", "index", "copy"},
}
# Methods that change the value: only while splitting, on the test's own values (`coeffs.append(c)`).
_MUTATORS = {
    list: {"append", "extend", "insert", "pop", "remove", "sort", "reverse", "clear"},
    dict: {"update", "setdefault", "pop", "popitem", "clear"},
    set: {"add", "discard", "remove", "update", "pop", "clear", "difference_update", "intersection_update",
          "symmetric_difference_update"},
    bytearray: {"append", "extend", "pop", "remove", "clear", "reverse", "insert"},
    collections.deque: {"append", "appendleft", "pop", "popleft", "extend", "extendleft", "rotate", "clear",
                        "remove"},
    random.Random: {"randint", "random", "uniform", "choice", "randrange", "sample", "choices", "gauss", "shuffle",
                    "seed"},
}
_MUTATOR_NAMES = frozenset().union(*_MUTATORS.values())
METHOD_NAMES = frozenset().union(*_METHODS.values()) | _MUTATOR_NAMES


def _method(owner, name: str, mutate: bool):
    for t in type(owner).__mro__:
        if name in _METHODS.get(t, ()) or (mutate and name in _MUTATORS.get(t, ())):
            return getattr(t, name)
    return None


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


class Unrolled(ast.expr):
    """A comprehension unrolled while splitting: one host tree per item (a generator stays lazy on the host)."""

    _fields = ("elts",)

    def __init__(self, kind: str = "", elts: list = ()):  # defaults: unpickling calls Unrolled() first
        super().__init__()
        self.kind, self.elts = kind, list(elts)


def _check_pow(a, b) -> None:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a.bit_length() * b > MAX_BITS:
        raise HostJudgeError("** result over %d bits on the host" % MAX_BITS)


def _binop(op: ast.operator, a, b):
    if isinstance(op, ast.Pow):
        _check_pow(a, b)
    elif isinstance(op, ast.LShift) and isinstance(b, int) and b > MAX_BITS:
        raise HostJudgeError("<< over %d bits on the host" % MAX_BITS)
    elif isinstance(op, ast.Mult):
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_LEN:
                raise HostJudgeError("sequence * n over %d items on the host" % MAX_LEN)
    elif isinstance(op, ast.Mod) and isinstance(a, (str, bytes)):
        raise HostJudgeError("%-formatting is not evaluated on the host")
    return _BINOPS[type(op)](a, b)


def _evaluable(node: ast.AST) -> bool:
    """Whether the host evaluator accepts this node's kind (its children are checked separately)."""
    if isinstance(node, (ast.Constant, ast.Name, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.BoolOp, ast.Compare,
                         ast.IfExp, ast.Subscript, ast.Slice, *_COMPS)):
        return True
    if isinstance(node, ast.UnaryOp):
        return type(node.op) in _UNARY
    if isinstance(node, ast.BinOp):
        return type(node.op) in _BINOPS
    if isinstance(node, ast.Attribute):  # only a module facade's member, e.g. math.pi
        return isinstance(node.value, ast.Name)
    if isinstance(node, ast.Call):
        return not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords)
    return False


class Evaluator:
    """Evaluates the host's part of a test: plain values and a fixed set of pure functions, nothing else.

    `mutate`: while splitting, the test's own values may change (`xs.append(1)`, a seeded generator's draws)."""

    def __init__(self, env: dict, mutate: bool = False, handed: dict | None = None):
        self.env = env
        self.mutate = mutate
        self.iterations = 0
        self.handed = handed  # id -> object: the test's values the program received, and may have changed

    def __call__(self, node: ast.AST, container: bool = False):
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise HostJudgeError("cannot evaluate %s on the host" % type(node).__name__)
        value = method(node)
        # What the program received lives on in the sandbox; the host's copy is stale. Indexing a value that holds
        # one is fine (t[1] after f(t[0])): only what is read out of it is checked.
        if self.handed and (id(value) in self.handed if container else _reaches(value, self.handed)):
            raise Unsplittable("%r reads a value the program received, which it may have changed in place: in "
                               "Python the test would see that change, the host's copy would not"
                               % ast.unparse(node)[:80])
        return value

    def _value(self, value):
        if isinstance(value, Raised):
            raise HostJudgeError("it raised %s in the sandbox" % value.name)
        if isinstance(value, Opaque):
            raise HostJudgeError("its value cannot be judged outside the sandbox: %s" % value.why)
        if isinstance(value, _Failed):
            raise HostJudgeError(value.why)
        return value

    def _Constant(self, node):
        return node.value

    def _Name(self, node):
        if node.id in self.env:
            return self._value(self.env[node.id])
        if node.id in HOST_BUILTINS:
            return HOST_BUILTINS[node.id]
        raise HostJudgeError("name %r is not known on the host" % node.id)

    def _Tuple(self, node):
        return tuple(self(e) for e in node.elts)

    def _List(self, node):
        return [self(e) for e in node.elts]

    def _Set(self, node):
        return {self(e) for e in node.elts}

    def _Dict(self, node):
        if any(k is None for k in node.keys):
            raise HostJudgeError("** in a dict display is not evaluated on the host")
        return {self(k): self(v) for k, v in zip(node.keys, node.values)}

    def _Unrolled(self, node):
        if node.kind == "gen":
            return (self(e) for e in node.elts)
        if node.kind == "dict":
            items = [self(e) for e in node.elts]
            return dict(zip(items[0::2], items[1::2]))
        return (set if node.kind == "set" else list)(self(e) for e in node.elts)

    def _UnaryOp(self, node):
        return _UNARY[type(node.op)](self(node.operand))

    def _BinOp(self, node):
        return _binop(node.op, self(node.left), self(node.right))

    def _BoolOp(self, node):
        value = None
        for operand in node.values:
            value = self(operand)
            if (not value) if isinstance(node.op, ast.And) else value:
                return value
        return value

    def _Compare(self, node):
        left = self(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self(right_node)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node):
        return self(node.body) if self(node.test) else self(node.orelse)

    def _Subscript(self, node):
        return self(node.value, container=True)[self(node.slice)]

    def _Slice(self, node):
        return slice(*(None if p is None else self(p) for p in (node.lower, node.upper, node.step)))

    def _Attribute(self, node):
        owner = self(node.value)
        if isinstance(owner, _Facade) and node.attr in owner.members:
            return owner.members[node.attr]
        raise HostJudgeError("attribute %r is not evaluated on the host" % node.attr)

    def _Call(self, node):
        func = node.func
        owner = None
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and
                                                    isinstance(self.env.get(func.value.id), _Facade)):
            owner = self(func.value)
        args = [self(a) for a in node.args]
        kwargs = {k.arg: self(k.value) for k in node.keywords}
        if owner is not None:
            method = _method(owner, func.attr, self.mutate)
            if method is None:
                raise HostJudgeError("%s.%s() is not evaluated on the host" % (type(owner).__name__, func.attr))
            result = method(owner, *args, **kwargs)
            if self.mutate and hasattr(owner, "__len__") and len(owner) > MAX_LEN:
                raise HostJudgeError("a value grew over %d items on the host" % MAX_LEN)
            return result
        target = self(func)
        if id(target) not in _CALLABLE and not any(target is m for f in self.env.values() if isinstance(f, _Facade)
                                                   for m in f.members.values()):
            raise HostJudgeError("this call is not evaluated on the host")
        if not self.mutate and getattr(target, "__name__", "") in _MUTATING_FUNCTIONS:
            raise HostJudgeError("%s() is only evaluated while splitting" % target.__name__)
        result = _GUARDED.get(target, target)(*args, **kwargs)
        if self.mutate and args and hasattr(args[0], "__len__") and len(args[0]) > MAX_LEN:  # heappush
            raise HostJudgeError("a value grew over %d items on the host" % MAX_LEN)
        return result

    def _comprehension(self, node, generators, emit):
        saved = dict(self.env)

        def loop(i):
            if i == len(generators):
                emit()
                return
            gen = generators[i]
            for item in self(gen.iter, container=True):  # its items are checked where they are read
                self.iterations += 1
                if self.iterations > MAX_ITERATIONS:
                    raise HostJudgeError("more than %d comprehension items on the host" % MAX_ITERATIONS)
                _assign(self.env, gen.target, item)
                if all(self(cond) for cond in gen.ifs):
                    loop(i + 1)

        try:
            loop(0)
        finally:
            self.env.clear()
            self.env.update(saved)

    def _ListComp(self, node):
        out = []
        self._comprehension(node, node.generators, lambda: out.append(self(node.elt)))
        return out

    _GeneratorExp = _ListComp

    def _SetComp(self, node):
        out = set()
        self._comprehension(node, node.generators, lambda: out.add(self(node.elt)))
        return out

    def _DictComp(self, node):
        out = {}
        self._comprehension(node, node.generators, lambda: out.__setitem__(self(node.key), self(node.value)))
        return out


def _target_names(target: ast.AST) -> tuple[list[str], bool]:
    """(names, unpack) of an assignment or loop target made of plain names, else Unsplittable."""
    if isinstance(target, ast.Name):
        return [target.id], False
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts], True
    raise Unsplittable("assignment to %s" % ast.unparse(target))


def _assign(env: dict, target: ast.AST, value) -> None:
    names, unpack = _target_names(target)
    if not unpack:
        env[names[0]] = value
        return
    items = tuple(value)
    if len(items) != len(names):
        raise HostJudgeError("cannot unpack %d values into %d names" % (len(items), len(names)))
    env.update(zip(names, items))


def _bound_inside(node: ast.AST) -> set[str]:
    """Names a node binds for itself (comprehension targets, lambda arguments, walrus targets)."""
    bound = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            bound |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            a = sub.args
            bound |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
        elif isinstance(sub, ast.NamedExpr):
            bound.add(sub.target.id)
    return bound


def _free_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - _bound_inside(node)


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, tuple, frozenset)


def _contents(value) -> tuple[list, bool]:
    """Every object reachable from `value` through containers (itself included), each once, and whether a mutable
    one is reached twice: an alias, which the codec would turn into two copies."""
    seen, found, twice, todo = set(), [], False, [value]
    while todo:
        v = todo.pop()
        if id(v) in seen:
            twice = twice or not isinstance(v, _IMMUTABLE)
            continue
        seen.add(id(v))
        found.append(v)
        if isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple, set, frozenset, collections.deque)):
            todo += list(v)
    return found, twice


def _reaches(value, handed: dict) -> bool:
    if isinstance(value, (str, bytes, int, float, type(None))):
        return False
    return any(id(v) in handed for v in _contents(value)[0])


def _mutable(value) -> bool:
    """Whether the program could change this value in place (then it lives in the sandbox once sent there)."""
    if isinstance(value, (tuple, frozenset)):
        return any(map(_mutable, value))
    return not isinstance(value, (type(None), bool, int, float, complex, str, bytes, range))


def _is_type(node: ast.AST) -> bool:
    """`int`, `str`, ... or `type(x)`: types are the host's own objects, one per type, as in Python."""
    if isinstance(node, ast.Name):
        return isinstance(HOST_BUILTINS.get(node.id), type)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" and len(
        node.args) == 1 and not node.keywords


# ---- the splitter

_HOST_KINDS = frozenset({"static", "builtin", "module", "hostfn"})  # what a value the host computes now may use


class _Splitter:
    def __init__(self, program: frozenset = frozenset()):
        self.steps: list[tuple] = []
        self.actions: list[tuple] = []
        # name -> "static" (a value the host knows now), "mirror" (a value that lives in the sandbox), "dynamic"
        # (a value the host computes from the program's results), "module"/"hostfn" (what the host evaluates from
        # a test's import), "testmodule" (a test's import the host does not evaluate), "computed" (a value the test
        # computes with one in the sandbox: an input for the program, never judged here); unbound names are
        # builtins, or else the program's
        self.kind: dict[str, str] = {}
        self.static: dict[str, object] = {}
        self.consts: dict[str, object] = {}  # placeholder -> a value the host knows, frozen where it was used
        self.facades: dict[str, _Facade] = {}
        self.hostfns: dict[str, object] = {}
        self.fresh: dict[str, tuple] = {}  # mirror -> (step count when its value was last known, where it is)
        self.program = program  # builtin names that mean the program's own definitions (the program world)
        self.visited = 0
        self.handed: dict[int, object] = {}  # the test's mutable values sent to the program (see Evaluator)
        self.frozen: dict[int, object] = {}  # id -> the test's mutable objects frozen into constants (_const)

    def env(self) -> dict:
        return {**self.consts, **self.facades, **self.hostfns}

    # -- names

    def _kind(self, name: str) -> str:
        if name in self.kind:
            return self.kind[name]
        if name in self.program:
            return "sandbox"
        if name in HOST_BUILTINS:
            return "builtin"
        return "foreign" if name in _PY_BUILTINS else "sandbox"

    def _touches_sandbox(self, node: ast.AST) -> bool:
        """Whether it calls the program: a program name, or a change of a value that lives in the sandbox (r.pop())."""
        return any(self._kind(n) == "sandbox" for n in _free_names(node)) or any(
            isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _MUTATOR_NAMES
            and self._program_rooted(sub) for sub in ast.walk(node))

    def _static_only(self, node: ast.AST) -> bool:
        return self._static_only_but(node, set())

    def _static_only_but(self, node: ast.AST, names: set) -> bool:
        return all(self._kind(n) in _HOST_KINDS for n in _free_names(node) - names)

    def _bind(self, names: list[str], kind: str) -> None:
        for n in names:
            self.kind[n] = kind
            self.static.pop(n, None)
            self.fresh.pop(n, None)

    # -- values the host computes now: the test's own, live (aliases and in-place changes hold as in Python)

    def _eval_static(self, node: ast.AST, container: bool = False):
        evaluator = Evaluator({**self.static, **self.facades, **self.hostfns}, mutate=True, handed=self.handed)
        return evaluator(node, container)

    def _const(self, value) -> ast.Name:
        """A value frozen where the test uses it: a later in-place change of the test's own value must not reach it."""
        if self.handed and _reaches(value, self.handed):
            raise Unsplittable("it uses a value the program received, which it may have changed in place: in "
                               "Python the test would see that change, the host's copy would not")
        if _mutable(value):  # a later call may change it before the test uses the copy (see _prepare)
            self.frozen.update((id(v), v) for v in _contents(value)[0] if not isinstance(v, _IMMUTABLE))
        try:
            value = copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - a generator: the host never changes it after this point anyway
            pass
        key = "=%d" % len(self.consts)
        self.consts[key] = value
        return ast.Name(id=key, ctx=ast.Load())

    def _host_value(self, node: ast.AST, lazy: bool) -> ast.AST:
        """A host-only part the host can compute now: computed once, here; what it raises is raised where it is used."""
        try:
            value = self._eval_static(node)
        except Unsplittable:
            raise
        except Exception as exc:  # noqa: BLE001 - the test's own expression fails: its assertion fails when judged
            key = "=%d" % len(self.consts)
            self.consts[key] = _Failed(exc)
            return ast.Name(id=key, ctx=ast.Load())
        if hasattr(value, "__next__"):  # an iterator is used up once: each judgement evaluates its own
            return self._freeze(node, lazy)
        return self._const(value)

    def _read(self, name: str, lazy: bool) -> ast.Name:
        """A mirror's value as the host needs it now: read back from the sandbox if the program ran since."""
        at, where = self.fresh.get(name, (-1, None))
        if at != len(self.steps):
            j = self._add_step(("eval", name, (), None, True, not lazy))
            at, where = len(self.steps), "#%d" % j
            self.fresh[name] = (at, where)
        return ast.Name(id=where, ctx=ast.Load())

    # -- expressions

    def _host_tree(self, node: ast.AST, lazy: bool) -> ast.AST:
        """The host's version of an expression: the host's values as constants, the program's parts as probes."""
        if isinstance(node, ast.Name):
            kind = self._kind(node.id)
            if kind == "static":
                return self._const(self.static[node.id])
            if kind == "mirror":
                return self._read(node.id, lazy)
            if kind in ("foreign", "testmodule", "computed"):
                raise Unsplittable("the host cannot evaluate %r" % node.id)
            if kind != "sandbox":
                return node
        elif not self._touches_sandbox(node):
            self._check_host_only(node)
            return self._host_value(node, lazy) if self._static_only(node) else self._freeze(node, lazy)
        if isinstance(node, _COMPS):
            # [f(x) for x in xs]: only inputs flow into the program's calls, so it may run there as a whole.
            # (all(f(x) == 2 * x for x in xs) may not: its comparison and expected values belong to the host;
            # nor [f(t[0]) for t in tests]: t[1] would go in with it. Those are unrolled here, item by item.)
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            if not any(self._host_shape(e) or not self._touches_sandbox(e) for e in elements) and (
                    self._uses_targets_whole(node) or not any(self._holds_host_data(g.iter) for g in node.generators)):
                return self._probe(node, lazy)
            unrolled = self._unroll(node, lazy)
            if unrolled is None:
                raise Unsplittable("a comprehension that compares or computes on the program's results")
            return unrolled
        if self._host_shape(node) and not self._whole(node):
            return self._rebuild(node, lazy)
        if self._program_rooted(node) or not self._holds_host_data(node, inputs=False):
            return self._probe(node, lazy)
        # np.allclose(f(x), [1, 2]): neither the host's nor the program's function, and it holds the test's values
        raise Unsplittable("the host cannot evaluate %r, and the sandbox may not see its values"
                           % ast.unparse(node)[:80])

    def _whole(self, node: ast.AST) -> bool:
        """`len(stack)`, `sorted(set(sys.modules) - seen)`: an operation on program values that holds no host data
        (no constant, no host value) leaks nothing, so it runs where the values live and only its result travels.
        Comparisons, `not`, `and`/`or`, `type` and `isinstance` always stay on the host: they judge."""
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ("type", "isinstance"):
                return False
        elif not isinstance(node, (ast.BinOp, ast.Subscript)):
            return False
        return not self._holds_host_data(node)

    def _holds_host_data(self, node: ast.AST, inputs: bool = True) -> bool:
        """Whether a constant or a host value appears in it (`inputs=False`: other than as an input of a call of
        the program's, as in `ascii(f(1))`)."""
        own = _bound_inside(node)
        todo = [node]
        while todo:
            sub = todo.pop()
            if isinstance(sub, ast.Constant) or (isinstance(sub, ast.Name) and sub.id not in own and
                                                 self._kind(sub.id) in ("static", "dynamic")):
                return True
            if inputs or not (sub is not node and isinstance(sub, ast.Call) and self._program_rooted(sub)):
                todo.extend(ast.iter_child_nodes(sub))
        return False

    def _host_shape(self, node: ast.AST) -> bool:
        if not _evaluable(node) or isinstance(node, (ast.Name, ast.Attribute)):
            return False
        if isinstance(node, ast.Subscript) and self._rooted_in_sandbox(node.value):
            return False  # os.environ["HOME"], table[k]: index the program's object where it lives
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                return self._kind(func.id) in ("builtin", "hostfn")
            if isinstance(func, ast.Attribute):
                if isinstance(func.value, ast.Name) and self._kind(func.value.id) == "module":
                    return func.attr in self.facades[func.value.id].members
                return func.attr in METHOD_NAMES and not self._rooted_in_sandbox(func.value)
            return False
        return True

    def _rooted_in_sandbox(self, node: ast.AST) -> bool:
        """`obj.method(...)`, `mod.sub.f(...)`, `table[k].get(...)` on a program name: the object lives there."""
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return isinstance(node, ast.Name) and self._kind(node.id) == "sandbox"

    def _program_rooted(self, node: ast.AST) -> bool:
        """`f(x, 5)`, `s.push(5)`, `f(1).real`: the program's own code receives what the expression holds."""
        while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and self._kind(node.id) in ("sandbox", "mirror")

    def _test_code(self, node: ast.AST) -> bool:
        """Code of the test's that only the sandbox can run (a module the host does not evaluate), on constants
        and values that already live there: it computes an input. Its value never reaches the host."""
        kinds = {self._kind(n) for n in _free_names(node)}  # never a value of the program's (a mirror)
        return bool(kinds & {"testmodule", "foreign", "computed"}) and kinds <= _HOST_KINDS - {"static"} | {
            "testmodule", "foreign", "computed"}

    def _uses_targets_whole(self, node: ast.AST) -> bool:
        """Whether a comprehension hands each item it draws whole to the program (f(x)): not a part of it (f(t[0])),
        and no part only in a condition (`for x, y in cases if y`)."""
        targets = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        if any(isinstance(sub, (ast.Subscript, ast.Attribute)) and isinstance(sub.value, ast.Name) and
               sub.value.id in targets for sub in ast.walk(node)):
            return False
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        return targets <= {n.id for e in elements for n in ast.walk(e) if isinstance(n, ast.Name)}

    def _unroll(self, node: ast.AST, lazy: bool) -> ast.AST | None:
        """One host tree per item, the items drawn here: None when the loops depend on the program."""
        gens, targets = node.generators, set()
        for gen in gens:
            if gen.is_async or not self._static_only_but(gen.iter, targets):
                return None
            targets |= set(_target_names(gen.target)[0])
            if not all(self._static_only_but(cond, targets) for cond in gen.ifs):
                return None
        kind = {ast.ListComp: "list", ast.SetComp: "set", ast.GeneratorExp: "gen", ast.DictComp: "dict"}[type(node)]
        saved = {n: (self.kind.get(n), self.static.get(n), self.fresh.get(n)) for n in targets}
        elts: list = []

        def loop(i: int) -> None:
            if i == len(gens):
                self.visited += 1
                if self.visited > MAX_UNROLL:
                    raise Unsplittable("more than %d items once comprehensions are unrolled" % MAX_UNROLL)
                item_lazy = lazy or (kind == "gen" and bool(elts))  # any(), all() may stop before this item
                parts = [node.key, node.value] if kind == "dict" else [node.elt]
                elts.extend(self._host_tree(p, item_lazy) for p in parts)
                return
            gen = gens[i]
            self._check_host_only(gen.iter)
            try:
                items = list(self._eval_static(gen.iter, container=True))
            except Unsplittable:
                raise
            except Exception as exc:  # noqa: BLE001
                raise Unsplittable("a comprehension's iterable raised %s on the host" % type(exc).__name__) from None
            for item in items:
                tmp: dict = {}
                try:
                    _assign(tmp, gen.target, item)
                    self._bind(list(tmp), "static")
                    self.static.update(tmp)
                    for cond in gen.ifs:
                        self._check_host_only(cond)
                    taken = all(self._eval_static(c) for c in gen.ifs)
                except Unsplittable:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise Unsplittable("a comprehension's condition raised %s on the host"
                                       % type(exc).__name__) from None
                if taken:
                    loop(i + 1)

        try:
            loop(0)
        finally:  # the comprehension's names are its own, as in Python 3
            for n, (kind_, value, fresh) in saved.items():
                self._bind([n], kind_)
                if kind_ is None:
                    del self.kind[n]
                elif kind_ == "static":
                    self.static[n] = value
                if fresh is not None:
                    self.fresh[n] = fresh
        return Unrolled(kind, elts)

    def _rebuild(self, node: ast.AST, lazy: bool) -> ast.AST:
        """Split each child, in evaluation order; operands after a short-circuit point are lazy."""
        if isinstance(node, ast.BoolOp):
            values = [self._host_tree(v, lazy or i > 0) for i, v in enumerate(node.values)]
            return ast.BoolOp(op=node.op, values=values)
        if isinstance(node, ast.IfExp):
            test = self._host_tree(node.test, lazy)
            body, orelse = self._host_tree(node.body, True), self._host_tree(node.orelse, True)
            return ast.IfExp(test=test, body=body, orelse=orelse)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not (
                isinstance(node.func.value, ast.Name) and self._kind(node.func.value.id) == "module"):
            owner = self._host_tree(node.func.value, lazy)
            func = ast.Attribute(value=owner, attr=node.func.attr, ctx=ast.Load())
            args = [self._host_tree(a, lazy) for a in node.args]
            keywords = [ast.keyword(arg=k.arg, value=self._host_tree(k.value, lazy)) for k in node.keywords]
            return ast.Call(func=func, args=args, keywords=keywords)
        new = type(node)()
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                value = self._host_tree(value, lazy)
            elif isinstance(value, list):
                value = [self._host_tree(v, lazy) if isinstance(v, ast.expr) else
                         ast.keyword(arg=v.arg, value=self._host_tree(v.value, lazy)) if isinstance(v, ast.keyword)
                         else v for v in value]
            setattr(new, field, value)
        return new

    def _check_host_only(self, node: ast.AST) -> None:
        """A part that mentions no program name must be evaluable here: sending it in would leak it."""
        own = _bound_inside(node)
        methods = set()
        for sub in ast.walk(node):
            if isinstance(sub, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
                                ast.comprehension, ast.keyword)) or id(sub) in methods:
                continue
            bad = not _evaluable(sub)
            if isinstance(sub, ast.Call):
                func = sub.func
                if isinstance(func, ast.Name):
                    bad = bad or self._kind(func.id) not in ("builtin", "hostfn")
                elif isinstance(func, ast.Attribute) and (func.attr in METHOD_NAMES or self._module_member(func)):
                    methods.add(id(func))
                else:
                    bad = True
            elif isinstance(sub, ast.Attribute):
                bad = not self._module_member(sub)
            elif isinstance(sub, ast.Name) and sub.id not in own:
                bad = self._kind(sub.id) in ("foreign", "testmodule", "computed", "sandbox")
            if bad:
                raise Unsplittable("the host cannot evaluate %r" % ast.unparse(sub)[:80])

    def _check_identity(self, stmt: ast.stmt) -> None:
        """`is` between values the host gets as copies (read back from the sandbox, or frozen per use) answers
        otherwise than Python (`f(a) is not a`): only a singleton (None, True, False, ...) or two types may be
        compared so, unless both sides are the test's own values, which the host evaluates live."""
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Compare) or not any(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops):
                continue
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                if not isinstance(op, (ast.Is, ast.IsNot)) or any(
                        isinstance(x, ast.Constant) and type(x.value) in (type(None), bool, type(...))
                        for x in (left, right)):
                    continue
                if all(_is_type(x) for x in (left, right)) or self._static_only(node):  # live values, not copies
                    continue
                raise Unsplittable("%r compares identities of values the host receives as copies"
                                   % ast.unparse(node)[:80])

    def _module_member(self, node: ast.Attribute) -> bool:
        return (isinstance(node.value, ast.Name) and self._kind(node.value.id) == "module"
                and node.attr in self.facades[node.value.id].members)

    def _freeze(self, node: ast.AST, lazy: bool) -> ast.AST:
        """Replace the test's own names (not the comprehension's) by the values they hold at this point."""
        own = _bound_inside(node)
        splitter = self

        class Freeze(ast.NodeTransformer):
            def visit_Name(self, n):  # noqa: N802
                kind = splitter._kind(n.id) if n.id not in own else ""
                if kind == "static":
                    return ast.copy_location(splitter._const(splitter.static[n.id]), n)
                if kind == "mirror":
                    return ast.copy_location(splitter._read(n.id, lazy), n)
                return n

        return Freeze().visit(_copy(node))

    def _input(self, node: ast.AST):
        """(tokens, value) of a part of a probe the host computes now, or None to leave it to the sandbox as
        written."""
        try:
            self._check_host_only(node)
            value = self._eval_static(node)
            tokens = codec.encode(value)
            back = codec.decode(tokens)
        except Unsplittable:
            raise
        except Exception:  # noqa: BLE001 - the sandbox computes it as Python would, and fails as Python would
            return None
        return (tokens, value) if type(back) is type(value) and back == value else None

    def _prepare(self, node: ast.AST) -> tuple[ast.AST, tuple, list]:
        """What a step sends in: (source, inputs, names it hands over). Each part that holds the test's own values
        is computed here and sent as a value (`f(t[0])` sends t[0], not t); a value the host computed from the
        program's results is never sent back. The mutable values sent are recorded in `handed`: the host may not
        read them again (the program may change them), and none may be sent twice in one step (the sandbox would
        get two copies where Python passes one object)."""
        own = _bound_inside(node)
        bindings: list = []
        sent: list = []
        splitter = self

        class Inputs(ast.NodeTransformer):
            def visit(self, sub):
                if isinstance(sub, ast.expr) and not isinstance(sub, (ast.Constant, ast.Name, ast.Starred)):
                    names = _free_names(sub)
                    if not names & own and splitter._static_only(sub) and any(
                            splitter._kind(n) == "static" for n in names):
                        part = splitter._input(sub)
                        if part is not None:
                            bindings.append(("__in%d" % len(bindings), part[0]))
                            sent.append(part[1])
                            return ast.Name(id=bindings[-1][0], ctx=ast.Load())
                return self.generic_visit(sub)

        statics = any(isinstance(n, ast.Name) and self._kind(n.id) == "static" for n in ast.walk(node))
        new = Inputs().visit(_copy(node)) if statics else node
        handed = []
        for name in sorted(_free_names(new)):
            kind = self._kind(name)
            if kind == "dynamic":
                raise Unsplittable("a value the host computes from the program's results is passed back in")
            if kind == "static":
                value = self.static[name]
                if self.handed and _reaches(value, self.handed):
                    raise Unsplittable("input %r holds a value the program received before, which it may have "
                                       "changed in place: the host's copy is stale" % name)
                try:
                    bindings.append((name, codec.encode(value)))
                except codec.CodecError as exc:
                    raise Unsplittable("input %r is not plain data: %s" % (name, exc)) from None
                sent.append(value)
                if _mutable(value):
                    handed.append(name)
        contents, twice = _contents(tuple(sent))
        if twice:
            raise Unsplittable("a step hands the program one mutable value twice (an alias): the sandbox would "
                               "get two copies, where Python passes one object")
        fresh = {id(v): v for v in contents[1:] if not isinstance(v, _IMMUTABLE)}
        if fresh.keys() & self.frozen.keys():  # `assert a == f(a)`: Python compares the changed a
            raise Unsplittable("the program receives a value the test already took a copy of: in Python the test "
                               "would see the program's changes to it, the host's copy would not")
        self.handed.update(fresh)
        return new, tuple(bindings), handed

    def _add_step(self, step: tuple) -> int:
        if len(self.steps) >= MAX_STEPS:
            raise Unsplittable("more than %d sandbox steps" % MAX_STEPS)
        self.steps.append(step)
        return len(self.steps) - 1

    def _step(self, kind: str, node: ast.AST, want: bool, strict: bool) -> int:
        source, bindings, handed = self._prepare(node)
        j = self._add_step((kind, ast.unparse(source), bindings, None, want, strict))
        # a value the program can change in place lives in the sandbox from now on: the host reads it back, and
        # the test's other names for the same object (b = a) name it there too
        for name in handed:
            for alias in [n for n, v in self.static.items() if v is self.static[name] and n not in handed]:
                self._add_step(("exec", "%s = %s" % (alias, name), (), None, False, True))
                self._bind([alias], "mirror")
        self._bind(handed, "mirror")
        return j

    def _probe(self, node: ast.AST, lazy: bool) -> ast.AST:
        return ast.Name(id="#%d" % self._step("eval", node, True, not lazy), ctx=ast.Load())

    # -- statements

    def statements(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.visited += 1
            if self.visited > MAX_UNROLL:
                raise Unsplittable("more than %d statements once loops are unrolled" % MAX_UNROLL)
            self._statement(stmt)

    def _statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return
        self._check_identity(stmt)
        if isinstance(stmt, ast.Assert):
            tree = self._host_tree(stmt.test, False)
            self.actions.append(("assert", tree, ast.unparse(stmt.test)))
        elif isinstance(stmt, ast.Assign):
            self._assign(stmt)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            value = ast.BinOp(left=ast.Name(id=name, ctx=ast.Load()), op=stmt.op, right=stmt.value)
            self._assign(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value))
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self._import(stmt)
        elif isinstance(stmt, ast.Expr):
            self._expr(stmt.value)
        elif isinstance(stmt, ast.For):
            self._for(stmt)
        elif isinstance(stmt, ast.If):
            self._if(stmt)
        else:
            raise Unsplittable("a %s statement" % type(stmt).__name__)

    def _assign(self, stmt: ast.Assign) -> None:
        if len(stmt.targets) != 1:
            raise Unsplittable("chained assignment")
        names, unpack = _target_names(stmt.targets[0])
        value = stmt.value
        if self._static_only(value):
            self._check_host_only(value)
            try:
                result = self._eval_static(value)
                tmp: dict = {}
                _assign(tmp, stmt.targets[0], result)
            except Exception as exc:  # noqa: BLE001 - the test itself fails here; let the sandbox show it as written
                raise Unsplittable("a host-side assignment raised %s" % type(exc).__name__) from None
            self._bind(names, "static")
            self.static.update(tmp)
            return
        if self._test_code(value):  # data = json.loads('[1, 2]'): an input made in the sandbox, kept there
            self.actions.append(("ran", self._add_step(("eval", ast.unparse(value), (), (names, unpack), False,
                                                        True))))
            self._bind(names, "computed")
            return
        tree = self._host_tree(value, False)
        self.actions.append(("bind", names, unpack, tree))
        if isinstance(tree, ast.Name) and tree.id.startswith("#") and self._touches_sandbox(value):
            j = int(tree.id[1:])  # the whole value comes from the sandbox: keep it there too, under its names
            kind, source, bindings, _, want, strict = self.steps[j]
            self.steps[j] = (kind, source, bindings, (names, unpack), want, strict)
            self._bind(names, "mirror")
            self.fresh.update((n, (len(self.steps), n)) for n in names)
        else:
            self._bind(names, "dynamic")

    def _import(self, stmt: ast.stmt) -> None:
        self._add_step(("exec", ast.unparse(stmt), (), None, False, True))
        self.actions.append(("ran", len(self.steps) - 1))
        for alias in stmt.names:
            if alias.name == "*":
                raise Unsplittable("import *")
            if isinstance(stmt, ast.Import):
                name = alias.asname or alias.name.split(".")[0]
                if alias.name in HOST_MODULES:
                    self._bind([name], "module")
                    self.facades[name] = _facade(alias.name)
                else:
                    self._bind([name], "testmodule")
                continue
            name = alias.asname or alias.name
            module = stmt.module if not stmt.level else None
            facade = _facade(module) if module in HOST_MODULES else None
            member = facade.members.get(alias.name) if facade else None
            if member is not None:
                self.facades["%" + name] = facade  # not a name a test can write: only makes its members callable
            if member is None:
                self._bind([name], "testmodule")
            elif callable(member):  # from collections import Counter: the real one, whatever the program did
                self._bind([name], "hostfn")
                self.hostfns[name] = member
            else:
                self._bind([name], "static")
                self.static[name] = member

    def _expr(self, value: ast.expr) -> None:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print" and \
                self._kind("print") == "foreign":
            for arg in value.args:  # what it prints decides nothing: only the program's parts run, without it
                if not self._static_only(arg):
                    self._expr(arg)
            return
        if isinstance(value, ast.Name):  # a bare name: `print` in HumanEval/129
            if self._kind(value.id) == "sandbox":
                self.actions.append(("ran", self._add_step(("exec", value.id, (), None, False, True))))
            return
        if self._static_only(value):  # the test's own statement on its own values: `coeffs.append(c)`
            self._check_host_only(value)
            try:
                self._eval_static(value)
            except Exception as exc:  # noqa: BLE001 - the test itself fails here; let the sandbox show it
                raise Unsplittable("a host-side statement raised %s" % type(exc).__name__) from None
            return
        if self._test_code(value):  # np.random.seed(0)
            self.actions.append(("ran", self._add_step(("exec", ast.unparse(value), (), None, False, True))))
            return
        if self._touches_sandbox(value) or self._program_rooted(value):
            if not self._program_rooted(value) and self._holds_host_data(value, inputs=False):
                raise Unsplittable("the host cannot evaluate %r, and the sandbox may not see its values"
                                   % ast.unparse(value)[:80])
            self.actions.append(("ran", self._step("exec", value, False, True)))
            return
        self.actions.append(("expr", self._host_tree(value, False)))

    def _for(self, stmt: ast.For) -> None:
        if stmt.orelse or any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(stmt)):
            raise Unsplittable("a loop with break, continue or else")
        items = self._static_value(stmt.iter, list, "a loop over", "a loop's iterable", container=True)
        names, _ = _target_names(stmt.target)
        for item in items:
            tmp: dict = {}
            try:
                _assign(tmp, stmt.target, item)
            except HostJudgeError as exc:
                raise Unsplittable(str(exc)) from None
            self._bind(names, "static")
            self.static.update(tmp)
            self.statements(stmt.body)

    def _if(self, stmt: ast.If) -> None:
        taken = self._static_value(stmt.test, bool, "an if on", "an if's condition")
        self.statements(stmt.body if taken else stmt.orelse)

    def _static_value(self, node: ast.expr, convert, use: str, part: str, container: bool = False):
        """convert(`node`'s value), computed on the host from the test's own values; Unsplittable when the
        program's values reach it or computing it raises."""
        if not self._static_only(node):
            raise Unsplittable("%s values the program computes" % use)
        self._check_host_only(node)
        try:
            return convert(self._eval_static(node, container))
        except Unsplittable:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Unsplittable("%s raised %s on the host" % (part, type(exc).__name__)) from None


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="eval").body if isinstance(node, ast.expr) else node


def _inline_check(module: ast.Module) -> list[ast.stmt]:
    """HumanEval's `def check(candidate): <body>` then `check(f)`: the body, with candidate renamed f."""
    body = module.body
    last = body[-1] if body else None
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name)
            and len(last.value.args) == 1 and isinstance(last.value.args[0], ast.Name) and not last.value.keywords):
        return body
    name, target = last.value.func.id, last.value.args[0].id
    defs = [s for s in body if isinstance(s, ast.FunctionDef) and s.name == name]
    if len(defs) != 1:
        return body
    func = defs[0]
    a = func.args
    if func.decorator_list or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg or a.defaults or len(a.args) != 1:
        return body
    param = a.args[0].arg
    for node in ast.walk(func):
        if isinstance(node, (ast.Return, ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.FunctionDef,
                             ast.Lambda, ast.ClassDef)) and node is not func:
            return body
        if isinstance(node, ast.Name) and node.id in (param, name, target) and not isinstance(node.ctx, ast.Load):
            return body

    class Rename(ast.NodeTransformer):
        def visit_Name(self, n):  # noqa: N802
            return ast.copy_location(ast.Name(id=target, ctx=n.ctx), n) if n.id == param else n

    inlined = [Rename().visit(s) for s in func.body]
    rest = [s for s in body[:-1] if s is not func]
    if any(isinstance(n, ast.Name) and n.id == name for s in rest + inlined for n in ast.walk(s)):
        return body
    return rest + inlined


def _scope(source: str, mode: str = "exec") -> tuple[set, set]:
    """(global names read, module-level names bound) by `source`, in any scope, as Python scopes them."""
    table = symtable.symtable(source, "<code>", mode)
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    binds = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    todo = list(table.get_children())
    while todo:
        child = todo.pop()
        todo += child.get_children()
        for sym in child.get_symbols():
            if sym.is_global() and sym.is_referenced():
                reads.add(sym.get_name())
            if sym.is_declared_global():  # `global x` in a function: x may be bound at module level
                binds.add(sym.get_name())
    return reads, binds


def _imports(stmts: list[ast.stmt]) -> dict[str, str]:
    """{name: module} of the module-level `import module [as name]` statements among `stmts` (their if, for and try
    blocks included); a name bound by an import of two different modules maps to ''."""
    found: dict[str, str] = {}
    todo = list(stmts)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                module = alias.name if alias.asname else name
                found[name] = module if found.get(name, module) == module else ""
        todo.extend(ast.iter_child_nodes(node))
    return found


@dataclass(frozen=True)
class ProgramNames:
    """What a program binds and reads at module level, as written: what the names its tests use mean. Bindings
    made at run time (`globals()[...]`) are not seen: there the host takes a name as its real builtin or module,
    which a program could get anyway by not defining it."""

    shadowed: frozenset = frozenset()  # builtin names it binds (def sum): a test that calls only those calls them
    modules: tuple = ()  # (name, module) for the names it binds only with `import module [as name]`
    reads: frozenset | None = frozenset()  # the global names its code reads as written; None: unknown (no parse)


def program_names(program: str) -> ProgramNames:
    try:
        with _SPLIT_LOCK:
            tree = ast.parse(program)
            reads, binds = _scope(program)
    except Exception:  # noqa: BLE001 - it does not load in the sandbox either, or too deep to read here
        return ProgramNames(reads=None)
    imports = _imports(tree.body)
    froms, stored = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            froms.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stored.add(node.id)
    assigned = {n for n in binds if n not in imports or n in froms} | stored
    modules = tuple(sorted((n, m) for n, m in imports.items() if m and n not in assigned))
    return ProgramNames(frozenset(binds & _PY_BUILTINS), modules, frozenset(reads))


def shadowed_builtins(program: str) -> frozenset:
    """The builtin names a program binds at module level as written (def, class, import, assignment, `global`):
    a test that calls them means the program's (`def sum(xs)`), as in Python."""
    return program_names(program).shadowed


def _free_builtins(body: list[ast.stmt]) -> frozenset:
    """The names a test reads and never binds, when all of them are builtins (`assert sum([1, 2, 3]) == 6`): the
    ones a program's own definitions may answer, as in Python. Where the test also calls other program
    functions, a redefined builtin is the real one: in `assert f(x) == sorted([3, 1, 2])` it computes an
    expected value, and [3, 1, 2] must not go in (every step's inputs are visible to the program from the start
    of the job), nor may the program decide what it returns."""
    read, bound = set(), set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
    free = read - bound
    return frozenset(free) if not free - _PY_BUILTINS else frozenset()


@dataclass(frozen=True)
class _TestNames:
    early: frozenset  # global names it may read before it binds them itself: another test's, or the program's
    binds: tuple  # (name, module) for each name it binds at module level; module '' unless bound by `import`
    modules: frozenset  # names it uses as modules (`math.isclose`) without binding them
    world: frozenset  # see _free_builtins
    reads_all: bool = False  # it reads names it does not spell out (dir(), globals(), eval): any name at all
    binds_any: bool = False  # it binds names it does not spell out (exec, globals()[...] = ..., import *)


_READS_ALL = frozenset({"dir", "globals", "locals", "vars", "eval", "exec", "breakpoint"})
_BINDS_ANY = frozenset({"globals", "exec"})


def _flow(stmts: list[ast.stmt], certain: set, early: set, binds: dict) -> None:
    """Walk statements in the order they run: the names read before this test binds them (`early`), and what it
    binds. A loop's or branch's bindings hold only inside it: it may not run."""

    def bind(name: str, module: str = "") -> None:
        binds[name] = module if binds.get(name, module) == module else ""

    for stmt in stmts:
        if isinstance(stmt, ast.For) and _target_free(stmt.target):
            early.update(_scope(ast.unparse(stmt.iter), "eval")[0] - certain)
            targets = {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
            for name in targets:
                bind(name)
            _flow(stmt.body, certain | targets, early, binds)
            _flow(stmt.orelse, set(certain), early, binds)
        elif isinstance(stmt, ast.If):
            early.update(_scope(ast.unparse(stmt.test), "eval")[0] - certain)
            _flow(stmt.body, set(certain), early, binds)
            _flow(stmt.orelse, set(certain), early, binds)
        else:
            reads, bound = _scope(ast.unparse(stmt))
            early.update(reads - certain)
            modules = _imports([stmt])
            for name in bound:
                bind(name, modules.get(name, ""))
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom, ast.Expr,
                                 ast.Assert, ast.FunctionDef, ast.ClassDef)):
                certain |= bound


def _target_free(target: ast.AST) -> bool:
    return all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.expr_context)) for n in ast.walk(target))


@functools.lru_cache(maxsize=8192)
def _test_names(source: str) -> _TestNames | None:
    """What a test reads and binds, as the tests run in sequence in one namespace; None when it does not parse."""
    try:
        with _SPLIT_LOCK:
            tree = ast.parse(source)
            early, binds = set(), {}
            _flow(tree.body, set(), early, binds)
            world = _free_builtins(_inline_check(tree))
    except (SyntaxError, RecursionError, ValueError, MemoryError):
        return None
    modules = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    star = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in ast.walk(tree))
    return _TestNames(frozenset(early), tuple(sorted(binds.items())), frozenset(modules & early), world,
                      bool(called & _READS_ALL & early), star or bool(called & _BINDS_ANY & early))


def split_tests(tests: list[str], program: str | ProgramNames) -> list[Plan]:
    """How each of `tests` will be judged against `program` (or its program_names), the tests run in sequence as
    the dataset's harness runs them: where a test's names mean what another test or the program bound in a way a
    test of its own cannot reproduce here, it is refused, saying why."""
    prog = program if isinstance(program, ProgramNames) else program_names(program)
    imported = dict(prog.modules)
    plans, bound, stop = [], {}, ""
    for i, source in enumerate(tests):
        names = _test_names(source)
        if names is None:
            plans.append(split_test(source))
            continue
        reason, modules = stop, {}
        if names.reads_all and any(not module for _, module in bound.values()):
            reason = reason or ("it reads names it does not spell out (dir(), globals(), eval), and an earlier test "
                                "binds some: in Python it would see them, here each test runs on its own")
        if names.binds_any:
            stop = stop or ("test %d may bind any name (exec, globals(), import *): in Python the program and "
                            "the later tests would see them, here they do not" % i)
            reason = reason or stop
        for name in sorted(names.early):
            if name in bound and not bound[name][1]:
                reason = reason or ("it reads %r, which test %d binds: in Python it would see that test's value, "
                                    "here each test runs on its own (make each test self-contained)"
                                    % (name, bound[name][0]))
            elif name in bound or name in imported:
                modules[name] = bound[name][1] if name in bound else imported[name]
            elif name in names.modules and name in HOST_MODULES:  # `math.isclose(...)`, no `import math`
                reason = reason or ("it uses %r without importing it, and the program does not import it either: "
                                    "in Python that name is whatever the program bound there" % name)
        for name, module in names.binds:
            if (prog.reads is None or name in prog.reads) and not (module and imported.get(name) == module):
                stop = stop or ("test %d binds %r, which the program's code reads: in Python the program sees the "
                                "test's value from then on, here it does not (rename it in the test)" % (i, name))
                reason = reason or stop
            bound[name] = (i, module)
        if reason:
            plans.append(Plan("refused", reason="refused: " + reason, source=source))
        else:
            plans.append(split_test(source, prog.shadowed, tuple(sorted(modules.items()))))
    return plans


def split_test(source: str, shadowed: frozenset = frozenset(), modules: tuple = ()) -> Plan:
    """How `source` will be judged against a program that binds the builtin names `shadowed` (shadowed_builtins),
    with `modules` ((name, module), ...) the names the test uses as modules that the program or an earlier test
    imported. Cached per test and per choice among the test's own names only: a program picks what it redefines."""
    names = _test_names(source)
    return _split(source, shadowed & names.world if names else frozenset(), modules)


@functools.lru_cache(maxsize=8192)
def _split(source: str, world: frozenset, modules: tuple) -> Plan:
    try:
        with _SPLIT_LOCK:  # the splitter parses again (_copy): the whole split, not just the first parse
            body = _inline_check(ast.parse(source))
            imports = [ast.Import(names=[ast.alias(name=m, asname=None if n == m else n)]) for n, m in modules]
            splitter = _Splitter(world)
            splitter.statements(imports + body)
    except SyntaxError:
        return Plan("sandbox", reason="the test does not parse on the host", source=source)
    except Unsplittable as exc:
        return Plan("sandbox", reason=str(exc), source=source)
    except RecursionError:
        return Plan("sandbox", reason="the test is nested too deeply to split", source=source)
    plan = Plan("host", tuple(splitter.steps), (splitter.env(), tuple(splitter.actions)), source=source,
                program_names=bool(splitter.program))
    try:
        plan.pickled
    except Exception as exc:  # noqa: BLE001 - a value of the test's that cannot leave this process
        return Plan("sandbox", reason="its values cannot reach the judging process (%s)" % type(exc).__name__,
                    source=source)
    return plan


def judge(plan: Plan, values: list) -> tuple[bool, str]:
    """Evaluate a host-mode plan on the steps' values (decoded, Raised or Opaque); (passed, why not). Whatever the
    values are, a failure is a verdict with its reason, never an exception: only MemoryError goes up (the
    judging process's budget, judge.py)."""
    env, actions = plan.actions
    env = {**env, **{"#%d" % j: v for j, v in enumerate(values)}}
    evaluate = Evaluator(env)
    for action in actions:
        kind = action[0]
        what = "assert " + action[2][:200] if kind == "assert" else kind
        try:
            if kind == "ran":
                value = values[action[1]]
                if isinstance(value, Raised):
                    return False, "a statement raised %s in the sandbox" % value.name
            elif kind == "bind":
                _, names, unpack, tree = action
                if isinstance(tree, ast.Name) and tree.id.startswith("#"):  # straight from the sandbox
                    value = env[tree.id]
                    if isinstance(value, Raised):
                        return False, "an assignment raised %s in the sandbox" % value.name
                    if isinstance(value, Opaque):  # fine until the host needs it
                        env.update((n, value) for n in names)
                        continue
                else:
                    value = evaluate(tree)
                target = ast.Tuple(elts=[ast.Name(id=n) for n in names]) if unpack else ast.Name(id=names[0])
                _assign(env, target, value)
            elif kind == "expr":
                evaluate(action[1])
            elif not evaluate(action[1]):
                return False, "%s: false on the host%s" % (what, _shown(action[1], values))
        except MemoryError:
            raise
        except HostJudgeError as exc:
            return False, "%s: %s" % (what[7:] if kind == "assert" else what, safe_text(exc, 400))
        except BaseException as exc:  # what the expression raises on the program's values (TypeError, KeyError, ...)
            return False, "%s raised %s on the host: %s" % (what, type(exc).__name__, safe_text(exc))
    return True, ""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def _shown(tree: ast.AST, values: list) -> str:
    """The first probes' values, for the message: `f(3)` returned 9."""
    shown = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id.startswith("#") and len(shown) < 8:
            value = values[int(node.id[1:])]
            if not isinstance(value, (Raised, Opaque)):
                shown.append(safe_text(value, 120, _REPR.repr))
    return " (values: %s)" % ", ".join(shown) if shown else ""
