"""mlcpack against ONNX Runtime and OpenVINO on the real-model corpus (bench/corpus.py).

Run: .venv/bin/python bench/real.py [model ...] [--threads 1,2] [--budget S] [--markdown]
                                    [--cpu-time] [--json [PATH]]
Every model is exported the way a user would (``mlcpack export MODEL -o X.mlc --input-shape
...``: golden check on, ``--target host``), then the peers (bench/peers.py: ONNX Runtime, and
OpenVINO in f32 and at its default precision when it is installed) and the bundle run the
model's realistic input alternating in blocks (bench.py's time_interleaved) at each thread
count, so that all see the same machine load. Prints per model and thread count the median ms
of every engine, mlcpack/ORT and mlcpack/best fp32 peer by median (and the best by min), the
largest output difference from ONNX Runtime, our export time and OpenVINO's compile time, and
per thread count the geometric mean and the worst of the ratios. A model that fails to export
is a line with the reason, not a crash. Bundles go to the corpus cache
(``$MLCPACK_CORPUS_CACHE/bundles``). ``--no-cache`` exports without the compile cache (a cold
export time).
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
import peers  # noqa: E402
from bench import time_interleaved  # noqa: E402

MLCPACK = Path(sys.executable).parent / "mlcpack"


def export_cli(name: str, onnx_path: Path, bundle: Path, cache: bool = True
               ) -> tuple[float, str | None]:
    """Export with the command line's default path; (seconds, None) or (seconds, reason)."""
    args = [str(MLCPACK), "export", str(onnx_path), "-o", str(bundle), "--target", "host"]
    if not cache:
        args.append("--no-cache")
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


def bench_model(name: str, threads_list: list[int], budget: float, reuse: bool = False,
                cache: bool = True, clock=time.perf_counter) -> dict:
    """One model: export (or, with ``reuse``, take the bundle already in the cache when it is
    newer than the ONNX file), then per thread count the interleaved timing of the peers and
    the bundle."""
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
        row["export_s"], reason = export_cli(name, onnx_path, bundle, cache)
    if reason:
        row["error"] = reason
        return row
    feeds = corpus.realistic_inputs(name)
    for threads in threads_list:
        try:
            engines = [peers.ort_engine(onnx_path, feeds, threads)]
            try:
                engines += peers.openvino_engines(onnx_path, feeds, threads)
            except Exception as exc:  # a peer that cannot take the model is a note, not a
                # failed model: mlcpack is still compared with the peers that run it
                first = str(exc).strip().splitlines()
                row.setdefault("peer_errors", {})["OpenVINO"] = (
                    f"{type(exc).__name__}: {first[-1] if first else ''}"[:200])
            with load(bundle, threads=threads) as mlc:
                timing = time_engines(engines, mlc, budget, corpus.bundle_inputs(name), clock)
        except Exception as exc:  # a model that fails to run is a line, not a crash
            row["error"] = f"run ({threads} threads): {type(exc).__name__}: {exc}"[:200]
            break
        row["rows"].append({"threads": threads, **timing})
        ov = [e for e in engines if e.label == "OV f32"]
        if ov and "ov_compile_s" not in row:
            row["ov_compile_s"] = ov[0].compile_s
    return row


