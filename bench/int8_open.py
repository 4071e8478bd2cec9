"""A quantized model's bundles beside ONNX Runtime on the same QDQ file, taking turns in one
process: is the int8 bundle faster than our fp32 one, and than ORT's int8?

Run: .venv/bin/python bench/int8_open.py MODEL QDQ.onnx NAME=BUNDLE.mlc [NAME=BUNDLE.mlc ...]
     [--rounds 30] [--profile NAME] [--top 10]

MODEL is a corpus name (bench/corpus.py): its realistic input at the corpus shape is the feed
(the bundles may keep the file's open dims). Every bundle is loaded with 1 thread, ORT runs
QDQ.onnx with 1 thread and its default optimizations (its fused int8 kernels); after a warm-up
the engines take turns for ``--rounds`` rounds, one run each per round, and the CPU time of
each run (``time.process_time``) is kept: printed min / median per engine and their ratios to
the first bundle and to ORT. ``--profile NAME`` then ranks bundle NAME's kernels by their least
time (``mlcpack bench --profile`` at the corpus shape) with the kind ``mlcpack inspect`` gives
each (a "generic loop nest" is the slow fallback). The host's vector flags are printed first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def host_flags() -> str:
    """The vector flags of this CPU that matter here (cpuinfo names)."""
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    keep = sorted(f for f in flags if f in ("avx2", "fma", "f16c") or f.startswith("avx512")
                  or f in ("avx_vnni",))
    return " ".join(keep) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("qdq", type=Path)
    ap.add_argument("bundles", nargs="+", help="NAME=BUNDLE.mlc")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--profile", default=None, help="a bundle NAME to profile per kernel")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()

    import corpus
    import onnxruntime as ort

    from mlcpack.runtime import load

    feed = dict(corpus.realistic_inputs(args.model))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(args.qdq), opts, providers=["CPUExecutionProvider"])
    named = [b.split("=", 1) for b in args.bundles]
    models = {name: load(path, threads=1) for name, path in named}
    engines = {name: (lambda m=m: m.run(feed)) for name, m in models.items()}
    engines["ORT int8"] = lambda: sess.run(None, feed)
    print(f"host vector flags: {host_flags()}; feed "
          f"{ {k: v.shape for k, v in feed.items()} }, 1 thread, {args.rounds} rounds", flush=True)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for fn in engines.values():   # warm up
        fn()
        fn()
    for _ in range(args.rounds):
        for name, fn in engines.items():
            c0 = time.process_time()
            fn()
            times[name].append((time.process_time() - c0) * 1e3)
    first = named[0][0]
    base = {k: (min(v), float(np.median(v))) for k, v in times.items()}
    print("| engine | CPU ms min | median | / " + first + " (min, median) | / ORT int8 |")
    print("|---|---|---|---|---|")
    for name, (mn, md) in base.items():
        r0 = f"{mn / base[first][0]:.3f}, {md / base[first][1]:.3f}"
        r1 = f"{mn / base['ORT int8'][0]:.3f}, {md / base['ORT int8'][1]:.3f}"
        print(f"| {name} | {mn:.2f} | {md:.2f} | {r0} | {r1} |")
    for m in models.values():
        m.close()
    if args.profile:
        from quant_sweep import profile_top

        top = profile_top(Path(dict(named)[args.profile]),
                          corpus.MODELS[args.model].input_shape_args(), args.top)
        print(f"{args.profile}: the {args.top} kernels of least time highest (mlcpack bench "
              "--profile): name, kind, min us, share of the sum of mins")
        for name, kind, us, share in top:
            print(f"  {us:8.1f} us {share:6.1%}  {kind:24s} {name[:110]}")


if __name__ == "__main__":
    main()
