"""The golden check: a bundle may carry one input/output pair its exporter computed with a
reference (onnxruntime, or the numpy reference of the IR). ``verify`` re-runs it with this
runtime alone and compares.

The comparison (``compare_output``), per output with reference ``r``, result ``g``, scale ``S``
(the largest finite ``|r|``, 1 when that is 0) and magnitude ``M``:

- Floats: every element must satisfy ``|g - r| <= max(atol * S, K * eps * M) + rtol * |r|``, with
  ``eps = 2**-23`` (float32's machine epsilon) and ``K = ROUNDING_K``. ``M`` is the largest finite
  ``|value|`` among the output and the inputs of the operator that computed it (looking through
  reshapes, transposes, concats), recorded by the exporter from the IR's numpy reference; ``S``
  where it is not recorded. That term is float32 rounding of the values involved: an output near
  zero made from large values (``sigmoid(-15)``, ``a - b`` with ``a ~ b``) carries rounding error
  of the *inputs'* size, which ``atol * S`` alone would call a mismatch.
  An output whose elements do not all pass still passes as a whole when it agrees to float32
  level by the measures ONNX Runtime's and TensorRT's accuracy tools use: a signal-to-noise
  ratio ``10 log10(sum r^2 / sum (g - r)^2)`` of at least ``MIN_SNR_DB`` and a cosine similarity
  of at least ``1 - 10**(-MIN_SNR_DB / 10)`` (scattered rounding outliers, not a wrong region).
- Quantized models (the exporter records a quantization step ``Q`` per output): floats may
  differ by ``QUANT_STEPS * Q`` more, integers by ``QUANT_STEPS * Q`` (``Q`` is 1 for an
  integer output of a quantize), and a whole output passes at an SNR of ``QUANT_MIN_SNR_DB``
  or an RMS error of at most ``QUANT_RMS_STEPS * Q`` whose mean is at most ``Q`` (the bound
  the scales give; a misread zero point shifts every element the same way):
  references run integer kernels whose requantization rounds ties and accumulates differently
  from the bundle's (ONNX Runtime's own QDQ path differs from its float path the same way), so
  single elements land one step apart; a wrong scale, zero point or axis moves every element.
  ``Q`` is the largest dequantize scale that reaches the output through data moves, unary
  activations, pools and sums; 0 where it is not known (then only the SNR rule widens).
- NaN must meet NaN and an infinity the same infinity.
- Integer and bool outputs must match exactly.
- Shapes must match, except that ONNX's scalar (shape ``()``) and a one-element ``(1,)`` compare
  by value: ONNX defines scalars as rank 0, and some references return ``(1,)`` for them.

A disagreement names the output, its worst element (index, both values, what was allowed there)
and the output's SNR and cosine similarity.

A dynamic-batch bundle's pair holds a batch of its largest size (or the one the exporter was
given): the whole batch runs, and so do its first ``b`` rows for every smaller plan size ``b``, so
every plan is checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .errors import BundleError, MlcpackError
from .header import Golden, Header

GOLDEN_KEY = "golden"


class GoldenMismatchError(MlcpackError):
    """The bundle's outputs differ from its golden (reference) outputs beyond the tolerance."""

    exit_code = 13


class NoGoldenDataError(MlcpackError):
    """The bundle carries no golden input/output pair to verify (older, or exported without)."""

    exit_code = 14


EPS_F32 = 2.0 ** -23   # float32's machine epsilon
# Elements may differ by ROUNDING_K float32 roundings of the magnitude involved. Measured on
# correct bundles (every passing ONNX node test, the Paddle OCR models, YOLOv8n, PicoDet, against
# ONNX Runtime and the IR's numpy reference): the largest |g - r| / (eps * M) where atol * S did
# not already cover it was FILLED_IN; 64 leaves a margin and still sits below atol * S = 1e-4 * S
# unless M > 13 * S.
ROUNDING_K = 64.0
MIN_SNR_DB = 80.0      # an output agreeing this well as a whole passes despite rounding outliers
# Quantized models: elements may differ by this many quantization steps of the output, and an
# output agreeing to this SNR as a whole passes (one step flips on 3 of 10 logits of a QDQ conv
# net: 43 dB; ddddocr's dynamically quantized OCR model, which requantizes every layer's input
# at run time, so a tie rounded the other way early on spreads: 35-41 dB; a zero point or
# per-channel axis misread gives < 20 dB)
QUANT_STEPS = 2.0
QUANT_MIN_SNR_DB = 30.0
# ... or whose RMS error is at most this many quantization steps of the output, with a mean
# of at most one step (errors both ways, not a shifted zero point): in a deep
# quantized network a tie rounded the other way early on moves later activations by whole
# steps, and a small output collects them (PP-LCNet's 4-way softmax: 2 of 4 probabilities 4
# steps off, RMS 2.9 steps, 27.9 dB; ONNX Runtime's own fused and unfused runs of its QDQ copy
# differ by 18 dB); a misread zero point or axis moves every element by many steps
QUANT_RMS_STEPS = 4.0
# Outputs of a narrower float (a reference may round every intermediate to it, the bundle
# computes in float32) may also differ by NARROW_K of that type's epsilons of the magnitude.
NARROW_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float8_e4m3fn": 2.0 ** -3,
              "float8_e4m3fnuz": 2.0 ** -3, "float8_e5m2": 2.0 ** -2, "float8_e5m2fnuz": 2.0 ** -2}
