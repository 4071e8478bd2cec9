"""Calibration methods of ``--quantize int8`` compared on real corpus models.

    .venv/bin/python bench/calibration.py [--calibrate 16] [--held-out 16]
                                          [--methods percentile] [--guard on,off] [model ...]

For each model (default: ppocr_cls, pp_lcnet_orientation, ppocr_rec from bench/corpus.py) and
each method of packager/calibrate.py (minmax, percentile, entropy): quantize_onnx calibrates on
``--calibrate`` realistic inputs (bench/corpus.py's synthetic text lines / pages, one seed),
and the QDQ model it builds is run with ONNX Runtime, graph optimizations off (the QDQ
semantics exactly as ONNX defines them: the calibration's effect, not any kernel's), beside the
float model on ``--held-out`` other inputs. Printed per model and method: layers kept int8,
output SNR against float (all held-out values together, and the worst input), and argmax
agreement along the last axis (the class; for the recognizer, the CTC symbol at every step);
with the accuracy guard on (quantize_onnx's default: the most sensitive layers kept float until
the calibration data's outputs meet its targets) and off.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = {   # name -> (realistic-input kind, input shape)
    "ppocr_cls": ("text_paddle", (1, 3, 48, 192)),
    "pp_lcnet_orientation": ("document_imagenet", (1, 3, 224, 224)),
    "ppocr_rec": ("text_paddle", (1, 3, 48, 320)),
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


def main() -> None:
    import corpus
    import onnxruntime as ort

    from mlcpack.packager.calibrate import METHODS, quantize_onnx

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--calibrate", type=int, default=16)
    ap.add_argument("--held-out", type=int, default=16)
    ap.add_argument("--max-layer-error", type=float, default=None,
                    help="quantize_onnx's limit (default its own, 5 %%; 1e9: every layer int8)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--guard", default="on,off",
                    help="the accuracy guard of quantize_onnx: on, off or both (on,off)")
    args = ap.parse_args()
    print(f"onnxruntime {ort.__version__}; QDQ models run with graph optimizations off")
    for name in args.models:
        kind, shape = MODELS[name]
        path = corpus.model_path(name)
        rng = np.random.default_rng(0)
        calib = [corpus.realistic_input(kind, shape, rng) for _ in range(args.calibrate)]
        held = [corpus.realistic_input(kind, shape, rng) for _ in range(args.held_out)]
        fsess = _session(path, ort)
        in_name = fsess.get_inputs()[0].name
        out_name = fsess.get_outputs()[0].name
        refs = [fsess.run([out_name], {in_name: x})[0] for x in held]
        print(f"\n{name} ({path.name}), input {shape}, {len(calib)} calibration / "
              f"{len(held)} held-out inputs, output {out_name!r} {refs[0].shape}")
        print(f"  {'method':<11} {'guard':>5} {'int8 layers':>11} {'SNR all':>8} "
              f"{'SNR worst':>9} {'argmax':>7} {'calibrate s':>11}")
        runs = [(m, g) for m in args.methods.split(",") for g in args.guard.split(",")]
        for method, guard in runs:
            t = time.perf_counter()
            limit = {} if args.max_layer_error is None else {"max_layer_error":
                                                             args.max_layer_error}
            q = quantize_onnx(path, calib, {in_name: shape}, method, guard=guard == "on",
                              **limit)
            secs = time.perf_counter() - t
            try:
                qsess = _session(q.model.SerializeToString(), ort)
                gots = [qsess.run([out_name], {in_name: x})[0] for x in held]
            finally:
                q.close()
            ref = np.concatenate([r.ravel() for r in refs])
            got = np.concatenate([g.ravel() for g in gots])
            worst = min(_snr(r, g) for r, g in zip(refs, gots))
            agree = np.mean(np.concatenate([(r.argmax(-1) == g.argmax(-1)).ravel()
                                            for r, g in zip(refs, gots)]))
            kept = sum(layer.quantized for layer in q.report.layers)
            print(f"  {method:<11} {guard:>5} {kept:>5} of {len(q.report.layers):<3} "
                  f"{_snr(ref, got):>7.1f} "
                  f"{worst:>9.1f} {agree:>7.1%} {secs:>11.1f}", flush=True)


if __name__ == "__main__":
    main()
