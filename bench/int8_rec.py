"""``mlcpack export --quantize int8 --calibration DIR`` of the fp32 PP-OCRv4 recognizer as a user
runs it, against the fp32 bundle of the same command: digits accuracy and speed (issue 33).

    .venv/bin/python bench/int8_rec.py [--work DIR] [--calibrate 16] [--rounds 40]
        [--variant NAME=FLAGS ...] [--reuse] [--profile]

Calibration: ``--calibrate`` text lines drawn by bench/text_lines.py (seed 1000, the inputs
bench/calibration.py calibrates on), saved as ``.npy`` files in ``WORK/calibration``: the
``DIR`` of the command. Bundles: ``mlcpack export MODEL -o WORK/fp32.mlc`` and, per variant,
``mlcpack export MODEL -o WORK/NAME.mlc --quantize int8 --calibration WORK/calibration FLAGS``
(default variant ``int8`` with no flags: golden check on, portable target, the model's
symbolic dims kept). FLAGS may start with ``VAR=VALUE`` words: environment variables of that
export (docs/env-vars.md), ``MLCPACK_BIN=PATH`` another checkout's ``mlcpack`` (a baseline).
A variant's flags other than the quantization ones and the variables (``--target``,
``--input-shape``) go to an fp32 export too, so each int8 bundle is compared with the fp32
bundle of its own command (``fp32@NAME``, one per set of such flags).

Accuracy: each bundle itself (1 thread) on bench/calibration.py's held-out lines: 100
digits-only lines (seed 2: the issue's "digits accuracy") and 200 mixed lines (seed 1),
1 - character error rate of the greedy CTC decoding with the model's dictionary.

Speed: 1 thread, batch 1, one 1x3x48x320 line; the bundles take turns in one process,
``--rounds`` rounds of one run each after a warm-up: wall time (``perf_counter``) and CPU
time (``process_time``) per run, median and min. ``--profile``: each bundle's kernels by
their least time (``Model.profile``), with the kernel ``mlcpack inspect`` names.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

QUANT_FLAGS = ("--quantize", "--calibration", "--calibration-method", "--quantize-fallback",
               "--no-quantize-guard", "--quantize-guard")
NO_VALUE = ("--quantize-fallback", "--no-quantize-guard", "--quantize-guard")


def _float_flags(flags: list[str]) -> list[str]:
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        if re.fullmatch(r"[A-Z_0-9]+=.*", f):
            continue
        name = f.split("=")[0]
        if name in QUANT_FLAGS:
            skip = "=" not in f and name not in NO_VALUE
            continue
        out.append(f)
    return out


def _export(model: Path, out: Path, flags: list[str], reuse: bool) -> None:
    if reuse and out.exists():
        print(f"  {out.name}: reused", flush=True)
        return
    env = dict(os.environ)
    for f in [f for f in flags if re.fullmatch(r"[A-Z_0-9]+=.*", f)]:   # VAR=VALUE words
        flags.remove(f)
        k, v = f.split("=", 1)
        env[k] = v
    exe = Path(env.pop("MLCPACK_BIN", str(Path(sys.executable).parent / "mlcpack")))
    cmd = [str(exe), "export", str(model), "-o", str(out), *flags]
    print("  $", " ".join(f"{k}={v}" for k, v in env.items() if k not in os.environ),
          " ".join(shlex.quote(c) for c in cmd), flush=True)
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print(f"    exit {res.returncode}, {time.perf_counter() - t:.0f} s", flush=True)
    for line in (res.stdout + res.stderr).strip().splitlines():
        print("    |", line)
    if res.returncode:
        raise SystemExit(f"export of {out.name} failed")


def _accuracy(model, name: str, lines, chars) -> float:
    import text_lines

    errors = total = 0
    for x, text in lines:
        out = list(model.run({name: x}).values())[0]
        errors += text_lines.edit_distance(text_lines.ctc_decode(out, chars), text)
        total += len(text)
    return 1 - errors / total


def _profile(label: str, path: Path, model, feed, runs: int = 30) -> None:
    from mlcpack.runtime.describe import describe

    prof = model.profile(feed, runs=runs)
    mins = prof.durations_ns.min(axis=0) / 1e3
    kinds = {r["symbol"]: r.get("kernel") for r in describe(path)["kernels"]}
    print(f"  {label}: {len(prof.steps)} steps, sum of mins {mins.sum() / 1e3:.2f} ms; "
          "slowest 15 (min us, kernel):")
    for i in np.argsort(-mins)[:15]:
        st = prof.steps[i]
        print(f"    {mins[i]:8.1f}  {st.name[:44]:44s} {kinds.get(st.symbol) or st.kind}")
    by: dict[str, float] = {}
    for i, st in enumerate(prof.steps):
        k = kinds.get(st.symbol) or st.kind
        by[k] = by.get(k, 0.0) + float(mins[i])
    print("    by kernel kind: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                             sorted(by.items(), key=lambda e: -e[1])))


def main() -> None:
    import corpus
    import onnx

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/mlcpack-int8-rec")
    ap.add_argument("--calibrate", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=FLAGS: extra export flags of one int8 bundle (repeatable)")
    ap.add_argument("--reuse", action="store_true", help="keep bundles already in --work")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-accuracy", action="store_true")
    args = ap.parse_args()

    import text_lines
    from mlcpack.runtime import load

    flags = subprocess.run(["grep", "-o", "avx512[a-z_0-9]*", "/proc/cpuinfo"],
                           capture_output=True, text=True).stdout.split()
    print("host flags:", " ".join(sorted(set(flags))) or "(no AVX-512)")
    path = corpus.model_path("ppocr_rec")
    chars = {p.key: p.value for p in onnx.load(str(path), load_external_data=False)
             .metadata_props}.get("character", "").split("\n")
    work = Path(args.work)
    calib = work / "calibration"
    calib.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1000)
    for i in range(args.calibrate):
        x, _ = text_lines.text_line(rng)
        np.save(calib / f"{i:03d}.npy", x)
    variants = dict(v.split("=", 1) for v in args.variant) or {"int8": ""}
    bundles: dict[str, Path] = {}
    fp32_of: dict[str, str] = {}    # variant -> its fp32 bundle's key
    by_flags: dict[str, str] = {}   # fp32 flags -> key
    for name, extra in variants.items():
        extra_flags = shlex.split(extra)
        fflags = _float_flags(extra_flags)
        fkey = by_flags.setdefault(" ".join(fflags), "fp32" + (f"@{name}" if fflags else ""))
        fp32_of[name] = fkey
        if fkey not in bundles:
            bundles[fkey] = work / f"{fkey.replace('@', '_')}.mlc"
            _export(path, bundles[fkey], fflags, args.reuse)
        bundles[name] = work / f"{name}.mlc"
        _export(path, bundles[name], ["--quantize", "int8", "--calibration", str(calib),
                                      *extra_flags], args.reuse)
    models = {k: load(p, threads=1) for k, p in bundles.items()}
    name = models["fp32"].inputs[0].name if "fp32" in models else \
        next(iter(models.values())).inputs[0].name
    rng2 = np.random.default_rng(2)
    sets = {"digits": [text_lines.text_line(rng2, True) for _ in range(100)]}
    rng1 = np.random.default_rng(1)
    sets["mixed"] = [text_lines.text_line(rng1) for _ in range(200)]
    if not args.no_accuracy:
        for k, m in models.items():
            acc = {s: _accuracy(m, name, lines, chars) for s, lines in sets.items()}
            print(f"  accuracy {k:14s} " + ", ".join(f"{s} {a:.2%}" for s, a in acc.items()),
                  flush=True)
    x = sets["mixed"][0][0]
    feed = {name: x}
    wall: dict[str, list[float]] = {k: [] for k in models}
    cpu: dict[str, list[float]] = {k: [] for k in models}
    for m in models.values():
        m.run(feed)
        m.run(feed)
    for _ in range(args.rounds):
        for k, m in models.items():
            c0, t0 = time.process_time(), time.perf_counter()
            m.run(feed)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    print(f"  speed, 1 thread, batch 1, {x.shape}, {args.rounds} alternating rounds "
          "(ms: wall median / min, CPU median / min):")
    for k in models:
        print(f"    {k:14s} wall {1e3 * np.median(wall[k]):7.2f} / {1e3 * min(wall[k]):7.2f}   "
              f"cpu {1e3 * np.median(cpu[k]):7.2f} / {1e3 * min(cpu[k]):7.2f}")
    for k in variants:
        fp = fp32_of[k]
        print(f"    {k} vs {fp}: wall median {np.median(wall[fp]) / np.median(wall[k]):.2f}x, "
              f"min {min(wall[fp]) / min(wall[k]):.2f}x; cpu median "
              f"{np.median(cpu[fp]) / np.median(cpu[k]):.2f}x, min "
              f"{min(cpu[fp]) / min(cpu[k]):.2f}x")
    if args.profile:
        for k, m in models.items():
            _profile(k, bundles[k], m, feed)
    for m in models.values():
        m.close()


if __name__ == "__main__":
    main()
