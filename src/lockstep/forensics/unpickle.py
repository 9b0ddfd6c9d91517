"""A bounded, restricted unpickler for flight-recorder dumps (`dumps`): builtins only, within a
`bounds.Budget` of memory and time that every dump of a folder shares.

Pure Python, one opcode at a time, so that it refuses what the C unpickler cannot: a memo
index far past the pickle's size (9 bytes, `LONG_BINPUT 2**26`, made the C unpickler
allocate 1 GB: its memo is an array as long as the largest index, up to 64 GiB), a length
that claims more bytes than the pickle holds, containers nested deeper than
`bounds.MAX_DEPTH`, more memory than the budget. Opcodes that name a class or a function
(GLOBAL, REDUCE, BUILD, ...) are refused: a dump holds only dicts, lists, tuples, sets,
strings, bytes, numbers, booleans and None.

Each object is charged what CPython 3.11 allocates for it, rounded up (`sys.getsizeof` for
strings and numbers, a slot a reference, a dict's table as it grows), and so are the
machine's own memo, MARKs and depths while it runs: the budget bounds the memory the reader
takes at its peak, not only the dump's size (tests/forensics/test_dump_bounds.py measures
it against tracemalloc).
"""

from __future__ import annotations

import struct
import sys

from lockstep.forensics.bounds import MAX_DEPTH, Budget, DumpError, OutOfBounds, mib

MAX_MARKS = 64  # MARKs open at once (torch's pickler: a few)
MAX_TEXT_ARG = 64  # bytes of a text opcode's argument: a number, a memo index
CHECK_MEMORY, CHECK_TIME = 1 << 10, 1 << 14  # opcodes between two looks at the budget, the clock
# Bytes charged: a reference's slot (on the stack, then in its container); a dict's table (120
# more with its first item, 46 an item after, its old table too while it grows: half given
# back after); a set's; a list's growth (while the MARK's list still holds the items: given
# back after); a MARK's list, a memo entry, a kept depth (the machine's own, back at its end).
SLOT, DICT_ITEM, DICT_FIRST, SET_ITEM, LIST_ITEM = 8, 96, 120, 128, 10
MARK, MEMO_ITEM, NESTED = 64, 112, 176
_NESTING = {list, dict, tuple, set, frozenset}


def load(data: bytes, budget: Budget):
    """The object `data` pickles, made of builtins only, within `budget`: DumpError when
    `data` is not such a pickle, OutOfBounds when it is past a bound."""
    machine = _Machine(data, budget)
    try:
        return machine.run()
    except DumpError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, RecursionError,
            OverflowError, struct.error) as err:  # fmt: skip
        where = f"at byte {machine.pos - 1}"
        raise DumpError(f"not a dump: a malformed pickle {where} ({type(err).__name__})") from None
    finally:
        budget.peak = max(budget.peak, budget.used + machine.top)
        budget.used += machine.used - machine.own


