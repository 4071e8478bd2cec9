"""The export's golden check: run the source model once with a reference, embed the pair in the
bundle, and refuse the export when the compiled bundle, loaded with the runtime on this host,
disagrees. ``runtime/selftest.py`` holds the comparison (``mlcpack verify`` re-runs the pair with
the runtime alone).

References, and which may refuse an export:

- ONNX models with onnxruntime installed: ONNX Runtime is the reference. It checks the ONNX
  import and the compiler together, and a disagreement refuses the export.
- ONNX models without onnxruntime (a plain ``pip install mlcpack``): the numpy reference of the
  IR (``evaluate_ir``: each operator's ``OpDef.reference``, library calls through the runtime's
  library functions) is the reference that may refuse; it checks the compiled code, not the
  import. ``onnx.reference.ReferenceEvaluator`` runs beside it as advice only: it differs from
  ONNX Runtime where it departs from the spec (its Conv with auto_pad and BatchNormalization
  with a momentum attribute run as the spec says here: ``frontends.reference.spec_ops``), so a
  disagreement is a one-line warning and never fails the export; advice that cannot run adds
  "no advice: ..." to the summary. The summary says the import
  was not independently checked and that ``pip install 'mlcpack[check]'`` adds ONNX Runtime.
  The advice is asked by default only where it is cheap (``advice_too_large``): its
  convolutions gather every window into memory (im2col) and its pools and transposed
  convolutions loop in Python, so on a large model it would take most of the export and
  gigabytes (DNSMOS at the check size: 37 CPU-s and 5.7 GB, against 6 CPU-s for the IR's
  reference); the summary then says it was not asked and why. ``--check-advice`` asks it
  always, ``--no-check-advice`` never (``ExportOptions.check_advice``: None, True, False).
- Everything else (pickled weights, the builder API): the numpy reference of the IR.

The IR's numpy reference also runs beside ONNX Runtime, for the magnitudes the comparison's
float32-rounding term needs (the largest |value| among each output's inputs).

The references themselves (ONNX Runtime, onnx.reference, eager torch) are
``frontends/reference.py``'s; ``MLCPACK_NO_ORT=1`` there makes ``onnx_reference`` behave as if
onnxruntime were not installed (the tests use it to run the default path both ways).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..runtime.errors import CpuFeatureError, LibraryFunctionError, MlcpackError
from ..runtime.header import Golden as GoldenRecord, GoldenRow, Header
from ..frontends.reference import Reference, ReferenceUnavailable
from ..runtime.selftest import CheckResult, check_model, compare_output
from .bundle_writer import BundleWriteError
from .errors import ExportError
from .ir.graph import Call, CallLibrary, Constant, Function, IRModule, Var
from .golden_inputs import choose_inputs, sizes_unmet
from .golden_quant import quantization_step, quantized_input_ranges

MAX_EMBED_BYTES = 4 << 20
IR_REFERENCE = "the numpy reference of the IR"
CHECK_EXTRA = "pip install 'mlcpack[check]'"


def _export_error(message: str) -> Exception:
    return ExportError(message)


class IntegerDivisionByZero(ReferenceUnavailable):
    """The check input makes the model divide an integer by zero, which compiled code (x86's
    idiv) may trap on, killing the process: the bundle is not run on it."""


@dataclass
class Golden:
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    reference: str
    seed: int | None
    rtol: float
    atol: float
    skipped: str | None = None   # why no reference ran (then nothing is checked)
    magnitudes: dict[str, float] = field(default_factory=dict)  # per output, see runtime/selftest.py
    steps: dict[str, float] = field(default_factory=dict)  # quantized models: per output, ditto
    note: str | None = None      # appended to the check's summary line
    warnings: list[str] = field(default_factory=list)  # advice that does not fail the export
    second: Reference | None = None  # asked when the bundle disagrees with ONNX Runtime


# ---- references ---------------------------------------------------------------------------------

# onnx.reference's advice is asked by default while its estimated cost stays under both:
ADVICE_MAX_SECONDS = 10.0          # CPU seconds, by ``AdviceWork.seconds``' estimate
ADVICE_MAX_BYTES = 1 << 30         # its largest convolution's working memory
_POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.pool", "nn.max_pool_indices")


class AdviceWork:
    """What onnx.reference's ``ReferenceEvaluator`` would do to run the model at the check's
    sizes, counted from the shapes the IR's numpy reference meets (``evaluate_ir``'s
    ``work``), so that whether the advice runs is decided the same way on every machine.
    onnx 1.22's Conv gathers every window into one array (im2col, with an int64 index array
    per spatial axis) and multiplies it out, once per batch and group when grouped; its
    MaxPool, AveragePool and LpPool visit each window, and ConvTranspose's col2im each
    column element, in Python loops. The seconds are an estimate (on a 2024 x86 core: about
    40 ns per gathered value, 0.5 us per Python loop step, 100 us per grouped call; DNSMOS
    sig_bak_ovr at the check size: estimated 19 s / 5.4 GB, measured 37 CPU-s / 5.7 GB);
    the other operators are whole-array numpy calls and not counted."""

    GATHER_SECONDS, LOOP_SECONDS, CALL_SECONDS = 40e-9, 0.5e-6, 100e-6

    def __init__(self) -> None:
        self.gathered = 0    # values its convolutions' im2col gathers
        self.loops = 0       # steps of its Python loops
        self.calls = 0       # grouped convolutions' per-batch-and-group calls
        self.peak_bytes = 0  # the largest convolution's im2col memory

    def add(self, op: str, attrs: Mapping[str, Any], args: list[np.ndarray],
            result: np.ndarray) -> None:
        if op in ("nn.conv2d", "nn.conv") and len(args) >= 2 and args[0].ndim >= 3:
            x, w = args[0], args[1]
            dilation = tuple(attrs.get("dilation") or ()) or (1,) * (w.ndim - 2)
            taps = int(np.prod([k + (k - 1) * (d - 1) for k, d in zip(w.shape[2:], dilation)]))
            groups = int(attrs.get("groups", 1) or 1)
            positions = int(np.prod(result.shape[2:]))
            per_image = x.shape[1] // groups * taps * positions    # one call's im2col rows
            batch = 1 if groups > 1 else x.shape[0]                # grouped: one image a call
            self.gathered += x.shape[0] * x.shape[1] * taps * positions
            if groups > 1:
                self.calls += x.shape[0] * groups
            # the gathered windows and their concatenation, plus the index arrays
            self.peak_bytes = max(self.peak_bytes, 2 * batch * per_image * x.dtype.itemsize
                                  + 8 * (x.ndim - 2) * per_image)
        elif op in _POOLS:
            self.loops += result.size * int(np.prod(attrs.get("kernel") or (1,)))
        elif op == "nn.conv_transpose" and len(args) >= 2:   # weight [C, O/groups, k...]
            x, w = args[0], args[1]
            self.loops += x.shape[0] * result.shape[1] * int(np.prod(w.shape[2:])) \
                * int(np.prod(x.shape[2:]))

    @property
    def seconds(self) -> float:
        return (self.gathered * self.GATHER_SECONDS + self.loops * self.LOOP_SECONDS
                + self.calls * self.CALL_SECONDS)


def advice_too_large(work: AdviceWork) -> str:
    """Why onnx.reference's advice is not asked by default ("" when it is): its estimated
    time or memory over ``ADVICE_MAX_SECONDS`` / ``ADVICE_MAX_BYTES``."""
    over = []
    if work.seconds > ADVICE_MAX_SECONDS:
        over.append(f"about {work.seconds:.0f} CPU-s (limit {ADVICE_MAX_SECONDS:.0f})")
    if work.peak_bytes > ADVICE_MAX_BYTES:
        over.append(f"{work.peak_bytes / 2**30:.1f} GiB for one convolution (limit "
                    f"{ADVICE_MAX_BYTES / 2**30:.0f} GiB)")
    if not over:
        return ""
    return ("onnx.reference was not asked for advice: at the check size it would take "
            + " and ".join(over) + " by mlcpack's estimate; --check-advice asks it")


def evaluate_ir(mod: IRModule, feeds: Mapping[str, np.ndarray],
                params: Mapping[str, np.ndarray] | None = None,
                magnitudes: dict[str, float] | None = None,
                steps: dict[str, float] | None = None,
                float_activations: bool = False,
                work: AdviceWork | None = None,
                values: dict[int, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run ``main`` with numpy: each high-level call through its op's reference. If
    ``magnitudes`` is a dict, fill it, per output, with the largest finite |value| among the
    output and the inputs of the call that computed it, looking through calls that only move
    data (reshape, transpose, concat, slices): the size of the values whose float32 rounding
    the output carries (``runtime/selftest.py``). If ``steps`` is a dict and the module
    quantizes, fill it with each output's quantization step. ``float_activations``: a
    ``dequantize`` of a ``quantize``'s result gives the quantize's float input back (the model
    without its activations' quantization; weights stay quantized). ``work``: counts what
    onnx.reference would do for each call at these sizes (``AdviceWork.add``). If ``values``
    is a dict, fill it with every parameter's and binding's value, by the Var's id (the bf16
    guard's runs that recompute only what a rounded layer reaches: precision.py)."""
    from ..runtime import library
    from .ir.concrete import SizeMismatch, bind_sizes, concrete, concrete_shape
    from .ops import get_op
    from .ops.registry import INJECTIVE, VIEW

    fn = mod.functions["main"]
    if not isinstance(fn, Function):
        raise ReferenceUnavailable("main is not a graph function")
    env: dict[int, np.ndarray] = {}
    carried: dict[int, float] = {}  # var id -> the magnitude its value carries
    quantized = steps is not None and any(
        isinstance(b.value, Call) and b.value.op in ("quantize", "dequantize")
        for b in fn.bindings())
    qstep: dict[int, float] = {}    # var id -> the quantization step its value carries
    unquantized: dict[int, np.ndarray] = {}  # float_activations: quantize var id -> its input
    for p in fn.params:
        source = params if params and p.name in params else feeds
        env[id(p)] = np.asarray(source[p.name])
    # a symbolic-shape module runs at the inputs' sizes (ir/concrete.py)
    try:
        sizes = bind_sizes(fn.params, {p.name: env[id(p)] for p in fn.params})
        if getattr(mod, "value_vars", None):   # sizes set by inputs' values
            from ..runtime.values import bind_values
            from .vm_emit import value_rows
            from ..runtime.errors import InputError
            try:
                bind_values(value_rows(mod), {p.name: env[id(p)] for p in fn.params}, sizes)
            except InputError as exc:
                raise SizeMismatch(str(exc)) from None
    except SizeMismatch as exc:
        raise ReferenceUnavailable(f"the check inputs do not fit the model: {exc}") from None

    def value(v: Any) -> np.ndarray:
        if isinstance(v, Constant):
            return v.data
        if id(v) not in env:
            raise ReferenceUnavailable(f"{getattr(v, 'name', v)} is used before it is defined")
        return env[id(v)]

    own: dict[int, float] = {}      # var or constant id -> its own largest |value|, once

    def largest(v: Any) -> float:
        if id(v) not in own:
            own[id(v)] = _largest(value(v))
        return own[id(v)]

    def carried_by(v: Any) -> float:
        return carried[id(v)] if id(v) in carried else largest(v)

    branch_outputs: dict[int, list[np.ndarray]] = {}   # an if's binding -> its outputs
    for b in fn.bindings():
        v = b.value
        if isinstance(v, Call) and v.op in ("if", "if_output", "check", "loop", "loop_output",
                                            "loop_rows"):
            env[id(b.var)] = _run_branch(mod, v, value, branch_outputs, id(b.var))
            if v.op in ("loop", "loop_output"):   # resized carried values: their final extents
                _bind_final_extents(b.var.type.shape, np.shape(env[id(b.var)]), mod, sizes)
            if magnitudes is not None:
                carried[id(b.var)] = _largest(env[id(b.var)])
            continue
        if isinstance(v, (Var, Constant)):
            env[id(b.var)] = value(v)
            if magnitudes is not None:
                carried[id(b.var)] = carried_by(v)
            qstep[id(b.var)] = qstep.get(id(v), 0.0)
            if id(v) in unquantized:
                unquantized[id(b.var)] = unquantized[id(v)]
            continue
        if isinstance(v, Call):
            args = [value(a) for a in v.args]
            if v.op in ("divide", "mod") and len(args) == 2 and args[1].dtype.kind in "iu" \
                    and not np.all(args[1]):
                raise IntegerDivisionByZero(
                    f"the check input divides an integer by zero ({b.var.name}; integer inputs "
                    "are zeros by default: give real ones with --check-input)")
            if float_activations and v.op == "dequantize" and id(v.args[0]) in unquantized:
                result = unquantized[id(v.args[0])]
            else:
                result = np.asarray(get_op(v.op).reference(*args, **concrete(v.attrs, sizes)))
            if float_activations and v.op == "quantize":
                unquantized[id(b.var)] = args[0]
            if v.op == "bind_size":   # a size a kernel counted: the ops after it read it
                sizes[v.attrs["var"]] = int(np.asarray(result).reshape(-1)[0])
            env[id(b.var)] = result.astype(v.type.dtype, copy=False).reshape(
                concrete_shape(v.type.shape, sizes))
            if work is not None:
                work.add(v.op, v.attrs, args, env[id(b.var)])
            moves = get_op(v.op).kind in (VIEW, INJECTIVE)
            if quantized:
                qstep[id(b.var)] = quantization_step(v.op, get_op(v.op).kind, args,
                                                      [qstep.get(id(a), 0.0) for a in v.args])
        elif isinstance(v, CallLibrary):
            try:
                (fn_lib,) = library.resolve([v.func], None, "the model").values()
            except MlcpackError as exc:
                raise ReferenceUnavailable(str(exc)) from None
            out = np.empty(concrete_shape(v.type.shape, sizes), v.type.dtype)
            fn_lib(*[value(a) for a in v.args], out=out, **concrete(v.attrs, sizes))
            env[id(b.var)], moves = out, False
        else:
            raise ReferenceUnavailable(f"{b.var.name} is a {type(v).__name__}, which the numpy "
                                       "reference cannot evaluate")
        if magnitudes is not None:
            inputs = [carried_by(a) if moves else largest(a) for a in v.args]
            carried[id(b.var)] = max([largest(b.var), *inputs])
    if magnitudes is not None:
        magnitudes.update({name: carried_by(o) for name, o in zip(fn.output_names, fn.outputs)})
    if quantized and steps is not None:
        steps.update({name: qstep.get(id(o), 0.0) for name, o in zip(fn.output_names, fn.outputs)})
    if values is not None:
        values.update(env)
    return {name: np.asarray(value(o)) for name, o in zip(fn.output_names, fn.outputs)}


