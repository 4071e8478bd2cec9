"""mlcpack against ONNX Runtime and OpenVINO (and numpy where it applies), one process per model.

Run: .venv/bin/python bench/bench.py [model ...] [--budget SECONDS] [--markdown]
Models: mlp_b1 mlp_b64 resnet18 mobilenet_v2 transformer (default: all). Each model is built
with torch (random weights) into bench/.cache/<name>.onnx, exported with mlcpack, and the
engines run the same ONNX file on the same input, alternating in blocks of 0.2 s (ORT, OpenVINO
f32, [OpenVINO default,] mlcpack, ORT, ...) for about --budget seconds per thread count, so
that all see the same machine load; each block starts once the other engines' threads have
stopped spinning (``wait_quiet``). The peers are bench/peers.py's: OpenVINO only when it is
installed (``pip install -e '.[bench]'``), its default precision timed apart only where it is
not f32. Per engine: load (compile) time, first inference, steady-state median and min latency,
GFLOP/s (from the ONNX graph's Conv/Gemm/MatMul MACs); mlcpack's ratios to ORT and to the best
fp32 peer; per model, the export time and the cold start (a fresh `python` loading the bundle
and running it once, against `python -c "import numpy"`). With several models, each runs in its
own subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(HERE, ".cache")
ALL = ("mlp_b1", "mlp_b64", "resnet18", "mobilenet_v2", "transformer")


def onnx_flops(path: str) -> float:
    """2 × multiply-accumulates of every Conv, Gemm and MatMul node (shapes inferred)."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(path))
    g = model.graph
    shapes = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    for init in g.initializer:
        shapes[init.name] = list(numpy_helper.to_array(init).shape)
    total = 0.0
    for node in g.node:
        if node.op_type == "Conv":
            w, y = shapes[node.input[1]], shapes[node.output[0]]
            total += np.prod(y) * np.prod(w[1:])
        elif node.op_type in ("Gemm", "MatMul"):
            a, y = shapes[node.input[0]], shapes[node.output[0]]
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            total += np.prod(y) * (a[-2] if trans_a else a[-1])
    return 2.0 * float(total)


COLD_SCRIPT = """import sys, numpy as np
from mlcpack.runtime import load
m = load(sys.argv[1])
m.run({s.name: np.zeros(s.shape, s.dtype) for s in m.inputs})
"""


