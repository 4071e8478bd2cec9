"""Export time per model, cold and warm: ``mlcpack export`` as a user runs it (golden check on),
first with an empty compile cache (cold), then again with the cache that run filled (warm).

Each export runs as its own command (``python -m mlcpack.packager.cli export ... --timings``)
with ``MLCPACK_CACHE_DIR`` pointing at a fresh directory per model and checkout, and the
checkouts' bytecode compiled first (as an installed package has it; ``PYTHONDONTWRITEBYTECODE``
in the shell would otherwise add ~1 CPU-s of compiling sources to every command). Printed per
model: wall seconds and CPU seconds (the command's and its compile workers': on a shared,
loaded host the wall time is inflated by other processes, the CPU time much less), cold and
warm, and the stages ``--timings`` reported (where the time goes). With ``--other DIR`` (a
directory holding another ``mlcpack`` package, e.g. ``git archive BASE | tar -x -C
/tmp/base/mlcpack``) the other checkout runs beside this one, alternating (other cold, this
cold, other warm, this warm, per run), and the table gives both and the ratio of CPU times.

Run: .venv/bin/python bench/export_time.py [--other /tmp/base] [--runs 1] [--target host]
     [--no-check] [--markdown] [MODEL.onnx[:name=1,3,48,192] | corpus-name | --corpus ...]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


@dataclass
class Run:
    wall: float
    cpu: float
    stages: dict[str, float] = field(default_factory=dict)


def model_args(spec: str, folder: Path) -> tuple[str, list[str], str]:
    """(ONNX path, extra export arguments, display name) for a path[:shape] or a corpus name."""
    path, _, shape = spec.partition(":")
    if Path(path).exists():
        return str(Path(path).resolve()), (["--input-shape", shape] if shape else []), \
            Path(path).stem
    import corpus
    if spec not in corpus.MODELS:
        raise SystemExit(f"{spec}: neither a file nor a corpus model")
    extra = []
    for s in corpus.MODELS[spec].input_shape_args():
        extra += ["--input-shape", s]
    extra += corpus.MODELS[spec].bind_args(folder)
    return str(corpus.model_path(spec)), extra, spec


def parse_timings(stdout: str) -> dict[str, float]:
    """The ``--timings`` table's top-level rows (stage -> seconds)."""
    stages = {}
    if "export stage" not in stdout:
        return stages
    for line in stdout[stdout.index("export stage"):].splitlines()[1:]:
        m = re.match(r"^(\S[^\d]*?)\s+(\d+\.\d+)(?:\s+(\d+\.\d+))?", line)
        if m and not line.startswith(" "):
            # the CPU column where the checkout prints one (wall seconds in older ones)
            stages[m.group(1).strip()] = float(m.group(3) or m.group(2))
    return stages


