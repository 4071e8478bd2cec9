"""mlcpack against ONNX Runtime on the real-model corpus (bench/corpus.py).

Run: .venv/bin/python bench/real.py [model ...] [--threads 1,2] [--budget S] [--markdown]
                                    [--json [PATH]]
Every model is exported the way a user would (``mlcpack export MODEL -o X.mlc --input-shape
...``: golden check on, ``--target host``), then ONNX Runtime and the bundle run the model's
realistic input alternating in blocks (bench.py's time_interleaved) at each thread count, so that
both see the same machine load. Prints per model and thread count the median ms of both engines,
mlcpack/ORT by median and by min, the largest output difference, and per thread count the
geometric mean of the ratios. A model that fails to export is a line with the reason, not a
crash. Bundles go to the corpus cache (``$MLCPACK_CORPUS_CACHE/bundles``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from bench import time_interleaved  # noqa: E402

MLCPACK = Path(sys.executable).parent / "mlcpack"


def export_cli(name: str, onnx_path: Path, bundle: Path) -> tuple[float, str | None]:
    """Export with the command line's default path; (seconds, None) or (seconds, reason)."""
    args = [str(MLCPACK), "export", str(onnx_path), "-o", str(bundle), "--target", "host"]
    for shape in corpus.MODELS[name].input_shape_args():
        args += ["--input-shape", shape]
    args += corpus.MODELS[name].bind_args(bundle.parent)
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        return seconds, (lines[-1] if lines else f"exit {proc.returncode}")[:200]
    return seconds, None


def ort_session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3  # ddddocr's declared output shape makes ORT warn on every run
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def bench_model(name: str, threads_list: list[int], budget: float, reuse: bool = False) -> dict:
    """One model: export (or, with ``reuse``, take the bundle already in the cache when it is
    newer than the ONNX file), then per thread count the interleaved timing of both engines."""
    from mlcpack.runtime import load

    model = corpus.MODELS[name]
    row: dict = {"model": name, "source": model.source, "rows": []}
    try:
        onnx_path = corpus.model_path(name)
    except corpus.CorpusError as exc:
        row["error"] = f"fetch: {exc}"
        return row
    bundles = corpus.cache_dir() / "bundles"
    bundles.mkdir(parents=True, exist_ok=True)
    bundle = bundles / f"{name}.mlc"
    if reuse and bundle.exists() and bundle.stat().st_mtime > onnx_path.stat().st_mtime:
        row["export_s"], reason = float("nan"), None
    else:
        row["export_s"], reason = export_cli(name, onnx_path, bundle)
    if reason:
        row["error"] = reason
        return row
    feeds = corpus.realistic_inputs(name)
    for threads in threads_list:
        try:
            with load(bundle, threads=threads) as mlc:
                timing = time_pair(ort_session(onnx_path, threads), mlc, feeds, budget,
                                   corpus.bundle_inputs(name))
        except Exception as exc:  # a model that fails to run is a line, not a crash
            row["error"] = f"run ({threads} threads): {type(exc).__name__}: {exc}"[:200]
            break
        row["rows"].append({"threads": threads, **timing})
    return row


def time_pair(sess, mlc, feeds: dict[str, np.ndarray], budget: float,
              mlc_feeds: dict[str, np.ndarray] | None = None) -> dict:
    """ONNX Runtime and the bundle alternating on ``feeds`` (the bundle on ``mlc_feeds``, less
    the inputs bound at export, when given): times in ms, ratios, and the largest absolute
    difference between their outputs."""
    mlc_feeds = feeds if mlc_feeds is None else mlc_feeds
    expected = sess.run(None, feeds)
    got = list(mlc.run(mlc_feeds).values())
    err = max(float(np.max(np.abs(g.astype(np.float64) - e))) for g, e in zip(got, expected))
    (o_med, o_min, runs), (m_med, m_min, _) = time_interleaved(
        [lambda: sess.run(None, feeds), lambda: mlc.run(mlc_feeds)], budget)
    return {"ort_ms": o_med / 1e3, "ort_min_ms": o_min / 1e3, "mlc_ms": m_med / 1e3,
            "mlc_min_ms": m_min / 1e3, "ratio": m_med / o_med, "ratio_min": m_min / o_min,
            "runs": runs, "max_abs_err": err}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(results: list[dict], threads_list: list[int]) -> dict[int, float]:
    return {t: geomean([r["ratio"] for res in results for r in res["rows"] if r["threads"] == t])
            for t in threads_list}


