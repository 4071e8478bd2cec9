"""Where an export's time goes: a clock of named stages (``ExportReport.stages``) and the short
table ``mlcpack export --timings`` prints from it.

The stages follow one another (import, passes, codegen, vm, write, golden reference, golden
check); codegen's per-target rows are the compiles inside it, which run side by side for a
fat bundle, so they overlap each other and are not added to the total. The golden check's
reference runs in a worker process beside the passes and the compile: its row is the time
the export still waited for it afterwards. Each row has its CPU seconds beside the wall
seconds: this process's and its workers' (compile workers, the reference's), which a loaded
machine inflates much less than wall time.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Callable, Mapping, Sequence


class StageClock:
    """Wall seconds per stage name, summed over every time a stage runs (one per batch plan).
    Call it with a stage's name when that stage starts; ``stop`` ends the current one.
    ``forward`` is called with each name too (an ``on_stage`` callback of the caller's)."""

    def __init__(self, forward: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}   # CPU seconds per stage (cpu_seconds)
        self._forward = forward
        self._current: str | None = None
        self._start = 0.0
        self._cpu_start = 0.0

    def __call__(self, name: str) -> None:
        self.stop()
        self._current, self._start, self._cpu_start = name, time.perf_counter(), cpu_seconds()
        if self._forward is not None:
            self._forward(name)

    def stop(self) -> None:
        if self._current is not None:
            spent = time.perf_counter() - self._start
            self.seconds[self._current] = self.seconds.get(self._current, 0.0) + spent
            self.cpu[self._current] = self.cpu.get(self._current, 0.0) + \
                cpu_seconds() - self._cpu_start
            self._current = None


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of the child processes it has waited
    for (compile workers, the golden reference's worker)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timings_table(stages: Mapping[str, float], compiles: Sequence[tuple[str, float, bool]],
                  total: float, cpu: Mapping[str, float] | None = None,
                  total_cpu: float | None = None,
                  phases: Sequence[tuple[str, Sequence[tuple[str, float]]]] = ()) -> str:
    """The table: one row per stage in the order it ran (seconds, CPU seconds from ``cpu``
    where given, and share of ``total``), a row per target under codegen (``compiles``: target
    name, seconds, from the compile cache) with its compile workers' CPU seconds per phase
    where any was spent (``phases``: target name and (phase, seconds) pairs, as
    ``CompiledCode.phases``; summed over plans), the rest of ``total`` as "other" and the
    total."""
    cpu = cpu or {}
    rows: list[tuple[str, str, str, str]] = []

    def share(seconds: float) -> str:
        return f"{100 * seconds / total:.0f} %" if total else ""

    for name, seconds in stages.items():
        rows.append((name, f"{seconds:.2f}",
                     f"{cpu[name]:.2f}" if name in cpu else "", share(seconds)))
        if name == "codegen":
            spent_cpu: dict[str, dict[str, float]] = {}
            for target, pairs in phases:
                summed = spent_cpu.setdefault(target, {})
                for phase, seconds in pairs:
                    summed[phase] = summed.get(phase, 0.0) + seconds
            for target, spent, cached in _per_target(compiles):
                rows.append((f"  {target}", f"{spent:.2f}", "", "cache hit" if cached else
                             "compiled" if cached is False else "some from cache"))
                if sum(spent_cpu.get(target, {}).values()) > 0:
                    rows += [(f"    {phase}", "", f"{seconds:.2f}", "")
                             for phase, seconds in spent_cpu[target].items()]
    other = total - sum(stages.values())
    if other >= 0.005:
        other_cpu = total_cpu - sum(cpu.values()) if total_cpu is not None and cpu else None
        rows.append(("other", f"{other:.2f}",
                     f"{other_cpu:.2f}" if other_cpu is not None and other_cpu >= 0 else "",
                     share(other)))
    rows.append(("total", f"{total:.2f}", f"{total_cpu:.2f}" if total_cpu is not None else "",
                 ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'export stage':<{width}}  {'seconds':>7}  {'cpu s':>7}  share"]
    lines += [f"{name:<{width}}  {secs:>7}  {c:>7}  {note}".rstrip()
              for name, secs, c, note in rows]
    if len({t for t, _, _ in compiles}) > 1:
        lines.append("(the targets compile side by side: their rows overlap in time)")
    lines.append("(cpu s: this process and its workers; on a loaded machine wall seconds grow, "
                 "CPU seconds much less)")
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
