"""Wall time of ``mlcpack export`` for this checkout beside another one, alternating runs.

The other checkout is a directory holding an ``mlcpack`` package (e.g. ``git archive BASE |
tar -x -C /tmp/base/mlcpack``), run with PYTHONPATH pointing at it; both run with this
interpreter, no compile cache and ``--no-check`` (the golden check's time does not depend on
the compiler). Prints each model's median and min for both, wall time and CPU time (the
command's and its compile workers'), and the ratios of the medians.

Run: .venv/bin/python bench/export_time.py --other /tmp/base [--runs 5] [--target host]
     [MODEL.onnx[:name=1,3,48,192] ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_seconds(model: str, shapes: list[str], target: str | None, pythonpath: str | None,
                   out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and the workers it waited for)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLCPACK_CACHE_DIR"] = ""   # no compile cache, in older checkouts too (empty: off)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, "-m", "mlcpack.packager.cli", "export", model, "-o", str(out),
           "--no-check"]
    for s in shapes:
        cmd += ["--input-shape", s]
    if target:
        cmd += ["--target", target]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="directory holding the other mlcpack package")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--target", default=None, help="--target for both (default: portable)")
    ap.add_argument("models", nargs="*", default=[str(ROOT / "artifacts" / "cnn.onnx")])
    args = ap.parse_args()
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for f in line.split() if f.startswith(("avx2", "avx512", "fma"))})
    print(f"host flags: {' '.join(flags)}; {os.cpu_count()} CPUs; target "
          f"{args.target or 'portable'}; {args.runs} runs each, alternating")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models:
            model, *shapes = spec.split(":")
            model = str(Path(model).resolve())
            wall: dict[str, list[float]] = {"this": [], "other": []}
            cpu: dict[str, list[float]] = {"this": [], "other": []}
            for _ in range(args.runs):
                for who, path in (("this", None), ("other", args.other)):
                    w, c = export_seconds(model, shapes, args.target, path,
                                          Path(tmp) / f"{who}.mlc")
                    wall[who].append(w)
                    cpu[who].append(c)
            for what, times in (("wall", wall), ("cpu", cpu)):
                med = {k: statistics.median(v) for k, v in times.items()}
                print(f"{Path(model).name:36s} {what:4s} this median {med['this']:6.2f} s min "
                      f"{min(times['this']):6.2f} | other median {med['other']:6.2f} s min "
                      f"{min(times['other']):6.2f} | this/other {med['this'] / med['other']:.3f}")


if __name__ == "__main__":
    main()