def _run_branch(mod: IRModule, v: Any, value: Any, outputs: dict[int, list[np.ndarray]],
                key: int) -> np.ndarray:
    """The value of an ``if`` (its taken branch's function, run by ``evaluate_ir``; its
    outputs kept in ``outputs`` under ``key`` for its ``if_output``s), an ``if_output`` or a
    ``check`` (ops/control.py)."""
    if v.op in ("if_output", "loop_output", "loop_rows"):
        return outputs[id(v.args[0])][v.attrs["index"]]
    if v.op == "loop":
        return _run_loop(mod, v, value, outputs, key)
    flag = bool(np.asarray(value(v.args[0])).reshape(-1)[0])
    if v.op == "check":
        if flag:
            raise ReferenceUnavailable(f"the check inputs break a size relation a branch of an "
                                       f"If or a Loop's body needs ({v.attrs.get('where', '')})")
        return value(v.args[0])
    taken = v.attrs["branches"][0 if flag else 1]
    if not taken:
        raise ReferenceUnavailable("the check inputs take a branch of an If that the export "
                                   "left out")
    branch = mod.functions[taken]
    sub = dataclasses.replace(mod.copy(), value_vars=[])
    sub.functions["main"] = branch
    result = evaluate_ir(sub, {p.name: value(a) for p, a in zip(branch.params, v.args[1:])})
    outputs[key] = [result[name] for name in branch.output_names[:len(v.attrs["outputs"])]]
    return outputs[key][0]