def _env(pythonpath: str | None, pycache: Path) -> dict[str, str]:
    """The commands' environment: ``pythonpath`` (None: this checkout, as installed), and
    bytecode cached under ``pycache`` as an installed package has it (pip compiles it), even
    where the shell sets PYTHONDONTWRITEBYTECODE (compiling ~130 modules from source costs
    ~1 CPU-s per command), outside both checkouts."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def compile_bytecode(pythonpath: str | None, pycache: Path) -> None:
    """Every module of the checkout compiled into ``pycache`` before anything is timed."""
    code = ("import compileall, os, mlcpack\n"
            "root = os.path.dirname(mlcpack.__file__)\n"
            "compileall.compile_file(mlcpack.__file__, quiet=1)\n"
            "for sub in ('runtime', 'packager', 'frontends'):\n"
            "    compileall.compile_dir(os.path.join(root, sub), quiet=1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(pythonpath, pycache),
                   cwd=pycache.parent)


def export(onnx_path: str, extra: list[str], out: Path, cache: Path, pythonpath: str | None,
           flags: list[str], pycache: Path) -> Run:
    env = _env(pythonpath, pycache)
    env["MLCPACK_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-m", "mlcpack.packager.cli", "export", onnx_path, "-o", str(out),
           *extra, "--timings", *flags]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return Run(wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
               parse_timings(proc.stdout))


def _cell(runs: list[Run]) -> str:
    if not runs:
        return "-"
    return (f"{statistics.median(r.wall for r in runs):.1f} / "
            f"{statistics.median(r.cpu for r in runs):.1f}")


def _top(runs: list[Run], n: int = 3) -> str:
    """The largest stages of the last run, e.g. 'codegen 12.1, golden reference 2.0'."""
    if not runs:
        return ""
    stages = sorted(runs[-1].stages.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.1f}" for k, v in stages[:n] if k != "total")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=[])
    ap.add_argument("--corpus", action="store_true", help="every corpus model (bench/corpus.py)")
    ap.add_argument("--other", default=None, help="directory holding another mlcpack package")
    ap.add_argument("--this", default=None, help="directory holding this mlcpack package "
                    "(default: the one this Python has installed)")
    ap.add_argument("--runs", type=int, default=1, help="cold + warm pairs per checkout")
    ap.add_argument("--target", default=None, help="--target for both (default: portable)")
    ap.add_argument("--no-check", action="store_true", help="golden check off")
    ap.add_argument("--markdown", action="store_true", help="the summary as a markdown table")
    ap.add_argument("--only-other", action="store_true", help="time --other alone (a baseline "
                    "taken while this checkout changes)")
    args = ap.parse_args()
    specs = list(args.models)
    if args.corpus:
        import corpus
        specs += list(corpus.MODELS)
    if not specs:
        specs = [str(ROOT / "artifacts" / "cnn.onnx")]
    flags = (["--no-check"] if args.no_check else []) + \
        (["--target", args.target] if args.target else [])
    who = [("other", args.other)] if args.other else []
    if not (args.only_other and args.other):
        who.append(("this", args.this))
    cpuflags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                       for f in line.split() if f.startswith(("avx2", "avx512", "fma"))})
    print(f"host flags: {' '.join(cpuflags)}; {os.cpu_count()} CPUs; target "
          f"{args.target or 'portable'}; golden check {'off' if args.no_check else 'on'}; "
          f"{args.runs} cold+warm pair(s) per checkout, alternating; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlcpack-export-time-") as tmp:
        pycache = {w: Path(tmp) / f"pycache-{w}" for w, _ in who}
        for w, path in who:
            compile_bytecode(path, pycache[w])
        for spec in specs:
            onnx_path, extra, name = model_args(spec, Path(tmp))
            cold: dict[str, list[Run]] = {w: [] for w, _ in who}
            warm: dict[str, list[Run]] = {w: [] for w, _ in who}
            for i in range(args.runs):
                caches = {w: Path(tmp) / f"cache-{w}-{i}" for w, _ in who}
                for table in (cold, warm):
                    for w, path in who:
                        table[w].append(export(onnx_path, extra, Path(tmp) / f"{w}.mlc",
                                               caches[w], path, flags, pycache[w]))
                for c in caches.values():
                    shutil.rmtree(c, ignore_errors=True)
            rows.append((name, cold, warm))
            line = f"{name:22s}"
            for w, _ in who:
                line += (f" | {w}: cold {_cell(cold[w])} warm {_cell(warm[w])} s (wall / cpu)"
                         f" [cold: {_top(cold[w])}; warm: {_top(warm[w])}]")
            print(line, flush=True)
    print()
    head = ["model"] + [f"{w} {k}" for w, _ in who for k in ("cold wall / cpu s",
                                                              "warm wall / cpu s")]
    both = len(who) == 2
    if both:
        head += ["cpu this/other cold", "cpu this/other warm"]
    table = []
    for name, cold, warm in rows:
        cells = [name] + [c for w, _ in who for c in (_cell(cold[w]), _cell(warm[w]))]
        if both:
            for t in (cold, warm):
                o, s = (statistics.median(r.cpu for r in t[w]) for w in ("other", "this"))
                cells.append(f"{s / o:.2f}")
        table.append(cells)
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for cells in table:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(r[i]) for r in [head] + table) for i in range(len(head))]
        for cells in [head] + table:
            print("  ".join(c.ljust(wd) for c, wd in zip(cells, widths)))
    print(f"(medians of {args.runs}; wall time of the whole command, CPU time of it and its "
          "compile workers; host shared with other work: trust the CPU column more)")


if __name__ == "__main__":
    main()
