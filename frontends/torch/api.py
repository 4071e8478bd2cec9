"""The PyTorch frontend's entry points: load a ``.pt2`` file, capture a module, import an
ExportedProgram, and the golden check's reference that runs the module itself (eager PyTorch).
Exporting to a bundle is the packager's (``packager/torch_export.py``: frontends never import the
export driver)."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from ...packager.errors import ExportError
from ...packager.ir.graph import IRModule
from .importer import TorchImportInfo, import_exported

# torch 2.13 warns about its own pytree internals (LeafSpec) when it copies an exported program;
# the user can do nothing about it, and it was printed on every .pt2 export (twice with plans).
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                        category=FutureWarning)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def load_program(path: str | os.PathLike) -> Any:
    """The ExportedProgram ``torch.export.save`` wrote to ``path``."""
    name = os.path.basename(os.fspath(path))
    if not os.path.isfile(path):
        raise ExportError(f"{name}: no such file ({os.fspath(path)})")
    try:
        return torch.export.load(os.fspath(path))
    except Exception as exc:  # a zip torch cannot read, a newer schema, not a .pt2 at all
        raise ExportError(f"{name} is not a program torch.export.load can read: "
                          f"{_one_line(exc)}") from None


def import_program(program: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                   input_names: Sequence[str] | None = None,
                   output_names: Sequence[str] | None = None, source: str | None = None
                   ) -> tuple[IRModule, TorchImportInfo]:
    """An ExportedProgram, or the path of a ``.pt2`` file, as an IRModule; ``source`` names it
    in errors (default: the file's name, or "the ExportedProgram")."""
    if isinstance(program, (str, os.PathLike)):
        source = source or os.path.basename(os.fspath(program))
        program = load_program(program)
    else:
        source = source or "the ExportedProgram"
    if not isinstance(program, torch.export.ExportedProgram):
        raise ExportError(f"expected a torch.export.ExportedProgram, got "
                          f"{type(program).__name__}")
    return import_exported(program, input_shapes, source, input_names, output_names)


def eager_reference(fn: Any, input_names: Sequence[str], output_names: Sequence[str]) -> Any:
    """A golden-check reference that runs ``fn`` (the module, or ``ExportedProgram.module()``)
    eagerly on the check's inputs and returns its flattened tensor outputs by bundle name."""
    from ..reference import Reference

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in input_names]
        with torch.no_grad():
            out = fn(*args)
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if len(leaves) != len(output_names):
            raise ValueError(f"the module returned {len(leaves)} tensors, the program "
                             f"{len(output_names)}")
        return {n: t.detach().cpu().numpy() for n, t in zip(output_names, leaves)}

    return Reference(run, f"PyTorch {torch.__version__.split('+')[0]} (eager)")


@contextlib.contextmanager
def eval_mode(module: Any) -> Iterator[None]:
    """The module in eval mode while exporting (as torch.onnx.export does), restored after."""
    if not isinstance(module, torch.nn.Module):
        yield
        return
    was = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in was:
            m.training = training


def capture(module: Any, example_inputs: Sequence[Any], dynamic_shapes: Any) -> Any:
    if isinstance(module, torch.export.ExportedProgram):
        return module
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"export_torch takes a torch.nn.Module or an ExportedProgram, not "
                          f"{type(module).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) \
        else (example_inputs,)
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        raise ExportError(f"torch.export.export could not capture {type(module).__name__}: "
                          f"{_one_line(exc)}") from None


def batch_shapes(ep: Any, batch: int, given: Mapping[str, Sequence[int]] | None = None,
                 input_names: Sequence[str] | None = None) -> dict[str, tuple[int, ...]]:
    """Input shapes at batch ``batch``: every user input whose first dim is symbolic gets
    ``batch`` there and its example's sizes elsewhere (``given`` overrides the rest)."""
    users = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    tensors = [s for s in users if isinstance(nodes[s.arg.name].meta.get("val"), torch.Tensor)]
    names = list(input_names) if input_names else [s.arg.name for s in tensors]
    shapes: dict[str, tuple[int, ...]] = {}
    for name, spec in zip(names, tensors):
        val = nodes[spec.arg.name].meta["val"]
        dims = [d for d in val.shape]
        if not dims or not isinstance(dims[0], torch.SymInt):
            continue
        rest = []
        for d in dims[1:]:
            hint = d.node.hint if isinstance(d, torch.SymInt) else d
            rest.append(int(hint))
        shapes[name] = (batch, *rest)
    if not shapes:
        raise ExportError("batch sizes need an input whose first dim is a torch.export.Dim "
                          "(dynamic_shapes={'x': {0: Dim('batch')}})")
    for name, shape in (given or {}).items():
        shapes[name] = (batch, *tuple(shape)[1:]) if name in shapes else tuple(shape)
    return shapes


def modules_from_file(path: str | os.PathLike, shapes_by_batch: Mapping[Any, Mapping],
                      check: bool = True) -> tuple[dict, Any, str | None]:
    """What ``mlcpack export model.pt2`` builds: the modules by batch size (key None: one
    fixed-shape module; else ``--batch-sizes``, the symbolic first dims at each size), and the
    golden check's reference (``ExportedProgram.module()`` run eagerly) with its name."""
    ep = load_program(path)
    mods, info = {}, None
    for batch, given in shapes_by_batch.items():
        shapes = dict(given) if batch is None else batch_shapes(ep, batch, given)
        mods[batch], info = import_exported(ep, shapes or None, os.path.basename(os.fspath(path)))
    if not check:
        return mods, None, None
    reference = eager_reference(ep.module(), info.input_names, info.output_names)
    return mods, reference, reference.name