def _bind_final_extents(shape: tuple, got: tuple, mod: IRModule, sizes: dict) -> None:
    """A loop output's run-time-bound sizes (a carried value's ``carriedK``, bound in its
    body at each iteration) take the extents the loop ended with."""
    from .ir.sym import SymExpr

    for d, n in zip(shape, got):
        if isinstance(d, SymExpr) and str(d) in mod.dynamic_sizes:
            sizes[str(d)] = int(n)


def _run_loop(mod: IRModule, v: Any, value: Any, outputs: dict[int, list[np.ndarray]],
              key: int) -> np.ndarray:
    """The value of a ``loop`` (ops/control.py): its body function run by ``evaluate_ir``
    while the iteration number is below the trip count and the condition holds; its carried
    values kept in ``outputs`` under ``key`` for its ``loop_output``s."""
    body = mod.functions[v.attrs["body"]]
    n = v.attrs["carried"]
    trip = int(np.asarray(value(v.args[0])).reshape(-1)[0])
    running = bool(np.asarray(value(v.args[1])).reshape(-1)[0])
    grown = v.attrs.get("grown", ())
    state = [value(a) for a in v.args[2:2 + n]]
    captures = [value(a) for a in v.args[2 + n:len(v.args) - len(grown)]]
    pieces = [[value(a)] for a in v.args[len(v.args) - len(grown):]]   # format 1.10
    sub = dataclasses.replace(mod.copy(), value_vars=[])
    sub.functions["main"] = body
    row_types = v.attrs.get("rows", ())
    rows: list[list[np.ndarray]] = [[] for _ in row_types]   # format 1.9: appended rows
    k = 0
    while running and k < trip:
        feed = [np.array(k, np.int64)] + state + captures
        result = evaluate_ir(sub, {p.name: x for p, x in zip(body.params, feed)})
        got = [result[name] for name in body.output_names]
        running = bool(np.asarray(got[0]).reshape(-1)[0])
        state = got[1:1 + n]
        for r, x in zip(rows, got[1 + n:]):
            r.append(np.asarray(x))
        for r, x in zip(pieces, got[1 + n + len(row_types):]):
            r.append(np.asarray(x))
        k += 1
    stacks = [np.stack(r) if r else np.zeros((0,) + tuple(shape), dtype)
              for r, (shape, dtype) in zip(rows, row_types)]
    outputs[key] = state + stacks + [np.concatenate(r, axis=g[0])
                                     for r, g in zip(pieces, grown)]
    return state[0]


