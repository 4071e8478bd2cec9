"""Where the time goes: every VM instruction of a loaded model timed over several runs
(``Model.profile``, ``mlcpack bench --profile``).

Each instruction is a kernel call, a library call or a copy; ``Executor.run_timed`` wraps each
prepared call in ``time.perf_counter_ns``. A profile keeps, per instruction, the mean and the
minimum over the runs, its share of the summed means, the source-model nodes it came from (the
header's optional ``source`` records, absent in bundles made before them) and, for contractions
(the header's optional ``macs``), GFLOP/s at the minimum time. It renders as plain text, a JSON
document, and a Chrome trace (``ph: "X"`` events, microseconds) that Perfetto and
chrome://tracing open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .errors import BundleError
from .header import (OP_APPEND, OP_BIND_SIZE, OP_CALL_KERNEL, OP_CALL_LIB, OP_JUMP,
                     OP_JUMP_UNLESS, OP_LOOP, OP_NEXT, OP_TRAP, Plan)
from .vm import Executor

MAX_SOURCES = 1 << 16


@dataclass(frozen=True)
class SourceNode:
    """A node of the source model (an ONNX node's name and op type)."""
    name: str
    op: str


def read_sources(value: Any, what: str) -> tuple[SourceNode, ...]:
    """A header ``source`` record (``[{"name", "op"}, ...]``, optional: None or absent reads as
    no sources); BundleError when it is there but malformed."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or len(value) > MAX_SOURCES or not all(
            isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("op"), str)
            for s in value):
        raise BundleError(f"bundle header: {what} has a malformed source list (expected "
                          "[{'name': str, 'op': str}, ...]); export it again")
    return tuple(SourceNode(s["name"], s["op"]) for s in value)


def read_macs(value: Any, what: str) -> int | None:
    """A header ``macs`` record (optional non-negative int); BundleError when malformed."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 62:
        raise BundleError(f"bundle header: {what} has an invalid macs value {value!r:.40}")
    return value or None


def sources_text(sources: tuple[SourceNode, ...], shown: int = 2) -> str:
    """``Conv_12 (Conv), Relu_13 (Relu) +3 more``."""
    text = ", ".join(f"{s.name} ({s.op})" for s in sources[:shown])
    return text + (f" +{len(sources) - shown} more" if len(sources) > shown else "")


@dataclass(frozen=True)
class Step:
    """What one VM instruction is, from the bundle header."""
    # "kernel", "library", "copy" (COPY, and format 1.9's APPEND), "bind" (BIND_SIZE) or "jump"
    # (JUMP_UNLESS, JUMP, TRAP, and format 1.8's LOOP, NEXT)
    kind: str
    name: str                         # the prim function, the library function, or "copy"
    symbol: str                       # the kernel's symbol (shared by identical kernels)
    sources: tuple[SourceNode, ...]
    macs: int | None


def describe_steps(executor: Executor, plan: Plan) -> list[Step]:
    """One ``Step`` per instruction of ``executor``, read from its ``plan`` (header record)."""
    kernels, sites = plan.kernels, plan.library_calls or ()
    steps = []
    for ins in executor.program:
        if ins.opcode == OP_CALL_KERNEL:
            k = kernels[ins.target]
            what = f"kernel {ins.target}"
            steps.append(Step("kernel", k.name, k.symbol, read_sources(k.source, what),
                              read_macs(k.macs, what)))
        elif ins.opcode == OP_CALL_LIB:
            site = sites[ins.target]
            steps.append(Step("library", site.func, site.func,
                              read_sources(site.source, f"library call {ins.target}"), None))
        elif ins.opcode == OP_BIND_SIZE:   # a counted size: no kernel, the VM's check
            name = f"bind {plan.symbolic.vars[ins.target]}" if plan.symbolic else "bind"
            steps.append(Step("bind", name, name, (), None))
        elif ins.opcode in (OP_JUMP_UNLESS, OP_JUMP, OP_TRAP, OP_LOOP, OP_NEXT):   # control flow
            name = {OP_JUMP_UNLESS: "jump unless", OP_JUMP: "jump", OP_TRAP: "trap",
                    OP_LOOP: "loop", OP_NEXT: "next"}[ins.opcode]
            steps.append(Step("jump", name, name, (), None))
        elif ins.opcode == OP_APPEND:   # a row appended to a row store
            steps.append(Step("copy", "append", "append", (), None))
        else:
            steps.append(Step("copy", "copy", "copy", (), None))
    return steps


@dataclass(frozen=True)
class InstructionTime:
    index: int                        # position in the program
    step: Step
    mean_us: float
    min_us: float
    share: float                      # percent of the summed means

    @property
    def gflops(self) -> float | None:
        """Contractions only: 2 flops per multiply-add, at the minimum time (what the kernel
        does when nothing else takes the core; on a busy machine the mean says little)."""
        if not self.step.macs or self.min_us <= 0:
            return None
        return 2 * self.step.macs / (self.min_us * 1e3)


@dataclass
class Profile:
    """Per-instruction times of ``runs`` runs (``durations_ns``/``starts_ns``: runs x
    instructions) and each run's wall time (``totals_ns``)."""
    model: str
    threads: int
    steps: list[Step]
    starts_ns: np.ndarray
    durations_ns: np.ndarray
    totals_ns: np.ndarray
    batch: int | None = None          # the plan's batch size (dynamic-batch bundles)

    @property
    def title(self) -> str:
        plan = f" (batch-{self.batch} plan)" if self.batch is not None else ""
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{self.model}{plan}: {len(self.steps)} instructions, {self.runs} runs, {threads}"

    @property
    def runs(self) -> int:
        return int(self.durations_ns.shape[0])

    @property
    def instructions(self) -> list[InstructionTime]:
        """Every instruction, in program order."""
        mean = self.durations_ns.mean(axis=0) / 1e3
        best = self.durations_ns.min(axis=0) / 1e3
        whole = float(mean.sum()) or 1.0
        return [InstructionTime(i, s, float(mean[i]), float(best[i]), 100 * float(mean[i]) / whole)
                for i, s in enumerate(self.steps)]

    def ranked(self) -> list[InstructionTime]:
        """Every instruction, the slowest first."""
        return sorted(self.instructions, key=lambda t: -t.mean_us)

    @property
    def total_mean_us(self) -> float:
        """Mean wall time of a run (every instruction plus the timing's own cost)."""
        return float(self.totals_ns.mean()) / 1e3

    @property
    def total_min_us(self) -> float:
        return float(self.totals_ns.min()) / 1e3

    @property
    def kernels_sum_us(self) -> float:
        """The sum of the instructions' mean times."""
        return float(self.durations_ns.mean(axis=0).sum()) / 1e3

    def to_json(self) -> dict[str, Any]:
        rows = []
        for rank, t in enumerate(self.ranked(), start=1):
            gf = t.gflops
            rows.append({"rank": rank, "index": t.index, "kind": t.step.kind,
                         "kernel": t.step.symbol, "name": t.step.name,
                         "sources": [{"name": s.name, "op": s.op} for s in t.step.sources],
                         "mean_us": round(t.mean_us, 3), "min_us": round(t.min_us, 3),
                         "share": round(t.share, 3), "macs": t.step.macs,
                         "gflops": None if gf is None else round(gf, 3)})
        return {"model": self.model, "batch": self.batch, "runs": self.runs,
                "threads": self.threads, "instructions": len(self.steps),
                "total_us": {"mean": round(self.total_mean_us, 3),
                             "min": round(self.total_min_us, 3)},
                "instructions_sum_us": round(self.kernels_sum_us, 3),
                "kernels": rows}

    def chrome_trace(self) -> dict[str, Any]:
        """Trace-event JSON: one complete (``ph: "X"``) event per instruction per run on one
        track, times in microseconds from the first run's start."""
        origin = int(self.starts_ns[0, 0]) if self.starts_ns.size else 0
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 1,
             "args": {"name": f"mlcpack {self.model}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
             "args": {"name": f"VM ({self.threads} thread{'s' if self.threads > 1 else ''})"}}]
        for run in range(self.runs):
            for i, step in enumerate(self.steps):
                args: dict[str, Any] = {"run": run, "index": i, "name": step.name,
                                        "sources": [f"{s.name} ({s.op})" for s in step.sources]}
                if step.macs:
                    args["macs"] = step.macs
                events.append({"name": step.symbol, "cat": step.kind, "ph": "X", "pid": 1,
                               "tid": 1, "ts": (int(self.starts_ns[run, i]) - origin) / 1e3,
                               "dur": int(self.durations_ns[run, i]) / 1e3, "args": args})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def text(self, top: int | None = None) -> str:
        """A plain-text table (the runtime has no rich), the slowest first."""
        lines = [f"{self.title}: run mean {self.total_mean_us:.1f} us, min "
                 f"{self.total_min_us:.1f} us",
                 f"{'#':>4}  {'kernel':<36} {'mean us':>9} {'min us':>9} {'share':>6} "
                 f"{'GFLOP/s':>8}  source"]
        ranked = self.ranked()
        for rank, t in enumerate(ranked[:top] if top else ranked, start=1):
            gf = t.gflops
            lines.append(f"{rank:>4}  {t.step.symbol[:36]:<36} {t.mean_us:>9.1f} {t.min_us:>9.1f} "
                         f"{t.share:>5.1f}% {'' if gf is None else f'{gf:.1f}':>8}  "
                         f"{sources_text(t.step.sources)}")
        if top and len(ranked) > top:
            rest = ranked[top:]
            lines.append(f"      ... {len(rest)} more, {sum(t.share for t in rest):.1f}% of the "
                         "time")
        return "\n".join(lines)


def profile_executor(model: str, executor: Executor, plan: Plan, runs: int,
                     place: Callable[[], None] | None = None) -> Profile:
    """Time ``runs`` runs of ``executor`` (inputs already in place) instruction by
    instruction; ``plan`` is its header record (kernels, library calls, batch). ``place``,
    untimed before each run, puts the inputs back where the memory plan may have reused
    their bytes for later tensors."""
    steps = describe_steps(executor, plan)
    starts = np.empty((runs, len(steps)), dtype=np.int64)
    durations = np.empty((runs, len(steps)), dtype=np.int64)
    totals = np.empty(runs, dtype=np.int64)
    for r in range(runs):
        if place is not None:
            place()
        s, d, begin, end = executor.run_timed()
        starts[r], durations[r], totals[r] = s, d, end - begin
    return Profile(model, executor.threads, steps, starts, durations, totals, plan.batch)
