"""Reading a pickle without unpickling it: inert placeholders for globals and calls.

``train_state.pt`` (a torch zip archive) and DCP's ``.metadata`` (a bare pickle) can run
arbitrary code if unpickled. ``read_pickle_tree`` walks the opcode stream with
``pickletools.genops`` and rebuilds plain data (dicts, lists, numbers, strings) with
``Global``/``Call``/``PersistentRef`` placeholders: nothing is imported or called.
"""

from __future__ import annotations

import pickletools
import struct
from dataclasses import dataclass

# ----------------------------------------------------------------------------------------------------------
# Safe pickle reading
# ----------------------------------------------------------------------------------------------------------


# Bounds on what a hostile pickle can cost. A real DCP .metadata is ~14,000 opcodes per 80 KB and nests
# about 8 levels; the walk runs at ~1 million opcodes a second.
MAX_OPS = 2_000_000
MAX_DEPTH = 100


class PickleUnreadable(Exception):
    """The opcode stream uses something we do not model, or is damaged."""


class PickleTooLarge(PickleUnreadable):
    """More opcodes than ``MAX_OPS``: the caller may fall back to a cheaper scan."""


@dataclass(eq=False)
class Global:
    """A class or function the pickle names (never imported)."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Call:
    """What unpickling *would* have built by calling ``func(*args)``; ``state`` is what BUILD would set."""

    func: object
    args: tuple = ()
    state: object = None

    @property
    def qualname(self) -> str:
        return self.func.qualname if isinstance(self.func, Global) else "?"


@dataclass(eq=False)
class PersistentRef:
    """A persistent id (torch zip archives use them for tensor storages)."""

    pid: object


def read_pickle_tree(data: bytes, persistent: bool = False, globals_out: list | None = None):
    """Rebuild the value a pickle describes, without executing anything.

    Walks ``pickletools.genops`` and keeps our own stack and memo; GLOBAL/STACK_GLOBAL become ``Global``
    placeholders, REDUCE/NEWOBJ/INST/OBJ become ``Call`` records, BUILD stores the state on the record.
    Raises ``PickleUnreadable`` for damaged streams or opcodes a data file has no reason to use, for more
    than ``MAX_OPS`` opcodes (``PickleTooLarge``), and for values nested deeper than ``MAX_DEPTH`` or
    containing themselves (checked after the walk, iteratively: such values crash a recursive consumer).
    Every class or function the pickle names is appended to ``globals_out`` when given, so the caller can
    judge what unpickling it for real would import and call.
    """
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    ops = 0

    def pop_mark() -> list:
        if not marks:
            raise PickleUnreadable("MARK missing")
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    try:
        for op, arg, _pos in pickletools.genops(data):
            ops += 1
            if ops > MAX_OPS:
                raise PickleTooLarge(f"more than {MAX_OPS} opcodes")
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                if len(stack) != 1:
                    raise PickleUnreadable("unbalanced stack at STOP")
                check_depth(stack[0])
                return stack[0]
            if name == "MARK":
                marks.append(len(stack))
            elif name in ("NONE",):
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name in (
                "INT",
                "BININT",
                "BININT1",
                "BININT2",
                "LONG",
                "LONG1",
                "LONG4",
                "FLOAT",
                "BINFLOAT",
                "STRING",
                "BINSTRING",
                "SHORT_BINSTRING",
                "UNICODE",
                "BINUNICODE",
                "SHORT_BINUNICODE",
                "BINUNICODE8",
                "BINBYTES",
                "SHORT_BINBYTES",
                "BINBYTES8",
                "BYTEARRAY8",
            ):
                stack.append(arg)
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "EMPTY_SET":
                stack.append(set())
            elif name == "LIST":
                stack.append(pop_mark())
            elif name == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise PickleUnreadable("stack underflow")
                tup = tuple(stack[-n:])
                del stack[-n:]
                stack.append(tup)
            elif name == "DICT":
                items = pop_mark()
                stack.append({_hashable(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif name == "FROZENSET":
                stack.append(frozenset(_hashable(x) for x in pop_mark()))
            elif name == "APPEND":
                v = stack.pop()
                _as(stack[-1], list).append(v)
            elif name == "APPENDS":
                items = pop_mark()
                _as(stack[-1], list).extend(items)
            elif name == "SETITEM":
                v = stack.pop()
                k = stack.pop()
                _as(stack[-1], dict)[_hashable(k)] = v
            elif name == "SETITEMS":
                items = pop_mark()
                d = _as(stack[-1], dict)
                for i in range(0, len(items) - 1, 2):
                    d[_hashable(items[i])] = items[i + 1]
            elif name == "ADDITEMS":
                items = pop_mark()
                _as(stack[-1], set).update(_hashable(x) for x in items)
            elif name == "POP":
                if stack:
                    stack.pop()
                elif marks:  # POP with an empty frame above a MARK behaves as POP_MARK
                    marks.pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise PickleUnreadable("memo key missing")
                stack.append(memo[arg])
            elif name == "GLOBAL":
                module, _, qual = str(arg).partition(" ")
                stack.append(_named(Global(module, qual), globals_out))
            elif name == "STACK_GLOBAL":
                qual = stack.pop()
                module = stack.pop()
                stack.append(_named(Global(str(module), str(qual)), globals_out))
            elif name == "REDUCE":
                args = stack.pop()
                func = stack.pop()
                stack.append(Call(func, tuple(args) if isinstance(args, (tuple, list)) else (args,)))
            elif name == "NEWOBJ":
                args = stack.pop()
                cls = stack.pop()
                stack.append(Call(cls, tuple(args) if isinstance(args, (tuple, list)) else (args,)))
            elif name == "NEWOBJ_EX":
                kwargs = stack.pop()
                args = stack.pop()
                cls = stack.pop()
                stack.append(Call(cls, tuple(args) if isinstance(args, (tuple, list)) else (args,), kwargs))
            elif name == "BUILD":
                state = stack.pop()
                obj = stack[-1]
                if isinstance(obj, Call):
                    obj.state = state
                else:
                    raise PickleUnreadable("BUILD on a non-object")
            elif name == "INST":
                module, _, qual = str(arg).partition(" ")
                stack.append(Call(_named(Global(module, qual), globals_out), tuple(pop_mark())))
            elif name == "OBJ":
                items = pop_mark()
                if not items:
                    raise PickleUnreadable("OBJ without class")
                stack.append(Call(items[0], tuple(items[1:])))
            elif name in ("PERSID", "BINPERSID"):
                if not persistent:
                    raise PickleUnreadable("persistent id in a plain pickle")
                pid = arg if name == "PERSID" else stack.pop()
                stack.append(PersistentRef(pid))
            else:  # EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER: no data file needs them
                raise PickleUnreadable(f"unsupported opcode {name}")
    except PickleUnreadable:
        raise
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, struct.error) as exc:
        raise PickleUnreadable(f"damaged pickle ({type(exc).__name__}: {exc})") from None
    raise PickleUnreadable("no STOP opcode (truncated)")


def _named(g: Global, out: list | None) -> Global:
    if out is not None:
        out.append(g)
    return g


_SCALARS = (str, bytes, int, float, bool, type(None), Global, Call, PersistentRef)


class _Unhashable:
    """Stands for a dict key or set member that is not a plain value (a list, a nested tuple ...)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unhashable key>"


