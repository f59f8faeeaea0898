"""Split a test so that the host judges it: the program's calls run in the sandbox, the comparisons run here.

    plan = split_test("assert f(2) == 4")
    plan.steps     -> (("eval", "f(2)", (), None, True, True),)    what the sandbox runs: calls and their inputs
    plan.actions   -> (("assert", <f(2) == 4 with f(2) a placeholder>, "f(2) == 4"),)   what the host evaluates

The expected values (`4`) never leave the host: the sandbox sends back f(2)'s value as plain data
(inside/codec.py), and the host evaluates `value == 4` itself, with real builtins. A program therefore cannot
see the answer, cannot rig `==` (it sends an int, not an object), and cannot shadow `type` or `isinstance`
(the host's are used).

What is split: statement lists of `assert`, assignments, imports, expression statements, `for` loops over
values the host knows (unrolled), and HumanEval's `def check(candidate): ...` + `check(f)` (inlined with
candidate -> f). In an expression, the host evaluates constants, containers, arithmetic, comparisons, boolean
logic, indexing, comprehensions, a set of pure builtins (abs, len, sorted, ...), math's functions, a private
random generator, and common methods of str/bytes/list/tuple/dict/set values. Any other part that involves a
program name (a call of a program function, a program global, an attribute of a program value) becomes a
probe: it is evaluated in the sandbox, with the host values it mentions sent in as its inputs.

A test the host cannot split this way runs whole in the sandbox, as before, and its verdict is the harness's:
`Plan.mode == "sandbox"`, with the reason. Splitting never sends a host-only expression into the sandbox: that
would leak what it computes.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import random
import threading
from dataclasses import dataclass

from .inside import codec

MAX_STEPS = 5000  # sandbox steps per test (unrolled loops multiply them)
MAX_UNROLL = 10_000  # statements visited while unrolling a test's loops
MAX_ITERATIONS = 1_000_000  # host evaluation: comprehension items and range lengths
MAX_BITS = 1 << 20  # host evaluation: size of ints from ** and <<
MAX_LEN = 1 << 20  # host evaluation: size of sequences from * and of strings given to int()
# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: a parse that a thread
# switch interrupts (a finalizer runs Python code mid-parse) while another thread parses ends in "SystemError: AST
# constructor recursion depth mismatch" (cpython gh-106905). run_many splits tests in worker threads: one at a time.
_SPLIT_LOCK = threading.Lock()


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


class HostJudgeError(Exception):
    pass


@dataclass(frozen=True)
class Plan:
    mode: str  # "host": the host judges; "sandbox": the test runs whole in the sandbox (weaker)
    steps: tuple = ()  # (kind, source, bindings, target, want, strict): see inside/harness.py
    actions: tuple = ()  # what the host evaluates once the values are back, in order
    reason: str = ""  # why "sandbox"
    source: str = ""  # the test as written

    def wire(self) -> tuple:
        return ("host", list(self.steps)) if self.mode == "host" else ("sandbox", self.source)


# ---- what the host may evaluate


class _Facade:
    """A module as the host evaluator sees it: a fixed set of pure members."""

    def __init__(self, name: str, members: dict):
        self.name, self.members = name, members


_MATH = ("fabs", "isclose", "sqrt", "isqrt", "floor", "ceil", "trunc", "isnan", "isinf", "isfinite", "exp", "log",
         "log2", "log10", "log1p", "pow", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "hypot", "degrees",
         "radians", "copysign", "fsum", "gcd", "pi", "e", "tau", "inf", "nan", "fmod", "remainder", "modf", "frexp")
_RANDOM = ("randint", "random", "uniform", "choice", "randrange")


def _facade(name: str) -> _Facade:
    if name == "math":
        return _Facade("math", {n: getattr(math, n) for n in _MATH if hasattr(math, n)})
    rng = random.Random()  # the test's own generator: never the trainer's global random state
    return _Facade("random", {n: getattr(rng, n) for n in _RANDOM})


HOST_MODULES = ("math", "random")


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


# Pure builtins the host evaluates; "print" is known so that it is never mistaken for a program name.
HOST_BUILTINS = {f.__name__: f for f in (
    abs, all, any, bool, chr, dict, divmod, enumerate, float, frozenset, isinstance, len, list, max, min, ord, repr,
    reversed, round, set, sorted, str, sum, tuple, type, zip, bytes, complex, hex, bin, oct, filter, map, range, int,
    pow)}
HOST_BUILTINS["print"] = None
_GUARDED = {range: _checked_range, int: _checked_int, pow: _checked_pow}
_CALLABLE = frozenset(id(f) for f in HOST_BUILTINS.values() if f is not None)
_METHODS = {
    str: {"startswith", "endswith", "lower", "upper", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
          "count", "find", "rfind", "index", "rindex", "isdigit", "isalpha", "isalnum", "isspace", "islower",
          "isupper", "istitle", "isdecimal", "isnumeric", "title", "capitalize", "swapcase", "casefold",
          "partition", "rpartition", "join", "encode"},
    bytes: {"decode", "startswith", "endswith", "count", "find", "hex", "lower", "upper", "strip", "split"},
    list: {"count", "index", "copy"}, tuple: {"count", "index"}, dict: {"keys", "values", "items", "get", "copy"},
    set: {"issubset", "issuperset", "isdisjoint", "union", "intersection", "difference", "symmetric_difference"},
    frozenset: {"issubset", "issuperset", "isdisjoint", "union", "intersection", "difference"},
    int: {"bit_length"}, float: {"is_integer"}, complex: {"conjugate"},
}
METHOD_NAMES = frozenset().union(*_METHODS.values())

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


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
    """Evaluates the host's part of a test: plain values and a fixed set of pure functions, nothing else."""

    def __init__(self, env: dict):
        self.env = env
        self.iterations = 0

    def __call__(self, node: ast.AST):
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise HostJudgeError("cannot evaluate %s on the host" % type(node).__name__)
        return method(node)

    def _value(self, value):
        if isinstance(value, Raised):
            raise HostJudgeError("it raised %s in the sandbox" % value.name)
        if isinstance(value, Opaque):
            raise HostJudgeError("its value cannot be judged outside the sandbox: %s" % value.why)
        return value

    def _Constant(self, node):
        return node.value

    def _Name(self, node):
        if node.id in self.env:
            return self._value(self.env[node.id])
        if node.id in HOST_BUILTINS and HOST_BUILTINS[node.id] is not None:
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
        return self(node.value)[self(node.slice)]

    def _Slice(self, node):
        return slice(*(None if p is None else self(p) for p in (node.lower, node.upper, node.step)))

    def _Attribute(self, node):
        owner = self(node.value)
        if isinstance(owner, _Facade) and node.attr in owner.members:
            return owner.members[node.attr]
        raise HostJudgeError("attribute %r is not evaluated on the host" % node.attr)

    def _Call(self, node):
        args = [self(a) for a in node.args]
        kwargs = {k.arg: self(k.value) for k in node.keywords}
        func = node.func
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and
                                                    isinstance(self.env.get(func.value.id), _Facade)):
            owner = self(func.value)
            if func.attr not in _METHODS.get(type(owner), ()):
                raise HostJudgeError("%s.%s() is not evaluated on the host" % (type(owner).__name__, func.attr))
            return getattr(type(owner), func.attr)(owner, *args, **kwargs)
        target = self(func)
        if id(target) not in _CALLABLE and not any(target is m for f in self.env.values() if isinstance(f, _Facade)
                                                   for m in f.members.values()):
            raise HostJudgeError("this call is not evaluated on the host")
        return _GUARDED.get(target, target)(*args, **kwargs)

    def _comprehension(self, node, generators, emit):
        saved = dict(self.env)

        def loop(i):
            if i == len(generators):
                emit()
                return
            gen = generators[i]
            for item in self(gen.iter):
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


