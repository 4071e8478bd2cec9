"""Quantized copies of real models, made as a new user makes them, through the default export.

Run: .venv/bin/python bench/quant_sweep.py [MODEL ...] [--variants qdq_pt,qdq_pc,...]
     [--budget 4] [--results bench/.cache/quant_sweep/results.json] [--table]

For each corpus model (bench/corpus.py; default: ppocr_cls, pp_lcnet_orientation,
mobilenet_v3_small, ppocr_det, ppocr_rec, yolov8n_320, deit_tiny) the ONNX file as shipped (its
open dims kept) goes through ``onnxruntime.quantization``'s documented path: ``quant_pre_process``
then

- ``qdq_pt``: ``quantize_static`` QDQ, per tensor;
- ``qdq_pc``: QDQ, per channel;
- ``qdq_rr``: QDQ, per channel, ``reduce_range=True``;
- ``qop``: QOperator format (QLinearConv / QLinearMatMul / QLinearAdd ...), per channel;
- ``dyn``: ``quantize_dynamic`` (DynamicQuantizeLinear, MatMulInteger / ConvInteger);
- ``V@fixed`` (not in the default list): variant V exported with the corpus's ``--input-shape``
  (the dims fixed: the integer kernels need static shapes), for comparison;

uint8 activations, int8 weights, calibrated on 8 of the corpus's realistic inputs (seeded). Besides
them ``ours``: ``mlcpack export FP32 --quantize int8 --calibration DIR`` (the same 8 inputs as
``.npy`` files). Every quantized file is exported with the default command (``mlcpack export Q -o
Q.mlc``: golden check on, the file's dims as they are); the table gives whether it exported (or
the one-line error), its SNR and argmax agreement (last axis) against ONNX Runtime's run of the
same quantized file (default session options) on 3 realistic inputs, and its speed (1 thread, batch
1) against ORT running that file and against mlcpack's fp32 bundle: the three alternate in blocks
(bench.py ``time_interleaved``, wall median / min) and then run by turns for the CPU time
(``time.process_time``, median / min of 15 each). ``ours`` is timed against ORT running
the float model (ORT has no file of it to run). Results are kept in ``--results`` (one entry per
model and variant, reused unless ``--redo``), so the sweep resumes after an interruption;
``--table`` prints the markdown table from them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MLCPACK = Path(sys.executable).parent / "mlcpack"
DEFAULT_MODELS = ("ppocr_cls", "pp_lcnet_orientation", "mobilenet_v3_small", "ppocr_det",
                  "ppocr_rec", "yolov8n_320", "deit_tiny")
VARIANTS = ("qdq_pt", "qdq_pc", "qdq_rr", "qop", "dyn", "ours")


def calibration_feeds(name: str, n: int = 8, seed: int = 100) -> list[dict[str, np.ndarray]]:
    """``n`` seeded realistic inputs at the corpus shape of model ``name``."""
    import corpus

    feeds = []
    for i in range(n):
        rng = np.random.default_rng(seed + i)
        feeds.append({k: corpus.realistic_input(kind, shape, rng)
                      for k, (shape, kind) in corpus.MODELS[name].inputs.items()})
    return feeds


def preprocessed(fp32: Path, folder: Path) -> Path:
    """ORT's recommended first step (``quant_pre_process``: shape inference and ORT's basic graph
    optimizations, which make Constant weights initializers; symbolic shape inference skipped
    where it fails on the file), after converting an opset < 13 file to 13: at opset 11
    ``quantize_static(per_channel=True)`` writes DequantizeLinear with an ``axis`` that ONNX
    Runtime and mlcpack both refuse to load."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = folder / "pre.onnx"
    if pre.exists():
        return pre
    model = onnx.load(str(fp32))
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
        src = folder / "opset13.onnx"
        onnx.save(version_converter.convert_version(model, 13), src)
        fp32 = src
    here = os.getcwd()
    os.chdir(folder)   # ORT's symbolic shape inference leaves files in the working directory
    try:
        quant_pre_process(str(fp32), str(pre))
    except Exception:  # noqa: BLE001 -- ORT's symbolic shape inference gives up on some graphs
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    finally:
        os.chdir(here)
    return pre