NARROW_K = 4.0
# Types numpy lacks (ml_dtypes' in a reference's outputs), which the runtime returns as their bits
BITS_DTYPES = (*NARROW_EPS, "int4", "uint4", "int2", "uint2")


@dataclass
class OutputCheck:
    name: str
    batch: int | None           # the rows run (dynamic-batch bundles), None: the whole pair
    max_abs: float
    max_rel: float
    ok: bool
    why: str = ""
    snr_db: float = float("inf")  # 10 log10(sum r^2 / sum (g - r)^2); inf when equal
    cosine: float = 1.0
    index: list[int] | None = None  # the worst element, where it fails: where, both values
    got: float | None = None
    ref: float | None = None


@dataclass
class CheckResult:
    checks: list[OutputCheck] = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0
    quantized: bool = False    # compared with the quantized-model rule

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def max_abs(self) -> float:
        return max((c.max_abs for c in self.checks), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((c.max_rel for c in self.checks), default=0.0)

    @property
    def min_snr_db(self) -> float:
        return min((c.snr_db for c in self.checks), default=float("inf"))

    def worst(self) -> OutputCheck | None:
        bad = [c for c in self.checks if not c.ok]
        return max(bad or self.checks, key=lambda c: c.max_rel, default=None)

    def summary(self) -> str:
        w = self.worst()
        where = ""
        if w is not None and not self.ok:
            rows = f" (first {w.batch} rows)" if w.batch is not None else ""
            where = f"; output {w.name!r}{rows} {w.why or 'differs'}"
        snr = self.min_snr_db
        snr_text = f", min SNR {snr:.0f} dB" if np.isfinite(snr) else ""
        return (f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}{snr_text} "
                f"(tolerance rtol {self.rtol:g}, atol {self.atol:g} x output scale, at least "
                f"{ROUNDING_K:g} float32 roundings{self._quantized_rule()}){where}")

    def _quantized_rule(self) -> str:
        if not self.quantized:
            return ""
        return (f", quantized model: + {QUANT_STEPS:g} quantization steps, or SNR >= "
                f"{QUANT_MIN_SNR_DB:g} dB, or RMS error <= {QUANT_RMS_STEPS:g} steps with mean <= 1")


def _same_shape(got: np.ndarray, ref: np.ndarray) -> bool:
    """Equal shapes, or ONNX's scalar (rank 0) against a one-element (1,)."""
    if got.shape == ref.shape:
        return True
    return got.size == ref.size == 1 and min(got.ndim, ref.ndim) == 0 and max(got.ndim,
                                                                              ref.ndim) == 1


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name in NARROW_EPS


def _largest_float(dtype: np.dtype) -> float:
    """The largest finite value of a float dtype (float32's for others and for ml_dtypes
    types numpy's finfo does not know)."""
    try:
        return float(np.finfo(dtype).max)
    except (ValueError, TypeError):
        return float(np.finfo(np.float32).max)


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def _exact(name: str, got: np.ndarray, ref: np.ndarray, batch: int | None,
           step: float | None = None) -> OutputCheck:
    """Integer and bool outputs: equal, element for element (within ``QUANT_STEPS * step``
    for a quantized output)."""
    g, r = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    diff = np.abs(g - r)
    allowed = QUANT_STEPS * step if step else 0.0
    mism = int(np.count_nonzero(diff > allowed))
    if not mism:
        return OutputCheck(name, batch, float(diff.max(initial=0.0)), 0.0, True)
    i = int(np.argmax(diff))
    rule = f"within {allowed:g} of each other" if allowed else "exactly"
    why = (f"differs in {mism} of {got.size} values (integers must match {rule}); worst at "
           f"{_index(i, ref.shape)}: got {got.ravel()[i]}, reference {ref.ravel()[i]}")
    return OutputCheck(name, batch, float(diff.max()), 1.0, False, why, float("-inf"), 0.0,
                       _index(i, ref.shape), float(g[i]), float(r[i]))


