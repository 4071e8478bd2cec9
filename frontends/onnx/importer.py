"""ONNX model -> IRModule.

``import_onnx`` loads the model, refuses it at once with every operator it cannot convert
listed, runs the ONNX checker, makes graph inputs parameters of ``main`` (shapes static, from the
file or ``input_shapes``) and initializers constants, then converts node by node with the
converter each node's opset selects. Output types come from our own operator table
(``emit_op`` infers them); shapes recorded in the ONNX file are never trusted past the inputs.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from . import proto as onnx

from ...packager.errors import ExportError
from ...packager.ir.builder import BlockBuilder, BuilderError
from ...packager.ir.graph import Constant, IRModule, Source, Value, Var
from ...packager.ir.sym import SymbolicShapeError, size_var
from . import converters, sequences, symvalue, valueinputs  # noqa: F401  (registers every converter family)
from .dtypes import RUNTIME_DTYPES
from .loops import casts_into_rows
from .registry import (IGNORED_ATTRIBUTES, NodeContext, lookup, make_constant, normalize_domain,
                       op_label)


@dataclass
class ImportInfo:
    """What the import found, for reports and the command line."""

    source: str                                  # file name, or the graph's name
    opsets: dict[str, int]                       # domain ("" for ONNX) -> version
    producer: str                                # e.g. "pytorch 2.4.0"
    input_names: dict[str, str]                  # ONNX input name -> bundle input name
    input_shapes: dict[str, tuple[int, ...]]     # ONNX input name -> static shape used
    output_names: list[str]
    op_counts: dict[str, int] = field(default_factory=dict)
    folded_nodes: int = 0                        # nodes computed at import (shape arithmetic)

    @property
    def renamed_inputs(self) -> dict[str, str]:
        """Inputs whose bundle name differs from the ONNX name (not a valid identifier)."""
        return {k: v for k, v in self.input_names.items() if k != v}


def import_onnx(model_or_path: str | os.PathLike | onnx.ModelProto,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                bind: Mapping[str, np.ndarray] | None = None,
                max_shapes: Mapping[str, Sequence[int]] | None = None
                ) -> tuple[IRModule, ImportInfo]:
    """Convert an ONNX model (a path or a loaded ``ModelProto``) to an IRModule whose ``main``
    takes the graph's inputs (by their ONNX names) and returns its outputs (by their ONNX
    names). ``input_shapes`` gives static shapes for inputs with symbolic or unknown dims;
    ``bind`` turns graph inputs into constants with the given values (``--bind``, the course's
    BindParams); ``max_shapes`` bounds inputs' symbolic dims (checked at run time).
    Raises ``ExportError`` (one line) for anything it cannot convert."""
    model, source = _load(model_or_path)
    if model.functions:
        model = onnx.inline_local_functions(model)
    opsets = _opsets(model)
    check_supported(model.graph, opsets, source)
    _check_model(model, model_or_path, source)
    graph = model.graph
    _check_unique_outputs(graph, source)

    initializer_names = {t.name for t in graph.initializer}
    runtime_inputs = [vi for vi in graph.input if vi.name not in initializer_names]
    bound = _bound_inputs(runtime_inputs, dict(bind or {}), source)
    runtime_inputs = [vi for vi in runtime_inputs if vi.name not in bound]
    shapes = _input_shapes(runtime_inputs, dict(input_shapes or {}), source)
    bounds = _max_shapes(runtime_inputs, shapes, dict(max_shapes or {}), source)

    if not runtime_inputs:
        raise ExportError(f"{source} has no run-time inputs (its outputs are constants); a "
                          "bundle needs at least one input")
    bb = BlockBuilder()   # it keeps the relations between symbolic dims that inference assumed
    params = _make_params(bb, runtime_inputs, shapes, source)
    # the --max-shape bound of each size variable that is an input's dim (a Loop over it unrolls
    # to the bound)
    bb.size_bounds = {d.variables().pop(): m for name, dims in bounds.items()
                      for d, m in zip(params[name].type.shape, dims)
                      if not isinstance(d, int) and str(d) in d.variables()}
    values: dict[str, Value] = dict(params)
    # inputs read only as shapes: their values bind size variables at run start
    taken = {v for p in params.values() for d in p.type.shape
             if not isinstance(d, int) for v in d.variables()}
    read_as_shapes = valueinputs.value_inputs(graph, params, taken)
    bb.axes_params = {id(p): p for name, p in params.items() if name not in read_as_shapes}
    values.update(read_as_shapes)
    for init in graph.initializer:
        values[init.name] = make_constant(bb, _tensor_array(init, source), init.name)
    for name, data in bound.items():
        values[name] = make_constant(bb, data, name)

    converter = _GraphConverter(bb, values, opsets, source)
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            for node in graph.node:
                converter.convert(node)
            outputs = [bb.emit_output(converter.graph_output(o.name)) for o in graph.output]
        bb.emit_func_output(outputs, names=[o.name for o in graph.output])

    info = ImportInfo(
        source=source, opsets=opsets,
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        input_names={name: v.name for name, v in params.items()},
        input_shapes={name: v.type.shape for name, v in params.items()},
        output_names=[o.name for o in graph.output],
        op_counts=dict(Counter(op_label(n.domain, n.op_type) for n in graph.node)),
        folded_nodes=converter.folded_nodes)
    mod = bb.get()
    casts_into_rows(mod)   # format 1.9: a row store's Cast (Range's function) on each row
    mod.max_shapes = {params[k].name: v for k, v in bounds.items()}
    mod.value_vars = valueinputs.module_rows_all(bb, read_as_shapes)
    return mod, info


def _bound_inputs(inputs: Sequence[onnx.ValueInfoProto], given: dict[str, np.ndarray],
                  source: str) -> dict[str, np.ndarray]:
    """``--bind NAME=file.npy``: the graph inputs that become constants, checked against what
    the model declares (dtype, rank, fixed sizes)."""
    by_name = {vi.name: vi for vi in inputs}
    out = {}
    for name, data in given.items():
        vi = by_name.get(name)
        if vi is None:
            raise ExportError(f"--bind names {name!r}, which is not an input of {source} "
                              f"(inputs: {', '.join(by_name) or 'none'})")
        tt = vi.type.tensor_type
        want = np.dtype(onnx.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
        data = np.asarray(data)
        if want is not None and data.dtype != want:
            raise ExportError(f"--bind {name}: the array is {data.dtype}; the model takes "
                              f"{want}: save it with .astype(np.{want})")
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if len(dims) != data.ndim or any(d is not None and d != n
                                             for d, n in zip(dims, data.shape)):
                shown = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
                raise ExportError(f"--bind {name}: the array has shape {tuple(data.shape)}; "
                                  f"{source} declares {shown}")
        out[name] = np.ascontiguousarray(data)
    if given and len(out) == len(inputs):
        raise ExportError(f"--bind binds every input of {source}; a bundle needs at least one "
                          "run-time input")
    return out


def _max_shapes(inputs: Sequence[onnx.ValueInfoProto], shapes: Mapping[str, tuple],
                given: dict[str, Sequence[int]], source: str) -> dict[str, tuple[int, ...]]:
    """``--max-shape NAME=DIMS``: upper bounds of an input's sizes, one per dim."""
    names = [vi.name for vi in inputs]
    out = {}
    for name, dims in given.items():
        if name not in shapes:
            raise ExportError(f"--max-shape names {name!r}, which is not an input of {source} "
                              f"(inputs: {', '.join(names) or 'none'})")
        shape = shapes[name]
        text = ",".join(map(str, dims))
        try:
            dims = tuple(int(d) for d in dims)
        except (TypeError, ValueError):
            raise ExportError(f"--max-shape {name}={text}: sizes must be integers") from None
        if len(dims) != len(shape):
            raise ExportError(f"--max-shape {name}={text} has {len(dims)} sizes; the input has "
                              f"rank {len(shape)}")
        for d, (m, s) in enumerate(zip(dims, shape)):
            if m < 1 or isinstance(s, int) and m < s:
                raise ExportError(f"--max-shape {name}={text}: size {m} at axis {d} is below "
                                  f"{'1' if m < 1 else f'the fixed size {s}'}")
        out[name] = dims
    return out


