"""``load_model``: a model file to IR modules, as ``mlcpack export`` reads it, so the Python API
does what the command line does. The frontend is chosen by file type; with batch sizes, an ONNX
model is re-imported once per size with its batch dimension made symbolic. Frontends build IR
only: compiling and writing the bundle is ``packager.export``'s."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ..packager.errors import ExportError
from ..packager.ir.graph import IRModule
from ..runtime.errors import check_files


class ModelOptionError(ExportError):
    """The shapes or batch sizes given do not fit the model file (a usage error, exit 2)."""

    exit_code = 2


@dataclass
class LoadedModel:
    """What ``load_model`` built: the modules by batch size (key None: one module, no batch
    plans), and the golden check's reference and its name when asked for and available."""

    modules: dict[Optional[int], IRModule]
    reference: Any = None
    reference_name: Optional[str] = None


def shapes_at_batch(shapes: dict[str, tuple[int | None, ...]], batch: Optional[int]
                    ) -> dict[str, tuple[int, ...]]:
    """``input_shapes`` at ``batch`` (None: as given, named dims kept symbolic): a named first
    dim becomes ``batch``."""
    if batch is None:   # named dims stay symbolic (size variables)
        return dict(shapes)
    named = [k for k, v in shapes.items() if any(isinstance(d, str) for d in v[1:])]
    if named:
        raise ModelOptionError(f"--input-shape {named[0]}: with --batch-sizes only the first "
                               "dimension may be named (the batch)")
    return {k: tuple(batch if isinstance(d, str) else d for d in v) for k, v in shapes.items()}


def load_model(model: str | os.PathLike, input_shapes: Mapping[str, Sequence] | None = None,
               batch_sizes: Sequence[int] | None = None, arch: str | os.PathLike | None = None,
               reference: bool = True, bind: Mapping[str, Any] | None = None,
               max_shapes: Mapping[str, Sequence[int]] | None = None) -> LoadedModel:
    """Import the model file ``model`` as ``mlcpack export`` does: the frontend chosen by its
    type (``.onnx``; ``.pt2``, torch.export.save; pickled weights ``.pkl``/``.pickle``/``.npz``
    with ``arch``, an architecture spec, or an MLP inferred from the weights). ``input_shapes``
    (name -> dims, a name for a symbolic dim) fixes input sizes; ``batch_sizes`` builds one
    module per batch size (ONNX: the model re-imported with its batch dim made symbolic).
    ``reference``: also build the golden check's reference (ONNX Runtime / onnx.reference for
    ONNX, eager torch for ``.pt2``; none for weights). ONNX only: ``bind`` (name -> array)
    makes graph inputs constants, ``max_shapes`` bounds inputs' sizes (docs/symbolic-shapes.md).
    Raises ``ExportError`` (one line)."""
    model = Path(model)
    shapes = dict(input_shapes or {})
    check = reference
    suffix = model.suffix.lower()
    check_files([model], "model to export")
    sizes: list[Optional[int]] = sorted(batch_sizes) if batch_sizes else [None]
    if (bind or max_shapes) and suffix != ".onnx":
        raise ModelOptionError("--bind and --max-shape are for ONNX models")
    if suffix == ".onnx":
        from .reference import onnx_reference
        from .onnx import import_onnx
        if not batch_sizes:
            mod, info = import_onnx(str(model), input_shapes=shapes_at_batch(shapes, None) or None,
                                    bind=bind, max_shapes=max_shapes)
            if not check:
                return LoadedModel({None: mod})
            return LoadedModel({None: mod}, *onnx_reference(model, info.input_names, bind))
        proto, batch_inputs = _onnx_batched(model, shapes)
        mods, info = {}, None
        for b in sizes:
            given = shapes_at_batch(shapes, b)
            for name in batch_inputs:  # a symbolic first dim kept from the ONNX model
                given.setdefault(name, batch_inputs[name](b))
            mods[b], info = import_onnx(proto, input_shapes=given or None, bind=bind)
        if not check:
            return LoadedModel(mods)
        return LoadedModel(mods, *onnx_reference(proto.SerializeToString(), info.input_names,
                                                 bind))
    if suffix == ".pt2":  # torch.export.save: the PyTorch frontend (needs torch)
        from .torch import modules_from_file
        return LoadedModel(*modules_from_file(
            model, {b: shapes_at_batch(shapes, b) for b in sizes}, check))
    if suffix in (".pkl", ".pickle", ".npz"):
        from .arch import build_from_spec, infer_mlp_spec, read_spec
        from .weights import load_weights
        weights = load_weights(model)
        spec = read_spec(arch) if arch else infer_mlp_spec(weights)
        mods = {}
        for b in sizes:
            given = shapes_at_batch(shapes, b)
            if any(isinstance(d, str) for v in given.values() for d in v):
                raise ModelOptionError("--input-shape: named (symbolic) dims are for ONNX models; "
                                       "give pickled weights' input sizes, or name the batch "
                                       "with --batch-sizes")
            shape = next(iter(given.values())) if given else None
            if shape is None and b is not None:
                default = tuple((spec.get("input") or {}).get("shape") or ())
                shape = (b, *default[1:]) if default else None
            mods[b] = build_from_spec(spec, weights, shape)
        return LoadedModel(mods)
    raise ModelOptionError(f"{model}: unknown model type {suffix or '(no suffix)'}; mlcpack "
                           "exports .onnx files and pickled weights (.pkl, .npz), and .pt2 "
                           "(torch.export.save)")


def _onnx_batched(model: Path, shapes: dict) -> tuple[Any, dict[str, Callable[[int], tuple]]]:
    """The ONNX model made batch-generic, and its inputs whose first dim is the batch without
    --input-shape naming them. An input named ``x=N,...`` whose declared first dim is fixed
    (exporters often write 1) gets a symbolic one, as do the graph outputs with that same
    fixed first dim; intermediate shape hints are dropped (they would pin the old batch)."""
    from .onnx.proto import load_model

    try:
        proto = load_model(str(model))
    except Exception as exc:
        raise ExportError(f"{model.name} is not a valid ONNX file: "
                          f"{' '.join(str(exc).split())[:200]}") from None
    inits = {t.name for t in proto.graph.initializer}
    out: dict[str, Callable[[int], tuple]] = {}
    pinned = set()
    for vi in proto.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if vi.name in shapes:
            if isinstance(shapes[vi.name][0], str) and len(dims) and dims[0].HasField("dim_value"):
                pinned.add(dims[0].dim_value)
                dims[0].dim_param = "N"
            continue
        known = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                 for d in dims]
        if known and known[0] is None and all(d is not None for d in known[1:]):
            out[vi.name] = lambda b, rest=tuple(known[1:]): (b, *rest)
    if not out and not any(isinstance(v[0], str) for v in shapes.values()):
        raise ExportError(f"--batch-sizes: no input of {model.name} has a symbolic first "
                          "dimension; name the batch with --input-shape x=N,...")
    if pinned:
        for vi in proto.graph.output:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) and dims[0].HasField("dim_value") and dims[0].dim_value in pinned:
                dims[0].dim_param = "N"
        del proto.graph.value_info[:]
    return proto, out