def _largest(a: np.ndarray) -> float:
    """The largest finite |value| of a float array; 0 for other dtypes and empty arrays."""
    a = np.asarray(a)
    if a.dtype.kind != "f" or a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        low, high = a.min(), a.max()   # two passes that copy nothing, where all are finite
        if np.isfinite(low) and np.isfinite(high):
            return float(max(-low, high))
        m = np.abs(a[np.isfinite(a)]).max(initial=0.0)
    return float(m)


# ---- the check --------------------------------------------------------------------------------

_REFERENCE_ERRORS = (ReferenceUnavailable, FloatingPointError, ValueError, TypeError, KeyError,
                     IndexError)


def prepare_golden(mod: IRModule, params: Mapping[str, np.ndarray] | None, opts: Any) -> Golden:
    """Choose the inputs and run the references (before anything is compiled): the one that may
    refuse the export, the IR's numpy reference for the magnitudes, and advice (see the module
    docstring). numpy's BLAS runs on one thread meanwhile (``blas_threads.py``: the compile
    workers have the cores; more threads only spun against them)."""
    from .blas_threads import one_blas_thread
    with one_blas_thread():
        return _prepare_golden(mod, params, opts)


def _prepare_golden(mod: IRModule, params: Mapping[str, np.ndarray] | None, opts: Any) -> Golden:
    fn = mod.main
    chosen = choose_inputs(mod, params, opts, quantized_input_ranges(fn))
    inputs, seed = chosen.inputs, chosen.seed
    reference = opts.reference
    refuses = reference is not None and getattr(reference, "refuses", True)
    magnitudes: dict[str, float] = {}
    steps: dict[str, float] = {}
    advice = reference is not None and not refuses   # an ONNX model without onnxruntime
    asked = getattr(opts, "check_advice", None)        # --check-advice: None, True, False
    work = AdviceWork() if advice and asked is None else None
    ir_outputs, ir_failed = None, ""
    unmet = sizes_unmet(mod, inputs, params)
    if unmet:   # inputs read as sizes whose check values the model's relations refuse
        return Golden(inputs, {}, IR_REFERENCE, seed, opts.check_rtol, opts.check_atol,
                      skipped=unmet, note=chosen.note)
    try:
        with np.errstate(all="ignore"):  # random inputs may meet log(-1): NaN, not a warning
            ir_outputs = evaluate_ir(mod, inputs, params, magnitudes, steps, work=work)
    except IntegerDivisionByZero as exc:
        return Golden(inputs, {}, IR_REFERENCE, seed, opts.check_rtol, opts.check_atol,
                      skipped=str(exc), note=chosen.note)
    except _REFERENCE_ERRORS as exc:
        magnitudes, steps, ir_failed = {}, {}, _failure(IR_REFERENCE, exc)
    name = (opts.reference_name or getattr(reference, "name", "the given reference")) \
        if refuses else IR_REFERENCE
    golden = Golden(inputs, {}, name, seed, opts.check_rtol, opts.check_atol,
                    magnitudes=magnitudes, steps=steps, note=chosen.note,
                    second=getattr(reference, "second", None))
    if advice:
        golden.note = "; ".join(n for n in (golden.note, (
            "the ONNX import was not independently checked (onnxruntime is not "
            f"installed; {CHECK_EXTRA} adds it)")) if n)
    if refuses:
        try:
            with np.errstate(all="ignore"):
                outputs = reference(dict(inputs))
        except _REFERENCE_ERRORS as exc:
            golden.skipped = _failure(name, exc)
            return golden
    elif ir_outputs is None:
        golden.skipped = ir_failed
        return golden
    else:
        outputs = ir_outputs
    missing = [n for n in fn.output_names if n not in outputs]
    if missing:
        raise _export_error(f"the reference ({name}) gave no output {missing[0]!r}")
    # np.asarray keeps a scalar's shape (); np.ascontiguousarray would make it (1,)
    golden.outputs = {n: np.asarray(outputs[n], order="C") for n in fn.output_names}
    if steps and any(v == 0.0 for v in steps.values()):
        steps.update(_noise_steps(mod, inputs, params, golden.outputs, steps))
    if advice:
        not_asked = "onnx.reference was not asked for advice (--no-check-advice)" \
            if asked is False else advice_too_large(work) if work is not None else ""
        if not_asked:
            golden.note += f"; {not_asked}"
        else:
            golden.warnings = advise(reference, golden)
    return golden