# ---- loading and checking -----------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _load(model_or_path: str | os.PathLike | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, model_or_path.graph.name or "the ONNX model"
    source = os.path.basename(os.fspath(model_or_path))
    if not os.path.isfile(model_or_path):
        raise ExportError(f"{source}: no such file ({os.fspath(model_or_path)})")
    try:
        model = onnx.load_model(model_or_path)
    except (DecodeError, ValueError, RuntimeError, OSError, onnx.validation_error()) as exc:
        raise ExportError(f"{source} is not a valid ONNX file: {_one_line(exc)}") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        raise ExportError(f"{source} is not a valid ONNX file: it has no graph or no IR version")
    return model, source


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for entry in model.opset_import:
        opsets[normalize_domain(entry.domain)] = int(entry.version)
    if model.ir_version < 3 and "" not in opsets:
        opsets[""] = 1  # IR version 1 and 2 models predate opset_import
    return opsets


def check_supported(graph: onnx.GraphProto, opsets: Mapping[str, int], source: str) -> None:
    """Raise one ExportError naming every (domain, op_type, opset) the graph uses that no
    converter handles, before anything is converted."""
    missing: dict[tuple[str, str, int | None], None] = {}
    for node in _nodes_with_subgraphs(graph):
        domain = normalize_domain(node.domain)
        opset = opsets.get(domain)
        if lookup(domain, node.op_type, opset) is None:
            missing[(domain, node.op_type, opset)] = None
    if not missing:
        return
    listed = ", ".join(f"{op_label(d, op)} (opset {v})" if v is not None
                       else f"{op_label(d, op)} (domain {d or 'ai.onnx'!r} not imported)"
                       for d, op, v in missing)
    count = len(missing)
    raise ExportError(f"{source} uses {count} operator{'s' if count > 1 else ''} mlcpack does not "
                      f"support: {listed}")


