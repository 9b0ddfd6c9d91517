"""The pickle opcodes `unpickle`'s machine runs: a handler each, which builds its object and
charges it, and the opcodes refused, by name."""

from __future__ import annotations

import struct
import sys

from lockstep.forensics.bounds import DumpError, OutOfBounds

MAX_MARKS = 64  # MARKs open at once (torch's pickler: a few)
CHUNK = 512  # items hashed between two looks at the clock (colliding hashes are quadratic)
# Bytes charged (docs/design/forensics.md, "Costs"): a reference's slot, a dict's and a set's
# items, a list's growth; a MARK's list, a memo entry, a kept depth.
SLOT, DICT_ITEM, DICT_FIRST, SET_ITEM, LIST_ITEM = 8, 96, 120, 128, 10
MARK, MEMO_ITEM, NESTED = 64, 112, 176
NESTING = {list, dict, tuple, set, frozenset}
HASHED = {tuple, frozenset}

_U1, _U2, _U4, _I4, _U8, _F8 = (
    struct.Struct(f).unpack_from for f in ("<B", "<H", "<I", "<i", "<Q", ">d")
)
WIDTH = {_U1: 1, _U2: 2, _U4: 4, _I4: 4, _U8: 8, _F8: 8}

# Each opcode's handler, True for STOP.


def _mark(m) -> bool:
    if len(m.marks) >= MAX_MARKS:
        raise OutOfBounds(f"MARKs nested over {MAX_MARKS} deep (at byte {m.pos - 1})")
    m.marks.append(m.stack)
    m.stack = []
    m.used += MARK
    return False


def _value(make, cost: int):
    def op(m) -> bool:
        m.stack.append(make())
        m.used += cost + SLOT
        return False

    return op


def _number(unpack, cost: int):
    def op(m) -> bool:
        m.stack.append(m.size(unpack))
        m.used += cost + SLOT
        return False

    return op


def _long(unpack):
    def op(m) -> bool:
        n = m.size(unpack)
        if not 0 <= n <= 256:
            raise OutOfBounds(f"an integer of {n} bytes at byte {m.pos} (at most 256)")
        m.push(int.from_bytes(m.take(n), "little", signed=True), 28 + n)
        return False

    return op


def _text(unpack):
    def op(m) -> bool:
        text = str(m.take(m.size(unpack)), "utf-8", "surrogatepass")
        m.push(text, sys.getsizeof(text))
        return False

    return op


def _bytes(unpack, kind=bytes):
    def op(m) -> bool:
        raw = kind(m.take(m.size(unpack)))
        m.push(raw, sys.getsizeof(raw))
        return False

    return op


def _int_line(m) -> bool:
    text = m.line()
    value = {b"00": False, b"01": True}.get(text)
    m.push(int(text, 0) if value is None else value, 36)
    return False


def _long_line(m) -> bool:
    m.push(int(m.line().rstrip(b"L"), 0), 36)
    return False


def _float_line(m) -> bool:
    m.push(float(m.line()), 24)
    return False


def _unicode_line(m) -> bool:
    text = str(m.line(None), "raw-unicode-escape")
    m.push(text, sys.getsizeof(text))
    return False


def _tuple_of(n: int | None):
    def op(m) -> bool:
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


def _append(m) -> bool:
    _extend(m, [m.stack.pop()])
    return False


def _appends(m) -> bool:
    _extend(m, m.pop_mark())
    return False


def _extend(m, items: list) -> None:
    target = m.stack[-1]
    if type(target) is not list:
        raise DumpError(f"not a dump: APPEND to a {type(target).__name__} at byte {m.pos - 1}")
    m.frozen(target)
    m.charge(LIST_ITEM * len(items))  # its slots: charged as pushed
    target.extend(items)
    m.nest(target, items)
    m.used -= SLOT * len(items)


def _setitem(m) -> bool:
    value, key = m.stack.pop(), m.stack.pop()
    _update(m, [key, value])
    return False


