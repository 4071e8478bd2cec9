"""The Python export API: ``export(model, path, options)`` does everything ``mlcpack export``
does, so a program gets the same bundle, messages and errors as the command line, which only
parses its flags into an ``Options``, calls ``export`` and prints the result.

What it decides, in order: the paths and option values (a one-line ``UsageError``, exit 2, or
``InputError``, exit 7, before any file is read or compiled); for an ONNX file, from its
signature (``frontends/onnx/signature.py``, read once without the weights) whether
``batch_sizes`` can make static plans, and whether to add the automatic static plan at batch 1
beside the symbolic one; the import (``frontends/loader.py``), re-imported without the batch-1
plan when that import fails; the recorded preprocessing; then one of four exports: int8
(``calibrate.py``), the symbolic plan with static batch plans beside it (falling back to padded
batch plans when the symbolic one does not compile, and to the symbolic plan alone when the
automatic batch-1 plan does not), batch plans, or one module. The golden check, bf16 guard,
signing and the bundle writing (a temporary file, then a rename: nothing half-written) are the
export driver's (``export.py``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ..runtime.errors import InputError, MlcpackError, UsageError
from .export import ExportReport
from .options import CompileOptions

if TYPE_CHECKING:
    from ..frontends.onnx.signature import Signature

__all__ = ["ExportResult", "Options", "check_paths", "export"]


@dataclass(frozen=True)
class Options:
    """What ``mlcpack export``'s flags say, as values (the flag in brackets).

    Shapes are name -> dims; a dim that is a name (``"N"``) stays symbolic, and with
    ``batch_sizes`` a named first dim is the batch. ``preprocess`` holds the image options to
    record on top of the default the first input's shape implies: ``size`` [H, W], ``color``,
    ``layout``, ``scale``, ``mean``, ``std``. ``compile`` None: the compiler's settings from
    the environment (docs/env-vars.md), read once, with no compile cache when ``cache`` is
    False."""

    arch: Optional[str | os.PathLike] = None                  # [--arch] spec for weights
    target: Optional[str] = None                              # [--target] None: portable
    input_shapes: Mapping[str, Sequence[int | str]] = field(default_factory=dict)
    batch_sizes: Optional[Sequence[int]] = None               # [--batch-sizes]
    max_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)   # [--max-shape]
    bind: Mapping[str, np.ndarray] = field(default_factory=dict)            # [--bind]
    labels: Optional[Sequence[str]] = None                    # [--labels]
    preprocess: Mapping[str, Any] = field(default_factory=dict)  # [--input-size, --color...]
    sign_key: Optional[str | os.PathLike] = None              # [--sign] Ed25519 private key
    check: bool = True                                        # [--check/--no-check]
    check_inputs: Optional[Mapping[str, np.ndarray]] = None   # [--check-input]
    check_rtol: float = 1e-3                                  # [--check-rtol]
    check_atol: float = 1e-4                                  # [--check-atol]
    check_advice: Optional[bool] = None                       # [--check-advice] None: if cheap
    quantize: Optional[str] = None                            # [--quantize] "int8"
    calibration: Optional[str | os.PathLike] = None           # [--calibration]
    calibration_method: Optional[str] = None                  # [--calibration-method]
    quantize_fallback: bool = False                           # [--quantize-fallback]
    quantize_guard: bool = True                               # [--quantize-guard/--no-...]
    precision: str = "fp32"                                   # [--precision] fp32 or bf16
    cache: bool = True                                        # [--cache/--no-cache]
    compile: Optional[CompileOptions] = None


@dataclass
class ExportResult(ExportReport):
    """The export's report (``export.ExportReport``), with what the command line prints
    besides: the import's seconds, the notes (a plan that could not be made, and what was
    made instead) and the quantization report's lines (``--quantize int8``)."""

    import_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    quantization: list[str] = field(default_factory=list)


