"""Static memory planning: every intermediate tensor gets an offset in one arena, and tensors whose
lifetimes do not overlap share bytes. Sizes and lifetimes are known at export, so the arena size
is too."""

from __future__ import annotations

from dataclasses import dataclass

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
    """Assign offsets (greedy by size, first fit among time-overlapping buffers, as in TFLite's
    arena planner). Returns ({buffer id: offset}, arena bytes). Two buffers whose lifetimes
    overlap never share a byte."""
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
