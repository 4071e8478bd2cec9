"""``torch.export.ExportedProgram`` -> IRModule.

The program is decomposed to core ATen (``run_decompositions()``), keeping the few composite
operators the IR has one fast form for (LSTM, GRU, scaled_dot_product_attention); every ATen
overload it then calls must have a converter, and all that do not are reported in one error
with the source line each comes from. Parameters, buffers and lifted constants become bound
constants; user inputs become ``main``'s parameters (named as ``forward``'s arguments), with
static shapes: a dim made symbolic by ``torch.export.Dim`` is fixed to ``input_shapes``' value,
or the example input's. Each node is converted inside a source scope naming its module path
(``layer1.0.conv1``, from ``nn_module_stack``), so every kernel records where it came from.
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ...packager.errors import ExportError
from ...packager.ir.builder import BlockBuilder, BuilderError
from ...packager.ir.graph import Constant, IRModule, Source, Value, Var
from ...packager.ir.sym import SymbolicShapeError, size_var
from . import converters  # noqa: F401  (registers every converter family)
from .registry import NodeContext, lookup, make_constant

# Composite operators kept whole by the decomposition: one converter each gives the IR's fast
# form (nn.recurrence; one softmax between two matmuls) instead of an unrolled or masked graph,
# or the ONNX path's formula (hardswish, hardsigmoid), so both paths compile the same kernels.
KEEP_COMPOSITE = ("aten.lstm.input", "aten.gru.input", "aten.scaled_dot_product_attention.default",
                  "aten.hardswish.default", "aten.hardsigmoid.default")

# Nodes that check sizes at run time (torch.export's guards): nothing to compute once shapes
# are fixed at export.
_IGNORED = frozenset({"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
                      "aten.sym_constrain_range.default", "aten._assert_tensor_metadata.default"})

# Python arithmetic on sizes (torch.export writes it as calls of these functions).
_PYTHON_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
               operator.mod, operator.neg, operator.pow, math.ceil, math.floor, math.sqrt,
               operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge}

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.int8: "int8", torch.int16: "int16",
           torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8", torch.bool: "bool"}

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


@dataclass
class TorchImportInfo:
    """What the import found, for reports and the command line."""

    source: str
    input_names: list[str]                       # bundle input names, in forward's order
    input_shapes: dict[str, tuple[int, ...]]
    output_names: list[str]
    symbolic_dims: dict[str, dict[int, str]] = field(default_factory=dict)  # fixed at export
    op_counts: dict[str, int] = field(default_factory=dict)


def torch_dtype(dtype: Any) -> str:
    if dtype not in _DTYPES:
        raise ExportError(f"tensors of {dtype} are not supported (only "
                          f"{', '.join(str(d) for d in _DTYPES)})")
    return _DTYPES[dtype]


def tensor_array(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def decompose(ep: Any) -> Any:
    """The program in core ATen, with ``KEEP_COMPOSITE`` operators left whole."""
    table = torch.export.default_decompositions()
    for name in KEEP_COMPOSITE:
        packet, overload = name.split(".")[1:]
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return ep.run_decompositions(table)


def target_name(target: Any) -> str:
    """``aten.convolution.default`` for an OpOverload; the Python name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def source_line(node: Any) -> tuple[str, str]:
    """(``file.py:12``, the code on that line) of the user's frame that made ``node``: the last
    frame of its stack trace outside torch itself; ("", "") when the trace is absent."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return "", ""
    outside = [f for f in frames if not os.path.abspath(f[0]).startswith(_TORCH_DIR)
               and not f[0].startswith("torch/")]
    path, line, _, code = (outside or frames)[-1]
    return f"{os.path.basename(path)}:{line}", code.strip()


def module_path(node: Any) -> str:
    """The dotted path of the innermost module that made ``node`` (``layer1.0.conv1``), or ""
    for the root module's own code."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] for k, v in stack.items() if not str(k).startswith("_") and isinstance(v, tuple)]
    path = paths[-1] if paths else ""
    return "" if path.startswith("_") else path


