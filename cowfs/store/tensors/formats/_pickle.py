"""A symbolic pickle machine: runs a pickle's opcodes (decoded by `pickletools.genops`) on
stand-in values, so the structure of a checkpoint's pickle can be read without unpickling.

Nothing named in the pickle is imported or called. GLOBAL/STACK_GLOBAL push a `Global`,
REDUCE/NEWOBJ/INST/OBJ push a `Call` that records the callable and its arguments, BUILD
records the state on it, SETITEM(S)/APPEND(S) on a Call record the items. Persistent ids
become `PersId`. Python literals (str, int, float, bytes, bool, None, tuple, list) stay as
they are; dicts become `Dict` (a list of pairs: keys may be unhashable stand-ins).
Out-of-band buffers (protocol 5) are refused."""
from __future__ import annotations

import pickletools
from dataclasses import dataclass, field
from typing import Iterator

from ._base import Malformed

MAX_PICKLE = 64 << 20
MAX_DEPTH = 1000  # deeper nesting is refused: paths are copied per level


@dataclass(eq=False)
class Global:
    module: str
    name: str


@dataclass(eq=False)
class Call:
    func: object
    args: object
    state: object = None
    dictitems: list[tuple[object, object]] = field(default_factory=list)
    listitems: list[object] = field(default_factory=list)

    def named(self, module: str, name: str) -> bool:
        f = self.func
        return isinstance(f, Global) and f.module == module and f.name == name


@dataclass(eq=False)
class PersId:
    pid: object


@dataclass(eq=False)
class Dict:
    items: list[tuple[object, object]] = field(default_factory=list)

    def get(self, key: str) -> object:
        for k, v in self.items:
            if k == key and type(k) is str:
                return v
        return None


@dataclass(eq=False)
class SetVal:
    items: list[object] = field(default_factory=list)


_CONST = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_PUSH_ARG = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING",
             "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
             "BYTEARRAY8", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
             "FLOAT", "BINFLOAT"}


def run(data: bytes) -> object:
    """The stand-in value the pickle in `data` builds. Raises (Malformed or anything the
    opcode decoder raises) on a malformed or unsupported pickle."""
    return run_prefix(data)[0]