def _nodes_with_subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The graph's nodes and, depth first, those of the subgraphs their attributes hold (If
    branches, Loop and Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes_with_subgraphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes_with_subgraphs(sub)


def _check_model(model: onnx.ModelProto, original: Any, source: str) -> None:
    """The ONNX checker, lenient about what mlcpack never reads: graph inputs and outputs may
    lack shapes (we infer every shape ourselves; inputs then need ``input_shapes``)."""
    graph = model.graph
    shapeless = [vi.type.tensor_type for vi in list(graph.input) + list(graph.output)
                 if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]
    target: onnx.ModelProto | str = model
    if not isinstance(original, onnx.ModelProto) and model.ByteSize() > (1 << 31) - 1:
        target = os.fspath(original)  # models over 2 GB can only be checked from their path
    for tt in shapeless:
        tt.shape.SetInParent()  # present but empty, for the checker only
    try:
        try:
            onnx.check_model(target)
        except onnx.validation_error() as exc:
            if not _deprecated_we_read(model, exc):
                raise
            onnx.check_model(_without_deprecated(model))
    except (onnx.validation_error(), ValueError) as exc:
        raise ExportError(f"{source} is not a valid ONNX model: {_one_line(exc)}") from None
    finally:
        for tt in shapeless:
            tt.ClearField("shape")


# Operator versions the checker refuses as deprecated although ONNX Runtime still runs them and
# exporters wrote them: GroupNormalization-18 (scale and bias per group; opset 21 made them per
# channel and deprecated 18). The converters read them as their version says (onnx/nn.py).
_DEPRECATED_READ = {"GroupNormalization"}
_PLACEHOLDER_DOMAIN = "mlcpack.checker-placeholder"


def _deprecated_we_read(model: onnx.ModelProto, exc: Exception) -> bool:
    text = str(exc)
    return ("is deprecated in domain_version" in text
            and any(f"OpType: {op}" in text for op in _DEPRECATED_READ))


