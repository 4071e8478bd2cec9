"""Fuzz the bundle reader, the header validation and the ELF loader with 100 000+ mutations of a
real bundle (outside CI; ``tests/format/test_fuzzed_bundles.py`` runs a short version).

    .venv/bin/python bench/fuzz_bundle.py                      # 100 000 mutations, all cores
    .venv/bin/python bench/fuzz_bundle.py --mutations 20000 --bundle my.mlc --json out.json
    .venv/bin/python bench/fuzz_bundle.py --mlcrun runtime/c/build-asan/mlcrun   # the C runtime
    .venv/bin/python bench/fuzz_bundle.py --loops --mutations 5000   # a Loop's grown values

``--loops`` mutates a greedy-decode Loop (tests/export/loop_models.py ``grown_values``: format
1.10's grown values and a counted size) instead of the MLP: half its header mutations hit the
vm record, the STORE rows and the run-time sizes (``fuzzing.loop_paths``), and a third family
rewrites words of its APPEND instructions in the bytecode (``fuzzing.random_append_case``).

Batches run in worker processes (``faulthandler`` on), so a segfault, an abort or a hang in one
batch is seen and reported with the batch seed and the index of the case it was running, instead
of taking the whole run down. The mutations and the property are in ``tests/fuzzing.py``. Exit
status 1 if any case broke the property, crashed or hung.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import faulthandler
import json
import mmap
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _tiny_bundle(folder: Path) -> Path:
    """A 6-5-3 MLP (a few KB), so one load costs well under a millisecond."""
    import numpy as np
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import ExportOptions, export_module

    rng = np.random.default_rng(0)
    weights = {"w0": rng.standard_normal((5, 6)).astype(np.float32),
               "b0": rng.standard_normal(5).astype(np.float32),
               "w1": rng.standard_normal((3, 5)).astype(np.float32),
               "b1": rng.standard_normal(3).astype(np.float32)}
    path = folder / "tiny.mlc"
    mod = build_from_spec(infer_mlp_spec(weights), weights, None)
    export_module(mod, path, ExportOptions(labels=["a", "b", "c"], model_name="tiny"))
    return path


# ---- worker ---------------------------------------------------------------------------------

def _loop_bundle(folder: Path) -> Path:
    """The greedy-decode Loop of tests/export/loop_models.py (format 1.10), exported."""
    sys.path.insert(0, str(ROOT / "tests" / "export"))
    import loop_models
    from mlcpack.packager.api import Options, export

    src, path = loop_models.grown_values(folder / "grown.onnx"), folder / "grown.mlc"
    export(src, path, Options())
    return path


def _loop_feeds() -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "export"))
    import loop_models

    return loop_models.grown_feeds(5, seed=1)


def run_worker(bundle: Path, batch_seed: int, count: int, progress: Path, scratch: Path,
               mlcrun: Path | None = None, loops: bool = False) -> None:
    import fuzzing

    faulthandler.enable()
    seed = fuzzing.make_seed(bundle, _loop_feeds() if loops else None)
    paths = fuzzing.header_paths(seed.header)
    focus = fuzzing.loop_paths(seed.header) if loops else paths
    rng = random.Random(batch_seed)
    outcomes: collections.Counter = collections.Counter()
    violations: list[str] = []
    crash_at = int(os.environ.get("MLCPACK_FUZZ_CRASH_AT", "-1"))  # tests the crash report
    with open(progress, "r+b") as f, mmap.mmap(f.fileno(), 8) as mark:
        for i in range(count):
            mark[:8] = struct.pack("<q", i)  # survives a crash: the parent reads it
            if i == crash_at:
                ctypes.string_at(0)  # a real SIGSEGV
            pick = rng.random()
            family = ("append" if loops and pick < 0.2 else "header" if pick < 0.6
                      else "bytes")
            case = None
            while case is None:
                case = (fuzzing.random_append_case(seed, rng) if family == "append"
                        else fuzzing.random_header_case(seed, rng, focus if rng.random() < 0.5
                                                        else paths) if family == "header"
                        else fuzzing.random_byte_case(seed, rng))
            try:
                got = (fuzzing.check_c(seed, case, scratch, mlcrun) if mlcrun
                       else fuzzing.check(seed, case, scratch))
                outcomes[f"{family}:{got}"] += 1
            except fuzzing.PropertyViolation as exc:
                outcomes[f"{family}:VIOLATION"] += 1
                if len(violations) < 20:
                    violations.append(f"batch {batch_seed} case {i}: {exc}")
    json.dump({"outcomes": outcomes, "violations": violations}, sys.stdout)


# ---- parent ---------------------------------------------------------------------------------

def run(mutations: int, batch: int, workers: int, bundle: Path | None, seed: int,
        timeout: float, mlcrun: Path | None = None, loops: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mlcfuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                 else None))
    try:
        bundle = bundle or (_loop_bundle(work) if loops else _tiny_bundle(work))
        return _run(work, bundle, mutations, batch, workers, seed, timeout, mlcrun, loops)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(work: Path, bundle: Path, mutations: int, batch: int, workers: int, seed: int,
         timeout: float, mlcrun: Path | None = None, loops: bool = False) -> dict:
    batches = [(seed * 1_000_003 + b, min(batch, mutations - b * batch))
               for b in range((mutations + batch - 1) // batch)]
    pending = list(batches)
    running: list[tuple[subprocess.Popen, int, int, Path, float]] = []
    outcomes: collections.Counter = collections.Counter()
    violations: list[str] = []
    crashes: list[str] = []
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < workers:
            bseed, n = pending.pop(0)
            progress = work / f"progress-{bseed}"
            progress.write_bytes(b"\xff" * 8)
            cmd = [sys.executable, __file__, "--worker", "--bundle", str(bundle),
                   "--batch-seed", str(bseed), "--count", str(n), "--progress", str(progress),
                   "--scratch", str(work / f"case-{bseed}.mlc")]
            if mlcrun:
                cmd += ["--mlcrun", str(mlcrun)]
            if loops:
                cmd.append("--loops")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((proc, bseed, n, progress, time.perf_counter()))
        time.sleep(0.02)
        for item in list(running):
            proc, bseed, n, progress, started = item
            if proc.poll() is None and time.perf_counter() - started < timeout:
                continue
            running.remove(item)
            hung = proc.poll() is None
            if hung:
                proc.kill()
            out, err = proc.communicate()
            (at,) = struct.unpack("<q", progress.read_bytes()[:8])
            if hung or proc.returncode != 0:
                what = "hung" if hung else f"exit {proc.returncode}"
                crashes.append(f"batch {bseed}: {what} at case {at}: {err.strip()[-2000:]}")
                outcomes["CRASH" if not hung else "HANG"] += 1
                continue
            result = json.loads(out)
            outcomes.update(result["outcomes"])
            violations += result["violations"]
    seconds = time.perf_counter() - t0
    return {"mutations": mutations, "seconds": round(seconds, 2),
            "per_second": round(mutations / seconds, 1), "workers": workers,
            "bundle_bytes": bundle.stat().st_size, "outcomes": dict(sorted(outcomes.items())),
            "violations": violations, "crashes": crashes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutations", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=5000, help="mutations per worker process")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bundle", type=Path, help="bundle to mutate (default: a tiny MLP)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300, help="seconds before a batch is hung")
    ap.add_argument("--json", type=Path, help="also write the report here")
    ap.add_argument("--mlcrun", type=Path, help="check the C runtime's mlcrun (runtime/c) "
                    "instead of the Python runtime: refuse with a README code or give the "
                    "original answer, never crash (point it at build-asan/mlcrun)")
    ap.add_argument("--loops", action="store_true", help="mutate a greedy-decode Loop (format "
                    "1.10's grown values) with mutations aimed at its loop records and APPENDs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch-seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        run_worker(args.bundle, args.batch_seed, args.count, args.progress, args.scratch,
                   args.mlcrun, args.loops)
        return 0
    mlcrun = args.mlcrun.resolve() if args.mlcrun else None
    report = run(args.mutations, args.batch, args.workers, args.bundle, args.seed, args.timeout,
                 mlcrun, args.loops)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"{report['mutations']} mutations in {report['seconds']} s "
          f"({report['per_second']}/s, {report['workers']} workers, bundle "
          f"{report['bundle_bytes']} bytes)")
    for key, n in report["outcomes"].items():
        print(f"  {key:<28} {n:>8}")
    for line in report["violations"] + report["crashes"]:
        print("FAIL:", line)
    return 1 if report["violations"] or report["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