class _Machine:
    """The pickle machine: a stack, its MARKs, the memo, and the depth of every container
    that holds one. A small object's cost is counted at once and compared with the budget
    every `CHECK_MEMORY` opcodes (a few hundred KB past it at most); a large one's at once.
    `own`: what of `used` is the machine's own (memo, depths), given back when it ends."""

    def __init__(self, data: bytes, budget: Budget):
        self.data, self.view, self.pos, self.budget = data, memoryview(data), 0, budget
        self.stack: list = []
        self.marks: list[list] = []
        self.memo: dict[int, object] = {}
        self.depths: dict[int, tuple[object, int]] = {}  # id -> (container, depth > 1)
        self.used = self.own = self.top = 0  # `top`: the most `used` was
        self.room = budget.memory - budget.used

    def run(self):
        data, end, table, memo, count = self.data, len(self.data), _OPS, self.memo, 0
        while self.pos < end:
            pos = self.pos
            op = data[pos]
            if op == 0x68:  # BINGET: most of a torch dump's opcodes (it memoizes its strings)
                self.stack.append(memo[data[pos + 1]])
                self.pos = pos + 2
                self.used += SLOT
            else:
                self.pos = pos + 1
                handler = table.get(op)
                if handler is None:
                    raise DumpError(_refused(op, self.stack))
                if handler(self):
                    return self.stack.pop()
            count += 1
            if not count & (CHECK_MEMORY - 1):
                self.charge(0)
                if not count & (CHECK_TIME - 1):
                    self.budget.clock()
        raise DumpError("not a dump: a pickle that ends before its STOP")

    def charge(self, n: int) -> None:
        self.used += n
        self.top = max(self.top, self.used)
        if self.used > self.room:
            raise self.budget.over()

    def push(self, obj, cost: int = 0) -> None:
        self.charge(cost + SLOT)
        self.stack.append(obj)

    def take(self, n: int) -> memoryview:
        left = len(self.data) - self.pos
        if n > left:
            raise DumpError(
                f"not a dump: claims {n} bytes at byte {self.pos} where {left} are left"
            )
        self.pos += n
        return self.view[self.pos - n : self.pos]

    def size(self, unpack) -> int:
        value = unpack(self.data, self.pos)[0]  # struct.error when cut short
        self.pos += _WIDTH[unpack]
        return value

    def line(self, limit: int | None = MAX_TEXT_ARG) -> bytes:
        stop = len(self.data) if limit is None else self.pos + limit + 1
        end = self.data.find(b"\n", self.pos, stop)
        if end < 0 and stop < len(self.data):
            raise OutOfBounds(f"a text argument at byte {self.pos} over {limit} bytes")
        if end < 0:
            raise DumpError(f"not a dump: a text argument at byte {self.pos} cut short")
        text, self.pos = self.data[self.pos : end], end + 1
        return text

    def pop_mark(self) -> list:
        items, self.stack = self.stack, self.marks.pop()
        self.used -= MARK
        return items

    def nest(self, container, items) -> None:
        """`container` now holds `items`: its depth is one more than the deepest of them."""
        if _NESTING.isdisjoint(map(type, items)):
            return
        depths = self.depths
        deepest = max(
            depths[id(item)][1] if id(item) in depths else 1
            for item in items
            if type(item) in _NESTING
        )
        if deepest + 1 > MAX_DEPTH:
            raise OutOfBounds(f"containers nested over {MAX_DEPTH} deep (at byte {self.pos - 1})")
        known = depths.get(id(container))
        if known is None:
            self.used += NESTED
            self.own += NESTED
        if known is None or known[1] <= deepest:
            depths[id(container)] = (container, deepest + 1)

    def put(self, index: int) -> None:
        if not 0 <= index < len(self.data):  # a pickler numbers its memo 0, 1, 2, ...
            raise OutOfBounds(
                f"memo index {index} in a {len(self.data)}-byte pickle (the C unpickler "
                f"would allocate {mib(16 * index)} for it)"
            )
        if index not in self.memo:
            self.used += MEMO_ITEM
            self.own += MEMO_ITEM
        self.memo[index] = self.stack[-1]


def _refused(op: int, stack: list) -> str:
    name = _NAMES.get(op)
    if name is None:
        return f"not a dump: unknown pickle opcode 0x{op:02x}"
    if name == "STACK_GLOBAL" and len(stack) >= 2 and all(type(s) is str for s in stack[-2:]):
        name = f"{stack[-2][:200]}.{stack[-1][:200]}"
        return f"refused: the dump names {name} (a dump holds only builtins)"
    return f"refused: the pickle's {name} (a dump holds only builtins, never a class or function)"


_U1, _U2, _U4, _I4, _U8, _F8 = (
    struct.Struct(f).unpack_from for f in ("<B", "<H", "<I", "<i", "<Q", ">d")
)
_WIDTH = {_U1: 1, _U2: 2, _U4: 4, _I4: 4, _U8: 8, _F8: 8}

# Each opcode's handler, True for STOP; the frequent ones count a small cost without a call.


def _mark(m: _Machine) -> bool:
    if len(m.marks) >= MAX_MARKS:
        raise OutOfBounds(f"MARKs nested over {MAX_MARKS} deep (at byte {m.pos - 1})")
    m.marks.append(m.stack)
    m.stack = []
    m.used += MARK
    return False