def time_engines(engines: list[peers.Engine], mlc, budget: float,
                 mlc_feeds: dict[str, np.ndarray], clock=time.perf_counter) -> dict:
    """The peers (``engines``, ONNX Runtime first) and the bundle alternating, the bundle on
    ``mlc_feeds`` (the inputs not bound at export): times in ms, mlcpack's ratios to ONNX
    Runtime and to the best fp32 peer, and the largest absolute difference of each engine's
    outputs from ONNX Runtime's."""
    expected = engines[0].outputs()
    mlc_err = peers.max_abs_err(list(mlc.run(mlc_feeds).values()), expected)
    timed = time_interleaved([e.run for e in engines] + [lambda: mlc.run(mlc_feeds)], budget,
                             clock=clock)
    medians = {e.label: t[0] / 1e3 for e, t in zip(engines, timed)}
    mins = {e.label: t[1] / 1e3 for e, t in zip(engines, timed)}
    m_med, m_min, runs = timed[-1][0] / 1e3, timed[-1][1] / 1e3, timed[-1][2]
    best, best_ms = peers.best_fp32(medians, engines)
    best_min = min(mins[e.label] for e in engines if e.fp32)
    return {"ort_ms": medians["ORT"], "ort_min_ms": mins["ORT"], "mlc_ms": m_med,
            "mlc_min_ms": m_min, "ratio": m_med / medians["ORT"],
            "ratio_min": m_min / mins["ORT"], "best": best, "best_ms": best_ms,
            "ratio_best": m_med / best_ms, "ratio_best_min": m_min / best_min,
            "peers": {e.label: {"ms": medians[e.label], "min_ms": mins[e.label],
                                "compile_s": e.compile_s, "fp32": e.fp32, "notes": e.notes,
                                "max_abs_err": peers.max_abs_err(e.outputs(), expected)}
                      for e in engines[1:]},
            "runs": runs, "max_abs_err": mlc_err}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(results: list[dict], threads_list: list[int], key: str = "ratio"
            ) -> dict[int, float]:
    return {t: geomean([r[key] for res in results for r in res["rows"] if r["threads"] == t])
            for t in threads_list}


def worst(results: list[dict], threads: int, key: str = "ratio_best") -> tuple[str, float]:
    rows = [(res["model"], r[key]) for res in results for r in res["rows"]
            if r["threads"] == threads]
    return max(rows, key=lambda p: p[1]) if rows else ("", float("nan"))


def peer_labels(results: list[dict]) -> list[str]:
    """The OpenVINO engines that ran, in a stable order."""
    labels = {label for res in results for r in res["rows"] for label in r.get("peers", {})}
    return sorted(labels, key=lambda s: (not s.startswith("OV f32"), s))


def print_text(results: list[dict], threads_list: list[int]) -> None:
    labels = peer_labels(results)
    head = "".join(f" {label + ' ms':>{max(10, len(label) + 3)}s}" for label in labels)
    print(f"\n{'model':22s} {'thr':>3s} {'ORT ms':>9s}{head} {'mlcpack ms':>10s} "
          f"{'/ORT':>5s} {'/best':>5s} {'(min)':>5s} {'best':>8s} {'max abs err':>11s} "
          f"{'export s':>8s} {'OV comp s':>9s}")
    notes = set()
    for res in results:
        for r in res["rows"]:
            cells = ""
            for label in labels:
                peer = r.get("peers", {}).get(label)
                cells += f" {peer['ms'] if peer else float('nan'):>{max(10, len(label) + 3)}.2f}"
                notes.update(peer["notes"] if peer else [])
            print(f"{res['model']:22s} {r['threads']:>3d} {r['ort_ms']:>9.2f}{cells} "
                  f"{r['mlc_ms']:>10.2f} {r['ratio']:>5.2f} {r['ratio_best']:>5.2f} "
                  f"{r['ratio_best_min']:>5.2f} {r['best']:>8s} {r['max_abs_err']:>11.2e} "
                  f"{res['export_s']:>8.1f} {res.get('ov_compile_s', float('nan')):>9.2f}")
    for t in threads_list:
        n = sum(1 for res in results for r in res["rows"] if r["threads"] == t)
        model, ratio = worst(results, t)
        print(f"{t} thread{'s' * (t > 1)}, {n} models: geometric mean of mlcpack/ORT "
              f"{summary(results, [t])[t]:.2f}, of mlcpack/best fp32 peer "
              f"{summary(results, [t], 'ratio_best')[t]:.2f} (worst {ratio:.2f}, {model})")
    if not labels and peers.openvino_version() is None:
        print(peers.OPENVINO_MISSING)
    for note in sorted(notes):
        print(f"note: {note}")
    for res in results:
        for peer, error in res.get("peer_errors", {}).items():
            print(f"note: {peer} cannot run {res['model']}: {error}")
    failed = [res for res in results if "error" in res]
    if failed:
        print(f"\n{len(failed)} model(s) not benchmarked:")
        for res in failed:
            print(f"  {res['model']} ({res['source']}): {res['error']}")