def _noise_steps(mod: IRModule, inputs: Mapping[str, np.ndarray],
                 params: Mapping[str, np.ndarray] | None, outputs: Mapping[str, np.ndarray],
                 steps: Mapping[str, float]) -> dict[str, float]:
    """The step of a quantized model's float outputs that no dequantize reaches directly (a
    softmax after the last quantized layer): half the RMS change the activations' quantization
    makes to the output (the reference against the IR's numpy reference with every activation
    left in float). ``runtime/selftest.py`` passes an output whose RMS error is at most 4 steps,
    so the bundle may differ from the reference by twice the noise the model's own scales put
    on it (6 dB below its SNR against float): one tie decided the other way early in a deep
    network moves every later activation by whole steps. Empty when the reference fails."""
    try:
        with np.errstate(all="ignore"):
            float_run = evaluate_ir(mod, inputs, params, float_activations=True)
    except _REFERENCE_ERRORS:
        return {}
    out = {}
    for name, step in steps.items():
        ref, flt = np.asarray(outputs.get(name)), np.asarray(float_run.get(name))
        if step != 0.0 or ref.dtype.kind != "f" or ref.shape != flt.shape or ref.size == 0:
            continue
        noise = ref.astype(np.float64) - flt.astype(np.float64)
        rms = float(np.sqrt(np.mean(np.square(noise)))) if np.all(np.isfinite(noise)) else 0.0
        if rms > 0.0:
            out[name] = rms / 2
    return out