def cold_start_ms(bundle: str, repeats: int = 7) -> tuple[float, float]:
    """Median wall time of a fresh interpreter that loads ``bundle`` and runs it once, and of
    one that only imports numpy (the floor any numpy-based runtime pays), in ms. Both read
    compiled bytecode, as after a ``pip install`` (which compiles it): an unmeasured first run
    writes it, even where PYTHONDONTWRITEBYTECODE is set for this shell."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def median_ms(args: list[str]) -> float:
        subprocess.run([sys.executable, *args], check=True, env=env)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *args], check=True, env=env)
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3
    return median_ms(["-c", COLD_SCRIPT, bundle]), median_ms(["-c", "import numpy"])


# Before each block: the process is quiet (its threads used under QUIET_CPU of CPU time in a
# QUIET_STEP-second sleep), at most QUIET_MAX seconds. ONNX Runtime's workers keep spinning for
# about 0.1 s after its last run; on 2 cores they took a core from the next block's engine:
# measured on mobilenet_v2 at 2 threads, mlcpack's runs in the first 0.1 s of its blocks had a
# median of 11-14 ms against 6.5 ms later in the block (ORT's, after mlcpack's workers, which
# sleep within about 0.5 ms: no change).
QUIET_STEP, QUIET_CPU, QUIET_MAX = 0.01, 0.002, 1.0


def wait_quiet() -> None:
    """Sleep until no thread of this process is busy (see QUIET_STEP)."""
    deadline = time.perf_counter() + QUIET_MAX
    while time.perf_counter() < deadline:
        cpu = time.process_time()
        time.sleep(QUIET_STEP)
        if time.process_time() - cpu < QUIET_CPU:
            return


def time_interleaved(fns: list, budget_s: float, block_s: float = 0.2, min_runs: int = 5,
                     clock=time.perf_counter) -> list[tuple[float, float, int]]:
    """Run each of ``fns`` in turn for a block of ``block_s`` seconds, block after block, until
    ``budget_s`` of timed blocks (for all together) have passed; (median µs, min µs, runs) for
    each. Each block starts once the process is quiet (``wait_quiet``: the other engine's
    threads have stopped spinning), and its first run is not counted: it pays for the switch
    (caches, waking the engine's workers). ``clock`` times each run (the wall clock; with
    ``time.process_time``, the CPU seconds of every thread of the process: on a loaded host the
    time an engine waits descheduled is not counted, so at 1 thread it is the runs' own work);
    the blocks are measured on the wall clock either way."""
    times: list[list[float]] = [[] for _ in fns]
    timed = 0.0
    while min(len(t) for t in times) < min_runs or timed < budget_s:
        for fn, t in zip(fns, times):
            wait_quiet()
            fn()
            start = time.perf_counter()
            block_end = start + block_s
            while True:
                c0 = clock()
                fn()
                t.append(clock() - c0)
                t1 = time.perf_counter()
                if t1 >= block_end:
                    break
            timed += t1 - start
    return [(float(np.median(t)) * 1e6, float(np.min(t)) * 1e6, len(t)) for t in times]


def run_model(name: str, budget: float) -> dict:
    import onnxruntime as ort

    sys.path.insert(0, HERE)
    import peers
    from mlcpack.packager.export import export_module
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.runtime import load
    from mlcpack.runtime.bench import time_runs

    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, f"{name}.onnx")
    if not os.path.exists(path):
        sys.path.insert(0, HERE)
        from models import build
        build(name, path)
    flops = onnx_flops(path)
    result: dict = {"model": name, "gflop": flops / 1e9, "rows": []}

    # ONNX Runtime sessions (1 and 2 intra-op threads), then the mlcpack export and models.
    x = None
    sessions, ort_rows = {}, {}
    for threads in (1, 2):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        t0 = time.perf_counter()
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        load_ms = (time.perf_counter() - t0) * 1e3
        inp = sess.get_inputs()[0]
        if x is None:
            x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
        t0 = time.perf_counter()
        ref = sess.run(None, {inp.name: x})[0]
        first_ms = (time.perf_counter() - t0) * 1e3
        sessions[threads] = (sess, inp.name)
        ort_rows[threads] = {"engine": f"ort t{threads}", "load_ms": load_ms,
                             "first_ms": first_ms}
        if threads == 1:
            expected = ref

    bundle = os.path.join(CACHE, f"{name}.mlc")
    t0 = time.perf_counter()
    try:
        mod, _ = import_onnx(path)
        export_module(mod, bundle)
    except Exception as exc:  # an unsupported model is a row, not a crash
        for threads in (1, 2):
            sess, in_name = sessions[threads]
            med, best, n = time_runs(lambda sess=sess, in_name=in_name: sess.run(None, {in_name: x}),
                                     budget_s=budget)
            result["rows"].append({**ort_rows[threads], "median_us": med, "min_us": best,
                                   "runs": n})
        result["unsupported"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return result
    result["export_s"] = time.perf_counter() - t0
    result["cold_ms"], result["numpy_import_ms"] = cold_start_ms(bundle)

    # Each thread count: ORT and mlcpack alternate in short blocks, so both see the same
    # machine load (on a shared machine, separate timing windows differ by more than the
    # engines do); the ratio of the medians is reported.
    for threads in (1, 2):
        t0 = time.perf_counter()
        model = load(bundle, threads=threads)
        load_ms = (time.perf_counter() - t0) * 1e3
        feeds = {model.inputs[0].name: x}
        t0 = time.perf_counter()
        got = next(iter(model.run(feeds).values()))
        first_ms = (time.perf_counter() - t0) * 1e3
        err = float(np.max(np.abs(got - expected)) / (np.max(np.abs(expected)) + 1e-12))
        sess, in_name = sessions[threads]
        ov = peers.openvino_engines(path, {in_name: x}, threads)
        ov_rows = []
        for e in ov:
            t0 = time.perf_counter()
            e.run()
            first = (time.perf_counter() - t0) * 1e3
            got_ov = e.outputs()[0]
            ov_rows.append({"engine": f"{e.label} t{threads}", "load_ms": e.compile_s * 1e3,
                            "first_ms": first, "fp32": e.fp32, "notes": e.notes,
                            "max_rel_err": float(np.max(np.abs(got_ov - expected))
                                                 / (np.max(np.abs(expected)) + 1e-12))})
        timed = time_interleaved([lambda sess=sess, in_name=in_name: sess.run(None, {in_name: x})]
                                 + [e.run for e in ov]
                                 + [lambda model=model, feeds=feeds: model.run(feeds)], budget)
        (o_med, o_min, n), (m_med, m_min, _) = timed[0], timed[-1]
        model.close()
        result["rows"].append({**ort_rows[threads], "median_us": o_med, "min_us": o_min,
                               "runs": n})
        for row, (med, best, runs) in zip(ov_rows, timed[1:-1]):
            result["rows"].append({**row, "median_us": med, "min_us": best, "runs": runs})
        result["rows"].append({"engine": f"mlcpack t{threads}", "load_ms": load_ms,
                               "first_ms": first_ms, "median_us": m_med, "min_us": m_min,
                               "runs": n, "max_rel_err": err})

    # numpy, for the MLP: the same two matmuls with the ONNX file's weights.
    if name.startswith("mlp"):
        import onnx
        from onnx import numpy_helper
        w = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
        mats = [v for v in w.values() if v.ndim == 2]
        biases = [v for v in w.values() if v.ndim == 1]

        def numpy_mlp() -> np.ndarray:
            h = np.maximum(x @ mats[0].T + biases[0], 0)
            return h @ mats[1].T + biases[1]

        numpy_mlp()
        med, best, n = time_runs(numpy_mlp, budget_s=budget)
        result["rows"].append({"engine": "numpy", "load_ms": 0.0, "first_ms": 0.0,
                               "median_us": med, "min_us": best, "runs": n})
    return result


def print_result(r: dict) -> None:
    print(f"\n== {r['model']}  ({r['gflop']:.3f} GFLOP per inference"
          + (f", mlcpack export {r['export_s']:.1f} s" if "export_s" in r else "") + ")")
    print(f"{'engine':<20} {'load ms':>9} {'first ms':>9} {'median µs':>11} {'min µs':>10} "
          f"{'GFLOP/s':>8} {'runs':>6}")
    for row in r["rows"]:
        gfs = r["gflop"] * 1e9 / (row["median_us"] * 1e-6) / 1e9
        print(f"{row['engine']:<20} {row['load_ms']:>9.2f} {row['first_ms']:>9.2f} "
              f"{row['median_us']:>11.1f} {row['min_us']:>10.1f} {gfs:>8.1f} {row['runs']:>6}")
    if "unsupported" in r:
        print(f"mlcpack: unsupported: {r['unsupported']}")
        return
    by = {row["engine"]: row for row in r["rows"]}
    for t in (1, 2):
        m, o = by[f"mlcpack t{t}"], by[f"ort t{t}"]
        best = best_peer(r, t)
        print(f"ratio mlcpack/ORT, {t} thread{'s' if t > 1 else ''}: median "
              f"{m['median_us'] / o['median_us']:.2f}, min {m['min_us'] / o['min_us']:.2f}; "
              f"mlcpack/best fp32 peer ({best['engine']}): median "
              f"{m['median_us'] / best['median_us']:.2f}, min "
              f"{m['min_us'] / min(p['min_us'] for p in fp32_peers(r, t)):.2f}")
    for note in sorted({n for row in r["rows"] for n in row.get("notes", [])}):
        print(f"note: {note}")
    if not any(row["engine"].startswith("OV") for row in r["rows"]):
        print("note: OpenVINO not installed: timing ONNX Runtime only (pip install -e '.[bench]')")
    if "cold_ms" in r:
        print(f"cold start (process start to first result): {r['cold_ms']:.1f} ms; "
              f"'python -c \"import numpy\"': {r['numpy_import_ms']:.1f} ms; "
              f"difference {r['cold_ms'] - r['numpy_import_ms']:.1f} ms")
    print(f"mlcpack 2 threads speed-up: {by['mlcpack t1']['median_us'] / by['mlcpack t2']['median_us']:.2f}x;"
          f" max relative error vs ORT {by['mlcpack t1']['max_rel_err']:.1e}")


def fp32_peers(r: dict, threads: int) -> list[dict]:
    """The fp32 peer rows (ORT, OV f32) at ``threads``."""
    return [row for row in r["rows"] if row["engine"].endswith(f" t{threads}")
            and not row["engine"].startswith("mlcpack") and row.get("fp32", True)
            and row["engine"] != "numpy"]


def best_peer(r: dict, threads: int) -> dict:
    """The fastest fp32 peer's row (by median) at ``threads``."""
    return min(fp32_peers(r, threads), key=lambda row: row["median_us"])


def markdown(results: list[dict]) -> str:
    lines = ["| model | GFLOP | engine | load ms | first ms | median µs | min µs | GFLOP/s "
             "| ratio vs ORT (median) | vs best fp32 peer |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        by = {row["engine"]: row for row in r["rows"]}
        for row in r["rows"]:
            gfs = r["gflop"] * 1e6 / row["median_us"]
            t = row["engine"][-1]
            ratio = best = ""
            if row["engine"].startswith("mlcpack"):
                ratio = f"{row['median_us'] / by['ort t' + t]['median_us']:.2f}"
                peer = best_peer(r, int(t))
                best = f"{row['median_us'] / peer['median_us']:.2f} ({peer['engine']})"
            lines.append(f"| {r['model']} | {r['gflop']:.3f} | {row['engine']} | "
                         f"{row['load_ms']:.1f} | {row['first_ms']:.2f} | {row['median_us']:.1f} | "
                         f"{row['min_us']:.1f} | {gfs:.1f} | {ratio} | {best} |")
        if "unsupported" in r:
            lines.append(f"| {r['model']} | {r['gflop']:.3f} | mlcpack | unsupported: "
                         f"{r['unsupported']} | | | | | | |")
        elif "export_s" in r:
            lines.append(f"| {r['model']} | | mlcpack export | {r['export_s']:.1f} s | | | | | | |")
            if "cold_ms" in r:
                lines.append(f"| {r['model']} | | mlcpack cold start | | "
                             f"{r['cold_ms']:.1f} (numpy import {r['numpy_import_ms']:.1f}) "
                             "| | | | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(ALL))
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timed runs per row")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if len(args.models) == 1 and args.json_out:
        r = run_model(args.models[0], args.budget)
        with open(args.json_out, "w") as f:
            json.dump(r, f)
        return
    results = []
    for name in args.models:
        out = os.path.join(CACHE, f"{name}.json")
        os.makedirs(CACHE, exist_ok=True)
        proc = subprocess.run([sys.executable, __file__, name, "--budget", str(args.budget),
                               "--json-out", out])
        if proc.returncode != 0:
            print(f"\n== {name}: failed (exit {proc.returncode})")
            continue
        with open(out) as f:
            r = json.load(f)
        print_result(r)
        sys.stdout.flush()
        results.append(r)
    if args.markdown:
        print("\n" + markdown(results))


if __name__ == "__main__":
    main()