# ---- the splitter


class _Splitter:
    def __init__(self):
        self.steps: list[tuple] = []
        self.actions: list[tuple] = []
        self.kind: dict[str, str] = {}  # name -> "static" | "mirror" | "dynamic" | "module" | "sandbox"
        self.static: dict[str, object] = {}
        self.consts: dict[str, object] = {}  # placeholder -> a static value, frozen where it was used
        self.facades: dict[str, _Facade] = {}
        self.visited = 0

    # -- names

    def _kind(self, name: str) -> str:
        if name in self.kind:
            return self.kind[name]
        return "builtin" if name in HOST_BUILTINS else "sandbox"

    def _touches_sandbox(self, node: ast.AST) -> bool:
        return any(self._kind(n) == "sandbox" for n in _free_names(node))

    def _bind(self, names: list[str], kind: str) -> None:
        for n in names:
            self.kind[n] = kind
            self.static.pop(n, None)

    # -- expressions

    def _host_tree(self, node: ast.AST, lazy: bool) -> ast.AST:
        """The host's version of an expression: static names frozen to constants, probes as placeholders."""
        if isinstance(node, ast.Name) and self._kind(node.id) != "sandbox":
            kind = self._kind(node.id)
            if kind == "static":
                key = "=%d" % len(self.consts)
                self.consts[key] = self.static[node.id]
                return ast.Name(id=key, ctx=ast.Load())
            if kind == "builtin" and HOST_BUILTINS[node.id] is None:
                raise Unsplittable("%s() is not evaluated on the host" % node.id)
            return node
        if not self._touches_sandbox(node):
            self._check_host_only(node)
            return self._freeze(node)
        if isinstance(node, _COMPS):
            # [f(x) for x in xs]: only inputs flow into the program's calls, so it may run there as a whole.
            # (all(f(x) == 2 * x for x in xs) may not: its comparison and expected values belong to the host.)
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            if any(self._host_shape(e) or not self._touches_sandbox(e) for e in elements):
                raise Unsplittable("a comprehension that compares or computes on the program's results")
            return self._probe(node, lazy)
        if self._host_shape(node) and not self._whole(node):
            return self._rebuild(node, lazy)
        return self._probe(node, lazy)

    def _whole(self, node: ast.AST) -> bool:
        """`len(stack)`, `sorted(set(sys.modules) - seen)`: an operation on program values that holds no host data
        (no constant, no host value) leaks nothing, so it runs where the values live and only its result travels.
        Comparisons, `not`, `and`/`or`, `type` and `isinstance` always stay on the host: they judge."""
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id not in ("type", "isinstance")):
                return False
        elif not isinstance(node, (ast.BinOp, ast.Subscript)):
            return False
        own = _bound_inside(node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) or (isinstance(sub, ast.Name) and sub.id not in own and
                                                 self._kind(sub.id) in ("static", "dynamic")):
                return False
        return True

    def _host_shape(self, node: ast.AST) -> bool:
        if not _evaluable(node) or isinstance(node, (ast.Name, ast.Attribute)):
            return False
        if isinstance(node, ast.Subscript) and self._rooted_in_sandbox(node.value):
            return False  # os.environ["HOME"], table[k]: index the program's object where it lives
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                return self._kind(func.id) == "builtin" and HOST_BUILTINS[func.id] is not None
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
        methods = set()
        for sub in ast.walk(node):
            if isinstance(sub, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
                                ast.comprehension, ast.keyword)) or id(sub) in methods:
                continue
            bad = not _evaluable(sub)
            if isinstance(sub, ast.Call):
                func = sub.func
                if isinstance(func, ast.Name):
                    bad = bad or self._kind(func.id) != "builtin" or HOST_BUILTINS[func.id] is None
                elif isinstance(func, ast.Attribute) and (func.attr in METHOD_NAMES or self._module_member(func)):
                    methods.add(id(func))
                else:
                    bad = True
            elif isinstance(sub, ast.Attribute):
                bad = not self._module_member(sub)
            if bad:
                raise Unsplittable("the host cannot evaluate %r" % ast.unparse(sub)[:80])

    def _module_member(self, node: ast.Attribute) -> bool:
        return (isinstance(node.value, ast.Name) and self._kind(node.value.id) == "module"
                and node.attr in self.facades[node.value.id].members)

    def _freeze(self, node: ast.AST) -> ast.AST:
        """Replace static names (not the comprehension's own) by placeholders bound to their current values."""
        own = _bound_inside(node)

        class Freeze(ast.NodeTransformer):
            def visit_Name(inner, n):  # noqa: N805 - closure over the splitter
                if n.id not in own and self._kind(n.id) == "static":
                    key = "=%d" % len(self.consts)
                    self.consts[key] = self.static[n.id]
                    return ast.copy_location(ast.Name(id=key, ctx=ast.Load()), n)
                return n

        return Freeze().visit(_copy(node))

    def _inputs(self, node: ast.AST) -> tuple:
        bindings = []
        for name in sorted(_free_names(node)):
            kind = self._kind(name)
            if kind == "dynamic":
                raise Unsplittable("a value the host computes from the program's results is passed back in")
            if kind == "static":
                try:
                    bindings.append((name, codec.encode(self.static[name])))
                except codec.CodecError as exc:
                    raise Unsplittable("input %r is not plain data: %s" % (name, exc)) from None
        return tuple(bindings)

    def _add_step(self, step: tuple) -> int:
        if len(self.steps) >= MAX_STEPS:
            raise Unsplittable("more than %d sandbox steps" % MAX_STEPS)
        self.steps.append(step)
        return len(self.steps) - 1

    def _probe(self, node: ast.AST, lazy: bool) -> ast.AST:
        j = self._add_step(("eval", ast.unparse(node), self._inputs(node), None, True, not lazy))
        return ast.Name(id="#%d" % j, ctx=ast.Load())

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
        if isinstance(stmt, ast.Assert):
            tree = self._host_tree(stmt.test, False)
            self.actions.append(("assert", tree, ast.unparse(stmt.test)))
        elif isinstance(stmt, ast.Assign):
            self._assign(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self._import(stmt)
        elif isinstance(stmt, ast.Expr):
            self._expr(stmt)
        elif isinstance(stmt, ast.For):
            self._for(stmt)
        else:
            raise Unsplittable("a %s statement" % type(stmt).__name__)

    def _assign(self, stmt: ast.Assign) -> None:
        if len(stmt.targets) != 1:
            raise Unsplittable("chained assignment")
        names, unpack = _target_names(stmt.targets[0])
        value = stmt.value
        refs = {self._kind(n) for n in _free_names(value)}
        if not self._touches_sandbox(value) and not refs & {"mirror", "dynamic"}:
            self._check_host_only(value)
            try:
                frozen = self._freeze(value)
                result = Evaluator({**self.consts, **self.facades})(frozen)
                tmp: dict = {}
                _assign(tmp, stmt.targets[0], result)
            except Exception as exc:  # the test itself fails here; let the sandbox show it as written
                raise Unsplittable("a host-side assignment raised %s" % type(exc).__name__) from None
            self._bind(names, "static")
            self.static.update(tmp)
            return
        tree = self._host_tree(value, False)
        if isinstance(tree, ast.Name) and tree.id.startswith("#") and self._touches_sandbox(value):
            j = int(tree.id[1:])  # the whole value comes from the sandbox: keep it there too, under its names
            kind, source, bindings, _, want, strict = self.steps[j]
            self.steps[j] = (kind, source, bindings, (names, unpack), want, strict)
            self.actions.append(("bind", names, unpack, tree))
            self._bind(names, "mirror")
        else:
            self.actions.append(("bind", names, unpack, tree))
            self._bind(names, "dynamic")

    def _import(self, stmt: ast.stmt) -> None:
        self._add_step(("exec", ast.unparse(stmt), (), None, False, True))
        self.actions.append(("ran", len(self.steps) - 1))
        for alias in stmt.names:
            if alias.name == "*":
                raise Unsplittable("import *")
            name = alias.asname or alias.name.split(".")[0]
            if isinstance(stmt, ast.Import) and alias.name in HOST_MODULES and "." not in alias.name:
                self.facades[name] = _facade(alias.name)
                self._bind([name], "module")
            else:
                self._bind([name], "sandbox")

    def _expr(self, stmt: ast.Expr) -> None:
        value = stmt.value
        if isinstance(value, ast.Name):  # a bare name: `print` in HumanEval/129
            if self._kind(value.id) == "sandbox":
                self._add_step(("exec", value.id, (), None, False, True))
                self.actions.append(("ran", len(self.steps) - 1))
            return
        if self._touches_sandbox(value):
            j = self._add_step(("exec", ast.unparse(stmt), self._inputs(value), None, False, True))
            self.actions.append(("ran", j))
            return
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
            return  # printing host values shows nothing the verdict depends on
        self.actions.append(("expr", self._host_tree(value, False)))

    def _for(self, stmt: ast.For) -> None:
        if stmt.orelse or any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(stmt)):
            raise Unsplittable("a loop with break, continue or else")
        if self._touches_sandbox(stmt.iter) or {self._kind(n) for n in _free_names(stmt.iter)} & {"mirror", "dynamic"}:
            raise Unsplittable("a loop over values the program computes")
        self._check_host_only(stmt.iter)
        try:
            frozen = self._freeze(stmt.iter)
            items = list(Evaluator({**self.consts, **self.facades})(frozen))
        except Exception as exc:
            raise Unsplittable("a loop's iterable raised %s on the host" % type(exc).__name__) from None
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