def _failure(name: str, exc: Exception) -> str:
    if isinstance(exc, ReferenceUnavailable):
        return f"no reference ran: {exc}"
    return f"no reference ran: {name} failed ({type(exc).__name__}: {exc})"


def advise(reference: Reference, golden: Golden) -> list[str]:
    """Run a reference that may not refuse the export (onnx.reference) and compare it with the
    golden outputs; a disagreement is one warning line. It never raises: advice that cannot
    run gives none, and the summary (``golden.note``) says so."""
    try:
        with np.errstate(all="ignore"):
            outputs = reference(dict(golden.inputs))
        checks = [compare_output(n, np.asarray(outputs[n]), ref, golden.rtol, golden.atol,
                                 magnitude=golden.magnitudes.get(n), step=golden.steps.get(n))
                  for n, ref in golden.outputs.items()]
    except Exception as exc:  # noqa: BLE001
        why = str(exc) if isinstance(exc, ReferenceUnavailable) else \
            f"{reference.name} failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        golden.note = "; ".join(n for n in (golden.note, f"no advice: {why}") if n)
        return []
    bad = [c for c in checks if not c.ok]
    if not bad:
        return []
    worst = max(bad, key=lambda c: c.max_rel)
    if worst.why.startswith("has shape"):   # compare_output: "has shape A, the reference B"
        what = "it g" + worst.why.replace("has shape", "ives shape", 1).replace(
            "the reference", "mlcpack", 1)
    else:
        what = f"max abs error {worst.max_abs:.3g}, SNR {worst.snr_db:.0f} dB"
        if worst.index is not None:
            what = (f"at {worst.index} {reference.name} gives {worst.got:.6g}, mlcpack "
                    f"{worst.ref:.6g}; {what}")
    return [f"{reference.name} disagrees on output {worst.name!r} ({what}). {reference.name} "
            "is known to differ from ONNX Runtime on some real models, so this does not fail "
            f"the export; {CHECK_EXTRA} checks against ONNX Runtime"]


