"""Where one target's compile goes, step by step, in this process: the kernels of a model's
export (its prim funcs after the passes, captured from ``mlcpack.packager.api.export``), then
per target: Python emitting the LLVM IR (``build.emit_module``), LLVM parsing the text,
verifying it, optimizing it (``--pipeline``: each one parses the same text again),
the code generator's object, and printing the optimized module (the compile cache's text).

    .venv/bin/python bench/codegen_phases.py MODEL.onnx [--target x86-64-v2,x86-64-v3]
        [--input-shape name=1,3,320,320] [--profile emit] [--time-passes] [--pipeline O2 ...]
        [--rounds 1] [--top 30]

CPU seconds (``time.process_time``) of this one process, no workers: the grouped compile
(``codegen/parallel.py``) spends the same work in four worker processes per target. With
``--profile emit`` the emission of the first target runs under cProfile and the ``--top``
functions by own time are printed. ``--pipeline`` names: ``O2`` (the default), ``O2-noloop``
(-O2 without the loop vectorizer), ``O2-noslp``, ``O2-novec``, ``O1`` (vectorizers off),
``O1-vec``, ``O3``; each one's object size and SHA-256 is printed (``--save DIR`` writes the
objects), so two runs can be compared for byte-identical code. ``--time-passes``: LLVM's pass
timers, the optimizer's and the code generator's.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

PIPELINES = {"O2": (2, True, True), "O2-noloop": (2, False, True), "O2-noslp": (2, True, False),
             "O2-novec": (2, False, False), "O1": (1, False, False), "O1-vec": (1, True, True),
             "O3": (3, True, True)}


class _Captured(Exception):
    pass


def capture(model: str, shapes: dict[str, list]) -> tuple[list, tuple, object]:
    """(prim funcs, size variables, compile options) the export of ``model`` compiles."""
    from mlcpack.packager import api, export

    seen = {}

    def grab(funcs, targets, size_vars=(), options=None):
        seen.update(funcs=list(funcs), size_vars=size_vars, options=options)
        raise _Captured

    export.compile_for_targets = grab
    with tempfile.TemporaryDirectory() as tmp:
        try:
            api.export(model, Path(tmp) / "m.mlc", api.Options(
                check=False, cache=False, input_shapes=shapes))
        except _Captured:
            pass
    return seen["funcs"], seen["size_vars"], seen["options"]


def _top_lines(report: str, top: int) -> str:
    """The first ``top`` rows of each table in an LLVM timing report."""
    out, rows = [], 0
    for line in report.splitlines():
        if "---" in line or "Total Execution Time" in line:
            rows = 0
        rows += 1
        if rows <= top + 4:
            out.append(line)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--target", default="x86-64-v2,x86-64-v3")
    ap.add_argument("--input-shape", action="append", default=[])
    ap.add_argument("--profile", choices=("emit",), default=None)
    ap.add_argument("--pipeline", action="append", default=[], choices=sorted(PIPELINES))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--save", default=None, metavar="DIR",
                    help="write each object to DIR/<target>-<pipeline>.o")
    ap.add_argument("--time-passes", action="store_true",
                    help="print LLVM's pass timers (optimizer, then code generator)")
    args = ap.parse_args()
    shapes = {}
    for item in args.input_shape:
        name, _, dims = item.partition("=")
        shapes[name] = [int(d) if d.isdigit() else d for d in dims.split(",")]

    import llvmlite.binding as llvm

    from mlcpack.packager.codegen import build
    from mlcpack.packager.codegen.target import resolve_target

    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for f in line.split() if f.startswith(("avx2", "avx512", "fma"))})
    print(f"host flags: {' '.join(flags)}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    funcs, size_vars, options = capture(args.model, shapes)
    print(f"{len(funcs)} prim funcs, size variables {size_vars}", flush=True)
    pipelines = args.pipeline or ["O2"]
    for round_ in range(args.rounds):
        for name in args.target.split(","):
            target = resolve_target(name)
            profiler = cProfile.Profile() if args.profile == "emit" and round_ == 0 else None
            t0 = time.process_time()
            if profiler:
                profiler.enable()
            emitted = build.emit_module(funcs, target, size_vars, True, options)
            if profiler:
                profiler.disable()
            t_emit = time.process_time() - t0
            digest = hashlib.sha256(emitted.text.encode()).hexdigest()[:16]
            print(f"[{name}] emit IR {t_emit:.2f} CPU-s, {len(emitted.text) / 1e6:.1f} MB, "
                  f"{len(emitted.groups)} distinct kernels, IR sha {digest}", flush=True)
            if profiler:
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
                print(out.getvalue())
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.top)
                print(out.getvalue())
            tm = build._target_machine(target)
            for pl in pipelines:
                level, loop, slp = PIPELINES[pl]
                t0 = time.process_time()
                parsed = llvm.parse_assembly(emitted.text)
                t1 = time.process_time()
                parsed.verify()
                t2 = time.process_time()
                parsed.triple = target.triple
                parsed.data_layout = str(tm.target_data)
                tuning = llvm.PipelineTuningOptions(speed_level=level)
                tuning.loop_vectorization = loop
                tuning.slp_vectorization = slp
                pb = llvm.create_pass_builder(tm, tuning)
                if args.time_passes:
                    pb.start_pass_timing()
                pb.getModulePassManager().run(parsed, pb)
                t3 = time.process_time()
                if args.time_passes:
                    print(_top_lines(pb.finish_pass_timing(), args.top))
                    llvm.set_time_passes(True)
                obj = tm.emit_object(parsed)
                t4 = time.process_time()
                if args.time_passes:
                    print(_top_lines(llvm.report_and_reset_timings(), args.top))
                    llvm.set_time_passes(False)
                text = str(parsed)
                t5 = time.process_time()
                if args.save:
                    Path(args.save, f"{name}-{pl}.o").write_bytes(obj)
                print(f"[{name} {pl}] parse {t1 - t0:.2f} verify {t2 - t1:.2f} optimize "
                      f"{t3 - t2:.2f} object {t4 - t3:.2f} print {t5 - t4:.2f} CPU-s; "
                      f"object {len(obj)} bytes sha {hashlib.sha256(obj).hexdigest()[:16]}; "
                      f"optimized IR {len(text) / 1e6:.1f} MB", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