def _without_deprecated(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for the checker with the deprecated ops we read renamed into a domain the checker
    does not know (it checks the rest of the graph, their edges included, as usual)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in _nodes_with_subgraphs(copy.graph):
        if node.domain in ("", "ai.onnx") and node.op_type in _DEPRECATED_READ:
            node.domain = _PLACEHOLDER_DOMAIN
    copy.opset_import.add(domain=_PLACEHOLDER_DOMAIN, version=1)
    return copy


def _check_unique_outputs(graph: onnx.GraphProto, source: str) -> None:
    # The checker allows a graph output listed twice; a bundle's outputs are looked up by name.
    counts = Counter(o.name for o in graph.output)
    repeated = sorted(name for name, n in counts.items() if n > 1)
    if repeated:
        raise ExportError(f"{source} lists graph output {', '.join(map(repr, repeated))} more than "
                          "once; outputs must have distinct names: remove the duplicate")


def _tensor_array(tensor: onnx.TensorProto, source: str) -> np.ndarray:
    try:
        return onnx.to_array(tensor)
    except (ValueError, TypeError, OSError) as exc:
        raise ExportError(f"{source}: initializer {tensor.name!r} cannot be read: "
                          f"{_one_line(exc)}") from None


# ---- inputs -------------------------------------------------------------------------------------

def _flag_example(name: str, dims: Sequence[int | None]) -> str:
    shown = ",".join(str(d) if d is not None else "1" for d in dims) or "1,3,224,224"
    return f"--input-shape {name}={shown}"


def _input_shapes(inputs: Sequence[onnx.ValueInfoProto], given: dict[str, Sequence[int]],
                  source: str) -> dict[str, tuple[int, ...]]:
    names = [vi.name for vi in inputs]
    unknown = [k for k in given if k not in names]
    if unknown:
        raise ExportError(f"--input-shape names {', '.join(map(repr, unknown))}, which "
                          f"{'is' if len(unknown) == 1 else 'are'} not an input of {source} "
                          f"(inputs: {', '.join(names) or 'none'})")
    # a named dim that --input-shape fixes in one input is fixed in every input that shares the
    # name (PLCMOS's degraded_audio [batch_size, 1, frames, 257] and rater_embed [batch_size,
    # 64]: fixing one left the other open, and the golden check fed them different batches)
    fixed: dict[str, int] = {}
    for vi in inputs:
        if vi.name in given and vi.type.HasField("tensor_type"):
            for proto, d in zip(vi.type.tensor_type.shape.dim, given[vi.name]):
                if proto.dim_param and isinstance(d, int) and not isinstance(d, bool):
                    fixed.setdefault(proto.dim_param, d)
    shapes = {}
    for vi in inputs:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ExportError(f"{source}: input {vi.name!r} is not a tensor; only tensor inputs "
                              "are supported")
        has_shape = tt.HasField("shape")
        dims: list[int | None] = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                                  else None for d in tt.shape.dim]
        if vi.name in given:
            shapes[vi.name] = _given_shape(vi.name, dims if has_shape else None,
                                           given[vi.name], source)
            continue
        if not has_shape:
            raise ExportError(f"{source}: input {vi.name!r} has no declared shape: give it with "
                              f"{_flag_example(vi.name, [])}")
        # A named or unknown dim stays symbolic (a size variable the runtime binds from the
        # fed array); an op that needs it fixed refuses with a pointer to --input-shape.
        shapes[vi.name] = tuple(
            int(d) if d is not None else fixed[proto.dim_param] if proto.dim_param in fixed
            else size_var(_var_name(vi.name, axis, proto.dim_param))
            for axis, (d, proto) in enumerate(zip(dims, tt.shape.dim)))
    return shapes


def _flag_example_for(bb: BlockBuilder) -> str:
    """``--input-shape x=1,3,<H>,<W>`` for the first input with a symbolic dim: a batch of 1,
    the other open dims by name, for the user to choose (1 is no image width)."""
    for p in bb.params if hasattr(bb, "params") else []:
        if any(not isinstance(d, int) for d in p.type.shape):
            shown = ",".join(str(d) if isinstance(d, int) else "1" if axis == 0 else f"<{d}>"
                             for axis, d in enumerate(p.type.shape))
            return f"--input-shape {p.name}={shown}"
    return "--input-shape NAME=1,3,224,224"