def embed_golden(golden: Golden, writer: Any, header: Header) -> tuple[Header, str | None]:
    """The header with the pair in it (payloads through ``writer``) unless it is too large,
    and a note when it is not embedded."""
    if golden.skipped:
        return header, None
    arrays = list(golden.inputs.values()) + list(golden.outputs.values())
    total = sum(a.nbytes for a in arrays)
    if total > MAX_EMBED_BYTES:
        return header, (f"golden pair not embedded ({total / 2**20:.1f} MiB > "
                        f"{MAX_EMBED_BYTES >> 20} MiB); `mlcpack verify` will have nothing to "
                        "run")
    # magnitude and quant_step are read by runtime/selftest.py's golden_magnitudes.
    rows = [tuple(GoldenRow(k, tuple(v.shape), str(v.dtype), writer.ref(v),
                            golden.magnitudes.get(k) if outputs else None,
                            golden.steps.get(k) if outputs else None)
                  for k, v in arrays_.items())
            for outputs, arrays_ in ((False, golden.inputs), (True, golden.outputs))]
    record = GoldenRecord(rows[0], rows[1], golden.rtol, golden.atol, golden.reference,
                          golden.seed)
    return dataclasses.replace(header, golden=record), None


def second_opinion(model: Any, golden: Golden, result: CheckResult) -> CheckResult | None:
    """When the bundle disagrees with ONNX Runtime, ask ONNX's own reference implementation: if
    it agrees with the bundle on every output, ONNX Runtime is the one that departs from the
    ONNX spec (it does on a few operators, e.g. Resize with align_corners when downsampling:
    its results fail ONNX's own backend tests there), so the export goes on, with a warning,
    against onnx.reference's outputs (``golden`` is updated). None: no second opinion, or it
    does not agree with the bundle either (the refusal stands)."""
    second = golden.second
    if second is None:
        return None
    try:
        with np.errstate(all="ignore"):
            outputs = second(dict(golden.inputs))
        outputs = {n: np.asarray(outputs[n], order="C") for n in golden.outputs}
    except Exception:  # noqa: BLE001  (a second opinion that cannot run gives none)
        return None
    again = check_model(model, golden.inputs, outputs, golden.rtol, golden.atol,
                        golden.magnitudes, golden.steps)
    if not again.ok:
        return None
    worst = result.worst()
    where = f" at {worst.index}: it gives {worst.ref:.6g}, the bundle {worst.got:.6g}" \
        if worst is not None and worst.index is not None else ""
    golden.warnings.append(
        f"{golden.reference} disagrees with the bundle on output {worst.name!r}{where}; "
        f"{second.name}, ONNX's reference implementation, agrees with the bundle. ONNX Runtime "
        "departs from the ONNX spec on a few operators (Resize with align_corners when "
        f"downsampling), so the export goes on, checked against {second.name}")
    golden.outputs, golden.reference = outputs, f"{second.name} ({golden.reference} disagreed)"
    return again


