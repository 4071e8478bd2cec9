"""The export's golden check: run the source model once with a reference, embed the pair in the
bundle, and refuse the export when the compiled bundle, loaded with the runtime on this host,
disagrees. ``runtime/verify.py`` holds the comparison (``mlcpack verify`` re-runs the pair with
the runtime alone).

References: for ONNX models onnxruntime if it imports, else ``onnx.reference.ReferenceEvaluator``
(``onnx_reference``); for everything else the numpy reference of the IR (``evaluate_ir``: each
operator's ``OpDef.reference``, library calls through the runtime's library functions).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..runtime.errors import CpuFeatureError, LibraryFunctionError, MlcpackError
from ..runtime.verify import GOLDEN_KEY, check_model
from .bundle_writer import BundleWriteError
from .ir.graph import Call, CallLibrary, Constant, Function, IRModule, Var

MAX_EMBED_BYTES = 4 << 20


def _export_error(message: str) -> Exception:
    from .export import ExportError
    return ExportError(message)


class ReferenceUnavailable(Exception):
    """The reference cannot evaluate this model (the check is skipped, and says so)."""


@dataclass
class Golden:
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    reference: str
    seed: int | None
    rtol: float
    atol: float
    skipped: str | None = None   # why no reference ran (then nothing is checked)


# ---- inputs ---------------------------------------------------------------------------------------

def random_inputs(specs: list[tuple[str, tuple[int, ...], str]], seed: int
                  ) -> dict[str, np.ndarray]:
    """Seeded inputs: standard normal floats, random bools, zeros for integers (integer inputs
    are usually indices, and 0 is the one index every axis has; give real ones with
    --check-input)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape, dtype in specs:
        dt = np.dtype(dtype)
        if dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            out[name] = np.zeros(shape, dt)
    return out