def run_prefix(data: bytes) -> tuple[object, int]:
    """`run` of the pickle `data` begins with, and where it ends (just past its STOP): the
    bytes after it are not looked at."""
    if len(data) > MAX_PICKLE:
        raise Malformed("pickle too large")
    stack: list[object] = []
    marks: list[int] = []
    memo: dict[int, object] = {}

    def pop_mark() -> list[object]:
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    for op, arg, pos in pickletools.genops(data):
        name = op.name
        if name in _PUSH_ARG:
            stack.append(bytes(arg) if isinstance(arg, bytearray) else arg)
        elif name in _CONST:
            stack.append(_CONST[name])
        elif name in ("PROTO", "FRAME"):
            pass
        elif name == "STOP":
            if len(stack) != 1 or marks:
                raise Malformed("pickle: STOP with a bad stack")
            return stack[0], pos + 1
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "POP":
            if marks and marks[-1] == len(stack):
                marks.pop()  # POP of a bare mark (what pickle.py does too)
            else:
                stack.pop()
        elif name == "POP_MARK":
            pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[int(arg)])
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "LIST":
            stack.append(pop_mark())
        elif name == "EMPTY_DICT":
            stack.append(Dict())
        elif name == "DICT":
            items = pop_mark()
            stack.append(Dict(list(zip(items[::2], items[1::2]))))
        elif name == "EMPTY_SET":
            stack.append(SetVal())
        elif name == "FROZENSET":
            stack.append(SetVal(pop_mark()))
        elif name == "TUPLE":
            stack.append(tuple(pop_mark()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n or (marks and marks[-1] > len(stack) - n):
                raise Malformed("pickle: stack underflow")
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name in ("APPEND", "APPENDS"):
            items = [stack.pop()] if name == "APPEND" else pop_mark()
            target = stack[-1]
            if isinstance(target, list):
                target.extend(items)
            elif isinstance(target, Call):
                target.listitems.extend(items)
            else:
                raise Malformed("pickle: APPEND to a non-list")
        elif name in ("SETITEM", "SETITEMS"):
            if name == "SETITEM":
                value = stack.pop()
                items = [stack.pop(), value]
            else:
                items = pop_mark()
            if len(items) % 2:
                raise Malformed("pickle: odd SETITEMS")
            target = stack[-1]
            pairs = list(zip(items[::2], items[1::2]))
            if isinstance(target, Dict):
                target.items.extend(pairs)
            elif isinstance(target, Call):
                target.dictitems.extend(pairs)
            else:
                raise Malformed("pickle: SETITEM on a non-dict")
        elif name == "ADDITEMS":
            items = pop_mark()
            target = stack[-1]
            if not isinstance(target, SetVal):
                raise Malformed("pickle: ADDITEMS on a non-set")
            target.items.extend(items)
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            stack.append(Global(module, attr))
        elif name == "STACK_GLOBAL":
            attr = stack.pop()
            module = stack.pop()
            if not isinstance(module, str) or not isinstance(attr, str):
                raise Malformed("pickle: STACK_GLOBAL of non-strings")
            stack.append(Global(module, attr))
        elif name in ("EXT1", "EXT2", "EXT4"):
            stack.append(Global("<extension>", str(arg)))
        elif name == "REDUCE":
            args = stack.pop()
            stack.append(Call(stack.pop(), args))
        elif name == "NEWOBJ":
            args = stack.pop()
            stack.append(Call(stack.pop(), args))
        elif name == "NEWOBJ_EX":
            kwargs = stack.pop()
            args = stack.pop()
            stack.append(Call(stack.pop(), (args, kwargs)))
        elif name == "INST":
            module, _, attr = str(arg).partition(" ")
            stack.append(Call(Global(module, attr), tuple(pop_mark())))
        elif name == "OBJ":
            items = pop_mark()
            if not items:
                raise Malformed("pickle: OBJ without a class")
            stack.append(Call(items[0], tuple(items[1:])))
        elif name == "BUILD":
            state = stack.pop()
            target = stack[-1]
            if not isinstance(target, Call):
                raise Malformed("pickle: BUILD on a non-object")
            target.state = state
        elif name == "PERSID":
            stack.append(PersId(arg))
        elif name == "BINPERSID":
            stack.append(PersId(stack.pop()))
        else:  # NEXT_BUFFER, READONLY_BUFFER, anything newer
            raise Malformed(f"pickle: unsupported opcode {name}")
        if marks and marks[-1] > len(stack):
            raise Malformed("pickle: an opcode consumed a mark")
    raise Malformed("pickle: no STOP")


def _key_text(key: object) -> str:
    """A dict key as a path component: str as is, int in decimal, other literals by repr,
    a tuple of literals as (a,b), anything else (a stand-in object) as "?"."""
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    if key is None or isinstance(key, (bool, float, bytes)):
        return repr(key)
    if isinstance(key, tuple) and all(isinstance(k, (str, int, float)) for k in key):
        return "(" + ",".join(_key_text(k) for k in key) + ")"
    return "?"


def walk(root: object) -> Iterator[tuple[tuple[str, ...], object]]:
    """(path, value) for every value reachable from `root`, depth first, in pickle order.
    Dict keys and list/tuple indices extend the path; so do a Call's state (a Dict or a
    (dict, slots) pair: keys) and its set/list items. A Call's positional arguments extend
    the path by their index, except for torch's own `torch._utils._rebuild_*` and
    `torch._tensor._rebuild_from_type*` wrappers, whose arguments are the tensor itself.
    Each container is visited once (the first path that reaches it wins). Raises
    Malformed for a path deeper than MAX_DEPTH."""
    seen: set[int] = set()
    todo: list[tuple[tuple[str, ...], object]] = [((), root)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, (list, tuple, Dict, Call, SetVal)):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if len(path) > MAX_DEPTH:
            raise Malformed("pickle: nesting too deep")
        yield path, value
        children: list[tuple[tuple[str, ...], object]] = []
        if isinstance(value, (list, tuple)):
            children = [(path + (str(i),), v) for i, v in enumerate(value)]
        elif isinstance(value, SetVal):
            children = [(path + (str(i),), v) for i, v in enumerate(value.items)]
        elif isinstance(value, Dict):
            children = [(path + (_key_text(k),), v) for k, v in value.items]
        elif isinstance(value, Call):
            f = value.func
            torch_wrapper = isinstance(f, Global) and (
                (f.module == "torch._utils" and f.name.startswith("_rebuild"))
                or (f.module == "torch._tensor" and f.name.startswith("_rebuild")))
            args = value.args if isinstance(value.args, tuple) else (value.args,)
            children = [(path if torch_wrapper else path + (str(i),), v)
                        for i, v in enumerate(args)]
            states = value.state if isinstance(value.state, tuple) else (value.state,)
            for st in states:
                if isinstance(st, Dict):
                    children += [(path + (_key_text(k),), v) for k, v in st.items]
                elif st is not None:
                    children.append((path, st))
            children += [(path + (_key_text(k),), v) for k, v in value.dictitems]
            children += [(path + (str(i),), v) for i, v in enumerate(value.listitems)]
        todo.extend(reversed(children))