# The check runs the bundle a second time on this many threads: a parallel kernel splits its
# work into tasks only then, and a fault in that split would otherwise pass the check and give
# wrong answers only to users who run it on several threads.
CHECK_THREADS = 2


def _check_threaded(tmp: str, golden: Golden) -> CheckResult | None:
    """The golden inputs run on CHECK_THREADS threads, checked like the 1-thread run (against
    ``golden.outputs``, which a second opinion may have replaced). None where the bundle has
    no parallel kernel (the same code would run again)."""
    from ..runtime import load

    with load(tmp, threads=CHECK_THREADS, verify=False) as model:   # hashed by the first load
        if not model.has_parallel_kernels:
            return None
        return check_model(model, golden.inputs, golden.outputs, golden.rtol, golden.atol,
                           golden.magnitudes, golden.steps)


def _not_run_here(exc: Exception, tmp: str, path: str, extra: str) -> str:
    """The summary's note for a bundle this host cannot run: the user's file name, never the
    temporary one, and no "export again" advice (the user chose that target on purpose)."""
    name = os.path.basename(path)
    why = str(exc).replace(os.path.basename(tmp), name).split(": export again")[0]
    return (f"golden check not run on this host: {why}; run `mlcpack verify {name}` (or "
            f"mlcpack-run verify) on a machine it targets{extra}")


def write_checked(writer: Any, path: str | os.PathLike, header: Header, signer: Any,
                  golden: Golden, note: str | None) -> tuple[int, str]:
    """Write the bundle next to ``path``, run it with the runtime, compare with the golden
    outputs, and move it into place only if they agree. Returns (size, what was checked)."""
    from ..runtime import load

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".mlcpack-check-", suffix=".mlc", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise _export_error(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        try:
            size = writer.write(tmp, header, signer=signer)
        except BundleWriteError as exc:  # name the user's file, not the temporary one
            raise BundleWriteError(str(exc).replace(tmp, path)) from None
        extra = "".join(f"; {n}" for n in (golden.note, note) if n)
        if golden.skipped:
            result_note = f"golden check skipped: {golden.skipped}{extra}"
        else:
            try:
                model = load(tmp)
            except (CpuFeatureError, LibraryFunctionError) as exc:
                model, result_note = None, _not_run_here(exc, tmp, path, extra)
            except MlcpackError as exc:
                raise _export_error(f"golden check: the exported bundle does not load ({exc}); "
                                    "nothing written") from None
            if model is not None:
                with model:
                    result = check_model(model, golden.inputs, golden.outputs, golden.rtol,
                                         golden.atol, golden.magnitudes, golden.steps)
                    overruled = None if result.ok else second_opinion(model, golden, result)
                if overruled is not None:
                    result = overruled
                    if header.golden is not None:  # embed the pair the bundle reproduces
                        header, _ = embed_golden(golden, writer, header)
                        size = writer.write(tmp, header, signer=signer)
                if not result.ok:
                    raise _export_error(
                        f"golden check failed against {golden.reference}: {result.summary()}; "
                        f"nothing written (--check-rtol/--check-atol loosen it, --no-check "
                        "skips it)")
                threaded = _check_threaded(tmp, golden)
                if threaded is not None and not threaded.ok:
                    raise _export_error(
                        f"golden check failed on {CHECK_THREADS} threads against "
                        f"{golden.reference}: {threaded.summary()} (it passed on 1 thread: a "
                        "fault in mlcpack's parallel kernels, please report it); nothing "
                        "written (--no-check skips the check)")
                result_note = (f"golden check passed against {golden.reference}: "
                               f"{result.summary()}{extra}")
        os.replace(tmp, path)
        tmp = None
        return size, result_note
    except OSError as exc:
        raise _export_error(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