def _short_op(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "aten" else name


def check_supported(graph: Any, source: str) -> None:
    """Raise one ExportError listing every ATen operator of ``graph`` without a converter, each
    with the source line of its first use and how many nodes use it."""
    missing: dict[str, list[Any]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem or node.target in _PYTHON_OPS:
            continue
        name = target_name(node.target)
        if name in _IGNORED or lookup(name) is not None:
            continue
        missing.setdefault(name, []).append(node)
    if not missing:
        return
    parts = []
    for name, nodes in missing.items():
        where, code = source_line(nodes[0])
        at = f" at {where}" + (f" `{code}`" if code else "") if where else ""
        more = f" (+{len(nodes) - 1} more)" if len(nodes) > 1 else ""
        parts.append(f"{name}{at}{more}")
    count = len(missing)
    raise ExportError(f"{source} uses {count} ATen operator{'s' if count > 1 else ''} mlcpack "
                      f"does not support: {'; '.join(parts)}")


class _Importer:
    def __init__(self, bb: BlockBuilder, source: str) -> None:
        self.bb = bb
        self.source = source
        self.values: dict[Any, Any] = {}
        self.absorbed: dict[Any, Any] = {}

    # ---- for converters (NodeContext) -------------------------------------------------------

    def absorb(self, node: Any, result: Any) -> None:
        self.absorbed[node] = result

    def output_read(self, node: Any, index: int) -> bool:
        return any(u.target is operator.getitem and u.args[1] == index for u in node.users)

    def source_of(self, node: Any) -> Source:
        return Source(module_path(node) or node.name, _short_op(target_name(node.target)))

    def constant_value(self, node: Any) -> np.ndarray | None:
        value = self.values.get(node)
        return value.data if isinstance(value, Constant) else None

    # ---- conversion ---------------------------------------------------------------------------

    def resolve(self, value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            if value not in self.values:
                raise ExportError(f"{self.source}: {value.name} is used before it is computed")
            return self.values[value]
        if isinstance(value, (list, tuple)):
            return type(value)(self.resolve(v) for v in value)
        if isinstance(value, torch.dtype):
            return torch_dtype(value)
        if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
            return str(value)
        if isinstance(value, torch.SymInt):
            raise ExportError(f"{self.source}: a size given as {value} cannot be resolved")
        return value

    def schema_args(self, node: Any) -> dict[str, Any]:
        schema = node.target._schema
        args: dict[str, Any] = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                raw = node.args[i]
            elif a.name in node.kwargs:
                raw = node.kwargs[a.name]
            elif a.has_default_value():
                raw = a.default_value
            else:
                raw = None
            args[a.name] = self.resolve(raw)
        return args

    def convert(self, node: Any) -> None:
        if node in self.absorbed:
            self.values[node] = self.absorbed.pop(node)
            return
        if node.target is operator.getitem:
            whole, index = self.resolve(node.args[0]), node.args[1]
            part = whole[index]
            if part is None:
                raise ExportError(f"{self.source}: output {index} of {node.args[0].name} is "
                                  "read but mlcpack does not compute it")
            self.values[node] = part
            return
        if node.target in _PYTHON_OPS:
            self.values[node] = node.target(*self.resolve(list(node.args)))
            return
        name = target_name(node.target)
        if name in _IGNORED:
            return
        conv = lookup(name)
        assert conv is not None, "check_supported runs first"
        where, _ = source_line(node)
        source = self.source_of(node)
        ctx = NodeContext(self.bb, name, node.name, self.schema_args(node), where, source, self,
                          node, _meta_dtype(node))
        try:
            with self.bb.source(source):
                result = conv.convert(ctx)
        except SymbolicShapeError as exc:  # the op needs a dim the user left symbolic
            raise ctx.error(f"{' '.join(str(exc).split())}; it needs static shapes here: give "
                            "the input sizes as numbers (--input-shape x=1,3,224,224) or use "
                            "--batch-sizes") from None
        except (BuilderError, ValueError) as exc:
            raise ctx.error(" ".join(str(exc).split())) from None
        self.values[node] = result


def _meta_dtype(node: Any) -> str | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype in _DTYPES:
        return _DTYPES[val.dtype]
    return None


def _concrete_shape(name: str, val: Any, given: Sequence[int] | None, source: str
                    ) -> tuple[tuple[int, ...], dict[int, str]]:
    """The static shape of a user input, and its symbolic dims (axis -> symbol)."""
    dims: list[int] = []
    symbolic: dict[int, str] = {}
    for axis, d in enumerate(val.shape):
        if isinstance(d, torch.SymInt):
            symbolic[axis] = str(d.node.expr)
            hint = d.node.hint
            dims.append(int(hint) if hint is not None else -1)
        else:
            dims.append(int(d))
    if given is not None:
        # a name (x=N,784) keeps that dim symbolic: a size variable the runtime binds
        shape = tuple(size_var(d) if isinstance(d, str) else int(d) for d in given)
        if len(shape) != len(dims) or any(a not in symbolic and shape[a] != dims[a]
                                          for a in range(len(dims))):
            shown = ",".join("?" if a in symbolic else str(d) for a, d in enumerate(dims))
            raise ExportError(f"input shape {name}={','.join(map(str, given))} does not match "
                              f"the shape {source} was exported with, [{shown}] (? = a "
                              "torch.export.Dim)")
        return shape, symbolic
    if any(d < 0 for d in dims):
        example = ",".join(str(d) if d >= 0 else "1" for d in dims)
        raise ExportError(f"{source}: input {name!r} has symbolic dims without an example "
                          f"size: give its shape with --input-shape {name}={example}")
    return tuple(dims), symbolic


def import_exported(ep: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                    source: str = "the ExportedProgram",
                    input_names: Sequence[str] | None = None,
                    output_names: Sequence[str] | None = None
                    ) -> tuple[IRModule, TorchImportInfo]:
    """Convert an ExportedProgram to an IRModule whose ``main`` takes the user inputs (by
    ``forward``'s argument names, or ``input_names``) and returns the flattened user outputs
    (``output``, or ``output_0``, ``output_1``... , or ``output_names``). ``input_shapes`` fixes
    the symbolic dims of inputs (default: the example input's sizes). Raises ``ExportError``
    (one line) for anything it cannot convert."""
    try:
        ep = decompose(ep)
    except Exception as exc:  # torch's own failure to decompose: say so in one line
        raise ExportError(f"{source}: torch could not decompose the program to core ATen "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    graph = ep.graph
    check_supported(graph, source)
    sig = ep.graph_signature
    _check_outputs(sig, source)

    specs = list(sig.input_specs)
    user = [s for s in specs if s.kind.name == "USER_INPUT"]
    tensor_users = [s for s in user if isinstance(_placeholder(graph, s.arg.name).meta.get("val"),
                                                  torch.Tensor)]
    names = list(input_names) if input_names else [s.arg.name for s in tensor_users]
    if len(names) != len(tensor_users):
        raise ExportError(f"{source} takes {len(tensor_users)} tensor inputs; {len(names)} "
                          "input names given")
    given = dict(input_shapes or {})
    unknown = [k for k in given if k not in names]
    if unknown:
        raise ExportError(f"input shape given for {', '.join(map(repr, unknown))}, which "
                          f"{'is' if len(unknown) == 1 else 'are'} not an input of {source} "
                          f"(inputs: {', '.join(names) or 'none'})")
    if not tensor_users:
        raise ExportError(f"{source} has no tensor inputs; a bundle needs at least one")

    bb = BlockBuilder()
    imp = _Importer(bb, source)
    params: list[Var] = []
    shapes: dict[str, tuple[int, ...]] = {}
    symbolic: dict[str, dict[int, str]] = {}
    state = {**dict(ep.state_dict), **dict(ep.constants)}
    for spec in specs:
        node = _placeholder(graph, spec.arg.name)
        kind = spec.kind.name
        if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            data = state.get(spec.target)
            if not isinstance(data, torch.Tensor):
                raise ExportError(f"{source}: {kind.lower()} {spec.target!r} is not a tensor")
            label = spec.target if spec.target else node.name
            imp.values[node] = make_constant(bb, tensor_array(data), label)
        elif kind == "USER_INPUT":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):  # a number the program was specialized to
                imp.values[node] = val
                continue
            name = names[tensor_users.index(spec)]
            shape, sym = _concrete_shape(name, val, given.get(name), source)
            shapes[name] = shape
            if sym:
                symbolic[name] = sym
            var = bb.input(name, shape, torch_dtype(val.dtype))
            params.append(var)
            imp.values[node] = var
        else:
            raise ExportError(f"{source}: input {spec.arg.name!r} is a {kind.lower()}, which "
                              "mlcpack does not support (only tensors, parameters, buffers and "
                              "constants)")

    out_node = next(n for n in graph.nodes if n.op == "output")
    out_args = list(out_node.args[0])
    with bb.function("main", params):
        with bb.dataflow():
            for node in graph.nodes:
                if node.op == "call_function":
                    imp.convert(node)
            outs = []
            for i, arg in enumerate(out_args):
                value = imp.resolve(arg)
                if not isinstance(value, Value):
                    raise ExportError(f"{source}: output {i} is {type(value).__name__}; only "
                                      "tensor outputs are supported")
                outs.append(bb.emit_output(value))
        out_names = list(output_names) if output_names else (
            ["output"] if len(outs) == 1 else [f"output_{i}" for i in range(len(outs))])
        if len(out_names) != len(outs):
            raise ExportError(f"{source} has {len(outs)} outputs; {len(out_names)} output "
                              "names given")
        bb.emit_func_output(outs, names=out_names)
    ops = Counter(target_name(n.target) for n in graph.nodes if n.op == "call_function")
    info = TorchImportInfo(source, names, shapes, out_names, symbolic, dict(ops))
    return bb.get(), info


def _placeholder(graph: Any, name: str) -> Any:
    for node in graph.nodes:
        if node.op == "placeholder" and node.name == name:
            return node
    raise ExportError(f"the program has no input {name!r}")


def _check_outputs(sig: Any, source: str) -> None:
    for spec in sig.output_specs:
        kind = spec.kind.name
        if kind == "USER_OUTPUT":
            continue
        if kind == "BUFFER_MUTATION":
            raise ExportError(f"{source} updates buffer {spec.target!r} when it runs (a BatchNorm "
                              "in training mode?): export the module after module.eval()")
        raise ExportError(f"{source} has a {kind.lower()} output ({spec.target or spec.arg}); "
                          "mlcpack exports inference programs without side effects")
