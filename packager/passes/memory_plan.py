"""Static memory planning: every intermediate tensor gets an offset in one arena, and tensors whose
lifetimes do not overlap share bytes. Sizes and lifetimes are known at export, so the arena size
is too."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.sym import evaluate

ALIGN = 64


@dataclass
class Buffer:
    """A storage request: ``size`` bytes live from step ``start`` through step ``end``."""

    id: int
    size: int
    start: int
    end: int

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.start <= other.end and other.start <= self.end


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_memory(buffers: list[Buffer]) -> tuple[dict[int, int], int]:
    """Assign offsets: the cache-aware plan (``plan_warm``) unless its arena is more than
    WARM_ARENA_SLACK times the smallest plan's (``plan_by_size``). Returns ({buffer id:
    offset}, arena bytes). Two buffers whose lifetimes overlap never share a byte."""
    small = plan_by_size(buffers)
    warm = plan_warm(buffers)
    return warm if warm[1] <= WARM_ARENA_SLACK * small[1] else small


# The warm plan's arena may be this much larger than the smallest plan's.
WARM_ARENA_SLACK = 1.25
# How warm a byte is when a buffer is placed on it: by the bytes the program wrote since the
# byte was last used (its last occupant's last step): within about L2 (1 MB on Zen 4), a few
# L2s, about an L3 slice; colder bytes come from memory.
WARM_TIERS = ((1 << 20, 1.0), (4 << 20, 0.6), (16 << 20, 0.3))
COLD_WEIGHT = 0.05
WARM_CANDIDATES = 24   # the most recently freed buffers whose places a buffer tries


def _warmth(distance: int) -> float:
    for limit, weight in WARM_TIERS:
        if distance <= limit:
            return weight
    return COLD_WEIGHT


def plan_warm(buffers: list[Buffer]) -> tuple[dict[int, int], int]:
    """Offsets in program order, each buffer where the bytes it covers were used most recently
    (a kernel's output then lands on lines still in cache, not on lines that come back from
    memory before it can write them: MobileNetV2's 1x1 32 -> 16 on 112x112 ran 2x slower
    with its output on bytes last used a whole run before). Candidate places: the start and
    end of every free gap (among buffers live at the same time), and the places of the
    WARM_CANDIDATES most recently freed buffers; ties go to the one that grows the arena
    least, then the lowest offset."""
    from bisect import bisect_right

    order = sorted(buffers, key=lambda b: (b.start, -b.size, b.id))
    by_end = sorted(buffers, key=lambda b: (b.end, b.id))
    written: dict[int, int] = {}
    for buf in buffers:
        written[buf.start] = written.get(buf.start, 0) + _aligned(max(buf.size, 1))
    steps = sorted(set(written) | {b.end for b in buffers})
    cum, total = {}, 0
    for s in steps:
        total += written.get(s, 0)
        cum[s] = total
    offsets: dict[int, int] = {}
    live: list[Buffer] = []
    freed: list[tuple[int, int, int]] = []   # (lo, hi, last step), in the order they died
    # last use of the bytes of freed buffers: disjoint sorted segments [lo, hi) -> last step
    seg_lo: list[int] = []
    seg: list[tuple[int, int, int]] = []
    died = 0
    arena = 0

    def mark(lo: int, hi: int, last: int) -> None:
        i = bisect_right(seg_lo, lo) - 1
        if i >= 0 and seg[i][1] > lo:
            a, c, t = seg[i]
            parts = [(a, lo, t)] + ([(hi, c, t)] if c > hi else [])
            seg[i:i + 1] = parts
            seg_lo[i:i + 1] = [p[0] for p in parts]
            i += 1
        else:
            i += 1
        j = i
        while j < len(seg) and seg[j][0] < hi:
            j += 1
        tailpart = [(hi, seg[j - 1][1], seg[j - 1][2])] if j > i and seg[j - 1][1] > hi else []
        seg[i:j] = [(lo, hi, last)] + tailpart
        seg_lo[i:j] = [lo] + [p[0] for p in tailpart]

    def heat(lo: int, hi: int, now: int) -> float:
        i = max(0, bisect_right(seg_lo, lo) - 1)
        h = 0.0
        while i < len(seg) and seg[i][0] < hi:
            a, c, t = seg[i]
            overlap = min(c, hi) - max(a, lo)
            if overlap > 0:
                h += overlap * _warmth(cum[now] - cum[t])
            i += 1
        return h

    for buf in order:
        s = buf.start
        while died < len(by_end) and by_end[died].end < s:
            d = by_end[died]
            died += 1
            if d.id in offsets:
                lo = offsets[d.id]
                hi = lo + _aligned(max(d.size, 1))
                mark(lo, hi, d.end)
                freed.append((lo, hi, d.end))
        live = [p for p in live if p.end >= s]
        size = _aligned(max(buf.size, 1))
        busy = sorted((offsets[p.id], offsets[p.id] + _aligned(max(p.size, 1))) for p in live)
        gaps, cur = [], 0
        for lo, hi in busy:
            if lo > cur:
                gaps.append((cur, lo))
            cur = max(cur, hi)
        gaps.append((cur, None))
        cands: set[int] = set()
        for glo, ghi in gaps:
            if ghi is not None and ghi - glo < size:
                continue
            cands.add(glo)
            if ghi is not None:
                cands.add(ghi - size)
            for lo, hi, _ in freed[-WARM_CANDIDATES:]:
                for c in (lo, hi - size):
                    if c >= glo and (ghi is None or c + size <= ghi):
                        cands.add(c)
        best = None
        for c in cands:
            key = (heat(c, c + size, s), -max(0, c + size - arena), -c)
            if best is None or key > best[0]:
                best = (key, c)
        offsets[buf.id] = best[1]
        live.append(buf)
        arena = max(arena, best[1] + size)
    return offsets, arena


def plan_by_size(buffers: list[Buffer]) -> tuple[dict[int, int], int]:
    """Offsets greedy by size, first fit among time-overlapping buffers, as in TFLite's arena
    planner: the smallest arenas of the two plans."""
    offsets: dict[int, int] = {}
    placed: list[Buffer] = []
    arena = 0
    for buf in sorted(buffers, key=lambda b: (-b.size, b.start, b.id)):
        size = _aligned(max(buf.size, 1))
        busy = sorted((offsets[p.id], offsets[p.id] + _aligned(max(p.size, 1)))
                      for p in placed if p.overlaps_in_time(buf))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        offsets[buf.id] = offset
        placed.append(buf)
        arena = max(arena, offset + size)
    return offsets, arena


# ---- symbolic sizes: an upper-bound plan for --max-shape ---------------------------------------
#
# A symbolic program's buffers have sizes as dim records (``packager/ir/sym.to_record``: an int,
# a size variable, ``["+" | "*", ...]``, ``["//" | "%", record, c]``). With an upper bound on
# every size variable (``--max-shape``), a buffer whose size never decreases as a variable grows
# is largest at the bound, so placing every buffer at its bounded size (the same first fit) gives
# one arena that serves every shape within the bound: the runtime allocates it once and never
# plans again (runtime/symbolic.py).


class UnboundedSizeError(Exception):
    """A buffer's size is not bounded by the size variables' bounds (one line, for a note)."""


def non_decreasing(rec, ones) -> bool:
    """Whether the record never decreases when a size variable grows, over sizes >= 1 (``ones``:
    every variable at 1). Sums of such terms are; products are when every factor is also
    non-negative (its value at all ones, its minimum); ``// c`` keeps it; ``% c`` does not."""
    if isinstance(rec, (int, str)):
        return True
    op = rec[0]
    if op == "+":
        return all(non_decreasing(r, ones) for r in rec[1:])
    if op == "*":
        return all(non_decreasing(r, ones) and evaluate(r, ones) >= 0 for r in rec[1:])
    if op == "//":
        return non_decreasing(rec[1], ones)
    if op == "%":
        return isinstance(rec[1], int)
    return False