@functools.lru_cache(maxsize=8192)
def split_test(source: str) -> Plan:
    """How `source` will be judged. Cached: a batch runs the same tests for every completion of a prompt."""
    try:
        with _SPLIT_LOCK:  # the splitter parses again (_copy): the whole split, not just the first parse
            module = ast.parse(source)
            splitter = _Splitter()
            splitter.statements(_inline_check(module))
    except SyntaxError:
        return Plan("sandbox", reason="the test does not parse on the host", source=source)
    except Unsplittable as exc:
        return Plan("sandbox", reason=str(exc), source=source)
    except RecursionError:
        return Plan("sandbox", reason="the test is nested too deeply to split", source=source)
    env = {**splitter.consts, **splitter.facades}
    return Plan("host", tuple(splitter.steps), (env, tuple(splitter.actions)), source=source)


def judge(plan: Plan, values: list) -> tuple[bool, str]:
    """Evaluate a host-mode plan on the steps' values (decoded, Raised or Opaque); (passed, why not)."""
    env, actions = plan.actions
    env = {**env, **{"#%d" % j: v for j, v in enumerate(values)}}
    evaluate = Evaluator(env)
    for action in actions:
        kind = action[0]
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
                return False, "assert %s: false on the host%s" % (action[2][:200], _shown(action[1], env, values))
        except HostJudgeError as exc:
            return False, "%s: %s" % (action[2][:200] if kind == "assert" else kind, exc)
        except Exception as exc:  # what the expression itself raises (TypeError, ZeroDivisionError, ...)
            what = "assert " + action[2][:200] if kind == "assert" else kind
            return False, "%s raised %s on the host: %s" % (what, type(exc).__name__, str(exc)[:200])
    return True, ""


def _shown(tree: ast.AST, env: dict, values: list) -> str:
    """The probes' values, for the message: `f(3)` returned 9."""
    shown = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id.startswith("#"):
            j = int(node.id[1:])
            value = values[j]
            if not isinstance(value, (Raised, Opaque)):
                shown.append(repr(value)[:120])
    return " (values: %s)" % ", ".join(shown) if shown else ""