def check_paths(model: str | os.PathLike, path: str | os.PathLike,
                arch: Optional[str | os.PathLike] = None, target: Optional[str] = None) -> None:
    """What needs no compile work is checked first: where the bundle goes (``UsageError``), the
    model and ``arch`` files (``InputError``), the ``target`` names (``UsageError``)."""
    from ..runtime.errors import check_files
    from .codegen.target import TargetError, resolve_targets

    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise UsageError(f"-o {out} is a directory; give the bundle's file name, e.g. "
                         f"{out / 'model.mlc'}")
    if not folder.is_dir():
        raise UsageError(f"-o {out}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise InputError(f"-o {out}: folder {folder} is not writable")
    check_files([model], "model to export")
    if arch is not None:
        check_files([arch], "--arch spec")
    try:
        resolve_targets(target)
    except TargetError as exc:
        raise UsageError(str(exc)) from None


def export(model: str | os.PathLike, path: str | os.PathLike, options: Optional[Options] = None,
           *, on_note: Optional[Callable[[str], None]] = None) -> ExportResult:
    """Export the model file ``model`` (``.onnx``, ``.pt2`` from torch.export.save, or pickled
    weights ``.pkl``/``.pickle``/``.npz``) to the bundle ``path``, as ``mlcpack export`` does
    with the flags ``options`` stands for. ``on_note`` receives each note as it happens (the
    command line prints them on stderr as ``note: ...``); they are in the result's ``notes``
    too. Raises an ``MlcpackError`` whose message is one line and whose ``exit_code`` is the
    command line's; nothing is written then."""
    from ..frontends.loader import load_model
    from ..frontends.onnx.signature import read_signature
    from .export import ExportOptions, export_batched, export_module, file_sha256

    opts = options if options is not None else Options()
    model, path = Path(model), Path(path)
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        if on_note is not None:
            on_note(line)

    check_paths(model, path, opts.arch, opts.target)
    if opts.check_rtol < 0 or opts.check_atol < 0:
        raise UsageError("--check-rtol and --check-atol must be >= 0")
    sizes = _batch_sizes(opts.batch_sizes)
    shapes = dict(opts.input_shapes)
    _check_precision(opts.precision, opts.quantize)   # conflicting flags before any file is read
    _check_quantize_options(model, opts, sizes)
    onnx_file = model.suffix.lower() == ".onnx"
    may_auto_batch = sizes is None and not opts.quantize and not opts.max_shapes
    # the file's inputs and outputs, read once (without the weights) when a batch plan is asked
    # for or may be added; None when unreadable (the loader then says why in its own words)
    signature = read_signature(model) if onnx_file and (sizes or may_auto_batch) else None
    if sizes and signature is not None:
        _check_batch_dims(signature, shapes)
    auto_batch = may_auto_batch and signature is not None and only_batch_open(signature, shapes)
    if auto_batch:   # the static batch-1 plan beside the symbolic one (see only_batch_open)
        sizes = [1]
    bind = dict(opts.bind) or None
    max_shapes = dict(opts.max_shapes) or None
    import_started = time.perf_counter()
    try:
        loaded = load_model(model, shapes, sizes, opts.arch,
                            reference=opts.check and not opts.quantize, bind=bind,
                            max_shapes=max_shapes)
    except MlcpackError:
        if not auto_batch:
            raise
        auto_batch, sizes = False, None   # the batch-1 import failed: the symbolic one alone
        loaded = load_model(model, shapes, sizes, opts.arch, reference=opts.check, bind=bind)
    import_seconds = time.perf_counter() - import_started
    mods = loaded.modules
    mod = mods[min(mods)] if sizes else mods[None]
    labels = list(opts.labels) if opts.labels is not None else None
    pre = _recorded_preprocess(mod, dict(opts.preprocess), labels)
    compile_options = opts.compile if opts.compile is not None else \
        CompileOptions.from_environ(os.environ)   # the environment's switches, read here once
    if not opts.cache:
        compile_options = compile_options.replace(cache_dir=None)
    export_opts = ExportOptions(
        target=opts.target, preprocess=pre, labels=labels, model_name=model.stem,
        source=model.name, source_sha256=file_sha256(model), sign_key=opts.sign_key,
        check=opts.check, check_inputs=dict(opts.check_inputs) if opts.check and
        opts.check_inputs is not None else None, check_rtol=opts.check_rtol,
        check_atol=opts.check_atol, check_advice=opts.check_advice,
        reference=loaded.reference,
        reference_name=loaded.reference_name, precision=opts.precision,
        compile=compile_options)
    quantization: list[str] = []
    if opts.quantize:
        report = _export_int8(model, path, export_opts, mod, pre, shapes, opts, quantization,
                              note)
    elif sizes and onnx_file:
        try:
            report = _export_specialized(model, path, export_opts, shapes, mods, bind,
                                         max_shapes, note)
        except MlcpackError as exc:
            if not auto_batch:
                raise
            note(f"no batch-1 plan ({exc}); the symbolic plan runs every batch")
            loaded = load_model(model, shapes, None, opts.arch, reference=opts.check, bind=bind)
            report = export_module(loaded.modules[None], path, dataclasses.replace(
                export_opts, reference=loaded.reference,
                reference_name=loaded.reference_name))
    else:
        report = (export_batched(mods, path, export_opts) if sizes
                  else export_module(mod, path, export_opts))
    return ExportResult(**{f.name: getattr(report, f.name)
                           for f in dataclasses.fields(ExportReport)},
                        import_seconds=import_seconds, notes=notes, quantization=quantization)


def _batch_sizes(sizes: Optional[Sequence[int]]) -> Optional[list[int]]:
    if sizes is None:
        return None
    out = sorted({int(v) for v in sizes})
    if not out or out[0] < 1:
        raise UsageError(f"--batch-sizes {','.join(str(v) for v in sizes)!r} should be "
                         "positive integers, e.g. 1,8,32")
    return out


def _check_precision(precision: str, quantize: Optional[str]) -> None:
    from .options import PRECISIONS

    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision}: choose " + " or ".join(PRECISIONS))
    if precision != "fp32" and quantize:
        raise UsageError(f"--precision {precision} and --quantize {quantize} do not combine; "
                         "choose one")