def _snr_cosine(g: np.ndarray, r: np.ndarray, err: np.ndarray) -> tuple[float, float]:
    """SNR (dB) and cosine similarity over the finite reference values."""
    finite = np.isfinite(r) & np.isfinite(g)
    gf, rf, ef = g[finite], r[finite], err[finite]
    noise, signal = float(np.dot(ef, ef)), float(np.dot(rf, rf))
    if not np.isfinite(err).all():
        snr = float("-inf")
    elif noise == 0:
        snr = float("inf")
    elif signal == 0:
        snr = float("-inf")
    else:
        snr = 10 * np.log10(signal / noise)
    norms = float(np.linalg.norm(gf) * np.linalg.norm(rf))
    cosine = float(np.dot(gf, rf) / norms) if norms > 0 else float(noise == 0)
    return float(snr), cosine


def _scattered_within(err: np.ndarray, signed: np.ndarray, step: float) -> bool:
    """A quantized output's errors are rounding ties decided the other way: RMS at most
    ``QUANT_RMS_STEPS`` steps, scattered both ways (mean at most one step: a misread zero point
    moves every element the same way)."""
    if not np.all(np.isfinite(err)):
        return False
    if float(np.sqrt(np.mean(np.square(err)))) > QUANT_RMS_STEPS * step:
        return False
    return abs(float(np.mean(np.where(err > 0, signed, 0.0)))) <= step


