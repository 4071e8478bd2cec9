"""Static post-training int8 quantization at export (``mlcpack export --quantize int8
--calibration DATA``): the float ONNX model becomes a QDQ ONNX model, which the ordinary ONNX
import turns into the IR's ``quantize``/``dequantize`` around float operators (the form the
integer-kernel fusion matches, ``frontends/onnx/quant.py``).

1. Calibration. The float model is compiled once for this host with the activation inputs of
   every quantizable layer (Conv with constant weights, Gemm/MatMul with a constant right
   operand) as extra outputs, and run on the calibration samples with the runtime.
2. Ranges. Activations per tensor, asymmetric uint8, from the calibration ``percentile``
   (default: the 99.99th percentile of each side of every value of every sample, exact: each
   sample's tails are kept), ``minmax`` or ``entropy`` method (the clipping threshold of |x|
   minimizing the KL divergence of its histogram, TensorRT's). The default was measured on
   corpus models against ground truth (``bench/calibration.py``, docs/quantization.md).
   Weights per output channel, symmetric int8 (zero point 0, scale max|w| / 127); a
   convolution's (groups 1) 7-bit (scale max|w| / 64, ONNX Runtime's ``reduce_range``) where
   no target of the export has an int8 dot instruction (``conv_weight_qmax``): every one then
   runs the exact ``vpmaddubsw`` quad kernel (passes/quad_weights.py), faster than fp32; biases
   int32 at scale x_scale * w_scale. The model may keep its weights in ``Constant`` nodes
   (Paddle) and have symbolic dims (each sample runs at its own size); an opset below 13 is
   converted to 13 (per-channel DequantizeLinear).
3. Layers left in float. A convolution the integer kernels would run slower than the fp32
   kernels on the export's targets (``passes/int8_cost.py``: no int8 dot instruction, and
   fp32 runs it as Winograd, at the calibration samples' shapes) is not quantized; the report
   says why. The accuracy guard (``_accuracy_guard``) keeps float the layers the
   outputs need, when they miss its targets against float. Each layer's error is also
   estimated on the calibration data as the RMS error of its quantized input and weights
   relative to their RMS (``sqrt(e_x^2 + e_w^2)``); a layer above ``max_layer_error`` keeps
   float input and weights. Its default: 5 % where the guard cannot run (``guard=False``, no
   onnxruntime), else no limit: on the PP-OCRv4 recognizer the 5 % gate floated 10 of 47
   layers and cost 1.8 points of held-out character accuracy (docs/quantization.md).
4. The 8-bit chain (``_chain_plan``; ``MLCPACK_INT8_CHAIN=0`` turns it off): activations stay
   uint8 between layers, the graph ONNX Runtime's ``quantize_static`` writes: a QDQ pair on
   every int8 convolution's output (a Relu, or a Clip from 0 to at least the calibrated top,
   alone after it folds into the quantize's clamp: its range has zero point 0), on a residual
   Add with an 8-bit input (its other input quantized too) and on a MaxPool of an 8-bit tensor
   (the input's scale and zero point), where an integer kernel reads the result. The QDQ
   fusions (passes/fuse_qdq*.py) then requantize in the convolutions' epilogues, add on bytes
   (``qbinary``) and pool on bytes. The ranges come from the same calibration run (the extra
   tensors are tapped too).
5. After export the caller runs ``compare`` for the report: per output, the error of the int8
   bundle against the float model on the calibration data, and both bundles' run times (the
   float model compiled for this host without the calibration's taps: ``export_int8``).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .calibration_data import CALIBRATION_SUFFIXES, fits, read_calibration  # noqa: F401
from .errors import ExportError
from .options import CompileOptions

METHODS = ("percentile", "minmax", "entropy")
DEFAULT_METHOD = "percentile"   # measured on three corpus models: docs/quantization.md
PERCENTILE = 99.99
_ENTROPY_BINS = 2048            # histogram bins of |x| for the entropy method
MAX_LAYER_ERROR = 0.05
_SAMPLE_VALUES = 1 << 16        # values per tap and sample kept for the entropy method
_TAIL_VALUES = 1 << 18          # at most this many per tap, sample and side for percentile


@dataclass
class Layer:
    node: str          # the ONNX node's name (or its first output)
    op: str
    activation: str    # the input tensor quantized per tensor
    error: float = 0.0  # estimated relative RMS error of quantizing it
    quantized: bool = True
    sensitive: float | None = None   # kept float by the accuracy guard: output SNR gained (dB)
    local_snr: float | None = None   # kept float by the guard's SNR ranking: its own SNR (dB)
    speed: str | None = None         # kept float for speed: why (passes/int8_cost.py)


@dataclass
class QuantizeReport:
    method: str
    samples: int
    layers: list[Layer] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)   # filled by compare()
    speed: str = ""
    int8_ms: float | None = None
    float_ms: float | None = None
    guard: str = ""    # the accuracy guard's line (quantize_onnx)
    criteria: str = ""   # the guard's targets per output (class axis or SNR only)
    axes: dict = field(default_factory=dict)   # output -> class axis or None (class_axes)
    chain: bool = True   # activations 8-bit between layers (_chain_plan; the guard may drop it)
    weights: str = "weights per channel"   # the weights' range (quantize_onnx)

    def summary(self) -> list[str]:
        done = [x for x in self.layers if x.quantized]
        kept = [x for x in self.layers if not x.quantized]
        ops: dict[str, int] = {}
        for x in done:
            ops[x.op] = ops.get(x.op, 0) + 1
        lines = [f"quantized int8: {len(done)} of {len(self.layers)} layers ("
                 + ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
                 + f"); {self.weights}, activations per tensor from {self.method} over "
                 f"{self.samples} calibration sample{'s' * (self.samples != 1)}"
                 + ("; 8-bit between layers" if self.chain else "")]
        for x in kept:
            if x.speed is not None:
                lines.append(f"  left in float: {x.op} {x.node!r} (speed: {x.speed})")
            elif x.local_snr is not None:
                lines.append(f"  left in float: {x.op} {x.node!r} (accuracy guard: its int8 "
                             f"output's SNR {x.local_snr:.1f} dB, among the lowest)")
            elif x.sensitive is None:
                lines.append(f"  left in float: {x.op} {x.node!r} (estimated error "
                             f"{x.error:.1%} > {MAX_LAYER_ERROR:.0%})")
            else:
                lines.append(f"  left in float: {x.op} {x.node!r} (accuracy guard: the output "
                             f"gains {x.sensitive:.1f} dB with it float)")
        if self.criteria:
            lines.append(self.criteria)
        if self.guard:
            lines.append(self.guard)
        lines += self.outputs
        if self.speed:
            lines.append(self.speed)
        return lines


# ---- finding layers and taps ---------------------------------------------------------------------

def _quantizable(model, inits: dict[str, np.ndarray]) -> list[tuple[int, object, int]]:
    """(index, node, weight axis) of every Conv/Gemm/MatMul whose weight is a float
    initializer."""
    out = []
    for index, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        w = inits.get(node.input[1])
        if w is None or w.dtype != np.float32 or node.input[0] in inits:
            continue
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Conv" and w.ndim in (3, 4):
            out.append((index, node, 0))
        elif node.op_type == "MatMul" and w.ndim == 2:
            out.append((index, node, 1))
        elif node.op_type == "Gemm" and w.ndim == 2 and not (
                "transA" in attrs and attrs["transA"].i):
            trans_b = attrs["transB"].i if "transB" in attrs else 0
            out.append((index, node, 0 if trans_b else 1))
    return out


def constants_as_initializers(model):
    """``model`` with its top-level ``Constant`` nodes holding a tensor made initializers
    (Paddle's exporter keeps every weight in one), so their consumers' weights are found."""
    from onnx import numpy_helper

    moved = []
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" in attrs:
            moved.append(node)
    if not moved:
        return model
    out = type(model)()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node
            if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                    and any(a.name == "value" for a in n.attribute))]
    for node in moved:
        value = next(a.t for a in node.attribute if a.name == "value")
        out.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(value),
                                                             node.output[0]))
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def _node_name(node) -> str:
    return node.name or node.output[0]


def _tapped(model, taps: Sequence[str]):
    """A copy of ``model`` that also returns ``taps`` (float tensors)."""
    from onnx import TensorProto, helper

    tapped = type(model)()
    tapped.CopyFrom(model)
    have = {o.name for o in tapped.graph.output}
    for name in taps:
        if name not in have:
            tapped.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                                     None))
    return tapped


# ---- ranges and scales -----------------------------------------------------------------------------

class _Stats:
    """One tap's values over the calibration samples: its extremes; for ``percentile`` each
    sample's tails (exact: see ``add``); for ``entropy`` a seeded subsample of each."""

    def __init__(self, samples: int = 1) -> None:
        self.lo, self.hi = np.inf, -np.inf
        self.samples = samples          # how many samples the calibration runs (tail sizes)
        self.count = 0                  # values seen
        self.kept: list[np.ndarray] = []
        self.low: list[np.ndarray] = []    # each sample's smallest values (percentile)
        self.high: list[np.ndarray] = []   # and largest

    def add(self, x: np.ndarray, method: str, rng: np.random.Generator) -> None:
        flat = x.ravel()
        self.count += flat.size
        self.lo = min(self.lo, float(flat.min(initial=np.inf)))
        self.hi = max(self.hi, float(flat.max(initial=-np.inf)))
        if method == "entropy":
            take = flat if flat.size <= _SAMPLE_VALUES else rng.choice(flat, _SAMPLE_VALUES)
            self.kept.append(np.asarray(take, np.float32))
        elif method == "percentile" and flat.size:
            # the percentile of all samples' values lies in the (1 - PERCENTILE) tail of their
            # union: a sample keeps that share of the union's size, as if it held the whole tail
            # (exact when the samples have one size; a random subsample made the ranges, and
            # the PP-OCRv4 recognizer's held-out accuracy, vary by 2 points with its seed)
            k = int(np.ceil(flat.size * self.samples * (1 - PERCENTILE / 100))) + 2
            k = min(k, _TAIL_VALUES)
            if 2 * k >= flat.size:
                low = high = np.asarray(flat, np.float32)
            else:
                part = np.partition(flat, (k - 1, flat.size - k))
                low, high = part[:k], part[flat.size - k:]
            self.low.append(np.array(low, np.float32))
            self.high.append(np.array(high, np.float32))

    def _percentile(self) -> tuple[float, float]:
        """``np.percentile`` (linear) of every value added at 100 - PERCENTILE and PERCENTILE,
        from the kept tails."""
        n = self.count
        low = np.sort(np.concatenate(self.low))
        high = np.sort(np.concatenate(self.high))[::-1]
        pos = (100 - PERCENTILE) / 100 * (n - 1)   # rank from either end
        i = int(np.floor(pos))
        frac = pos - i
        j = min(i + 1, n - 1)
        lo = low[min(i, low.size - 1)] + frac * (low[min(j, low.size - 1)]
                                               - low[min(i, low.size - 1)])
        hi = high[min(i, high.size - 1)] + frac * (high[min(j, high.size - 1)]
                                                  - high[min(i, high.size - 1)])
        return float(lo), float(hi)

    def range(self, method: str) -> tuple[float, float]:
        if method == "entropy" and self.kept:
            lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
            values = np.concatenate(self.kept)
            levels = 255 if lo == 0.0 else 128   # uint8 over [0, T], or about 128 a side
            t = entropy_threshold(np.abs(values), levels)
            return max(lo, -t), min(hi, t)
        if method == "percentile" and self.low:
            lo, hi = self._percentile()
            return min(lo, 0.0), max(hi, 0.0)
        return min(self.lo, 0.0), max(self.hi, 0.0)


def entropy_threshold(values: np.ndarray, levels: int, bins: int = _ENTROPY_BINS) -> float:
    """The clipping threshold T for |x| (``values``) that minimizes the KL divergence between
    the histogram of |x| clipped at T and that histogram merged into ``levels`` quantization
    bins (TensorRT's entropy calibration): T trades the clipped tail against the rounding of
    the bulk."""
    peak = float(values.max(initial=0.0))
    if peak <= 0.0 or values.size < 2:
        return peak
    hist, edges = np.histogram(values, bins=bins, range=(0.0, peak))
    hist = hist.astype(np.float64)
    best, best_kl = bins, np.inf
    for i in range(levels, bins + 1, max(1, (bins - levels) // 240)):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()            # the clipped tail lands in the last bin
        # q: p merged into ``levels`` chunks, each spread over the chunk's non-empty bins
        chunk = np.minimum((np.arange(i) * levels) // i, levels - 1)
        sums = np.bincount(chunk, weights=hist[:i], minlength=levels)
        nonzero = np.bincount(chunk, weights=(hist[:i] > 0), minlength=levels)
        q = np.where(hist[:i] > 0, sums[chunk] / np.maximum(nonzero[chunk], 1), 0.0)
        mask = p > 0
        p_n, q_n = p / p.sum(), q / max(q.sum(), 1e-300)
        kl = float(np.sum(p_n[mask] * np.log(p_n[mask] / np.maximum(q_n[mask], 1e-12))))
        if kl < best_kl:
            best, best_kl = i, kl
    return float(edges[best])


def uint8_params(lo: float, hi: float) -> tuple[np.float32, np.uint8]:
    """Scale and zero point of an asymmetric uint8 range holding [lo, hi] (and 0)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    zp = np.uint8(np.clip(np.round(-lo / scale), 0, 255))
    return scale, zp


def _qdq_uint8(x: np.ndarray, scale: np.float32, zp: np.uint8) -> np.ndarray:
    q = np.clip(np.round(x / scale) + np.float32(zp), 0, 255)
    return (q - np.float32(zp)) * scale


def weight_params(w: np.ndarray, axis: int, qmax: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric int8 over [-qmax, qmax]: (q int8, scale float32 [C]). ``qmax``
    64: the 7-bit range (ONNX Runtime's ``reduce_range`` for weights, ``W7_QMAX``)."""
    moved = np.moveaxis(w, axis, 0)
    peak = np.abs(moved.reshape(moved.shape[0], -1)).max(axis=1)
    scale = np.where(peak > 0, peak / float(qmax), 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale


W7_QMAX = 64   # |w| <= 64: the vpmaddubsw quad kernel is exact (passes/quad_weights.py)


def conv_weight_qmax(options: CompileOptions) -> int:
    """The weight range ``--quantize int8`` gives a convolution (groups 1) on ``options``'
    targets (resolved, ``CompileOptions.for_targets``): 7 bits (``W7_QMAX``) where no target
    has an int8 dot instruction (``int8_dot_targets`` False, the test ``int8_cost`` uses) and
    the x86 ``vpmaddubsw`` quad kernel is on (``conv_quads7``), so every such convolution runs
    it, exact and faster than fp32; else the full 127 (``vpdpbusd``/``sdot`` take 8 bits)."""
    return W7_QMAX if options.conv_quads7 and not options.int8_dot_targets else 127


def _relative_rms(err: np.ndarray, ref: np.ndarray) -> float:
    denom = float(np.sqrt(np.mean(np.square(ref, dtype=np.float64))))
    return float(np.sqrt(np.mean(np.square(err, dtype=np.float64)))) / denom if denom > 0 else 0.0


# ---- the quantized model ---------------------------------------------------------------------------

@dataclass
class Quantized:
    model: object                 # the QDQ ModelProto
    report: QuantizeReport
    float_bundle: Path            # the tapped float bundle (for compare), in ``workdir``
    float_outputs: list[dict[str, np.ndarray]]
    input_name: str               # the bundle's input name
    samples: list[np.ndarray]
    workdir: tempfile.TemporaryDirectory
    # the float model compiled as it is (no taps) for this host, which ``compare`` times the
    # int8 bundle against; None: ``float_bundle``, whose taps (extra outputs) keep its kernels
    # from fusing: the PP-OCRv4 recognizer's ran 4-5x slower than its fp32 bundle
    plain_bundle: Path | None = None

    def close(self) -> None:
        self.workdir.cleanup()


def quantize_onnx(model_path: str | os.PathLike, samples: Sequence[np.ndarray],
                  input_shapes: Mapping[str, Sequence[int]] | None = None,
                  method: str = DEFAULT_METHOD, max_layer_error: float | None = None,
                  compile_options: CompileOptions | None = None, guard: bool = True
                  ) -> Quantized:
    """Calibrate ``model_path`` on ``samples`` (values of its only input) and build its QDQ
    form (see the module docstring). The caller exports ``result.model`` and then calls
    ``compare``; ``result.close()`` removes the calibration bundle. ``compile_options``: the
    compiler's settings for the calibration bundle (None: from the environment); ``guard``:
    the accuracy guard (``_accuracy_guard``) after the per-layer estimate."""
    import onnx
    from onnx import numpy_helper

    from ..frontends.onnx import import_onnx
    from ..runtime import load
    from .export import ExportOptions, export_module

    if method not in METHODS:
        raise ExportError(f"--calibration-method {method!r}: use one of {', '.join(METHODS)}")
    if not samples:
        raise ExportError("--calibration: no samples")
    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # noqa: BLE001  (any parse failure is the user's file)
        raise ExportError(f"{Path(model_path).name} is not a valid ONNX file: {exc}") from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:   # per-axis DequantizeLinear needs opset 13
        from onnx import version_converter
        model = version_converter.convert_version(model, 13)
    model = constants_as_initializers(model)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    if len(graph_inputs) != 1:
        raise ExportError(f"--quantize int8 calibrates models with one input; this one has "
                          f"{len(graph_inputs)}")
    layers = _quantizable(model, inits)
    if not layers:
        raise ExportError("--quantize int8: the model has no Conv, Gemm or MatMul with constant "
                          "float weights to quantize")
    taps = list(dict.fromkeys(node.input[0] for _, node, _ in layers))
    options = (compile_options or ExportOptions().compile_options()).for_targets()
    # the ranges of the tensors an 8-bit chain may quantize too (``_chain_plan``)
    chain_taps = [t for t in _chain_candidates(model, layers) if t not in set(taps)] \
        if options.int8_chain else []
    originals = [o.name for o in model.graph.output]
    work = tempfile.TemporaryDirectory(prefix="mlcpack-calibration-")
    try:
        mod, info = import_onnx(_tapped(model, taps + chain_taps), input_shapes=input_shapes)
        bundle = Path(work.name) / "float.mlc"
        export_module(mod, bundle, ExportOptions(target="host", check=False,
                                                 compile=compile_options))
        input_name = info.input_names[graph_inputs[0].name]
        rng = np.random.default_rng(0)
        stats = {t: _Stats(len(samples)) for t in taps + chain_taps}
        outputs: list[dict[str, np.ndarray]] = []
        tap_shapes: dict[str, tuple] = {}   # at the first sample's size
        with load(bundle) as fmodel:
            for x in samples:
                got = fmodel.run({input_name: x})
                for t in taps:
                    tap_shapes.setdefault(t, got[t].shape)
                for t in stats:
                    stats[t].add(got[t], method, rng)
                outputs.append({k: np.array(got[k]) for k in originals})
            params = {t: uint8_params(*stats[t].range(method)) for t in stats}
            act_err = {t: 0.0 for t in taps}
            for x in samples:   # second pass: each tap's quantization error
                got = fmodel.run({input_name: x})
                for t in taps:
                    err = _relative_rms(_qdq_uint8(got[t], *params[t]) - got[t], got[t])
                    act_err[t] = max(act_err[t], err)
    except BaseException:
        work.cleanup()
        raise
    report = QuantizeReport(method, len(samples), chain=options.int8_chain)
    report.axes = class_axes(model, originals)   # the per-output argmax lines' axes, guard or not
    if max_layer_error is None:   # the estimate's gate only where the guard cannot run
        max_layer_error = np.inf if guard and _have_onnxruntime() else MAX_LAYER_ERROR
    chosen = []
    conv_qmax = conv_weight_qmax(options)
    if conv_qmax != 127 and any(_conv_groups(node) == 1 for _, node, _ in layers):
        report.weights = ("weights per channel, conv weights 7-bit (no int8 dot instruction in "
                          "the target set)")
    for index, node, axis in layers:
        w = inits[node.input[1]]
        qmax = conv_qmax if _conv_groups(node) == 1 else 127
        slow = _integer_slower(node, w, tap_shapes.get(node.input[0]), options,
                               w7=qmax <= W7_QMAX)
        if slow is not None:
            report.layers.append(Layer(_node_name(node), node.op_type, node.input[0],
                                       quantized=False, speed=slow))
            continue
        q, scale = weight_params(w, axis, qmax)
        shape = [1] * w.ndim
        shape[axis] = -1
        w_err = _relative_rms(q.astype(np.float32) * scale.reshape(shape) - w, w)
        err = float(np.hypot(act_err[node.input[0]], w_err))
        layer = Layer(_node_name(node), node.op_type, node.input[0], err,
                      err <= max_layer_error)
        report.layers.append(layer)
        if layer.quantized:
            chosen.append((index, axis, q, scale))
    if guard and chosen:
        by_index = {index: layer for (index, _, _), layer in zip(layers, report.layers)}
        macs = {index: _layer_macs(node, inits[node.input[1]], tap_shapes.get(node.input[0]))
                for index, node, _ in layers}
        chosen = _accuracy_guard(model, inits, chosen, params, graph_inputs[0].name, originals,
                                 list(samples), outputs, by_index, report, macs)
    qdq = _build_qdq(model, inits, chosen, params, chain=report.chain)
    return Quantized(qdq, report, bundle, outputs, input_name, list(samples), work)


def _conv_groups(node) -> int | None:
    """A Conv node's groups; None for other operators."""
    if node.op_type != "Conv":
        return None
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _layer_macs(node, w: np.ndarray, x_shape) -> float | None:
    """About how many multiply-adds the layer ``node`` (weights ``w``) does on an input of
    ``x_shape`` (the first calibration sample's): the weights' size times the output positions
    (a Conv's input positions over its strides; a MatMul's or Gemm's rows). None: unknown."""
    if x_shape is None or not len(x_shape):
        return None
    if node.op_type == "Conv":
        if len(x_shape) < 3:
            return None
        strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [])
        positions = float(x_shape[0])
        for i, size in enumerate(x_shape[2:]):
            positions *= -(-int(size) // max(1, strides[i] if i < len(strides) else 1))
        return positions * w.size
    return float(np.prod(x_shape[:-1], dtype=np.float64)) * w.size


def _integer_slower(node, w: np.ndarray, x_shape, options: CompileOptions,
                    w7: bool = False) -> str | None:
    """Why the Conv ``node`` (weights ``w``, input of shape ``x_shape``) runs faster on the
    fp32 kernels than on the integer ones for ``options``' targets, or None. ``w7``: its
    weights will be quantized to 7 bits (``conv_weight_qmax``)."""
    from .passes.int8_cost import float_conv_reason

    if node.op_type != "Conv" or w.ndim != 4 or x_shape is None or len(x_shape) != 4:
        return None
    attrs = {a.name: a for a in node.attribute}
    ints = {k: list(a.ints) for k, a in attrs.items() if a.ints}
    if "auto_pad" in attrs and attrs["auto_pad"].s not in (b"", b"NOTSET"):
        return None
    strides = ints.get("strides", [1, 1])
    dil = ints.get("dilations", [1, 1])
    pads = ints.get("pads", [0, 0, 0, 0])
    groups = attrs["group"].i if "group" in attrs else 1
    if dil != [1, 1] or len(strides) != 2 or len(pads) != 4:
        return None
    out = [x_shape[0], w.shape[0]]
    for i in range(2):
        span = x_shape[2 + i] + pads[i] + pads[2 + i] - w.shape[2 + i]
        out.append(span // strides[i] + 1)
    return float_conv_reason(w.shape, strides, out, groups, options, w7=w7)


# ---- the accuracy guard ----------------------------------------------------------------------------

# The int8 model is accepted as it is when, on the calibration data against the float model,
# every output meets an SNR of GUARD_SNR_DB and every output with a class axis
# (``class_axes``: a Softmax / LogSoftmax output, that axis; a Gemm / MatMul head's, the last)
# keeps its argmax along it at GUARD_AGREEMENT of the positions (a class, a CTC symbol per
# step); other outputs (a detector's [1, 84, anchors] head, a probability map, a regression)
# by the SNR alone: YOLOv8n's argmax over its 2100 anchors, near ties everywhere, had 28 of 64
# convolutions floated at 39.2 dB all int8. Otherwise the int8 layers are
# ranked and the first are kept float one by one, at most GUARD_MAX_FLOAT of them, until it
# does (or the best point reached is kept). The ranking: where a leave-one-out sweep (one
# measure per layer, each with that layer alone float) fits in half of GUARD_BUDGET_S (by the
# time of one measure on the search samples), the output SNR each layer's float version gains,
# and of the layers whose float version alone meets the targets the one with the fewest
# multiply-adds first (the least int8 speed given up); otherwise each layer's own SNR,
# measured in one run of the float model beside a quantized copy of every layer reading its
# float input (lowest first). The PP-OCRv4 recognizer (47 layers): the sweep took 921 s on a
# loaded 2-core host and, cut at its budget, chose nothing; the SNR ranking takes one run.
# Since then one measure takes 0.2 s on 8 of its samples (2026-12-07, Zen 5): the sweep 10 s.
# Its own-SNR ranking floated its two 480x480 1x1s (the lowest own SNR, 21 and 24 dB), which
# gain the logits nothing (17.8 -> 17.6 dB): the output's misses are a few CTC steps that
# flip, which floating any of several other layers also restores (docs/quantization.md).
GUARD_AGREEMENT = 0.995
GUARD_SNR_DB = 20.0
GUARD_MAX_FLOAT = 0.5
# The guard measures on at most GUARD_SAMPLES calibration samples and stops after
# GUARD_BUDGET_S seconds (keeping the best point reached; the report says so). Its seconds are
# this process's CPU seconds (``_guard_clock``; ONNX Runtime runs on one thread): on a wall
# clock the same export on the same host took the sweep or the SNR ranking by its load.
GUARD_SAMPLES = 8
GUARD_BUDGET_S = 60.0
GUARD_SWEEP_SHARE = 0.5   # of the budget a leave-one-out sweep may take, else the SNR ranking
_guard_clock = time.process_time


def _have_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _guard_session(model_bytes: bytes):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


# ops an output's class axis passes through unchanged (by position: the output's rank)
_CLASS_AXIS_SAME = {"Identity", "Cast", "Dropout", "Relu", "Sigmoid", "Exp", "Log", "Neg",
                    "Clip", "Mul", "Div", "Add", "Sub"}
_CLASS_AXIS_RESHAPE = {"Flatten", "Reshape", "Squeeze", "Unsqueeze"}


def class_axes(model, names: Sequence[str]) -> dict[str, int | None]:
    """Each output's class axis (counted from its end: -1 the last), or None when it has none:
    walking back from the output through elementwise ops along their first input
    (``_CLASS_AXIS_SAME``: a softmax written out as Exp / Div, a sum of two heads), Transposes
    and reshapes (which keep only a last class axis), a Softmax / LogSoftmax gives its axis,
    a Gemm / MatMul with constant weights (a classifier head) its last axis; anything else (a
    Conv, a Concat of detector heads, a map) none."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consts = {i.name for i in graph.initializer} | {
        n.output[0] for n in graph.node if n.op_type == "Constant"}
    ranks = {}
    for vi in list(graph.value_info) + list(graph.output) + list(graph.input):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            ranks[vi.name] = len(t.shape.dim)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    out: dict[str, int | None] = {}
    for name in names:
        axis, tensor, seen, moved = None, name, 0, False
        rank = ranks.get(name)
        while tensor in producer and seen < 64:
            seen += 1
            node = producer[tensor]
            ints = {a.name: (a.i, list(a.ints)) for a in node.attribute}
            if node.op_type in ("Softmax", "LogSoftmax"):
                a = ints.get("axis", (-1 if opset >= 13 else 1, []))[0]
                r = ranks.get(node.output[0], rank)
                if a >= 0 and r is None:
                    break
                axis = a - r if a >= 0 else a
                if opset < 13 and axis != -1:   # opset < 13: flattened from axis on
                    axis = -1
                if moved and axis != -1:
                    axis = None
                break
            if node.op_type in ("Gemm", "MatMul") and len(node.input) > 1 \
                    and node.input[1] in consts:
                axis = -1
                break
            if node.op_type in _CLASS_AXIS_SAME:   # a softmax by hand, two heads' sum
                tensor = node.input[0]
            elif node.op_type in _CLASS_AXIS_RESHAPE:
                tensor, moved = node.input[0], True   # a class axis only as the last one
            elif node.op_type == "Transpose" and ints.get("perm", (0, []))[1]:
                tensor, moved = node.input[0], True   # only where the last axis stays last
                perm = ints["perm"][1]
                if perm[-1] != len(perm) - 1:
                    break
            else:
                break
        out[name] = axis
    return out


def _agreement(ref: np.ndarray, got: np.ndarray, axis: int) -> np.ndarray:
    return (ref.argmax(axis) == got.argmax(axis)).ravel()


def _accuracy(refs: list[dict[str, np.ndarray]], gots: list[list[np.ndarray]],
              names: Sequence[str], axes: Mapping[str, int | None] | None = None
              ) -> tuple[float, float]:
    """(the worst output's SNR in dB, its worst argmax agreement along each output's class
    axis, ``axes`` from ``class_axes``; outputs without one: none) over all samples."""
    snr, agree = np.inf, 1.0
    for k, name in enumerate(names):
        ref = [np.asarray(r[name], np.float64) for r in refs]
        got = [np.asarray(g[k], np.float64).reshape(r.shape) for g, r in zip(gots, ref)]
        noise = sum(float(np.sum((g - r) ** 2)) for g, r in zip(got, ref))
        power = sum(float(np.sum(r ** 2)) for r in ref)
        if noise > 0:
            snr = min(snr, 10 * np.log10(power / noise) if power > 0 else -np.inf)
        axis = (axes or {}).get(name)
        if axis is not None and -ref[0].ndim <= axis and ref[0].shape[axis] > 1:
            agree = min(agree, float(np.mean(np.concatenate(
                [_agreement(r, g, axis) for r, g in zip(ref, got)]))))
    return float(snr), agree


def _criteria(names: Sequence[str], axes: Mapping[str, int | None]) -> str:
    """The report's line: which target each output was judged by."""
    return "  accuracy guard criteria: " + "; ".join(
        f"{n!r} SNR and argmax along axis {axes[n]} (class axis)" if axes.get(n) is not None
        else f"{n!r} SNR only (no class axis)" for n in names)


def _accuracy_guard(model, inits, chosen, params, onnx_input: str, names: Sequence[str],
                    samples: list[np.ndarray], refs: list[dict[str, np.ndarray]],
                    layers: dict[int, Layer], report: QuantizeReport,
                    macs: Mapping[int, float | None] | None = None) -> list:
    """The int8 layers of ``chosen`` the outputs allow (see the comment above): ONNX Runtime
    runs the QDQ models on the calibration samples with graph optimizations off (the QDQ
    semantics exactly). Without ONNX Runtime the model is kept as it is (said so). ``macs``:
    each layer's multiply-adds by node index (``_layer_macs``; None or absent: unknown), which
    orders the layers whose float version alone meets the targets."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        report.guard = "  accuracy guard: skipped (needs onnxruntime)"
        return chosen

    took = [0.0]   # the last measure's seconds
    axes = report.axes   # class_axes of ``names``, found by quantize_onnx
    report.criteria = _criteria(names, axes)

    def measure(subset) -> tuple[float, float]:
        t = _guard_clock()
        sess = _guard_session(_build_qdq(model, inits, subset, params,
                                         chain=report.chain).SerializeToString())
        gots = [sess.run(list(names), {onnx_input: x}) for x in samples]
        took[0] = _guard_clock() - t
        return _accuracy(refs, gots, names, axes)

    def good(acc: tuple[float, float]) -> bool:
        return acc[0] >= GUARD_SNR_DB and acc[1] >= GUARD_AGREEMENT

    def rank(acc: tuple[float, float]) -> tuple:
        # meeting the targets first; agreement beyond its target counts as the target (on a
        # few samples it is often 100 % while the SNR is short)
        return good(acc), min(acc[1], GUARD_AGREEMENT), acc[0]

    def targets(acc: tuple[float, float]) -> str:
        if not any(a is not None for a in axes.values()):
            return f"int8 output SNR {acc[0]:.1f} dB on the calibration data"
        return (f"int8 output SNR {acc[0]:.1f} dB, argmax agrees {acc[1]:.1%} on the "
                f"calibration data")

    start = _guard_clock()
    first = measure(chosen)
    if good(first):
        report.guard = f"  accuracy guard: {targets(first)}: every layer kept int8"
        return chosen
    chained = ""
    if report.chain:   # the 8-bit chain first goes, then layers
        report.chain = False
        chained = (f"  accuracy guard: activations 8-bit between layers: {targets(first)}; "
                   f"float between layers instead")
        first = measure(chosen)
        if good(first):
            report.guard = f"{chained}: {targets(first)}: every layer kept int8"
            return chosen
        chained += "\n"
    whole = first
    if len(samples) > GUARD_SAMPLES:   # the search on a few samples, the targets on them too
        samples, refs = samples[:GUARD_SAMPLES], refs[:GUARD_SAMPLES]
        first = measure(chosen)
    # a sweep measure is one on the search samples, the last one's time (the measures before
    # it ran more samples, the 8-bit chain too: their mean made the recognizer's 10 s sweep
    # look like 24-30 s, and on a loaded host like more than its share)
    per_measure = took[0]
    if per_measure * len(chosen) <= GUARD_BUDGET_S * GUARD_SWEEP_SHARE:
        how = "leave-one-out sweep"
        gains, passing = [], []
        for entry in chosen:
            acc = measure([c for c in chosen if c is not entry])
            (passing if good(acc) else gains).append((acc[1] - first[1], acc[0] - first[0],
                                                      entry))
        gains.sort(key=lambda g: (g[0], g[1]), reverse=True)   # most sensitive first
        # a layer whose float version alone meets the targets: the cheapest first
        known = macs or {}
        passing.sort(key=lambda g: (known.get(g[2][0]) is None, known.get(g[2][0]) or 0.0,
                                    -g[1]))
        if passing:
            how += (f" ({len(passing)} layer{'s' * (len(passing) != 1)} each meeting the "
                    f"targets alone float; the fewest multiply-adds first)")
        ranked = [(entry, gain_db, None) for _, gain_db, entry in passing + gains]
    else:
        how = "per-layer SNR ranking"
        local = _layer_snr(model, inits, chosen, params, onnx_input, samples)
        ranked = [(entry, None, local[i]) for i, entry in
                  sorted(enumerate(chosen), key=lambda e: local[e[0]])]
    limit = max(1, int(GUARD_MAX_FLOAT * len(chosen)))
    kept = list(chosen)
    best, acc = (first, list(chosen)), first
    stopped = False
    for entry, gain_db, snr in ranked[:limit]:
        if _guard_clock() - start > GUARD_BUDGET_S:
            stopped = True
            break
        kept = [c for c in kept if c is not entry]
        layers[entry[0]].quantized = False
        layers[entry[0]].sensitive, layers[entry[0]].local_snr = gain_db, snr
        acc = measure(kept)
        if rank(acc) > rank(best[0]):
            best = (acc, list(kept))
        if good(acc):
            break
    kept_ids = {id(c) for c in best[1]}
    for entry in chosen:   # layers floated past the best point are int8 again
        if id(entry) in kept_ids:
            layer = layers[entry[0]]
            layer.quantized, layer.sensitive, layer.local_snr = True, None, None
    acc = best[0]
    floated = len(chosen) - len(best[1])
    classes = any(a is not None for a in axes.values())
    report.guard = chained + (f"  accuracy guard: {targets(whole)} (targets {GUARD_SNR_DB:.0f} dB"
                    + (f", {GUARD_AGREEMENT:.1%}" if classes else "") + f"); {how}: with "
                    f"{floated} layer{'s' * (floated != 1)} float: {acc[0]:.1f} dB"
                    + (f", {acc[1]:.1%}" if classes else "") + " on "
                    f"{len(samples)} sample{'s' * (len(samples) != 1)}"
                    + ("" if good(acc) else " (targets not reached")
                    + (f"; stopped at its {GUARD_BUDGET_S:.0f} s CPU budget" if stopped else "")
                    + ("" if good(acc) else ")"))
    return best[1]


def _layer_snr(model, inits, chosen, params, onnx_input: str,
               samples: list[np.ndarray]) -> list[float]:
    """Each chosen layer's own SNR (dB) in int8: the float model with a copy of every chosen
    layer appended, the copies quantized (``_build_qdq``) and reading the float inputs, run
    once per sample by ONNX Runtime; each copy's output against its float original's."""
    probe = type(model)()
    probe.CopyFrom(model)
    copies, pairs = [], []
    for index, axis, q, scale in chosen:
        node = type(model.graph.node[index])()
        node.CopyFrom(model.graph.node[index])
        original = node.output[0]
        node.name = f"{_node_name(node)}_mlcprobe"
        del node.output[1:]
        node.output[0] = f"{original}_mlcprobe"
        probe.graph.node.append(node)
        copies.append((len(probe.graph.node) - 1, axis, q, scale))
        pairs.append((original, node.output[0]))
    probe = _build_qdq(probe, inits, copies, params, chain=False)
    taps = [t for pair in pairs for t in pair]
    sess = _guard_session(_tapped(probe, taps).SerializeToString())
    power = np.zeros(len(pairs))
    noise = np.zeros(len(pairs))
    for x in samples:
        got = dict(zip(taps, sess.run(taps, {onnx_input: x})))
        for i, (ref, copy) in enumerate(pairs):
            r = got[ref].astype(np.float64)
            power[i] += float(np.sum(r * r))
            noise[i] += float(np.sum((got[copy] - r) ** 2))
    with np.errstate(divide="ignore"):
        return [float(10 * np.log10(p / n)) if n > 0 else np.inf
                for p, n in zip(power, noise)]


def _chain_candidates(model, layers) -> list[str]:
    """Tensors whose ranges ``_chain_plan`` may use: the outputs of the quantizable Conv
    nodes, and of every Relu, Clip, Add and MaxPool (and the Add's inputs)."""
    names = [node.output[0] for _, node, _ in layers if node.op_type == "Conv"]
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in ("Relu", "Clip", "MaxPool") and node.output:
            names.append(node.output[0])
        elif node.op_type == "Add" and len(node.input) == 2:
            names += list(node.input) + [node.output[0]]
    return list(dict.fromkeys(names))


def _folds(node, p: tuple, consts: dict) -> bool:
    """Whether quantizing with ``p`` (scale, zero point) after ``node`` (a Relu, or a Clip
    with constant bounds) equals quantizing without it: zero point 0, and a Clip's upper bound
    absent or at or past the range's top (ReLU6 calibrated to at most 6)."""
    from onnx import numpy_helper

    scale, zp = p
    if int(zp) != 0:
        return False
    if node.op_type == "Relu":
        return True
    if node.attribute or len(node.input) < 2 or node.input[1] not in consts:
        return False   # opset < 11's attribute bounds, or no lower bound
    lo = numpy_helper.to_array(consts[node.input[1]])
    if lo.size != 1 or float(lo) != 0.0:
        return False
    if len(node.input) < 3 or not node.input[2]:
        return True
    if node.input[2] not in consts:
        return False
    hi = numpy_helper.to_array(consts[node.input[2]])
    return hi.size == 1 and float(hi) / float(scale) >= 254.6   # rounds to 255 or more


def _chain_plan(graph, chosen, params) -> tuple[dict, set]:
    """The 8-bit activation chain, what ONNX Runtime's ``quantize_static`` writes: a QDQ pair
    on the output of every chosen Conv, of every Add one of whose inputs is already 8-bit (its
    other input quantized too) and of a MaxPool of an 8-bit tensor (the input's scale and zero
    point). A Relu (or a Clip from 0 to at least the range's top: ReLU6) that alone reads such
    an output is dropped and its range (zero point 0, so the quantize's clamp is the ReLU)
    quantizes the output instead. The integer fusions then
    requantize in the convolutions' epilogues, add on bytes and pool on bytes
    (passes/fuse_qdq*.py). Returns ({tensor whose readers read the DQ: (tensor the Q reads,
    (scale, zero point))}, indices of the dropped Relu nodes)."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for x in n.input:
            readers.setdefault(x, []).append(i)
    outputs = {o.name for o in graph.output}
    consts = {t.name: t for t in graph.initializer}
    chosen_idx = {index for index, *_ in chosen}
    chain: dict[str, tuple] = {}
    relu_of: dict[str, int] = {}   # chained tensor -> the Relu folded into its quantize
    key: dict[int, str] = {}       # a chained Add or MaxPool node -> its chained tensor
    for i, n in enumerate(graph.node):
        if n.domain not in ("", "ai.onnx") or len(n.output) != 1 or n.output[0] in outputs:
            continue
        y = n.output[0]
        if n.op_type == "MaxPool" and n.input[0] in chain:
            chain[y] = (y, chain[n.input[0]][1])
            key[i] = y
            continue
        if n.op_type == "Add" and len(n.input) == 2 and any(x in chain for x in n.input) \
                and all(x in chain or x in params for x in n.input) \
                and len(set(n.input)) == 2:
            for x in n.input:
                if x not in chain:
                    chain[x] = (x, params[x])
        elif not (i in chosen_idx and n.op_type == "Conv"):
            continue
        target, relu = y, None
        after = readers.get(y, [])
        if len(after) == 1 and graph.node[after[0]].op_type in ("Relu", "Clip"):
            r = graph.node[after[0]].output[0]
            if r not in outputs and r in params and _folds(graph.node[after[0]], params[r],
                                                           consts):
                target, relu = r, after[0]
        if target not in params:
            continue
        if relu is not None:
            relu_of[target] = relu
        chain[target] = (y, params[target])
        key[i] = target
    # an 8-bit tensor no integer kernel reads stays float (a dequantize pass would undo the
    # saving): kept where a chosen layer, a chained Add or a chained MaxPool reads it
    dropped = set(relu_of.values())
    changed = True
    while changed:
        changed = False
        for t in list(chain):
            if not any((i in chosen_idx and graph.node[i].input[0] == t)
                       or key.get(i) in chain
                       for i in readers.get(t, []) if i not in dropped):
                del chain[t]
                dropped.discard(relu_of.pop(t, None))
                changed = True
    return chain, dropped


def _build_qdq(model, inits: dict[str, np.ndarray], chosen, params, chain: bool = True):
    """``model`` with QuantizeLinear/DequantizeLinear on the chosen layers' inputs, their
    weights int8 per channel behind DequantizeLinear, and Conv/Gemm biases int32; with
    ``chain`` (``CompileOptions.int8_chain``) the activations stay 8-bit between layers
    (``_chain_plan``)."""
    from onnx import helper, numpy_helper

    out = type(model)()
    out.CopyFrom(model)
    graph = out.graph
    new_inits, new_nodes = [], []
    dq_of: dict[str, str] = {}   # activation -> its dequantized name
    plan, dropped = _chain_plan(graph, chosen, params) if chain else ({}, set())
    act = {t: p for t, (_, p) in plan.items()}
    act.update((k, v) for k, v in params.items() if k not in act)
    for t, (src, (s, zp)) in plan.items():
        base = f"{t}_mlcq"
        new_inits += [numpy_helper.from_array(np.asarray(s, np.float32), f"{base}_scale"),
                      numpy_helper.from_array(np.asarray(zp, np.uint8), f"{base}_zp")]
        new_nodes.append((src, [helper.make_node("QuantizeLinear", [src, f"{base}_scale",
                                                                    f"{base}_zp"], [f"{base}_q"]),
                                helper.make_node("DequantizeLinear", [f"{base}_q",
                                                                      f"{base}_scale",
                                                                      f"{base}_zp"],
                                                 [f"{base}_dq"])]))
        dq_of[t] = f"{base}_dq"
    for index, axis, q, scale in chosen:
        node = graph.node[index]
        x = node.input[0]
        if x not in dq_of:
            s, zp = params[x]
            base = f"{x}_mlcq"
            new_inits += [numpy_helper.from_array(np.asarray(s, np.float32), f"{base}_scale"),
                          numpy_helper.from_array(np.asarray(zp, np.uint8), f"{base}_zp")]
            new_nodes.append((x, [helper.make_node("QuantizeLinear", [x, f"{base}_scale",
                                                                      f"{base}_zp"], [f"{base}_q"]),
                                  helper.make_node("DequantizeLinear", [f"{base}_q",
                                                                        f"{base}_scale",
                                                                        f"{base}_zp"],
                                                   [f"{base}_dq"])]))
            dq_of[x] = f"{base}_dq"
        wname = f"{node.input[1]}_{_node_name(node)}_mlcq"
        new_inits += [numpy_helper.from_array(q, f"{wname}_q"),
                      numpy_helper.from_array(scale, f"{wname}_scale"),
                      numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{wname}_zp")]
        wdq = helper.make_node("DequantizeLinear", [f"{wname}_q", f"{wname}_scale", f"{wname}_zp"],
                               [f"{wname}_dq"], axis=axis)
        extra = [wdq]
        bias_ok = node.op_type == "Conv" or (
            node.op_type == "Gemm" and all(a.f == 1.0 for a in node.attribute
                                           if a.name in ("alpha", "beta")))
        if len(node.input) > 2 and node.input[2] in inits and bias_ok \
                and inits[node.input[2]].shape == scale.shape:
            b = inits[node.input[2]]
            b_scale = (np.float32(act[x][0]) * scale).astype(np.float32)
            bq = np.round(b.astype(np.float64) / b_scale).astype(np.int64)
            if np.abs(bq).max(initial=0) < 2 ** 31:
                bname = f"{node.input[2]}_{_node_name(node)}_mlcq"
                new_inits += [numpy_helper.from_array(bq.astype(np.int32), f"{bname}_q"),
                              numpy_helper.from_array(b_scale, f"{bname}_scale"),
                              numpy_helper.from_array(np.zeros(b.shape, np.int32), f"{bname}_zp")]
                extra.append(helper.make_node("DequantizeLinear", [f"{bname}_q", f"{bname}_scale",
                                                                   f"{bname}_zp"],
                                              [f"{bname}_dq"], axis=0))
                node.input[2] = f"{bname}_dq"
        node.input[0] = dq_of[x]
        node.input[1] = f"{wname}_dq"
        new_nodes.append((None, extra))
    if plan:   # every reader of a chained tensor reads its dequantized value
        gone = {graph.node[i].output[0] for i in dropped}
        for i, n in enumerate(graph.node):
            for k, x in enumerate(n.input):
                if x in plan and i not in dropped:
                    n.input[k] = dq_of[x]
        keep = [n for i, n in enumerate(graph.node) if i not in dropped]
        del graph.node[:]
        graph.node.extend(keep)
        vi = [v for v in graph.value_info if v.name not in gone]
        del graph.value_info[:]
        graph.value_info.extend(vi)
    # Q/DQ of a graph input go first; of another tensor, right after its producer; weight DQs
    # first (they read initializers only)
    after: dict[str, list] = {}
    head = []
    for x, nodes in new_nodes:
        if x is None or x not in {o for n in graph.node for o in n.output}:
            head += nodes
        else:
            after.setdefault(x, []).extend(nodes)
    ordered = list(head)
    for n in graph.node:
        copy = type(n)()
        copy.CopyFrom(n)
        ordered.append(copy)
        for o in n.output:
            ordered += after.pop(o, [])
    del graph.node[:]
    graph.node.extend(ordered)
    graph.initializer.extend(new_inits)
    return out


# ---- the report after export ---------------------------------------------------------------------

def compare(quantized: Quantized, bundle: str | os.PathLike, runs: int = 21) -> QuantizeReport:
    """Run the int8 bundle on the calibration samples: per output, its error against the float
    model, and the run time of both bundles (1 thread, alternating, medians of the calling
    thread's CPU time: on a loaded machine wall time counts the waits for a core, and one
    export refused a correct int8 bundle as "slower than float" that way)."""
    from ..runtime import load

    report = quantized.report
    name = quantized.input_name
    with load(bundle, threads=1) as qmodel, load(quantized.plain_bundle
                                                 or quantized.float_bundle, threads=1) as fmodel:
        got = [qmodel.run({name: x}) for x in quantized.samples]
        for out in quantized.float_outputs[0]:
            # samples of a symbolic-shape model may differ in size: compared value for value
            refs = [np.asarray(o[out], np.float64) for o in quantized.float_outputs]
            vals = [np.asarray(g[out], np.float64) for g in got]
            ref = np.concatenate([r.ravel() for r in refs])
            val = np.concatenate([v.ravel() for v in vals])
            err = np.abs(val - ref)
            scale = float(np.abs(ref).max()) or 1.0
            noise = float(np.sum(err ** 2))
            snr = 10 * np.log10(float(np.sum(ref ** 2)) / noise) if noise > 0 else np.inf
            line = (f"  output {out!r} vs the float model on the calibration data: max abs "
                    f"error {err.max():.4g} ({err.max() / scale:.2%} of its largest |value|), "
                    f"SNR {snr:.1f} dB")
            axis = report.axes.get(out)   # only along a class axis (class_axes)
            if axis is not None and refs[0].ndim >= -axis and refs[0].shape[axis] > 1:
                agree = float(np.mean(np.concatenate(
                    [_agreement(r, v, axis) for r, v in zip(refs, vals)])))
                line += f", argmax agrees {agree:.1%} (axis {axis})"
            report.outputs.append(line)
        x = quantized.samples[0]
        times: dict[str, list[float]] = {"int8": [], "float": []}
        for _ in range(runs):
            for label, m in (("int8", qmodel), ("float", fmodel)):
                t = time.thread_time()
                m.run({name: x})
                times[label].append(time.thread_time() - t)
    q_ms, f_ms = (1e3 * float(np.median(times[k])) for k in ("int8", "float"))
    report.int8_ms, report.float_ms = q_ms, f_ms
    report.speed = (f"  speed (1 thread, CPU time, median of {runs}): int8 {q_ms:.3g} ms, float "
                    f"{f_ms:.3g} ms: {f_ms / q_ms:.2f}x")
    return report


# ---- the whole export ------------------------------------------------------------------------------

SLOWER_MARGIN = 1.05   # int8 counts as slower than float beyond this ratio of run times


def _qdq_reference(model: bytes, input_names: Mapping[str, str]):
    """The golden-check reference for the QDQ model: ONNX Runtime with its graph optimizations
    off, so DequantizeLinear -> Conv/MatMul run as the ONNX spec defines them (float32 over the
    dequantized values). With them on, ORT fuses the pattern into its own integer kernels, and
    its AVX2 u8 x s8 kernel (``vpmaddubsw``, CPUs without VNNI) saturates int16 pair sums: a
    wrong reference, off by far more than a quantization step on the demo CNN. Without
    onnxruntime: ``frontends/reference.py`` ``onnx_reference``'s fallback."""
    from ..frontends.reference import Reference, ReferenceUnavailable, _onnxruntime, onnx_reference

    fallback, fallback_name = onnx_reference(model, input_names)
    ort = _onnxruntime()
    if ort is None:
        return fallback, fallback_name
    to_onnx = {bundle: onnx_name for onnx_name, bundle in input_names.items()}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 4
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            values = sess.run(names, {to_onnx.get(k, k): v for k, v in feeds.items()})
        except Exception as exc:  # noqa: BLE001  (reported as an unavailable reference)
            raise ReferenceUnavailable(f"onnxruntime cannot run it "
                                       f"({' '.join(str(exc).split())[:200]})") from None
        return dict(zip(names, values))

    name = f"onnxruntime {ort.__version__} (QDQ as specified, graph optimizations off)"
    return Reference(run, name, second=getattr(fallback, "second", None) or fallback), name


def _add_stages(report, seconds: Mapping[str, float], cpu: Mapping[str, float]) -> None:
    """Add stages that ran before ``report``'s own (summed where a name repeats)."""
    for theirs, mine in ((report.stages, seconds), (report.stage_cpu, cpu)):
        merged = dict(mine)
        for name, spent in theirs.items():
            merged[name] = merged.get(name, 0.0) + spent
        theirs.clear()
        theirs.update(merged)


def _around_stages(report, before, after) -> None:
    """``report``'s stages with ``before``'s in front and ``after``'s behind, in the order
    they ran (``export --timings``)."""
    _add_stages(report, before.seconds, before.cpu)
    for name, spent in after.seconds.items():
        report.stages[name] = report.stages.get(name, 0.0) + spent
        report.stage_cpu[name] = report.stage_cpu.get(name, 0.0) + after.cpu.get(name, 0.0)


def export_int8(model_path: str | os.PathLike, out: str | os.PathLike, options,
                samples: Sequence[np.ndarray], input_shapes: Mapping[str, Sequence[int]] | None,
                method: str = DEFAULT_METHOD, fallback: bool = False, float_module=None,
                guard: bool = True) -> tuple[object, QuantizeReport]:
    """Quantize ``model_path`` on ``samples``, export the int8 bundle to ``out`` with
    ``options`` (an ``ExportOptions``; its golden check, when on, runs ONNX Runtime on the QDQ
    model), and report. When the int8 bundle runs slower than the float model: an
    ``ExportError`` and nothing written, or with ``fallback`` the float bundle
    (``float_module``, the imported float model) written instead. ``guard`` False
    (``--no-quantize-guard``): every layer int8 (no accuracy guard, no per-layer error gate)
    but those the targets run faster in float. Returns (ExportReport, QuantizeReport)."""
    import dataclasses

    from ..frontends.onnx import import_onnx
    from .export import ExportOptions, export_module
    from .timings import StageClock

    # `export --timings`: the int8 stages around the int8 model's own export
    started, before, after = time.perf_counter(), StageClock(), StageClock()
    before("calibrate")   # calibration bundle and runs, ranges, the accuracy guard
    # the export's targets decide which layers stay float for speed (passes/int8_cost.py)
    quantized = quantize_onnx(model_path, samples, input_shapes, method,
                              max_layer_error=None if guard else np.inf,
                              compile_options=options.compile_options(), guard=guard)
    if not guard:
        quantized.report.guard = ("  accuracy guard: off (--no-quantize-guard): every layer "
                                  "int8 but those faster in float")
    out = Path(out)
    tmp = out.with_name(f".mlcpack-int8-{os.getpid()}-{out.name}")
    try:
        # the float model as the user's fp32 export compiles it, for the speed comparison
        plain_module, _ = import_onnx(str(model_path), input_shapes=input_shapes)
        plain = Path(quantized.workdir.name) / "plain.mlc"
        before("float bundle")   # the float model for the speed comparison
        export_module(plain_module, plain, ExportOptions(target="host", check=False,
                                                         compile=options.compile_options()))
        quantized.plain_bundle = plain
        before("import int8")
        mod, info = import_onnx(quantized.model, input_shapes=input_shapes)
        if options.check and options.check_inputs is None:
            # the check runs on a calibration sample: inputs in the range the model is
            # calibrated for (seeded normal noise may overflow the activations' ranges)
            options = dataclasses.replace(
                options, check_inputs={quantized.input_name: quantized.samples[0]})
        opts = options
        if options.check:
            reference, name = _qdq_reference(quantized.model.SerializeToString(),
                                             info.input_names)
            opts = dataclasses.replace(options, reference=reference, reference_name=name)
        before.stop()
        report = export_module(mod, tmp, opts)
        after("int8 vs float")   # the int8 bundle's error and speed against the float one
        qreport = compare(quantized, tmp)
        if qreport.int8_ms > qreport.float_ms * SLOWER_MARGIN:
            why = (f"the int8 bundle runs slower than the float one on this machine (int8 "
                   f"{qreport.int8_ms:.3g} ms, float {qreport.float_ms:.3g} ms)")
            if not fallback:
                raise ExportError(f"--quantize int8: {why}; nothing written "
                                  "(--quantize-fallback writes the float bundle instead)")
            if float_module is None:
                float_module, _ = import_onnx(str(model_path), input_shapes=input_shapes)
            fopts = options
            if options.check:
                from ..frontends.reference import onnx_reference
                reference, name = onnx_reference(model_path, info.input_names)
                fopts = dataclasses.replace(options, reference=reference, reference_name=name)
            after.stop()
            int8_report, report = report, export_module(float_module, tmp, fopts)
            _add_stages(report, int8_report.stages, int8_report.stage_cpu)
            qreport.speed += f"\n  --quantize-fallback: {why}; wrote the float bundle"
        after.stop()
        os.replace(tmp, out)
        report.path = str(out)
        _around_stages(report, before, after)
        report.seconds = time.perf_counter() - started
        return report, qreport
    finally:
        quantized.close()
        if tmp.exists():
            tmp.unlink()