def _setitems(m) -> bool:
    _update(m, m.pop_mark())
    return False


def _update(m, items: list) -> None:
    target = m.stack[-1]
    if type(target) is not dict or len(items) % 2:
        raise DumpError(f"not a dump: SETITEMS on a {type(target).__name__} at byte {m.pos - 1}")
    m.frozen(target)
    m.charge(DICT_ITEM * (len(items) // 2) + (DICT_FIRST if items and not target else 0))
    for i in range(0, len(items), 2):
        key = items[i]
        if type(key) in HASHED:
            m.hashed((key,))
        if i and not i % CHUNK:
            m.budget.clock()
        target[key] = items[i + 1]
    m.nest(target, items)
    m.used -= DICT_ITEM // 2 * (len(items) // 2)


def _list(m) -> bool:
    items = m.pop_mark()
    m.nest(items, items)
    m.push(items, 88 + LIST_ITEM * len(items))
    return False


def _dict(m) -> bool:
    items = m.pop_mark()
    m.push({}, 64)
    _update(m, items)
    return False


def _additems(m) -> bool:
    items, target = m.pop_mark(), m.stack[-1]
    if type(target) is not set:
        raise DumpError(f"not a dump: ADDITEMS to a {type(target).__name__} at byte {m.pos - 1}")
    m.frozen(target)
    m.charge(SET_ITEM * len(items))
    _hash_into(m, target, items)
    m.nest(target, items)
    return False


def _hash_into(m, target: set, items: list) -> None:
    m.hashed(items)
    for start in range(0, len(items), CHUNK):
        m.budget.clock()
        target.update(items[start : start + CHUNK])


def _frozenset(m) -> bool:
    items = m.pop_mark()
    members: set = set()
    _hash_into(m, members, items)
    made = frozenset(members)
    m.nest(made, items)
    m.push(made, 216 + SET_ITEM * len(items))
    return False


def _pop(m) -> bool:
    if m.stack:
        m.stack.pop()
    else:
        m.pop_mark()
    return False


def _pop_mark(m) -> bool:
    m.pop_mark()
    return False


def _dup(m) -> bool:
    m.push(m.stack[-1])
    if type(m.stack[-1]) in NESTING:
        m.shared(m.stack[-1])
    return False


def _proto(m) -> bool:
    version = m.size(_U1)
    if version > 5:  # pickle.HIGHEST_PROTOCOL in Python 3.8-3.14
        raise DumpError(f"not a dump: pickle protocol {version}")
    return False


def _frame(m) -> bool:
    n = m.size(_U8)  # a frame's length: the opcodes in it are read as they come
    if n > len(m.data) - m.pos:
        raise DumpError(f"not a dump: a frame of {n} bytes at byte {m.pos} past the end")
    return False


def _stop(m) -> bool:
    if len(m.stack) != 1 or m.marks:
        raise DumpError("not a dump: a pickle that stops with more than its object")
    return True


def _global(m) -> bool:
    module, name = (m.line(256).decode("ascii", "replace") for _ in range(2))
    raise DumpError(f"refused: the dump names {module}.{name} (a dump holds only builtins)")


def _memo(unpack, store: bool):
    def op(m) -> bool:
        index = int(m.line(), 10) if unpack is None else m.size(unpack)
        if store:
            m.put(index)
        else:
            obj = m.memo[index]
            m.stack.append(obj)
            m.used += SLOT
            if type(obj) in NESTING:
                m.shared(obj)
        return False

    return op


def _memoize(m) -> bool:
    m.put(len(m.memo))
    return False


OPS = {
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

# The opcodes refused, by name: they call something or reach outside; Python 2's strings.
NAMES = {
    0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD", ord("i"): "INST",
    ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2",
    0x84: "EXT4", ord("P"): "PERSID", ord("Q"): "BINPERSID", 0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER", ord("S"): "STRING", ord("T"): "BINSTRING",
    ord("U"): "SHORT_BINSTRING",
}  # fmt: skip