def _value(make, cost: int):
    def op(m: _Machine) -> bool:
        m.stack.append(make())
        m.used += cost + SLOT
        return False

    return op


def _number(unpack, cost: int):
    def op(m: _Machine) -> bool:
        m.stack.append(m.size(unpack))
        m.used += cost + SLOT
        return False

    return op


def _long(unpack):
    def op(m: _Machine) -> bool:
        n = m.size(unpack)
        if not 0 <= n <= 256:
            raise OutOfBounds(f"an integer of {n} bytes at byte {m.pos} (at most 256)")
        m.push(int.from_bytes(m.take(n), "little", signed=True), 28 + n)
        return False

    return op


def _text(unpack):
    def op(m: _Machine) -> bool:
        text = str(m.take(m.size(unpack)), "utf-8", "surrogatepass")
        m.push(text, sys.getsizeof(text))
        return False

    return op


def _bytes(unpack, kind=bytes):
    def op(m: _Machine) -> bool:
        raw = kind(m.take(m.size(unpack)))
        m.push(raw, sys.getsizeof(raw))
        return False

    return op


def _int_line(m: _Machine) -> bool:
    text = m.line()
    value = {b"00": False, b"01": True}.get(text)
    m.push(int(text, 0) if value is None else value, 36)
    return False


def _long_line(m: _Machine) -> bool:
    m.push(int(m.line().rstrip(b"L"), 0), 36)
    return False


def _float_line(m: _Machine) -> bool:
    m.push(float(m.line()), 24)
    return False


def _unicode_line(m: _Machine) -> bool:
    text = str(m.line(None), "raw-unicode-escape")
    m.push(text, sys.getsizeof(text))
    return False


def _tuple_of(n: int | None):
    def op(m: _Machine) -> bool:
        if n is None:
            items = m.pop_mark()
        elif n:
            if len(m.stack) < n:
                raise IndexError("a tuple of more items than the stack holds")
            items, m.stack[-n:] = m.stack[-n:], []
        else:
            items = []
        made = tuple(items)
        m.nest(made, made)
        m.push(made, 40 + SLOT * len(made))
        return False

    return op


def _append(m: _Machine) -> bool:
    _extend(m, [m.stack.pop()])
    return False


def _appends(m: _Machine) -> bool:
    _extend(m, m.pop_mark())
    return False


def _extend(m: _Machine, items: list) -> None:
    target = m.stack[-1]
    if type(target) is not list:
        raise DumpError(f"not a dump: APPEND to a {type(target).__name__} at byte {m.pos - 1}")
    m.charge(LIST_ITEM * len(items))  # its slots: charged as pushed
    target.extend(items)
    m.nest(target, items)
    m.used -= SLOT * len(items)


def _setitem(m: _Machine) -> bool:
    value, key = m.stack.pop(), m.stack.pop()
    _update(m, [key, value])
    return False


def _setitems(m: _Machine) -> bool:
    _update(m, m.pop_mark())
    return False


