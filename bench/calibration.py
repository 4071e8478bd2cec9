"""Calibration methods of ``--quantize int8`` compared on real corpus models, against ground
truth where the inputs have one.

    .venv/bin/python bench/calibration.py [--calibrate 16] [--held-out 200]
        [--methods percentile,minmax,entropy] [--guard on,off] [--speed] [model ...]

Models (bench/corpus.py): ``ppocr_rec`` (PP-OCRv4 recognizer) on labelled text lines drawn
with Pillow (bench/text_lines.py: letters, digits, punctuation, DejaVu fonts, blur, noise;
and a digits-only set), ``ppocr_cls`` (PP-OCR text-direction classifier) on the same kind of
lines, half turned 180 degrees (label: the turn), ``pp_lcnet_orientation`` on
bench/corpus.py's synthetic pages (no labels). Calibration and held-out inputs come from
different seeds (disjoint). For each method and guard setting, ``quantize_onnx`` (the code
``--quantize int8`` runs) calibrates on the calibration inputs, and the QDQ model it builds is
run by ONNX Runtime with graph optimizations off (the QDQ semantics exactly as ONNX defines
them: the calibration's effect, not any kernel's) beside the float model on the held-out
inputs. Printed: layers kept int8, output SNR against float (all held-out values; the worst
input), argmax agreement with float along the last axis (the class; the recognizer's CTC
symbol at each of 40 steps), and the accuracy against ground truth of float and int8 (the
recognizer: 1 - character error rate, decoded greedily with the model's own dictionary, on
mixed lines and on digits-only lines; the classifier: the share of lines classified right).

``--speed``: also exports the model at its fixed input shape with the default command
(``--quantize int8 --calibration`` the calibration inputs, golden check on) and without
``--quantize``, and times both bundles (1 thread, alternating, 40 runs: medians and mins).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = {   # name -> (input kind, input shape)
    "ppocr_rec": ("text_line", (1, 3, 48, 320)),
    "ppocr_cls": ("oriented_line", (1, 3, 48, 192)),
    "pp_lcnet_orientation": ("document_imagenet", (1, 3, 224, 224)),
}


def _session(model, ort):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    data = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - ref) ** 2))
    return 10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise) if noise else np.inf


def _inputs(kind: str, shape, n: int, seed: int, digits: bool = False) -> list:
    """[(x, label or None)] * n."""
    import corpus
    import text_lines

    rng = np.random.default_rng(seed)
    if kind == "text_line":
        return [text_lines.text_line(rng, digits) for _ in range(n)]
    if kind == "oriented_line":
        return [text_lines.oriented_line(rng) for _ in range(n)]
    return [(corpus.realistic_input(kind, shape, rng), None) for _ in range(n)]


def _accuracy(kind: str, outs: list[np.ndarray], labels: list, chars) -> float | None:
    import text_lines

    if kind == "text_line":
        errors = sum(text_lines.edit_distance(text_lines.ctc_decode(o, chars), t)
                     for o, t in zip(outs, labels))
        return 1 - errors / sum(len(t) for t in labels)
    if kind == "oriented_line":
        return float(np.mean([int(np.argmax(o)) == t for o, t in zip(outs, labels)]))
    return None


def _timed(bundles: dict[str, Path], x: np.ndarray, runs: int = 40) -> dict[str, list[float]]:
    from mlcpack.runtime import load

    times: dict[str, list[float]] = {k: [] for k in bundles}
    models = {k: load(p, threads=1) for k, p in bundles.items()}
    try:
        name = models[next(iter(models))].inputs[0].name
        for m in models.values():
            m.run({name: x})   # warm
        for _ in range(runs):
            for k, m in models.items():
                t = time.perf_counter()
                m.run({name: x})
                times[k].append(time.perf_counter() - t)
    finally:
        for m in models.values():
            m.close()
    return times


def _speed(path: Path, in_name: str, shape, calib: list, workdir: Path) -> None:
    from mlcpack.packager import calibrate
    from mlcpack.packager.api import Options, export

    # the export refuses an int8 bundle slower than float (its own timing, printed): written
    # here whatever its speed, to be timed below
    calibrate.SLOWER_MARGIN = np.inf

    folder = workdir / "calibration"
    folder.mkdir()
    for i, (x, _) in enumerate(calib):
        np.save(folder / f"{i:03d}.npy", x)
    bundles = {"fp32": workdir / "fp32.mlc", "int8": workdir / "int8.mlc"}
    shapes = {in_name: list(shape)}
    for label, opts in (("fp32", Options(input_shapes=shapes, target="host")),
                        ("int8", Options(input_shapes=shapes, target="host", quantize="int8",
                                         calibration=folder))):
        t = time.perf_counter()
        report = export(path, bundles[label], opts)
        print(f"  export {label}: {time.perf_counter() - t:.0f} s", flush=True)
        for line in getattr(report, "notes", []) + getattr(report, "quantization", []):
            print("   ", line)
        if getattr(report, "check", None):
            print("    golden check:", report.check)
    times = _timed(bundles, calib[0][0])
    med = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    low = {k: 1e3 * float(np.min(v)) for k, v in times.items()}
    print(f"  speed (1 thread, alternating, {len(times['fp32'])} runs each): fp32 median "
          f"{med['fp32']:.2f} ms (min {low['fp32']:.2f}), int8 median {med['int8']:.2f} ms "
          f"(min {low['int8']:.2f}): int8 {med['fp32'] / med['int8']:.2f}x fp32", flush=True)


def main() -> None:
    import corpus
    import onnx
    import onnxruntime as ort

    from mlcpack.packager.calibrate import METHODS, quantize_onnx

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["ppocr_rec", "ppocr_cls"])
    ap.add_argument("--calibrate", type=int, default=16)
    ap.add_argument("--held-out", type=int, default=200)
    ap.add_argument("--max-layer-error", type=float, default=None,
                    help="quantize_onnx's limit (default its own, 5 %%; 1e9: every layer int8)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--guard", default="on,off",
                    help="the accuracy guard of quantize_onnx: on, off or both (on,off)")
    ap.add_argument("--speed", action="store_true",
                    help="also export fp32 and the default int8 bundle and time them")
    args = ap.parse_args()
    print(f"onnxruntime {ort.__version__}; QDQ models run with graph optimizations off")
    for name in args.models:
        kind, shape = MODELS[name]
        path = corpus.model_path(name)
        meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False)
                .metadata_props}
        chars = meta.get("character", "").split("\n")
        calib = _inputs(kind, shape, args.calibrate, seed=1000)
        sets = {"held-out": _inputs(kind, shape, args.held_out, seed=1)}
        if kind == "text_line":
            sets["digits"] = _inputs(kind, shape, args.held_out // 2, seed=2, digits=True)
        fsess = _session(path, ort)
        in_name = fsess.get_inputs()[0].name
        out_name = fsess.get_outputs()[0].name
        refs = {k: [fsess.run([out_name], {in_name: x})[0] for x, _ in v]
                for k, v in sets.items()}
        print(f"\n{name} ({path.name}), input {shape}, {len(calib)} calibration / "
              + " / ".join(f"{len(v)} {k}" for k, v in sets.items())
              + f" inputs, output {out_name!r} {refs['held-out'][0].shape}")
        fp32 = {k: _accuracy(kind, refs[k], [t for _, t in v], chars) for k, v in sets.items()}
        if fp32["held-out"] is not None:
            print("  fp32 accuracy: " + ", ".join(f"{k} {a:.2%}" for k, a in fp32.items()))
        print(f"  {'method':<11} {'guard':>5} {'int8 layers':>11} {'SNR all':>8} "
              f"{'SNR worst':>9} {'argmax':>7} {'accuracy (fp32)':>24} {'calibrate s':>11}")
        runs = [(m, g) for m in args.methods.split(",") for g in args.guard.split(",")]
        for method, guard in runs:
            t = time.perf_counter()
            limit = {} if args.max_layer_error is None else {"max_layer_error":
                                                             args.max_layer_error}
            q = quantize_onnx(path, [x for x, _ in calib], {in_name: shape}, method,
                              guard=guard == "on", **limit)
            secs = time.perf_counter() - t
            try:
                qsess = _session(q.model.SerializeToString(), ort)
                gots = {k: [qsess.run([out_name], {in_name: x})[0] for x, _ in v]
                        for k, v in sets.items()}
            finally:
                q.close()
            ref = np.concatenate([r.ravel() for r in refs["held-out"]])
            got = np.concatenate([g.ravel() for g in gots["held-out"]])
            worst = min(_snr(r, g) for r, g in zip(refs["held-out"], gots["held-out"]))
            agree = np.mean(np.concatenate([(r.argmax(-1) == g.argmax(-1)).ravel()
                                            for r, g in zip(refs["held-out"],
                                                            gots["held-out"])]))
            acc = {k: _accuracy(kind, gots[k], [t for _, t in v], chars)
                   for k, v in sets.items()}
            shown = " ".join(f"{acc[k]:.2%} ({fp32[k]:.2%})" for k in sets
                             if acc[k] is not None) or "-"
            kept = sum(layer.quantized for layer in q.report.layers)
            print(f"  {method:<11} {guard:>5} {kept:>5} of {len(q.report.layers):<3} "
                  f"{_snr(ref, got):>7.1f} {worst:>9.1f} {agree:>7.2%} {shown:>24} "
                  f"{secs:>11.1f}", flush=True)
            if q.report.guard:
                print("   ", q.report.guard.strip())
        if args.speed:
            with tempfile.TemporaryDirectory(prefix="mlcpack-calib-bench-") as tmp:
                _speed(path, in_name, shape, calib, Path(tmp))


if __name__ == "__main__":
    main()
