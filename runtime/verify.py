"""The golden check: a bundle may carry one input/output pair its exporter computed with a
reference (onnxruntime, onnx's ReferenceEvaluator, or the numpy reference of the IR). ``verify``
re-runs it with this runtime alone and compares.

Tolerance, per output: ``|got - ref| <= atol * scale + rtol * |ref|`` elementwise, where ``scale``
is the output's largest finite ``|ref|`` (1 when that is 0), so ``atol`` is relative to the output's
scale. NaN must meet NaN. Integer and bool outputs must match exactly. The reported errors are the
largest ``|got - ref|`` (abs) and that divided by ``scale`` (rel).

A dynamic-batch bundle's pair holds a batch of its largest size (or the one the exporter was
given): the whole batch runs, and so do its first ``b`` rows for every smaller plan size ``b``, so
every plan is checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .bundle import check_dtype, check_shape, payload_ref
from .errors import BundleError, MlcpackError

GOLDEN_KEY = "golden"


class GoldenMismatchError(MlcpackError):
    """The bundle's outputs differ from its golden (reference) outputs beyond the tolerance."""

    exit_code = 13


class NoGoldenDataError(MlcpackError):
    """The bundle carries no golden input/output pair to verify (older, or exported without)."""

    exit_code = 14


@dataclass
class OutputCheck:
    name: str
    batch: int | None           # the rows run (dynamic-batch bundles), None: the whole pair
    max_abs: float
    max_rel: float
    ok: bool
    why: str = ""


@dataclass
class CheckResult:
    checks: list[OutputCheck] = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def max_abs(self) -> float:
        return max((c.max_abs for c in self.checks), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((c.max_rel for c in self.checks), default=0.0)

    def worst(self) -> OutputCheck | None:
        bad = [c for c in self.checks if not c.ok]
        return max(bad or self.checks, key=lambda c: c.max_rel, default=None)

    def summary(self) -> str:
        w = self.worst()
        where = ""
        if w is not None and not self.ok:
            rows = f" (first {w.batch} rows)" if w.batch is not None else ""
            where = f"; output {w.name!r}{rows} {w.why or 'differs'}"
        return (f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g} "
                f"(tolerance rtol {self.rtol:g}, atol {self.atol:g} x output scale){where}")


def compare_output(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float,
                   batch: int | None = None) -> OutputCheck:
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return OutputCheck(name, batch, float("inf"), float("inf"), False,
                           f"has shape {got.shape}, the reference {ref.shape}")
    if got.size == 0:
        return OutputCheck(name, batch, 0.0, 0.0, True)
    if ref.dtype.kind not in "fc" and got.dtype.kind not in "fc":
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        mism = int(np.count_nonzero(diff))
        return OutputCheck(name, batch, float(diff.max()), float(mism > 0), mism == 0,
                           f"differs in {mism} of {got.size} values" if mism else "")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    scale = float(np.abs(r[finite]).max()) if finite.any() else 1.0
    scale = scale if scale > 0 else 1.0
    same_special = (np.isnan(g) & np.isnan(r)) | (np.isinf(r) & (g == r))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(same_special, 0.0, np.abs(g - r))
    err = np.where(np.isnan(err), np.inf, err)
    allowed = atol * scale + rtol * np.abs(np.where(finite, r, 0.0))
    bad = int(np.count_nonzero(err > allowed))
    max_abs = float(err.max())
    return OutputCheck(name, batch, max_abs, max_abs / scale, bad == 0,
                       f"differs beyond the tolerance in {bad} of {got.size} values"
                       if bad else "")


def check_model(model: Any, inputs: Mapping[str, np.ndarray],
                outputs: Mapping[str, np.ndarray], rtol: float, atol: float) -> CheckResult:
    """Run ``model`` (a loaded ``Model``) on ``inputs`` and compare with ``outputs``; for a
    dynamic-batch model also on the first ``b`` rows for each smaller plan size ``b``."""
    result = CheckResult(rtol=rtol, atol=atol)
    got = model.run(dict(inputs))
    for name, ref in outputs.items():
        result.checks.append(compare_output(name, got[name], ref, rtol, atol))
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
                result.checks.append(compare_output(name, got[name], ref_b, rtol, atol, b))
    return result


def golden_arrays(reader: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray],
                                        dict[str, Any]]:
    """The (inputs, outputs, record) of a bundle's golden pair; ``NoGoldenDataError`` if none."""
    rec = reader.header.get(GOLDEN_KEY)
    if rec is None:
        raise NoGoldenDataError(f"{reader.name} carries no golden data (exported before mlcpack "
                                "embedded it, with --no-check, or the pair was too large): "
                                "nothing to verify; export it again to add it")
    if not isinstance(rec, dict) or not isinstance(rec.get("inputs"), list) \
            or not isinstance(rec.get("outputs"), list):
        raise BundleError(f"{reader.name}: golden record is malformed")
    arrays = []
    for kind in ("inputs", "outputs"):
        out = {}
        for i, row in enumerate(rec[kind]):
            what = f"golden {kind[:-1]} {i}"
            if not isinstance(row, dict) or not isinstance(row.get("name"), str):
                raise BundleError(f"bundle header: {what} is malformed")
            shape = check_shape(row.get("shape"), what)
            dtype = check_dtype(row.get("dtype"), what)
            ref = payload_ref(row.get("data"), what, reader.data_size)
            out[row["name"]] = reader.array(ref, shape, dtype)
        arrays.append(out)
    for key in ("rtol", "atol"):
        if not isinstance(rec.get(key), (int, float)) or not 0 <= rec[key] < 1e6:
            raise BundleError(f"{reader.name}: golden record has no valid {key}")
    return arrays[0], arrays[1], rec


def verify(path: str | os.PathLike, *, threads: int | None = None,
           rtol: float | None = None, atol: float | None = None) -> CheckResult:
    """Load the bundle with this runtime, run its golden input and compare with its golden
    output (with the tolerance it records, or ``rtol``/``atol``)."""
    from .model import load

    with load(path, threads=threads) as model:
        inputs, outputs, rec = golden_arrays(model._reader)
        names = {s.name for s in model.outputs}
        if set(outputs) != names or set(inputs) != {s.name for s in model.inputs}:
            raise BundleError(f"{model.name}: golden data names other tensors than the model's "
                              "inputs and outputs")
        return check_model(model, inputs, outputs,
                           float(rec["rtol"] if rtol is None else rtol),
                           float(rec["atol"] if atol is None else atol))