def interval(rec, bounds) -> tuple[int, int]:
    """The smallest and largest value of a record with every size variable anywhere in
    ``[1, bounds[v]]`` (interval arithmetic: exact for a single variable, never too small)."""
    if isinstance(rec, int) and not isinstance(rec, bool):
        return rec, rec
    if isinstance(rec, str):
        if rec not in bounds:
            raise UnboundedSizeError(f"size variable {rec} has no bound")
        return 1, bounds[rec]
    op = rec[0]
    if op == "+":
        parts = [interval(r, bounds) for r in rec[1:]]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if op == "*":
        lo, hi = 1, 1
        for r in rec[1:]:
            a, b = interval(r, bounds)
            corners = (lo * a, lo * b, hi * a, hi * b)
            lo, hi = min(corners), max(corners)
        return lo, hi
    if op == "//":
        a, b = interval(rec[1], bounds)
        return a // rec[2], b // rec[2]
    if op == "%":
        a, b = interval(rec[1], bounds)
        c = rec[2]
        if b - a < c and a % c <= b % c:
            return a % c, b % c
        return 0, c - 1
    raise UnboundedSizeError(f"malformed dim record {rec!r:.60}")


GRID_POINTS = 1 << 22   # the largest box of sizes searched exhaustively (numpy, int64)


def box_max(rec, bounds) -> int:
    """The largest value of a record over every size variable in ``[1, bounds[v]]``: exact (every
    point of the box, vectorized) when the box has at most ``GRID_POINTS`` points, else the
    interval-arithmetic bound (never too small)."""
    import numpy as np

    names = sorted(bounds)
    points = 1
    for v in names:
        points *= bounds[v]
    if points > GRID_POINTS:
        return interval(rec, bounds)[1]
    grid = {v: np.arange(1, bounds[v] + 1, dtype=np.int64).reshape(
        [-1 if j == i else 1 for j in range(len(names))]) for i, v in enumerate(names)}
    return int(np.max(evaluate(rec, grid)))


def bounded_plan(sizes, spans, bounds) -> tuple[list[int], int, list[int], int]:
    """The upper-bound plan: ``sizes`` (dim records, one per buffer) and ``spans`` (first and
    last step) with every size variable at most its bound (``bounds``: name -> largest value).
    A size that never decreases as a size grows (``non_decreasing``) is largest at the bound;
    any other (a kernel workspace with a subtracted term, say) gets its largest value over the
    box (``box_max``: exact for boxes up to ``GRID_POINTS`` sizes, an interval-arithmetic bound
    beyond). Returns (offsets, arena bytes, each buffer's bounded size, how many sizes were
    not proved monotone); raises ``UnboundedSizeError`` for a record it cannot bound."""
    ones = {v: 1 for v in bounds}
    at_bound = []
    loose = 0
    for rec in sizes:
        if non_decreasing(rec, ones):
            at_bound.append(evaluate(rec, bounds))
        else:
            loose += 1
            at_bound.append(max(0, box_max(rec, bounds)))
    offsets, arena = plan_memory([Buffer(i, s, a, b) for i, (s, (a, b))
                                  in enumerate(zip(at_bound, spans))])
    return [offsets[i] for i in range(len(sizes))], arena, at_bound, loose