def given_inputs(specs: list[tuple[str, tuple[int, ...], str]],
                 given: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [s[0] for s in specs]
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise _export_error(f"--check-input must give every input of the model ({names}); "
                            + (f"unknown: {unknown}" if unknown else f"missing: {missing}"))
    out = {}
    for name, shape, dtype in specs:
        value = np.asarray(given[name])
        dt = np.dtype(dtype)
        if value.dtype != dt:
            if value.dtype.kind != dt.kind or value.dtype.kind not in "fiu":
                raise _export_error(f"--check-input {name}: dtype {value.dtype}, the model takes "
                                    f"{dtype}")
            value = value.astype(dt)
        if value.ndim != len(shape) or value.shape[1:] != tuple(shape[1:]):
            raise _export_error(f"--check-input {name}: shape {value.shape}, the model takes "
                                f"{tuple(shape)}")
        out[name] = np.ascontiguousarray(value)
    return out


# ---- references ---------------------------------------------------------------------------------

def evaluate_ir(mod: IRModule, feeds: Mapping[str, np.ndarray],
                params: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run ``main`` with numpy: each high-level call through its op's reference."""
    from ..runtime import library
    from .ops import get_op

    fn = mod.functions["main"]
    if not isinstance(fn, Function):
        raise ReferenceUnavailable("main is not a graph function")
    env: dict[int, np.ndarray] = {}
    for p in fn.params:
        source = params if params and p.name in params else feeds
        env[id(p)] = np.asarray(source[p.name])

    def value(v: Any) -> np.ndarray:
        if isinstance(v, Constant):
            return v.data
        if id(v) not in env:
            raise ReferenceUnavailable(f"{getattr(v, 'name', v)} is used before it is defined")
        return env[id(v)]

    for b in fn.bindings():
        v = b.value
        if isinstance(v, (Var, Constant)):
            env[id(b.var)] = value(v)
        elif isinstance(v, Call):
            args = [value(a) for a in v.args]
            result = np.asarray(get_op(v.op).reference(*args, **v.attrs))
            env[id(b.var)] = result.astype(v.type.dtype, copy=False).reshape(v.type.shape)
        elif isinstance(v, CallLibrary):
            try:
                (fn_lib,) = library.resolve([v.func], None, "the model").values()
            except MlcpackError as exc:
                raise ReferenceUnavailable(str(exc)) from None
            out = np.empty(v.type.shape, v.type.dtype)
            fn_lib(*[value(a) for a in v.args], out=out, **v.attrs)
            env[id(b.var)] = out
        else:
            raise ReferenceUnavailable(f"{b.var.name} is a {type(v).__name__}, which the numpy "
                                       "reference cannot evaluate")
    return {name: np.asarray(value(o)) for name, o in zip(fn.output_names, fn.outputs)}


def onnx_reference(model_path: str | os.PathLike | bytes, input_names: Mapping[str, str]
                   ) -> tuple[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], str]:
    """A reference for an ONNX file: onnxruntime if it imports, else onnx's ReferenceEvaluator.
    ``input_names`` maps ONNX input names to the bundle's. ``model_path`` may be the model's
    serialized bytes."""
    source = model_path if isinstance(model_path, bytes) else os.fspath(model_path)
    to_onnx = {bundle: onnx_name for onnx_name, bundle in input_names.items()}
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        def run_ort(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            try:
                opts = ort.SessionOptions()
                opts.log_severity_level = 3
                sess = ort.InferenceSession(source, opts,
                                            providers=["CPUExecutionProvider"])
                names = [o.name for o in sess.get_outputs()]
                values = sess.run(names, {to_onnx.get(k, k): v for k, v in feeds.items()})
            except Exception as exc:
                raise ReferenceUnavailable(f"onnxruntime cannot run it "
                                           f"({' '.join(str(exc).split())[:200]})") from None
            return dict(zip(names, values))
        return run_ort, f"onnxruntime {ort.__version__}"

    from onnx.reference import ReferenceEvaluator

    def run_ref(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            import onnx
            ev = ReferenceEvaluator(onnx.load_from_string(source) if isinstance(source, bytes)
                                    else source)
            values = ev.run(None, {to_onnx.get(k, k): v for k, v in feeds.items()})
        except Exception as exc:
            raise ReferenceUnavailable(f"onnx's ReferenceEvaluator cannot run it "
                                       f"({' '.join(str(exc).split())[:200]})") from None
        return dict(zip(ev.output_names, values))
    return run_ref, "onnx.reference.ReferenceEvaluator"


# ---- the check --------------------------------------------------------------------------------

def prepare_golden(mod: IRModule, params: Mapping[str, np.ndarray] | None, opts: Any) -> Golden:
    """Choose the inputs and run the reference (before anything is compiled)."""
    fn = mod.main
    specs = [(p.name, tuple(p.type.shape), p.type.dtype) for p in fn.params
             if not (params and p.name in params)]
    if opts.check_inputs:
        inputs, seed = given_inputs(specs, opts.check_inputs), None
    else:
        inputs, seed = random_inputs(specs, opts.check_seed), opts.check_seed
    name = opts.reference_name or "the numpy reference of the IR"
    try:
        if opts.reference is not None:
            outputs = opts.reference(dict(inputs))
        else:
            outputs = evaluate_ir(mod, inputs, params)
    except ReferenceUnavailable as exc:
        return Golden(inputs, {}, name, seed, opts.check_rtol, opts.check_atol,
                      skipped=f"no reference ran: {exc}")
    except (FloatingPointError, ValueError, TypeError, KeyError, IndexError) as exc:
        return Golden(inputs, {}, name, seed, opts.check_rtol, opts.check_atol,
                      skipped=f"no reference ran: {name} failed ({type(exc).__name__}: {exc})")
    wanted = list(fn.output_names)
    missing = [n for n in wanted if n not in outputs]
    if missing:
        raise _export_error(f"the reference ({name}) gave no output {missing[0]!r}")
    outputs = {n: np.ascontiguousarray(np.asarray(outputs[n])) for n in wanted}
    return Golden(inputs, outputs, name, seed, opts.check_rtol, opts.check_atol)


def embed_golden(golden: Golden, writer: Any, header: dict) -> str | None:
    """Put the pair into the header (payloads through ``writer``) unless it is too large;
    return a note when it is not embedded."""
    if golden.skipped:
        return None
    arrays = list(golden.inputs.values()) + list(golden.outputs.values())
    total = sum(a.nbytes for a in arrays)
    if total > MAX_EMBED_BYTES:
        return (f"golden pair not embedded ({total / 2**20:.1f} MiB > "
                f"{MAX_EMBED_BYTES >> 20} MiB); `mlcpack verify` will have nothing to run")
    header[GOLDEN_KEY] = {
        kind: [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype), "data": writer.add(v)}
               for k, v in arrays_.items()]
        for kind, arrays_ in (("inputs", golden.inputs), ("outputs", golden.outputs))}
    header[GOLDEN_KEY].update({"rtol": golden.rtol, "atol": golden.atol,
                               "reference": golden.reference, "seed": golden.seed})
    return None


def write_checked(writer: Any, path: str | os.PathLike, header: dict, signer: Any,
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
        extra = f"; {note}" if note else ""
        if golden.skipped:
            result_note = f"golden check skipped: {golden.skipped}{extra}"
        else:
            try:
                model = load(tmp)
            except (CpuFeatureError, LibraryFunctionError) as exc:
                model, result_note = None, f"golden check not run on this host: {exc}{extra}"
            except MlcpackError as exc:
                raise _export_error(f"golden check: the exported bundle does not load ({exc}); "
                                    "nothing written") from None
            if model is not None:
                with model:
                    result = check_model(model, golden.inputs, golden.outputs, golden.rtol,
                                         golden.atol)
                if not result.ok:
                    raise _export_error(
                        f"golden check failed against {golden.reference}: {result.summary()}; "
                        f"nothing written (--check-rtol/--check-atol loosen it, --no-check "
                        "skips it)")
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