def _check_quantize_options(model: Path, opts: Options, sizes: Optional[list[int]]) -> None:
    """``quantize`` and its companions, checked before any work."""
    calibration = Path(opts.calibration) if opts.calibration is not None else None
    method = opts.calibration_method
    if opts.quantize is None:
        if (calibration is not None or opts.quantize_fallback or method is not None
                or not opts.quantize_guard):
            raise UsageError("--calibration, --calibration-method, --quantize-fallback and "
                             "--no-quantize-guard go with --quantize int8")
        return
    if opts.quantize != "int8":
        raise UsageError(f"--quantize {opts.quantize}: only int8 is supported")
    if model.suffix.lower() != ".onnx":
        raise UsageError(f"--quantize int8 quantizes ONNX models; {model.name} is not one")
    if calibration is None:
        raise UsageError("--quantize int8 needs --calibration DATA: a folder of images or .npy "
                         "files the model sees in use")
    if not calibration.exists():
        raise UsageError(f"--calibration {calibration}: no such file or folder")
    from .calibrate import CALIBRATION_SUFFIXES, METHODS
    if calibration.is_dir() and not any(p.is_file() and p.suffix.lower() in CALIBRATION_SUFFIXES
                                        for p in calibration.iterdir()):
        raise UsageError(f"--calibration {calibration}: the folder has no images or .npy files")
    if method is not None and method not in METHODS:
        raise UsageError(f"--calibration-method {method}: use {' or '.join(METHODS)}")
    if sizes:
        raise UsageError("--quantize int8 does not take --batch-sizes yet; export one batch "
                         "size")


def _given_dims(dims: Sequence[Any], given: Optional[Sequence[Any]]) -> list[Optional[int]]:
    """An input's dims from the file (None: open), or as ``input_shapes`` gives them (a name
    is open) when it gives as many."""
    if given is not None and len(given) == len(dims):
        return [None if isinstance(g, str) else g for g in given]
    return [d.size for d in dims]


def _check_batch_dims(signature: Signature, shapes: dict) -> None:
    """``batch_sizes`` on an ONNX model: static plans per batch need every other dim fixed (by
    the file or ``input_shapes``); say so in one line when an input's batch and other dims are
    open."""
    for tensor in signature.inputs:
        dims = _given_dims(tensor.dims or (), shapes.get(tensor.name))
        if len(dims) > 1 and dims[0] is None and None in dims[1:]:
            text = ",".join("?" if d is None else str(d) for d in dims)
            example = ",".join(["N"] + [str(d) if d else "64" for d in dims[1:]])
            raise UsageError(
                f"--batch-sizes makes static plans per batch size, so every dim but the batch "
                f"must be fixed, but input {tensor.name} is ({text}): fix them with "
                f"--input-shape {tensor.name}={example} (your sizes), or drop --batch-sizes "
                "(the symbolic bundle runs every batch and size already)")


# the names exporters give an open batch: batch, batch_size, N, B, bs, TensorFlow's unk__653,
# Paddle's (p2o.)DynamicDimension.0, dim_0, or none at all
BATCH_NAME = re.compile(r"^$|batch|^[NB]$|^bs$|^unk__\d+$|DynamicDimension|^dim_?\d+$|^-1$|^\?$",
                        re.IGNORECASE)


