"""Where an export's time goes: a clock of named stages (``ExportReport.stages``) and the short
table ``mlcpack export --timings`` prints from it.

The stages follow one another (import, golden reference, passes, codegen, vm, write, golden
check); codegen's per-target rows are the compiles inside it, which run side by side for a
fat bundle, so they overlap each other and are not added to the total.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping, Sequence


class StageClock:
    """Wall seconds per stage name, summed over every time a stage runs (one per batch plan).
    Call it with a stage's name when that stage starts; ``stop`` ends the current one.
    ``forward`` is called with each name too (an ``on_stage`` callback of the caller's)."""

    def __init__(self, forward: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._forward = forward
        self._current: str | None = None
        self._start = 0.0

    def __call__(self, name: str) -> None:
        self.stop()
        self._current, self._start = name, time.perf_counter()
        if self._forward is not None:
            self._forward(name)

    def stop(self) -> None:
        if self._current is not None:
            spent = time.perf_counter() - self._start
            self.seconds[self._current] = self.seconds.get(self._current, 0.0) + spent
            self._current = None


def timings_table(stages: Mapping[str, float], compiles: Sequence[tuple[str, float, bool]],
                  total: float) -> str:
    """The table: one row per stage in the order it ran (seconds and share of ``total``), a row
    per target under codegen (``compiles``: target name, seconds, from the compile cache), the
    rest of ``total`` as "other" and the total."""
    rows: list[tuple[str, str, str]] = []
    for name, seconds in stages.items():
        rows.append((name, f"{seconds:.2f}", f"{100 * seconds / total:.0f} %" if total else ""))
        if name == "codegen":
            for target, spent, cached in _per_target(compiles):
                rows.append((f"  {target}", f"{spent:.2f}", "cache hit" if cached else
                             "compiled" if cached is False else "some from cache"))
    other = total - sum(stages.values())
    if other >= 0.005:
        rows.append(("other", f"{other:.2f}", f"{100 * other / total:.0f} %" if total else ""))
    rows.append(("total", f"{total:.2f}", ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'export stage':<{width}}  {'seconds':>7}  share"]
    lines += [f"{name:<{width}}  {secs:>7}  {note}".rstrip() for name, secs, note in rows]
    if len({t for t, _, _ in compiles}) > 1:
        lines.append("(the targets compile side by side: their rows overlap in time)")
    return "\n".join(lines)


def _per_target(compiles: Sequence[tuple[str, float, bool]]
                ) -> list[tuple[str, float, bool | None]]:
    """Seconds per target summed over plans; cached True/False when every compile agreed,
    None when some came from the cache and some did not."""
    merged: dict[str, tuple[float, set[bool]]] = {}
    for target, seconds, cached in compiles:
        spent, hits = merged.get(target, (0.0, set()))
        merged[target] = (spent + seconds, hits | {cached})
    return [(t, s, next(iter(h)) if len(h) == 1 else None) for t, (s, h) in merged.items()]


def process_seconds() -> float | None:
    """Wall seconds since this process started (Linux: /proc), None where that is unknown: the
    interpreter's start and the imports before the command runs."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
