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


class PickleUnreadable(Exception):
    """The opcode stream uses something we do not model, or is damaged."""


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


def read_pickle_tree(data: bytes, persistent: bool = False):
    """Rebuild the value a pickle describes, without executing anything.

    Walks ``pickletools.genops`` and keeps our own stack and memo; GLOBAL/STACK_GLOBAL become ``Global``
    placeholders, REDUCE/NEWOBJ/INST/OBJ become ``Call`` records, BUILD stores the state on the record.
    Raises ``PickleUnreadable`` for damaged streams or opcodes a data file has no reason to use.
    """
    stack: list = []
    marks: list[int] = []
    memo: dict = {}

    def pop_mark() -> list:
        if not marks:
            raise PickleUnreadable("MARK missing")
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                if len(stack) != 1:
                    raise PickleUnreadable("unbalanced stack at STOP")
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
                stack.append(Global(module, qual))
            elif name == "STACK_GLOBAL":
                qual = stack.pop()
                module = stack.pop()
                stack.append(Global(str(module), str(qual)))
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
                stack.append(Call(Global(module, qual), tuple(pop_mark())))
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


def _hashable(k):
    try:
        hash(k)
        return k
    except TypeError:
        return repr(k)


def _as(obj, typ):
    if not isinstance(obj, typ):
        raise PickleUnreadable(f"expected {typ.__name__} on the stack")
    return obj