def _var_name(input_name: str, axis: int, dim_param: str) -> str:
    """A size variable's name: the ONNX dim_param as an identifier, else ``<input>_<axis>``."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in dim_param)
    if not any(c.isalnum() for c in name):   # "?" and the like: no name worth keeping
        name = "".join(c if c.isalnum() or c == "_" else "_" for c in input_name) + f"_{axis}"
    return name if not name[0].isdigit() else "d" + name


def _given_shape(name: str, declared: list[int | None] | None, given: Sequence[int],
                 source: str) -> tuple[int, ...]:
    try:
        # a name (--input-shape x=N,784) keeps that dim symbolic, as a size variable
        shape = tuple(size_var(d) if isinstance(d, str) and d.isidentifier() else int(d)
                      for d in given)
    except (TypeError, ValueError):
        raise ExportError(f"--input-shape {name}: {given!r} is not a list of sizes") from None
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ExportError(f"--input-shape {name}={','.join(map(str, shape))}: sizes must be >= 0")
    if declared is not None:
        shown = "[" + ", ".join("?" if d is None else str(d) for d in declared) + "]"
        if len(declared) != len(shape) or any(d is not None and d != s and isinstance(s, int)
                                              for d, s in zip(declared, shape)):
            raise ExportError(f"--input-shape {name}={','.join(map(str, shape))} does not match "
                              f"the shape {source} declares, {shown}")
    return shape


def _make_params(bb: BlockBuilder, inputs: Sequence[onnx.ValueInfoProto],
                 shapes: Mapping[str, tuple[int, ...]], source: str) -> dict[str, Var]:
    """One ``main`` parameter per graph input, in graph order, named exactly as in ONNX when that
    name is an identifier (those are created first, so sanitized names cannot take them)."""
    made: dict[str, Var] = {}
    ordered = sorted(inputs, key=lambda vi: not vi.name.isidentifier())
    for vi in ordered:
        elem = vi.type.tensor_type.elem_type
        dtype = str(np.dtype(onnx.tensor_dtype_to_np_dtype(elem))) if elem else "undefined"
        if dtype not in RUNTIME_DTYPES:
            raise ExportError(f"{source}: input {vi.name!r} is {dtype}: {dtype} tensors at run time "
                              f"are not supported yet (only {', '.join(RUNTIME_DTYPES)})")
        made[vi.name] = bb.input(vi.name, shapes[vi.name], dtype)
    return {vi.name: made[vi.name] for vi in inputs}


# ---- nodes --------------------------------------------------------------------------------------

def _attribute_value(attr: onnx.AttributeProto) -> Any:
    value = onnx.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return onnx.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


class _GraphConverter:
    """Converts nodes in graph order, keeping the ONNX name -> IR value map."""

    def __init__(self, bb: BlockBuilder, values: dict[str, Value], opsets: Mapping[str, int],
                 source: str) -> None:
        self.bb = bb
        self.values = values
        self.opsets = opsets
        self.source = source
        self.unavailable: dict[str, str] = {}   # output name -> why there is no value
        self.folded_nodes = 0
        self.materialized: dict[int, Value] = {}   # id(SymValue) -> its run-time tensor
        # id(input) -> (input, result) of run-time-sized ops that give one answer per input
        # (NonZero): repeated NonZero of one mask share one count, so their sizes agree
        self.memo: dict[int, tuple[Value, Value]] = {}

    def _materialize(self, v: symvalue.SymValue) -> Value:
        made = self.materialized.get(id(v))
        if made is None:
            made = self.materialized[id(v)] = symvalue.materialize(self.bb, v)
        return made

    def graph_output(self, name: str) -> Value:
        v = self.value(name, "graph output")
        if isinstance(v, sequences.SeqValue):
            raise ExportError(f"{self.source}: graph output {name!r} is a sequence: only "
                              "tensors are a bundle's outputs (a ConcatFromSequence of it is)")
        return self._materialize(v) if isinstance(v, symvalue.SymValue) else v

    def value(self, name: str, user: str) -> Value:
        if name in self.values:
            return self.values[name]
        if name in self.unavailable:
            raise ExportError(f"{self.source}: {user} uses {name!r}, {self.unavailable[name]}")
        raise ExportError(f"{self.source}: {user} uses {name!r}, which no node, input or "
                          "initializer defines")

    def convert(self, node: onnx.NodeProto) -> None:
        domain = normalize_domain(node.domain)
        opset = self.opsets[domain]
        conv = lookup(domain, node.op_type, opset)
        assert conv is not None, "check_supported runs first"
        label = op_label(domain, node.op_type)
        who = f"{label} node {node.name or node.output[0]!r}"
        attrs = dict(conv.attrs)
        for a in node.attribute:
            if a.name in IGNORED_ATTRIBUTES:
                continue
            if a.name not in conv.attrs:
                raise ExportError(f"{self.source}: {who} (opset {opset}) sets attribute "
                                  f"{a.name!r}, which mlcpack does not handle")
            attrs[a.name] = _attribute_value(a)
        inputs = [self.value(name, who) if name else None for name in node.input]
        # If/Loop/Scan convert their subgraphs against this graph's values (``inline``)
        ctx = NodeContext(self.bb, node, opset, inputs, attrs, self.source, scope=self)
        if domain == "" and node.op_type not in sequences.SEQUENCE_OPS | {"Loop"}:
            sequences.refuse_sequences(ctx)
        try:
            # every binding this node becomes names it, through the passes into the bundle
            with self.bb.source(Source(node.name or (node.output[0] if node.output else label),
                                       label)):
                result = None
                if symvalue.any_symbolic(inputs):   # shape arithmetic on symbolic dims
                    result = symvalue.fold(ctx, label) if domain == "" else None
                    if result is None:   # read as a run-time tensor where not a shape input
                        keep = symvalue.SHAPE_INPUTS.get(label, frozenset()) \
                            if domain == "" else frozenset()
                        ctx.inputs = [self._materialize(v) if isinstance(v, symvalue.SymValue)
                                      and i not in keep else v for i, v in enumerate(inputs)]
                if result is None:
                    result = conv.convert(ctx)
        except SymbolicShapeError as exc:  # the op needs a dim the model leaves open
            raise ctx.error(f"{_one_line(exc)}; it needs static shapes here: fix the input "
                            f"sizes with {_flag_example_for(self.bb)}") from None
        except (BuilderError, ValueError) as exc:  # shape or attribute values the ops refuse
            raise ctx.error(_one_line(exc)) from None
        outs = list(result) if isinstance(result, (list, tuple)) else [result]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i < len(outs):
                self.values[name] = outs[i]
            else:
                self.unavailable[name] = (f"output {i} of {who}, which mlcpack does not compute "
                                          "(only inference outputs are supported)")
        if outs and all(isinstance(v, Constant) for v in outs):
            self.folded_nodes += 1

    def inline(self, ctx: NodeContext, graph: onnx.GraphProto, bound: Sequence[Value],
               isolated: dict[str, Value] | None = None,
               opsets: Mapping[str, int] | None = None) -> list[Value]:
        """``NodeContext.inline``: convert subgraph ``graph`` with a converter of its own."""
        if len(graph.input) != len(bound):
            raise ctx.error(f"subgraph {graph.name!r} takes {len(graph.input)} inputs, "
                            f"{len(bound)} given")
        opsets = dict(self.opsets, **(opsets or {}))
        check_supported(graph, opsets, self.source)
        values = dict(self.values) if isolated is None else dict(isolated)
        for init in graph.initializer:
            values[init.name] = make_constant(ctx.bb, _tensor_array(init, self.source), init.name)
        for vi, v in zip(graph.input, bound):
            values[vi.name] = v
        inner = _GraphConverter(ctx.bb, values, opsets, self.source)
        if isolated is None:
            inner.unavailable = dict(self.unavailable)
        for node in graph.node:
            inner.convert(node)
        return [inner.value(o.name, f"subgraph {graph.name!r} output") for o in graph.output]