def _update(m: _Machine, items: list) -> None:
    target = m.stack[-1]
    if type(target) is not dict or len(items) % 2:
        raise DumpError(f"not a dump: SETITEMS on a {type(target).__name__} at byte {m.pos - 1}")
    m.charge(DICT_ITEM * (len(items) // 2) + (DICT_FIRST if items and not target else 0))
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]
    m.nest(target, items)
    m.used -= DICT_ITEM // 2 * (len(items) // 2)


def _list(m: _Machine) -> bool:
    items = m.pop_mark()
    m.nest(items, items)
    m.push(items, 88 + LIST_ITEM * len(items))
    return False


def _dict(m: _Machine) -> bool:
    items = m.pop_mark()
    m.push({}, 64)
    _update(m, items)
    return False


def _additems(m: _Machine) -> bool:
    items, target = m.pop_mark(), m.stack[-1]
    if type(target) is not set:
        raise DumpError(f"not a dump: ADDITEMS to a {type(target).__name__} at byte {m.pos - 1}")
    m.charge(SET_ITEM * len(items))
    target.update(items)
    m.nest(target, items)
    return False


def _frozenset(m: _Machine) -> bool:
    items = m.pop_mark()
    made = frozenset(items)
    m.nest(made, items)
    m.push(made, 216 + SET_ITEM * len(items))
    return False


def _pop(m: _Machine) -> bool:
    if m.stack:
        m.stack.pop()
    else:
        m.pop_mark()
    return False


def _pop_mark(m: _Machine) -> bool:
    m.pop_mark()
    return False


def _dup(m: _Machine) -> bool:
    m.push(m.stack[-1])
    return False


def _proto(m: _Machine) -> bool:
    version = m.size(_U1)
    if version > 5:  # pickle.HIGHEST_PROTOCOL in Python 3.8-3.14
        raise DumpError(f"not a dump: pickle protocol {version}")
    return False


def _frame(m: _Machine) -> bool:
    n = m.size(_U8)  # a frame's length: the opcodes in it are read as they come
    if n > len(m.data) - m.pos:
        raise DumpError(f"not a dump: a frame of {n} bytes at byte {m.pos} past the end")
    return False


def _stop(m: _Machine) -> bool:
    if len(m.stack) != 1 or m.marks:
        raise DumpError("not a dump: a pickle that stops with more than its object")
    return True


def _global(m: _Machine) -> bool:
    module, name = (m.line(256).decode("ascii", "replace") for _ in range(2))
    raise DumpError(f"refused: the dump names {module}.{name} (a dump holds only builtins)")


def _memo(unpack, store: bool):
    def op(m: _Machine) -> bool:
        index = int(m.line(), 10) if unpack is None else m.size(unpack)
        if store:
            m.put(index)
        else:
            m.stack.append(m.memo[index])
            m.used += SLOT
        return False

    return op


def _memoize(m: _Machine) -> bool:
    m.put(len(m.memo))
    return False


_OPS = {
    0x80: _proto, 0x95: _frame, ord("."): _stop, ord("("): _mark, ord("0"): _pop,
    ord("1"): _pop_mark, ord("2"): _dup, ord("c"): _global,
    ord("N"): _value(lambda: None, 0), 0x88: _value(lambda: True, 0),
    0x89: _value(lambda: False, 0), ord("I"): _int_line, ord("L"): _long_line,
    ord("J"): _number(_I4, 32), ord("K"): _number(_U1, 0), ord("M"): _number(_U2, 32),
    0x8A: _long(_U1), 0x8B: _long(_I4), ord("F"): _float_line, ord("G"): _number(_F8, 24),
    ord("V"): _unicode_line, ord("X"): _text(_U4), 0x8C: _text(_U1), 0x8D: _text(_U8),
    ord("B"): _bytes(_U4), ord("C"): _bytes(_U1), 0x8E: _bytes(_U8),
    0x96: _bytes(_U8, bytearray), ord(")"): _tuple_of(0), 0x85: _tuple_of(1),
    0x86: _tuple_of(2), 0x87: _tuple_of(3), ord("t"): _tuple_of(None),
    ord("]"): _value(list, 88), ord("l"): _list, ord("a"): _append, ord("e"): _appends,
    ord("}"): _value(dict, 64), ord("d"): _dict, ord("s"): _setitem, ord("u"): _setitems,
    0x8F: _value(set, 216), 0x90: _additems, 0x91: _frozenset,
    ord("p"): _memo(None, True), ord("q"): _memo(_U1, True), ord("r"): _memo(_U4, True),
    0x94: _memoize, ord("g"): _memo(None, False), ord("h"): _memo(_U1, False),
    ord("j"): _memo(_U4, False),
}  # fmt: skip

# The opcodes refused, by name: they build objects by calling something, or reach outside;
# and Python 2's strings (torch writes none).
_NAMES = {
    0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD", ord("i"): "INST",
    ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2",
    0x84: "EXT4", ord("P"): "PERSID", ord("Q"): "BINPERSID", 0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER", ord("S"): "STRING", ord("T"): "BINSTRING",
    ord("U"): "SHORT_BINSTRING",
}  # fmt: skip
