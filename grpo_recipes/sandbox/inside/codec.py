"""Values as plain data: a flat list of tagged tokens that JSON can carry, both ways across the sandbox wall.

    encode(value) -> list   in the sandbox: a test's value, as plain builtins (a subclass becomes its base type,
                            marked as a subclass; any other Mapping a dict, an iterator the items it yields)
    decode(tokens) -> value on the host: builds only None, bool, int, float, complex, str, bytes, bytearray, list,
                            tuple, set, frozenset, dict, range and a tuple iterator; it calls no code of the value
                            and is bounded in size, depth and hashing work whatever the tokens say

Tokens, in prefix order: "N" None, "T"/"F" bools, "i" <hex>, "f" <float repr>, "c" <repr> <repr>, "s" <str>,
"b"/"B" <hex> bytes/bytearray, "r" <hex> <hex> <hex> range, and "l" list, "t" tuple, "S" set, "Z" frozenset,
"I" iterator, each followed by its item count and the items, "d" dict by its pair count and key, value, ...
"x" before a value's tag: the value was of a subclass of that builtin (decoded as a subclass that adds nothing).
Flat, so neither side recurses: a program that lowers the recursion limit or nests a list 10^5 deep cannot make
the codec fail in an interesting way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MAX_TOKENS = 1 << 18
MAX_BYTES = 1 << 20  # characters of str/bytes/number text in one value
MAX_DEPTH = 100
MAX_HASHED = 4096  # set items + dict keys in one value: bounds the host's work under crafted hash collisions
MAX_INT_HEX = 4096  # hex digits: 16384 bits
MAX_ITEMS = 100_000  # items drawn from an iterator, and the length of a range

_INT = re.compile(r"-?[0-9a-f]{1,%d}\Z" % MAX_INT_HEX)
_FLOAT = re.compile(r"-?(?:inf|nan|[0-9]+(?:\.[0-9]*)?(?:e[-+]?[0-9]+)?)\Z")
_CONTAINERS = {"l": list, "t": tuple, "S": set, "Z": frozenset, "I": None, "d": dict}


class CodecError(ValueError):
    """The value is not plain data (encode), or the tokens are not a well-formed, bounded value (decode)."""


# ---- encode: runs in the sandbox, after the program (so it trusts nothing it did not bind at import)

_type, _isinstance, _len, _iter, _next = type, isinstance, len, iter, next
_int_hex = int.__format__
_float_repr = float.__repr__
_str_copy = str.__str__
_list_copy, _dict_copy, _set_copy, _frozenset_copy = list.copy, dict.copy, set.copy, frozenset.copy
_tuple_items = tuple.__getitem__
_complex_real, _complex_imag = complex.real.__get__, complex.imag.__get__
_FULL = slice(None)
_SUBCLASSABLE = (int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)
_EXACT = frozenset(_SUBCLASSABLE)


def encode(value: object) -> list:
    out: list = []
    budget = [MAX_BYTES]

    def text(s: str) -> str:
        budget[0] -= _len(s)
        if budget[0] < 0:
            raise CodecError("value too large to report (over %d characters of data)" % MAX_BYTES)
        return s

    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH or _len(out) > MAX_TOKENS:
            raise CodecError("value too large or too deeply nested to report")
        t = _type(v)
        if t not in _EXACT and v is not None and t is not bool and _isinstance(v, _SUBCLASSABLE):
            out.append("x")  # not exactly the builtin: `type(r) is int` must stay False on the host, as in Python
        if v is None:
            out.append("N")
        elif t is bool:
            out.append("T" if v else "F")
        elif _isinstance(v, int):
            out += ["i", text(_int_hex(v, "x"))]
        elif _isinstance(v, float):
            out += ["f", text(_float_repr(v))]
        elif _isinstance(v, complex):
            out += ["c", text(_float_repr(_complex_real(v))), text(_float_repr(_complex_imag(v)))]
        elif _isinstance(v, str):
            out += ["s", text(_str_copy(v))]
        elif _isinstance(v, (bytes, bytearray)):
            out += ["B" if _isinstance(v, bytearray) else "b", text(bytes(memoryview(v)).hex())]
        elif t is range:
            out += ["r", text(_int_hex(v.start, "x")), text(_int_hex(v.stop, "x")), text(_int_hex(v.step, "x"))]
        else:
            if _isinstance(v, list):
                tag, items = "l", _list_copy(v)
            elif _isinstance(v, tuple):
                tag, items = "t", _tuple_items(v, _FULL)
            elif _isinstance(v, dict):
                tag, items = "d", [x for pair in _dict_copy(v).items() for x in pair]
            elif _isinstance(v, (set, frozenset)):
                tag, items = ("S", _set_copy(v)) if _isinstance(v, set) else ("Z", _frozenset_copy(v))
            elif _isinstance(v, Mapping):  # os.environ, MappingProxy...: Mapping's == is dict's already
                tag, items = "d", [x for pair in v.items() for x in pair]
            elif hasattr(t, "__next__"):  # an iterator or generator: what list() of it would see
                tag, items = "I", []
                for x in _iter(v):
                    items.append(x)
                    if _len(items) > MAX_ITEMS:
                        raise CodecError("iterator longer than %d items" % MAX_ITEMS)
            else:
                raise CodecError("a %s is not plain data" % getattr(t, "__name__", "?"))
            items = list(items)
            out += [tag, _len(items) // 2 if tag == "d" else _len(items)]
            stack += [(x, depth + 1) for x in reversed(items)]
    return out


# ---- decode: runs on the host, on tokens the program may have forged


def _hex_int(token: object) -> int:
    if _type(token) is not str or not _INT.match(token):
        raise CodecError("bad int token")
    return int(token, 16)


def _scalar(tag: str, tokens: list, pos: int) -> tuple[object, int]:
    def arg(k: int = 0) -> object:
        if pos + k >= len(tokens):
            raise CodecError("truncated value")
        return tokens[pos + k]

    if tag == "N":
        return None, pos
    if tag in ("T", "F"):
        return tag == "T", pos
    if tag == "i":
        return _hex_int(arg()), pos + 1
    if tag in ("f", "c"):
        parts = [arg(k) for k in range(1 if tag == "f" else 2)]
        if not all(type(p) is str and len(p) <= 40 and _FLOAT.match(p) for p in parts):
            raise CodecError("bad float token")
        return (float(parts[0]) if tag == "f" else complex(float(parts[0]), float(parts[1]))), pos + len(parts)
    if tag == "s":
        if type(arg()) is not str:
            raise CodecError("bad str token")
        return arg(), pos + 1
    if tag in ("b", "B"):
        try:
            data = bytes.fromhex(arg()) if type(arg()) is str else None
        except ValueError:
            data = None
        if data is None:
            raise CodecError("bad bytes token")
        return (data if tag == "b" else bytearray(data)), pos + 1
    if tag == "r":
        value = range(_hex_int(arg()), _hex_int(arg(1)), _hex_int(arg(2)) or 1)
        try:
            length = len(value)
        except OverflowError:  # past 2**63 items: range(1 << 100) is a value a program can send
            length = MAX_ITEMS + 1
        if length > MAX_ITEMS:
            raise CodecError("range longer than %d" % MAX_ITEMS)
        return value, pos + 3
    raise CodecError("unknown tag %r" % (tag,))


def decode(tokens: object) -> object:
    if type(tokens) is not list or not tokens or len(tokens) > MAX_TOKENS:
        raise CodecError("not a token list")
    if sum(len(t) for t in tokens if type(t) is str) > 4 * MAX_BYTES:
        raise CodecError("value too large")
    pos, hashed = 0, 0
    stack: list[list] = []  # [tag, items left, items, subclass]
    while True:
        if pos >= len(tokens):
            raise CodecError("truncated value")
        tag, pos = tokens[pos], pos + 1
        sub = tag == "x"
        if sub:
            tag, pos = (tokens[pos] if pos < len(tokens) else None), pos + 1
        if type(tag) is not str or (sub and tag not in _MARKED):
            raise CodecError("bad tag")
        if tag in _CONTAINERS:
            count = tokens[pos] if pos < len(tokens) else None
            if type(count) is not int or not 0 <= count <= len(tokens):
                raise CodecError("bad item count")
            pos += 1
            items_left = 2 * count if tag == "d" else count
            if items_left:
                stack.append([tag, items_left, [], sub])
                if len(stack) > MAX_DEPTH:
                    raise CodecError("nested deeper than %d" % MAX_DEPTH)
                continue
            value = _build(tag, [], sub)
        else:
            value, pos = _scalar(tag, tokens, pos)
            if sub:
                value = _MARKED[tag](value)
        while stack:
            frame = stack[-1]
            frame[2].append(value)
            frame[1] -= 1
            if frame[1]:
                break
            stack.pop()
            if frame[0] in ("S", "Z", "d"):
                hashed += len(frame[2]) // (2 if frame[0] == "d" else 1)
                if hashed > MAX_HASHED:
                    raise CodecError("more than %d set items or dict keys" % MAX_HASHED)
            value = _build(frame[0], frame[2], frame[3])
        else:
            if pos != len(tokens):
                raise CodecError("trailing tokens")
            return value


def _build(tag: str, items: list, sub: bool = False) -> object:
    kind = _MARKED[tag] if sub else _CONTAINERS[tag]
    try:
        if tag == "d":
            return kind(zip(items[0::2], items[1::2]))
        if tag == "I":
            return iter(tuple(items))
        return kind(items)
    except TypeError as exc:  # an unhashable set item or dict key
        raise CodecError(str(exc)) from None


# What a value of a subclass of a builtin (a program's class, a namedtuple, a Counter) becomes here: an instance of
# a subclass that adds nothing, so that ==, hashing and the rest are the builtin's and `type(r) is int` is False.
_MARKED = {tag: type("subclass of " + base.__name__, (base,), {"__slots__": ()})
           for tag, base in (("i", int), ("f", float), ("c", complex), ("s", str), ("b", bytes),
                             ("B", bytearray), ("l", list), ("t", tuple), ("d", dict), ("S", set), ("Z", frozenset))}