def make_variant(variant: str, name: str, fp32: Path, folder: Path) -> Path:
    """The quantized ONNX file of ``variant`` (made once, kept in ``folder``)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)

    out = folder / f"{variant}.onnx"
    if out.exists():
        return out
    pre = preprocessed(fp32, folder)
    if variant == "dyn":
        quantize_dynamic(str(pre), str(out), weight_type=QuantType.QInt8)
        return out
    feeds = calibration_feeds(name)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    fmt = QuantFormat.QOperator if variant == "qop" else QuantFormat.QDQ
    quantize_static(str(pre), str(out), Reader(), quant_format=fmt,
                    per_channel=variant != "qdq_pt", reduce_range=variant == "qdq_rr",
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def run_export(args: list[str], log: Path) -> tuple[int, str, float]:
    """(exit code, the one-line error or the golden check's line, wall seconds) of ``mlcpack
    export ARGS``; the whole output goes to ``log``."""
    start = time.perf_counter()
    proc = subprocess.run([str(MLCPACK), "export", *args], capture_output=True, text=True,
                          timeout=3600)
    wall = time.perf_counter() - start
    log.write_text(proc.stdout + "\n---- stderr ----\n" + proc.stderr)
    lines = (proc.stdout + "\n" + proc.stderr).splitlines()
    if proc.returncode:
        msg = next((x for x in reversed(lines) if x.startswith("error")), lines[-1] if lines
                   else "")
    else:
        msg = next((x.strip() for x in lines if "golden check" in x), "")
        speed = next((x.strip() for x in lines if x.strip().startswith("speed")), "")
        msg = f"{msg} | {speed}" if speed else msg
    return proc.returncode, msg, wall


def compare(got: dict[str, np.ndarray], ref: list[np.ndarray], names: list[str]) -> dict:
    """Worst SNR (dB) over the outputs and argmax agreement over the last axis (outputs whose
    last axis has 2 or more entries)."""
    snrs, agree = [], []
    for n, r in zip(names, ref):
        g = np.asarray(got[n], np.float64).reshape(r.shape)
        r = r.astype(np.float64)
        err = float(np.sum((g - r) ** 2))
        snrs.append(float("inf") if err == 0 else 10 * np.log10(np.sum(r ** 2) / err))
        if r.ndim and r.shape[-1] > 1:
            agree.append(np.mean(g.argmax(-1) == r.argmax(-1)))
    return {"snr": min(snrs), "argmax": float(np.mean(agree)) if agree else None}


def cpu_times(fns: list, rounds: int = 15) -> list[tuple[float, float]]:
    """(median, min) CPU seconds of one run of each of ``fns``, the functions taking turns."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(rounds):
        for fn, t in zip(fns, times):
            c0 = time.process_time()
            fn()
            t.append(time.process_time() - c0)
    return [(float(np.median(t)), float(np.min(t))) for t in times]


def ort_session(path: Path, optimize: bool = True):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def accuracy(bundle, sess, feeds: list[dict]) -> dict:
    names = [o.name for o in sess.get_outputs()]
    accs = [compare(bundle.run(feed), sess.run(None, feed), names) for feed in feeds]
    return {"snr": min(a["snr"] for a in accs),
            "argmax": (None if accs[0]["argmax"] is None
                       else float(np.mean([a["argmax"] for a in accs])))}


class _OrtAsBundle:
    """An ORT session with the bundle's ``run`` (name -> array), to compare ORT with ORT."""

    def __init__(self, sess) -> None:
        self.sess = sess

    def run(self, feed: dict) -> dict:
        names = [o.name for o in self.sess.get_outputs()]
        return dict(zip(names, self.sess.run(None, feed)))


def exact_session(qfile: Path):
    """ORT with graph optimizations off on ``qfile`` as ONNX defines it: int8 weights of u8 x s8
    integer operators stored as uint8 (``frontends/onnx/exact_reference.py``; ORT's u8 x s8
    kernel saturates on AVX2 without VNNI), the golden check's reference."""
    import onnx

    from mlcpack.frontends.onnx.exact_reference import exact_integer_copy

    model = onnx.load(str(qfile))
    exact = exact_integer_copy(model)
    if exact is None:
        return ort_session(qfile, optimize=False)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(exact.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def accuracies(bundle, qfile: Path, fp32: Path, feeds: list[dict]) -> dict:
    """``bundle`` against ORT on ``qfile`` (default options; as written, exactly) and against the
    float model, and ORT's run of ``qfile`` against the float model."""
    sess = ort_session(qfile)
    float_sess = ort_session(fp32)
    return {"ort": accuracy(bundle, sess, feeds),
            "ort_noopt": accuracy(bundle, exact_session(qfile), feeds),
            "fp32": accuracy(bundle, float_sess, feeds),
            "ort_vs_fp32": accuracy(_OrtAsBundle(sess), float_sess, feeds)}


def reaccuracy(name: str, variants: list[str], root: Path, results: dict, save) -> None:
    """Recompute the accuracy columns of the rows that exported (no export, no timing)."""
    import corpus

    from mlcpack.runtime import load

    fp32 = corpus.model_path(name)
    for variant in variants:
        r = results.get(f"{name}/{variant}")
        if not r or r["rc"]:
            continue
        base = variant.partition("@")[0]
        qfile = fp32 if variant == "ours" else root / name / f"{base}.onnx"
        with load(root / name / f"{variant}.mlc", threads=1) as q:
            r.update(accuracies(q, qfile, fp32, eval_feeds(name)))
        save()


def profile_top(bundle: Path, shapes: list[str], top: int = 10) -> list[list]:
    """The ``top`` kernels of ``mlcpack bench --profile`` at ``shapes`` (``--shape`` values),
    ranked by their least time (the mean is noise on a loaded host): [name, kind (``mlcpack
    inspect``: "generic loop nest", "contraction", "GEMM integer" ...), min µs, share of the
    sum of the mins]."""
    def cli(*args: str) -> dict:
        out = subprocess.run([str(MLCPACK), *args, "--json"], capture_output=True, text=True,
                             check=True, timeout=600).stdout
        return json.loads(out)

    kinds = {k["symbol"]: k["kernel"] for k in cli("inspect", str(bundle))["kernels"]}
    shape_args = [a for s in shapes for a in ("--shape", s)]
    rows = [k for k in cli("bench", str(bundle), "--profile", "--top", "0", "--budget", "1",
                           *shape_args)["kernels"] if k["kind"] == "kernel"]
    total = sum(k["min_us"] for k in rows) or 1.0
    rows.sort(key=lambda k: -k["min_us"])
    return [[k["name"], kinds.get(k["kernel"], "?"), k["min_us"], k["min_us"] / total]
            for k in rows[:top]]


def profile_rows(name: str, variants: list[str], root: Path, results: dict, save) -> None:
    """``profile_top`` of every kept bundle of ``name`` (the fp32 one too), kept as "top"."""
    import corpus

    shapes = corpus.MODELS[name].input_shape_args()
    for variant in ["fp32", *variants]:
        r = results.get(f"{name}/{variant}")
        if not r or r["rc"]:
            continue
        r["top"] = profile_top(root / name / f"{variant}.mlc", shapes)
        save()
        generic = [f"{n} ({share:.0%})" for n, kind, _, share in r["top"]
                   if kind == "generic loop nest"]
        print(f"{name}/{variant}: generic loop nests in the top 10: "
              f"{', '.join(generic) or 'none'}", flush=True)


def eval_feeds(name: str) -> list[dict]:
    """The corpus's realistic input of ``name`` and two more (seeds apart from calibration)."""
    import corpus

    return [dict(corpus.realistic_inputs(name)), *calibration_feeds(name, n=2, seed=900)]


def measure(qfile: Path, fp32: Path, qbundle: Path, f32bundle: Path, feeds: list[dict],
            budget: float) -> dict:
    """Accuracy of ``qbundle`` against ORT on ``qfile`` (default options, and graph
    optimizations off: the QDQ semantics as written) and on the float model, and the speed of
    mlcpack int8, ORT on ``qfile`` and mlcpack fp32."""
    from bench import time_interleaved

    from mlcpack.runtime import load

    sess = ort_session(qfile)
    q = load(qbundle, threads=1)
    f = load(f32bundle, threads=1)
    try:
        acc = accuracies(q, qfile, fp32, feeds)
        feed = feeds[0]
        fns = [lambda: q.run(feed), lambda: sess.run(None, feed), lambda: f.run(feed)]
        wall = time_interleaved(fns, budget)
        cpu = cpu_times(fns)
    finally:
        q.close()
        f.close()
    return {**acc, "wall_ms": [[m / 1e3, mn / 1e3] for m, mn, _ in wall],
            "cpu_ms": [[m * 1e3, mn * 1e3] for m, mn in cpu]}


def sweep_model(name: str, variants: list[str], root: Path, results: dict, budget: float,
                save) -> None:
    import corpus

    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = corpus.model_path(name)
    f32bundle = folder / "fp32.mlc"
    key = f"{name}/fp32"
    if key not in results or not f32bundle.exists():
        rc, msg, wall = run_export([str(fp32), "-o", str(f32bundle)], folder / "fp32.log")
        results[key] = {"rc": rc, "msg": msg, "export_s": wall}
        save()
    if results[key]["rc"]:
        print(f"{name}: the fp32 export fails: {results[key]['msg']}")
        return
    feeds = eval_feeds(name)
    for variant in variants:
        key = f"{name}/{variant}"
        if key in results:
            continue
        entry: dict = {}
        try:
            if variant == "ours":
                calib = folder / "calibration"
                calib.mkdir(exist_ok=True)
                for i, feed in enumerate(calibration_feeds(name)):
                    np.save(calib / f"{i}.npy", next(iter(feed.values())))
                qfile = fp32
                args = [str(fp32), "--quantize", "int8", "--calibration", str(calib)]
            else:   # "qdq_pc@fixed": the same file exported with the corpus's --input-shape
                base, _, fixed = variant.partition("@")
                qfile = make_variant(base, name, fp32, folder)
                args = [str(qfile)]
                for shape in corpus.MODELS[name].input_shape_args() if fixed else ():
                    args += ["--input-shape", shape]
        except Exception as e:  # noqa: BLE001 -- ORT's quantizer failing is a row of the table
            entry = {"rc": -1, "msg": f"onnxruntime.quantization: {type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}"[:200]}
            results[key] = entry
            save()
            print(f"{key}: {entry['msg']}")
            continue
        qbundle = folder / f"{variant}.mlc"
        rc, msg, wall = run_export([*args, "-o", str(qbundle)], folder / f"{variant}.log")
        entry = {"rc": rc, "msg": msg, "export_s": wall}
        print(f"{key}: exit {rc} in {wall:.0f} s: {msg}", flush=True)
        if rc == 0:
            entry.update(measure(qfile, fp32, qbundle, f32bundle, feeds, budget))
            print(f"  {json.dumps({k: entry[k] for k in ('ort', 'ort_noopt', 'fp32', 'cpu_ms')})}",
                  flush=True)
        results[key] = entry
        save()


def _acc(a: dict) -> str:
    snr = "equal" if a["snr"] == float("inf") else f"{a['snr']:.1f} dB"
    return snr if a["argmax"] is None else f"{snr}, {a['argmax']:.0%}"


def table(results: dict, models: list[str], variants: list[str]) -> str:
    """The markdown table of ``results``."""
    rows = ["| model | variant | default export | vs ORT, same file: optimized / as written "
            "(SNR, argmax) | vs float: mlcpack / ORT | CPU ms median / min: mlcpack int8 | "
            "ORT same file | mlcpack fp32 | int8 / ORT | int8 / our fp32 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in models:
        for variant in variants:
            r = results.get(f"{name}/{variant}")
            if r is None:
                continue
            if r["rc"]:
                rows.append(f"| {name} | {variant} | **fails**: {r['msg']} | | | | | | | |")
                continue
            (qm, qn), (om, on), (fm, fn) = r["cpu_ms"]
            peer = " (fp32)" if variant == "ours" else ""
            rows.append(
                f"| {name} | {variant} | exports ({r['export_s']:.0f} s) | {_acc(r['ort'])} / "
                f"{_acc(r['ort_noopt'])} | {_acc(r['fp32'])} / {_acc(r['ort_vs_fp32'])} | "
                f"{qm:.2f} / {qn:.2f} | {om:.2f} / {on:.2f}{peer} | {fm:.2f} / {fn:.2f} | "
                f"{qm / om:.2f} | {qm / fm:.2f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--budget", type=float, default=4.0, help="seconds of wall timing per row")
    ap.add_argument("--root", type=Path, default=HERE / ".cache" / "quant_sweep")
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--redo", action="store_true", help="forget the kept results of these rows")
    ap.add_argument("--profile", action="store_true",
                    help="per-kernel profile of the kept bundles: the top 10 and their kinds")
    ap.add_argument("--reaccuracy", action="store_true",
                    help="recompute the accuracy columns of the kept rows (no export, no timing)")
    ap.add_argument("--table", action="store_true",
                    help="only print the table of the kept results (every results*.json in --root)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    path = args.results or args.root / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}

    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        os.replace(tmp, path)

    if args.table:   # every results file in the folder (sweeps run side by side keep their own;
        # a later file by name wins: a rerun of rows kept apart)
        for other in sorted(args.root.glob("results*.json")):
            results = {**results, **json.loads(other.read_text())}
    else:
        if args.redo:
            for m in args.models:
                for v in [*variants, "fp32"]:
                    results.pop(f"{m}/{v}", None)
        for name in args.models:
            if args.reaccuracy:
                reaccuracy(name, variants, args.root, results, save)
            elif args.profile:
                profile_rows(name, variants, args.root, results, save)
            else:
                sweep_model(name, variants, args.root, results, args.budget, save)
    print(table(results, args.models, variants))


if __name__ == "__main__":
    main()
