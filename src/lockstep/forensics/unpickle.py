"""A bounded, restricted unpickler for flight-recorder dumps: builtins only, one opcode at a
time in pure Python, within a `bounds.Budget`. Design: docs/design/forensics.md.
"""

from __future__ import annotations

import struct

from lockstep.forensics.bounds import MAX_DEPTH, Budget, DumpError, OutOfBounds, mib
from lockstep.forensics.opcodes import (
    DICT_ITEM,
    HASHED,
    MARK,
    MEMO_ITEM,
    NAMES,
    NESTED,
    NESTING,
    OPS,
    SET_ITEM,
    SLOT,
    WIDTH,
)

MAX_TEXT_ARG = 64  # bytes of a text opcode's argument: a number, a memo index
MAX_KEY = 1 << 12  # a hashed tuple's or frozenset's weight
CHECK_MEMORY, CHECK_TIME = 1 << 10, 1 << 14  # opcodes between two looks at the budget, the clock
# A container's own bytes and each item's slot.
WEIGHT = {list: (88, SLOT), tuple: (40, SLOT), dict: (184, DICT_ITEM), set: (216, SET_ITEM),
          frozenset: (216, SET_ITEM)}  # fmt: skip


def load(data: bytes, budget: Budget):
    """The object `data` pickles, of builtins only, within `budget`: DumpError or OutOfBounds."""
    machine = _Machine(data, budget)
    try:
        made = machine.run()
    except DumpError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, RecursionError,
            OverflowError, struct.error) as err:  # fmt: skip
        where = f"at byte {machine.pos - 1}"
        raise DumpError(f"not a dump: a malformed pickle {where} ({type(err).__name__})") from None
    finally:  # a pickle refused is freed: what it was charged is given back
        budget.peak = max(budget.peak, budget.used + machine.top)
    budget.used += machine.used - machine.own
    return made


class _Machine:
    """The pickle machine: a stack, its MARKs, the memo, and the depth of every container
    that holds one; `own`: what of `used` is its own."""

    def __init__(self, data: bytes, budget: Budget):
        self.data, self.view, self.pos, self.budget = data, memoryview(data), 0, budget
        self.stack: list = []
        self.marks: list[list] = []
        self.memo: dict[int, object] = {}
        self.depths: dict[int, tuple[object, int]] = {}  # id -> (container, depth > 1)
        self.weights: dict[int, tuple[object, int]] = {}  # id -> (container, weight): frozen
        self.used = self.own = self.top = 0  # `top`: the most `used` was
        self.room = budget.memory - budget.used

    def run(self):
        data, end, table, memo, count = self.data, len(self.data), OPS, self.memo, 0
        while self.pos < end:
            pos = self.pos
            op = data[pos]
            if op == 0x68:  # BINGET: most of a torch dump's opcodes, inlined
                obj = memo[data[pos + 1]]
                self.stack.append(obj)
                self.pos = pos + 2
                self.used += SLOT
                if type(obj) in NESTING:
                    self.shared(obj)
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

    def weight(self, obj) -> int:
        """`obj`'s weight expanded as a tree, counted once and kept (`frozen`)."""
        known = self.weights.get(id(obj))
        if known is not None:
            return known[1]
        base, each = WEIGHT[type(obj)]
        total = base + each * len(obj)
        if id(obj) in self.depths:  # it holds containers (`nest`)
            items = [*obj.keys(), *obj.values()] if type(obj) is dict else obj
            total += sum(self.weight(i) for i in items if type(i) in NESTING)
        self.weights[id(obj)] = (obj, total)
        self.used += NESTED
        self.own += NESTED
        return total

    def shared(self, obj) -> None:
        """One more reference to the container `obj`: charged its weight, as a copy."""
        self.used += self.weight(obj)
        if self.used > self.room:
            raise OutOfBounds(f"{self.budget.over()}, a container counted at each reference "
                              f"to it (at byte {self.pos - 1})")  # fmt: skip

    def frozen(self, target) -> None:
        if id(target) in self.weights:
            raise DumpError(f"not a dump: a container changed after it was shared (at byte "
                            f"{self.pos - 1})")  # fmt: skip

    def hashed(self, items) -> None:
        """OutOfBounds past `MAX_KEY` for a tuple or frozenset among `items`."""
        for item in items:
            if type(item) in HASHED and self.weight(item) > MAX_KEY:
                raise OutOfBounds(f"a dict key or set member of {self.weight(item)} bytes "
                                  f"expanded (at byte {self.pos - 1}): over the {MAX_KEY} "
                                  "lockstep hashes")  # fmt: skip

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
        self.pos += WIDTH[unpack]
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
        if NESTING.isdisjoint(map(type, items)):
            return
        depths = self.depths
        deepest = max(
            depths[id(item)][1] if id(item) in depths else 1
            for item in items
            if type(item) in NESTING
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
    name = NAMES.get(op)
    if name is None:
        return f"not a dump: unknown pickle opcode 0x{op:02x}"
    if name == "STACK_GLOBAL" and len(stack) >= 2 and all(type(s) is str for s in stack[-2:]):
        name = f"{stack[-2][:200]}.{stack[-1][:200]}"
        return f"refused: the dump names {name} (a dump holds only builtins)"
    return f"refused: the pickle's {name} (a dump holds only builtins, never a class or function)"