def markdown(results: list[dict], threads_list: list[int]) -> str:
    labels = peer_labels(results)
    lines = ["| model | threads | ORT ms | " + "".join(f"{label} ms | " for label in labels)
             + "mlcpack ms | /ORT | /best fp32 peer | best | export s | OV compile s |",
             "|---|---|---|" + "---|" * len(labels) + "---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            cells = "".join(f"{r['peers'][label]['ms']:.2f} | " if label in r.get("peers", {})
                            else " | " for label in labels)
            lines.append(f"| {res['model']} | {r['threads']} | {r['ort_ms']:.2f} | {cells}"
                         f"{r['mlc_ms']:.2f} | {r['ratio']:.2f} | {r['ratio_best']:.2f} | "
                         f"{r['best']} | {res['export_s']:.1f} | "
                         f"{res.get('ov_compile_s', float('nan')):.2f} |")
        if "error" in res:
            lines.append(f"| {res['model']} | | fails: {res['error']} |" + " |" * (len(labels) + 6))
        for peer, error in res.get("peer_errors", {}).items():
            lines.append(f"| {res['model']} | | {peer} cannot run it: {error} |"
                         + " |" * (len(labels) + 6))
    for t in threads_list:
        lines.append(f"| **geometric mean** | {t} | | " + " | " * len(labels)
                     + f" | **{summary(results, [t])[t]:.2f}** | "
                     f"**{summary(results, [t], 'ratio_best')[t]:.2f}** | | | |")
    return "\n".join(lines)


def machine() -> str:
    """The CPU's model name and the number of CPUs this process may use."""
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       "")
    return f"{cpu or 'unknown CPU'}, {len(os.sched_getaffinity(0))} CPUs"


def cpu_flags() -> str:
    """The vector extensions the host has (what every number here depends on)."""
    flags: set[str] = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
        flags = set(line.split(":", 1)[-1].split())
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"]
    have = [f for f in wanted if f in flags]
    return "+".join(have) + (" (no AVX-512)" if "avx512f" not in flags else "") if have \
        else "unknown"


def ort_version() -> str:
    import onnxruntime
    return onnxruntime.__version__


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
    ap.add_argument("--no-cache", action="store_true",
                    help="export without the compile cache (cold export times)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time each run by the process's CPU seconds, not the wall clock (a "
                         "loaded host: time spent descheduled is not counted; at 1 thread that "
                         "is each engine's own work, at more it sums the threads)")
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
                                   reuse=args.reuse_bundles, cache=not args.no_cache,
                                   clock=time.process_time if args.cpu_time
                                   else time.perf_counter))
    print_text(results, threads_list)
    if args.markdown:
        print("\n" + markdown(results, threads_list))
    print(f"machine: {machine()}; CPU flags: {cpu_flags()}; ONNX Runtime {ort_version()}, "
          f"OpenVINO {peers.openvino_version() or 'not installed'}"
          + ("; times are CPU seconds per run (--cpu-time)" if args.cpu_time else ""))
    if args.json:
        doc = {"machine": machine(), "cpu_flags": cpu_flags(), "threads": threads_list,
               "openvino": peers.openvino_version(), "results": results,
               "geomean": {str(t): g for t, g in summary(results, threads_list).items()},
               "geomean_best": {str(t): g for t, g in
                                summary(results, threads_list, "ratio_best").items()}}
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
