"""Cold vs warm ``mlcpack export``: wall time without the compile cache and with a warm one.

Run: .venv/bin/python bench/export_cache.py [MODEL.onnx[:name=1,3,48,192] | corpus-name ...]
     [--runs 2] [--target host] [--check]
Per model, in a fresh cache directory: one export fills the cache (not timed), then cold
(``--no-cache``) and warm (cache hit) exports alternate ``--runs`` times each, so that both see
the same machine load. Prints each one's median and min wall seconds (the whole process, as a
user waits for it), warm/cold, and the ``--timings`` table of the last warm export (where the
time that is left goes). Default: the golden check off (``--no-check``: its time does not
depend on the cache) and the portable target (every level from x86-64-v2 up to this CPU's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MLCPACK = Path(sys.executable).parent / "mlcpack"


def model_args(spec: str) -> tuple[str, list[str], str]:
    """(ONNX path, extra export arguments, display name) for a path[:shape] or a corpus name."""
    path, _, shape = spec.partition(":")
    if Path(path).exists():
        return path, (["--input-shape", shape] if shape else []), Path(path).stem
    import corpus
    if spec not in corpus.MODELS:
        raise SystemExit(f"{spec}: neither a file nor a corpus model")
    extra = []
    for s in corpus.MODELS[spec].input_shape_args():
        extra += ["--input-shape", s]
    onnx_path = corpus.model_path(spec)
    extra += corpus.MODELS[spec].bind_args(Path(tempfile.gettempdir()))
    return str(onnx_path), extra, spec


def export(onnx_path: str, extra: list[str], out: Path, cache_dir: Path, *flags: str
           ) -> tuple[float, str]:
    env = {**os.environ, "MLCPACK_CACHE_DIR": str(cache_dir)}
    cmd = [str(MLCPACK), "export", onnx_path, "-o", str(out), *extra, *flags]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return seconds, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=[str(HERE.parent / "artifacts" / "cnn.onnx")])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--target", default=None, help="--target (default: portable)")
    ap.add_argument("--check", action="store_true", help="keep the golden check on")
    args = ap.parse_args()
    flags = [] if args.check else ["--no-check"]
    if args.target:
        flags += ["--target", args.target]
    rows = []
    for spec in args.models:
        onnx_path, extra, name = model_args(spec)
        with tempfile.TemporaryDirectory(prefix="mlcpack-export-cache-") as tmp:
            cache_dir, out = Path(tmp) / "cache", Path(tmp) / "m.mlc"
            export(onnx_path, extra, out, cache_dir, *flags)   # fills the cache
            cold, warm, table = [], [], ""
            for _ in range(args.runs):
                cold.append(export(onnx_path, extra, out, cache_dir, "--no-cache", *flags)[0])
                seconds, stdout = export(onnx_path, extra, out, cache_dir, "--timings", *flags)
                warm.append(seconds)
                table = stdout[stdout.index("export stage"):]
        rows.append((name, cold, warm))
        print(f"\n== {name}: cold {statistics.median(cold):.1f} s (min {min(cold):.1f}), warm "
              f"{statistics.median(warm):.1f} s (min {min(warm):.1f}), warm/cold "
              f"{statistics.median(warm) / statistics.median(cold):.2f}\n"
              f"last warm export, --timings:\n{table}", flush=True)
    print(f"\n{'model':24s} {'cold s':>7s} {'warm s':>7s} {'warm/cold':>9s}  (medians of "
          f"{args.runs}, wall time of the whole command)")
    for name, cold, warm in rows:
        print(f"{name:24s} {statistics.median(cold):>7.1f} {statistics.median(warm):>7.1f} "
              f"{statistics.median(warm) / statistics.median(cold):>9.2f}")
    from real import cpu_flags, machine
    print(f"machine: {machine()}; CPU flags: {cpu_flags()}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