def compare_output(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float,
                   batch: int | None = None, magnitude: float | None = None,
                   step: float | None = None) -> OutputCheck:
    """Compare one output with its reference (the rule is in the module docstring);
    ``magnitude``: the largest |value| of the inputs that computed it, if known; ``step``: the
    output's quantization step in a quantized model (None: not quantized)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if not _same_shape(got, ref):
        return OutputCheck(name, batch, float("inf"), float("inf"), False,
                           f"has shape {got.shape}, the reference {ref.shape}",
                           float("-inf"), 0.0)
    got, ref = got.reshape(ref.shape), ref
    if got.size == 0:
        return OutputCheck(name, batch, 0.0, 0.0, True)
    narrow = NARROW_EPS.get(ref.dtype.name, NARROW_EPS.get(got.dtype.name, 0.0))
    if ref.dtype.name in BITS_DTYPES and got.dtype.kind == "u" \
            and got.dtype.itemsize == ref.dtype.itemsize:  # the runtime returns their bits
        got = got.view(ref.dtype)
    if not (_is_float(ref.dtype) or _is_float(got.dtype)):
        return _exact(name, got, ref, batch, step)
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    scale = float(np.abs(r[finite]).max()) if finite.any() else 1.0
    scale = scale if scale > 0 else 1.0
    mag = max(scale, float(magnitude)) if magnitude is not None and np.isfinite(magnitude) \
        else scale
    # An infinity meets the same infinity or the largest finite value of that sign: references
    # mask with -inf or with the lowest float (ONNX Runtime's Attention).
    big = _largest_float(ref.dtype)
    saturated = (np.abs(g) >= big) & (np.abs(r) >= big) & (np.sign(g) == np.sign(r))
    same_special = (np.isnan(g) & np.isnan(r)) | (np.isinf(r) & (g == r)) | saturated
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(same_special, 0.0, np.abs(g - r))
    err = np.where(np.isnan(err), np.inf, err)
    rounding = mag * (ROUNDING_K * EPS_F32 + NARROW_K * narrow)
    allowed = max(atol * scale, rounding) + rtol * np.abs(np.where(finite, r, 0.0))
    if step is not None:
        allowed = allowed + QUANT_STEPS * step
    bad = err > allowed
    n_bad = int(np.count_nonzero(bad))
    max_abs = float(err.max())
    snr, cosine = _snr_cosine(np.where(same_special, 0.0, g), np.where(same_special, 0.0, r),
                              err)
    rms_steps_ok = bool(step) and _scattered_within(err, g - r, step)
    if n_bad == 0 or snr >= (MIN_SNR_DB if step is None else QUANT_MIN_SNR_DB) or rms_steps_ok:
        return OutputCheck(name, batch, max_abs, max_abs / scale, True, "", snr, cosine)
    i = int(np.argmax(np.where(bad, err - allowed, -np.inf)))
    why = (f"differs beyond the tolerance in {n_bad} of {got.size} values (SNR {snr:.1f} dB, "
           f"cosine similarity {cosine:.6f}); worst at {_index(i, ref.shape)}: got "
           f"{got.ravel()[i]:.7g}, reference {ref.ravel()[i]:.7g}, |difference| "
           f"{err.ravel()[i]:.3g} > allowed {allowed.ravel()[i]:.3g}")
    return OutputCheck(name, batch, max_abs, max_abs / scale, False, why, snr, cosine,
                       _index(i, ref.shape), float(g.ravel()[i]), float(r.ravel()[i]))


def check_model(model: Any, inputs: Mapping[str, np.ndarray],
                outputs: Mapping[str, np.ndarray], rtol: float, atol: float,
                magnitudes: Mapping[str, float] | None = None,
                steps: Mapping[str, float] | None = None) -> CheckResult:
    """Run ``model`` (a loaded ``Model``) on ``inputs`` and compare with ``outputs``; for a
    dynamic-batch model also on the first ``b`` rows for each smaller plan size ``b``.
    ``magnitudes``: per output, the largest |value| of the inputs that computed it; ``steps``:
    per output of a quantized model, its quantization step."""
    mags = magnitudes or {}
    steps = steps or {}
    result = CheckResult(rtol=rtol, atol=atol, quantized=bool(steps))
    got = model.run(dict(inputs))
    for name, ref in outputs.items():
        result.checks.append(compare_output(name, got[name], ref, rtol, atol,
                                            magnitude=mags.get(name), step=steps.get(name)))
    batch = getattr(model, "batch", None)
    if batch is not None:
        n = {inputs[k].shape[0] for k in batch.inputs if k in inputs}
        n_rows = n.pop() if len(n) == 1 else 0
        for b in batch.sizes:
            if b >= n_rows:
                continue
            part = {k: (v[:b] if k in batch.inputs else v) for k, v in inputs.items()}
            got = model.run(part)
            for name, ref in outputs.items():
                ref_b = ref[:b] if name in batch.outputs else ref
                result.checks.append(compare_output(name, got[name], ref_b, rtol, atol, b,
                                                    mags.get(name), steps.get(name)))
    return result


def golden_arrays(reader: Any, header: Header | None = None
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Golden]:
    """The (inputs, outputs, record) of a bundle's golden pair (``header``: the reader's header
    already validated); ``NoGoldenDataError`` if none."""
    if header is None:
        header = Header.from_msgpack(reader.header, reader.data_size, reader.name)
    rec = header.golden
    if rec is None:
        raise NoGoldenDataError(f"{reader.name} carries no golden data (exported before mlcpack "
                                "embedded it, with --no-check, with no reference that could "
                                "run at export, or the pair was too large): nothing to verify; "
                                "export it again to add it")
    arrays = [{row.name: reader.array(row.data, row.shape, row.dtype) for row in rows}
              for rows in (rec.inputs, rec.outputs)]
    return arrays[0], arrays[1], rec


def verify(path: str | os.PathLike, *, threads: int | None = None,
           rtol: float | None = None, atol: float | None = None) -> CheckResult:
    """Load the bundle with this runtime, run its golden input and compare with its golden
    output (with the tolerance it records, or ``rtol``/``atol``)."""
    from .model import load

    with load(path, threads=threads) as model:
        inputs, outputs, rec = golden_arrays(model._reader, model.schema)
        names = {s.name for s in model.outputs}
        if set(outputs) != names or set(inputs) != {s.name for s in model.inputs}:
            raise BundleError(f"{model.name}: golden data names other tensors than the model's "
                              "inputs and outputs")
        return check_model(model, inputs, outputs,
                           float(rec.rtol if rtol is None else rtol),
                           float(rec.atol if atol is None else atol), golden_magnitudes(rec),
                           golden_magnitudes(rec, "quant_step"))


def golden_magnitudes(rec: Golden, key: str = "magnitude") -> dict[str, float]:
    """Per output, the magnitude the exporter recorded (optional in the record: bundles from
    before it compare against the output's own scale); with ``key="quant_step"``, the
    quantization step of a quantized model's outputs. Advice: a value that is not a finite
    non-negative number is ignored."""
    out = {}
    for row in rec.outputs:
        value = getattr(row, key)
        if isinstance(value, (int, float)) and np.isfinite(value) and value >= 0:
            out[row.name] = float(value)
    return out