def only_batch_open(signature: Signature, shapes: Mapping[str, Sequence[Any]]) -> bool:
    """Whether the only sizes an ONNX model's ``signature`` leaves open (after ``shapes``) are
    its inputs' first dims: the batch of most models from the wild (open-nsfw's ``unk__653``, PP-LCNet's
    ``DynamicDimension.0``). The default export then adds a static plan at batch 1 beside the
    symbolic one (as ``batch_sizes=[1]``): kernels with every extent known at export run
    1.2-1.3x faster than run-time extents (PP-LCNet, Magika), and batch 1 is the usual call.

    The file's shapes decide first: a fixed or missing dim anywhere but an input's first, or an
    output whose first dim is fixed (a recurrent model's final state), is no open batch. Only an
    input whose first dim is open is then asked for its name (``BATCH_NAME``): a named time or
    sequence axis ("T", "seq_len") is no batch."""
    opened = False
    for tensor in signature.inputs:
        if tensor.dims is None:
            return False
        given = shapes.get(tensor.name)
        dims = _given_dims(tensor.dims, given)
        if any(d is None for d in dims[1:]):
            return False
        if len(dims) > 1 and dims[0] is None:
            name = tensor.dims[0].name if given is None else \
                given[0] if isinstance(given[0], str) else ""
            if not BATCH_NAME.search(name):
                return False   # a named time or sequence axis ("T", "seq_len"), not a batch
            opened = True
    # every output has an open first dim too (exporters name it unk__654 where the input has
    # unk__653); a recurrent model's [T, ...] input with a fixed final state is no batch
    for tensor in signature.outputs:
        if not tensor.dims or tensor.dims[0].size is not None:
            return False
    return opened


def _recorded_preprocess(mod: Any, given: dict[str, Any], labels: Optional[list[str]]
                         ) -> Optional[dict[str, Any]]:
    """The preprocessing to record for the module's first input: the default its shape implies,
    with the given options on top, checked against the input's and first output's shapes so a
    bundle never records what ``infer`` would fail on (``UsageError``, before any compile
    work)."""
    from ..runtime.model import TensorSpec
    from ..runtime.preprocess import (PreprocessError, check_labels, check_preprocess,
                                      default_preprocess, normalize_preprocess)
    from .ir.sym import is_static

    first = mod.main.params[0]
    spec = TensorSpec(first.name, tuple(first.type.shape), first.type.dtype, 0)
    # an image size known only at run time has no size to resize to: nothing is inferred
    pre = default_preprocess(spec) if is_static(first.type.shape) else None
    try:
        if labels is not None:
            out = mod.main.outputs[0]
            name = mod.main.output_names[0] if mod.main.output_names else "output 0"
            check_labels(labels, TensorSpec(name, tuple(out.type.shape), out.type.dtype, 0))
        if not given:
            return pre
        pre = normalize_preprocess({**(pre or {"scale": 1 / 255, "mean": [0.0], "std": [1.0],
                                                "layout": "NCHW", "color": "RGB"}), **given})
        if "size" not in pre:
            raise UsageError("--input-size is needed to record image preprocessing for this "
                             "input")
        check_preprocess(pre, spec)
    except PreprocessError as exc:
        raise UsageError(str(exc)) from None
    return pre


def _export_int8(model: Path, path: Path, export_opts: Any, mod: Any, pre: Any, shapes: dict,
                 opts: Options, summary: list[str],
                 note: Callable[[str], None] = lambda line: None) -> ExportReport:
    """Calibrate, quantize and export (``calibrate.py``); the quantization report's lines go to
    ``summary``, a note on samples resized to the input's size to ``note``."""
    from ..frontends.loader import shapes_at_batch
    from ..runtime.model import TensorSpec
    from .calibrate import DEFAULT_METHOD, export_int8, read_calibration

    first = mod.main.params[0]
    spec = TensorSpec(first.name, tuple(first.type.shape), first.type.dtype, 0)
    samples = read_calibration(opts.calibration, spec, pre, note)
    report, qreport = export_int8(model, path, export_opts, samples,
                                  shapes_at_batch(shapes, None) or None,
                                  opts.calibration_method or DEFAULT_METHOD,
                                  opts.quantize_fallback, mod, guard=opts.quantize_guard)
    summary.extend(qreport.summary())
    return report


def _export_specialized(model: Path, path: Path, export_opts: Any, shapes: dict, mods: dict,
                        bind: Optional[dict], max_shapes: Optional[dict],
                        note: Callable[[str], None]) -> ExportReport:
    """``batch_sizes`` on an ONNX model: the symbolic plan (the batch a size variable) with a
    static plan per batch size beside it. A model whose other dims stay symbolic is refused in
    one line; one whose graph needs static shapes somewhere gets padded batch plans."""
    from ..frontends.loader import load_model
    from .errors import ExportError
    from .export import SymbolicPlanError, export_batched, export_specialized

    try:
        try:
            symbolic = load_model(model, shapes, None, None, reference=False, bind=bind,
                                  max_shapes=max_shapes)
        except ExportError as exc:   # the batch plans imported: only the symbolic import failed
            raise SymbolicPlanError(str(exc)) from None
        return export_specialized(symbolic.modules[None], mods, path, export_opts)
    except SymbolicPlanError as exc:
        note(f"no symbolic plan ({exc}); any batch runs on the batch plans, padded up to the "
             "next one or in chunks of the largest")
        return export_batched(mods, path, export_opts)
