"""Format 1.8's counted loops in the VM: LOOP and NEXT (``vm.py`` documents the instructions),
and format 1.9's row stores: APPEND (format 1.10: several rows at once, for a Loop's carried
value that grows).

``link_loops`` checks a decoded program's loops at load (each LOOP and its NEXT name each other,
loops nest, no jump enters or leaves a loop's body) and sets their targets; ``loop_step`` and
``next_step`` are the prepared steps, which keep each loop's iteration and count in the VM (a
list the executor owns), never in a tensor a kernel could write, so every run ends.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .errors import BundleError, InputError
from .header import OP_JUMP, OP_JUMP_UNLESS, OP_LOOP, OP_NEXT


def link_loops(out: list[Any], loops: list[tuple[int, int, int]], starts: dict[int, int],
                words: tuple[int, ...], bad_at: Callable[[int, str], BundleError]) -> None:
    """Pair every LOOP with its NEXT (each names the other), check that loops nest and that
    no jump enters or leaves a loop's body, and set the decoded targets: a LOOP's, the
    instruction after its NEXT; a NEXT's, its LOOP."""
    heads: dict[int, int] = {}   # LOOP instruction -> its NEXT instruction
    for index, word, arg in loops:
        if out[index].opcode == OP_LOOP:
            after = starts.get(arg)
            nxt = starts.get(arg - 3)
            if after is None or nxt is None or out[nxt].opcode != OP_NEXT \
                    or words[arg - 1] != word:
                raise bad_at(word, "LOOP's end is not right after a NEXT that names it")
            heads[index] = nxt
        else:
            head = starts.get(arg)
            if head is None or out[head].opcode != OP_LOOP or words[arg + 4] != word + 3:
                raise bad_at(word, "NEXT names no LOOP that ends right after it")
    # the innermost loop around each instruction: its body is the instructions after its LOOP
    # up to its NEXT (-1: none; the end of the program is outside every loop)
    word_of = {i: w for w, i in starts.items()}
    inner: list[int] = [-1] * (len(out) + 1)
    stack: list[int] = []
    for i in range(len(out) + 1):
        while stack and heads[stack[-1]] < i:
            stack.pop()
        if i < len(out) and out[i].opcode == OP_NEXT and (not stack or heads[stack[-1]] != i):
            raise bad_at(word_of[i], "loops overlap without nesting")
        inner[i] = stack[-1] if stack else -1
        if i < len(out) and out[i].opcode == OP_LOOP:
            stack.append(i)
    for i, ins in enumerate(out):
        if ins.opcode in (OP_JUMP, OP_JUMP_UNLESS) and inner[ins.target] != inner[i]:
            raise bad_at(word_of[i], "a jump enters or leaves a loop's body")
    for head, nxt in heads.items():
        out[head] = dataclasses.replace(out[head], target=nxt + 1)
        out[nxt] = dataclasses.replace(out[nxt], target=head)


def loop_step(m: np.ndarray, c: np.ndarray, i: np.ndarray, state: list[int], body: int,
               end: int) -> Callable[[], int]:
    """LOOP: read the count once; iteration 0 runs (from ``body``) if the count is positive and
    the condition holds, else continue at ``end``."""
    count, cond, number = m.reshape(-1), c.reshape(-1), i.reshape(-1)

    def step() -> int:
        limit = int(count[0])
        if limit <= 0 or not cond[0]:
            return end
        state[0], state[1] = 0, limit
        number[0] = 0
        return body
    return step


def next_step(c: np.ndarray, i: np.ndarray, state: list[int], after: int, body: int
               ) -> Callable[[], int]:
    """NEXT: the next iteration (from ``body``) while it is below the count read at the LOOP
    and the condition holds, else continue at ``after``."""
    cond, number = c.reshape(-1), i.reshape(-1)

    def step() -> int:
        k = state[0] + 1
        if k >= state[1] or not cond[0]:
            return after
        state[0] = k
        number[0] = k
        return body
    return step


# A hard cap on one STORE's bytes, whatever its bound says (a damaged bundle's bound, or a loop
# whose count and condition never stop it): the run is refused past it.
STORE_MAX_BYTES = 1 << 32
FIRST_ROWS = 16   # a store's first capacity, in rows; it doubles when full


class RowStore:
    """The rows APPEND adds to one STORE row during a run (format 1.9): bytes grown by doubling
    (amortised: each row is copied O(1) times), kept across runs, ``count`` rows of
    ``row_shape`` valid; at most the bound of size variable ``var`` rows. Its count is at axis
    ``lead`` (1s before it; format 1.10: a Loop's carried value that grows, ``grown``)."""

    def __init__(self, var: int, lead: int = 0, grown: bool = False) -> None:
        self.var = var
        self.lead = lead
        self.grown = grown
        self.data = np.zeros(0, np.uint8)
        self.count = 0
        self.row_shape: tuple[int, ...] = ()
        self.dtype = np.dtype(np.uint8)

    def rows(self) -> np.ndarray:
        """The rows of the last run, a view of the store (valid until the next run)."""
        size = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        return self.data[:self.count * size].view(self.dtype).reshape(
            (1,) * self.lead + (self.count,) + self.row_shape)


def append_step(row: np.ndarray, store: RowStore, limits: np.ndarray,
                extent: Callable[[], int] | None = None) -> Callable[[], None]:
    """APPEND: ``row`` (an arena view) copied in as row ``store.count``; with ``extent``
    (format 1.10), ``row`` holds ``extent()`` rows along the store's count axis, which a kernel
    may have counted this iteration (the view is then at its bound: the rows are its leading
    bytes). Refused (an input error) past the bound of the store's count variable or
    STORE_MAX_BYTES."""
    lead = store.lead
    store.row_shape = tuple(row.shape[lead + 1:] if extent is not None else row.shape[lead:])
    store.dtype = row.dtype
    flat = row.reshape(-1).view(np.uint8)
    size = int(np.prod(store.row_shape, dtype=np.int64)) * row.dtype.itemsize
    var = store.var
    what = ("a carried value of one of the model's Loop nodes would grow past" if store.grown
            else "a scan output of one of the model's Loop nodes would pass")

    def refuse() -> None:
        raise InputError(f"{what} its cap ({int(limits[var])} rows, {STORE_MAX_BYTES} bytes): "
                         "the loop runs longer than the model can return")

    def step() -> None:   # one row (format 1.9)
        k = store.count
        start = k * size
        end = start + size
        if k >= limits[var] or end > store.data.size and not grow(k, end):
            refuse()
        store.data[start:end] = flat
        store.count = k + 1

    def rows_step() -> None:   # extent() rows (format 1.10)
        n = extent()
        k = store.count
        start = k * size
        end = start + n * size
        if n < 0 or n * size > flat.size:
            raise BundleError("bundle header: APPEND appends more rows than its tensor holds")
        if k + n > limits[var] or end > store.data.size and not grow(k, end):
            refuse()
        store.data[start:end] = flat[:n * size]
        store.count = k + n

    def grow(k: int, end: int) -> bool:
        """Room for ``end`` bytes (the store doubled, its ``k`` rows kept); False past
        STORE_MAX_BYTES."""
        if end > STORE_MAX_BYTES:
            return False
        grown = np.empty(min(max(end, 2 * store.data.size, FIRST_ROWS * size),
                             STORE_MAX_BYTES), np.uint8)
        grown[:k * size] = store.data[:k * size]
        store.data = grown
        return True
    return step if extent is None else rows_step