def _hashable(k):
    """``k`` when hashing it is cheap and safe, else a placeholder.

    Only scalars and flat tuples of scalars are hashed: ``hash()`` of a tuple nested thousands deep recurses
    in C without a depth check and kills the interpreter (a segfault, no exception)."""
    if isinstance(k, _SCALARS):
        return k
    if isinstance(k, tuple) and all(isinstance(x, _SCALARS) for x in k):
        return k
    return _Unhashable()


def _children(v):
    if isinstance(v, (list, tuple, set, frozenset)):
        return v
    if isinstance(v, dict):
        return [*v.keys(), *v.values()]
    if isinstance(v, Call):
        return (v.func, v.args, v.state)
    if isinstance(v, PersistentRef):
        return (v.pid,)
    return ()


_CONTAINERS = (list, tuple, set, frozenset, dict, Call, PersistentRef)


def check_depth(root, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of ``root``, computed iteratively (memoised per object, so shared values cost once).

    Raises PickleUnreadable past ``limit`` or for a value that contains itself: code that walks such a value
    recursively (hash, repr, ==, json) crashes or never ends.
    """
    depth: dict[int, int] = {}
    active: set[int] = set()
    stack = [(root, False)]
    while stack:
        v, done = stack.pop()
        if not isinstance(v, _CONTAINERS):
            continue
        key = id(v)
        if done:
            active.discard(key)
            d = 1 + max((depth.get(id(c), 0) for c in _children(v) if isinstance(c, _CONTAINERS)), default=0)
            if d > limit:
                raise PickleUnreadable(f"values nested more than {limit} levels deep")
            depth[key] = d
            continue
        if key in depth:
            continue
        if key in active:
            raise PickleUnreadable("a value that contains itself")
        active.add(key)
        stack.append((v, True))
        if len(active) > limit:
            raise PickleUnreadable(f"values nested more than {limit} levels deep")
        for c in _children(v):
            if isinstance(c, _CONTAINERS):
                if id(c) in active:
                    raise PickleUnreadable("a value that contains itself")
                if id(c) not in depth:
                    stack.append((c, False))
    return depth.get(id(root), 0)


def _as(obj, typ):
    if not isinstance(obj, typ):
        raise PickleUnreadable(f"expected {typ.__name__} on the stack")
    return obj