def print_text(results: list[dict], threads_list: list[int]) -> None:
    print(f"\n{'model':22s} {'source':28s} {'thr':>3s} {'ORT ms':>9s} {'mlcpack ms':>10s} "
          f"{'ratio':>6s} {'(min)':>6s} {'max abs err':>11s} {'export s':>8s}")
    for res in results:
        for r in res["rows"]:
            print(f"{res['model']:22s} {res['source']:28s} {r['threads']:>3d} {r['ort_ms']:>9.2f} "
                  f"{r['mlc_ms']:>10.2f} {r['ratio']:>6.2f} {r['ratio_min']:>6.2f} "
                  f"{r['max_abs_err']:>11.2e} {res['export_s']:>8.1f}")
    for t, g in summary(results, threads_list).items():
        n = sum(1 for res in results for r in res["rows"] if r["threads"] == t)
        print(f"geometric mean of mlcpack/ORT (median), {t} thread{'s' * (t > 1)}: {g:.2f} "
              f"over {n} models")
    failed = [res for res in results if "error" in res]
    if failed:
        print(f"\n{len(failed)} model(s) not benchmarked:")
        for res in failed:
            print(f"  {res['model']} ({res['source']}): {res['error']}")


def markdown(results: list[dict], threads_list: list[int]) -> str:
    lines = ["| model | source | threads | ORT ms | mlcpack ms | ratio (median) | ratio (min) |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            lines.append(f"| {res['model']} | {res['source']} | {r['threads']} | "
                         f"{r['ort_ms']:.2f} | {r['mlc_ms']:.2f} | {r['ratio']:.2f} | "
                         f"{r['ratio_min']:.2f} |")
        if "error" in res:
            lines.append(f"| {res['model']} | {res['source']} | | | fails: {res['error']} | | |")
    for t, g in summary(results, threads_list).items():
        lines.append(f"| **geometric mean** | | {t} | | | **{g:.2f}** | |")
    return "\n".join(lines)


def machine() -> str:
    """The CPU's model name and the number of CPUs this process may use."""
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       "")
    return f"{cpu or 'unknown CPU'}, {len(os.sched_getaffinity(0))} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(corpus.MODELS))
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--budget", type=float, default=3.0,
                    help="seconds of alternating runs per model and thread count")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--reuse-bundles", action="store_true",
                    help="time the bundles already in the cache (exported earlier by this script "
                         "from the same code) instead of exporting again")
    ap.add_argument("--export-only", action="store_true",
                    help="export every model (into the cache) and time nothing")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="write the results as JSON to PATH (or stdout)")
    args = ap.parse_args()
    unknown = [n for n in args.models if n not in corpus.MODELS]
    if unknown:
        sys.exit(f"unknown corpus model(s): {', '.join(unknown)}; known: "
                 f"{', '.join(corpus.MODELS)}")
    threads_list = [int(t) for t in args.threads.split(",")]
    results = []
    for name in args.models:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results.append(bench_model(name, [] if args.export_only else threads_list, args.budget,
                                   reuse=args.reuse_bundles))
    print_text(results, threads_list)
    if args.markdown:
        print("\n" + markdown(results, threads_list))
    print(f"machine: {machine()}")
    if args.json:
        doc = {"machine": machine(), "threads": threads_list, "results": results,
               "geomean": {str(t): g for t, g in summary(results, threads_list).items()}}
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
