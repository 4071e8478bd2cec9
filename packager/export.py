"""The export driver: IRModule -> passes -> LLVM object -> VM program -> bundle file.

Its public entries (``export_module``, ``export_batched``, ``export_specialized``,
``compile_module``, ``compile_variants``) take the compiler's settings as one
``CompileOptions`` (packager/options.py); given none, they read them from the environment once
(``CompileOptions.from_environ``, docs/env-vars.md) and hand them down explicitly."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import llvmlite
import numpy as np

from .. import packager
from ..runtime.bundle import (BRANCH_MINOR, DYNAMIC_MINOR, FORMAT_MAJOR, FORMAT_MINOR,
                              GROW_MINOR, LOOP_MINOR, SCALES_MINOR, STORE_MINOR, STORED_MINOR,
                              SYMBOLIC_MINOR, VALUES_MINOR)
from ..runtime.header import (CONST, BatchInfo, CodeVariant, ConstantRow, Header, IORow,
                              KernelRow, MemoryPlan, Plan, StoredRecord, SymbolicBound, VMRecord,
                              freeze, plain)
from .bundle_writer import BundleWriteError, BundleWriter
from .codegen.build import ALLOWED_EXTERNALS, CodegenError, CompiledCode, KernelCompileError
from .codegen.lower import KernelInfo, LoweringError
from .codegen.objinfo import function_sizes
from .codegen.parallel import Background, compile_for_targets
from .codegen.target import Target, TargetError, drop_idle_levels, resolve_targets
from .errors import ExportError
from .ir.builder import BuilderError
from .ir.graph import CallTIR, Function, IRModule, StoredInt, merge_sources
from .ir.printer import module_text
from .passes import DEFAULT_PIPELINE, bind_params, run_pipeline
from .options import PRECISIONS, CompileOptions
from .passes.memory_plan import UnboundedSizeError, bounded_plan
from .passes.simplify import BindError
from .timings import StageClock
from .ir.sym import SymbolicShapeError, SymExpr, to_record
from .ir.sym import evaluate as sym_evaluate
from .vm_emit import Program, VMEmitError, emit_program, main_size_vars, source_records


@dataclass
class ExportOptions:
    target: str | None = None                 # level name(s), comma-separated; None: portable
    preprocess: dict | None = None            # recorded for `mlcpack infer` on images
    labels: Sequence[str] | None = None
    model_name: str = "model"
    source: str | None = None                 # the file the model came from (name only)
    source_sha256: str | None = None
    verify_ir: bool = True
    sign_key: str | os.PathLike | None = None  # Ed25519 private key file: sign the bundle
    # The golden check (packager/golden.py): run the model once with a reference and with the
    # exported bundle, embed the pair, and refuse the export when they disagree. Off by
    # default in the API (the conformance tests compare themselves); on in `mlcpack export`.
    check: bool = False
    check_inputs: Mapping[str, np.ndarray] | None = None   # default: seeded random inputs
    check_seed: int = 0
    check_rtol: float = 1e-3
    check_atol: float = 1e-4                  # times the output's scale (its largest |value|)
    # onnx.reference's advice without onnxruntime (golden.py): None where it is cheap, True
    # always, False never
    check_advice: bool | None = None
    # feeds (bundle input names) -> outputs (bundle output names); None: the IR's numpy reference.
    # A golden.Reference with refuses=False (onnx.reference) is advice: it warns, never fails.
    reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    reference_name: str | None = None
    # "fp32", or "bf16": the packed contraction weights stored as bfloat16 (passes/layout.py
    # weights_to_bf16), guarded by BF16_MAX_ERROR (maps onto CompileOptions.precision)
    precision: str = "fp32"
    bf16_max_error: float = 0.01              # bf16 guard: largest error, times output's scale
    bf16_keep: frozenset | None = None        # bf16: source weights kept fp32 (set by the guard;
    #                                           maps onto CompileOptions.bf16_keep)
    # The compiler's settings; None: from the environment (``CompileOptions.from_environ``).
    # ``target`` above, when given, is its target; ``verify_ir`` False above turns its off;
    # ``precision`` and ``bf16_keep`` above are its precision and bf16_keep.
    compile: CompileOptions | None = None

    def compile_options(self) -> CompileOptions:
        """The ``CompileOptions`` this export compiles with (the environment is read here, once,
        when ``compile`` is None)."""
        base = self.compile if self.compile is not None else CompileOptions.from_environ(
            os.environ)
        return base.replace(target=self.target if self.target is not None else base.target,
                            verify_ir=self.verify_ir and base.verify_ir,
                            precision=self.precision, bf16_keep=self.bf16_keep or frozenset())


class SymbolicPlanError(ExportError):
    """``export_specialized``: the symbolic module does not compile (a graph that needs static
    shapes); the CLI then falls back to padded batch plans."""


@dataclass
class ExportReport:
    path: str
    bundle_bytes: int
    target: Target                            # the first target (the only one unless fat)
    kernels: int
    instructions: int
    weights_bytes: int
    arena_bytes: int
    intermediate_bytes: int
    seconds: float
    # wall seconds per stage, in the order they ran (packager/timings.py; `export --timings`)
    stages: dict[str, float] = field(default_factory=dict)
    stage_cpu: dict[str, float] = field(default_factory=dict)   # CPU seconds, same stages
    # every compile: (target name, seconds, from the compile cache), per plan and target
    compiles: list[tuple[str, float, bool]] = field(default_factory=list)
    # every compile's (phase, CPU seconds) pairs (``CompiledCode.phases``), as ``compiles``
    compile_phases: list[tuple[str, tuple[tuple[str, float], ...]]] = field(
        default_factory=list)
    targets: list[Target] = field(default_factory=list)  # one code variant each
    plans: list[dict] = field(default_factory=list)  # per batch size (dynamic batch bundles)
    check: str | None = None                  # what the golden check did, one line
    check_warnings: list[str] = field(default_factory=list)  # advice that did not fail it
    specialized: bool = False                 # plans: static ones beside the symbolic plan
    # symbolic bundles: the --max-shape upper-bound arena (None: planned per shape at run time)
    bound_bytes: int | None = None
    plan_note: str | None = None              # how memory is planned, when --max-shape was given
    # kernels compiled with a conservative pipeline because LLVM aborted on them, one line each
    compile_warnings: list[str] = field(default_factory=list)
    precision: str = "fp32"                   # what the bundle computes in (after the bf16 guard)
    precision_note: str | None = None         # --precision bf16: the guard's one line


def compile_module(mod: IRModule, params: Mapping[str, np.ndarray] | None = None,
                   target: str | None = None, verify_ir: bool = True,
                   on_stage: Callable[[str], None] | None = None,
                   options: CompileOptions | None = None
                   ) -> tuple[IRModule, Any, Program]:
    """Run the pipeline and code generation; return (optimized module, compiled code, program).
    ``target`` None is this host's level (one object to run here, not the portable bundle's
    several); with several targets, the compiled code is the first target's (see
    ``compile_variants``). ``options`` None: from the environment; ``target`` and
    ``verify_ir`` replace its fields of that name."""
    optimized, variants, program = compile_variants(mod, params, target or "host", verify_ir,
                                                    on_stage, options=options)
    return optimized, variants[0], program


def compile_variants(mod: IRModule, params: Mapping[str, np.ndarray] | None = None,
                     target: str | None = None, verify_ir: bool = True,
                     on_stage: Callable[[str], None] | None = None, pack_rows: bool = True,
                     options: CompileOptions | None = None
                     ) -> tuple[IRModule, list[CompiledCode], Program]:
    """Like ``compile_module`` for a comma-separated list of targets: one object per target,
    and one VM program (and memory plan) that every object serves. ``pack_rows`` False keeps
    convolution weights [O, C, KH, KW] (no ``nn.conv2d_rows``). The layout choices
    ``options`` leaves open are made for the targets (``CompileOptions.for_targets``)."""
    base = options if options is not None else CompileOptions.from_environ(os.environ)
    options = base.replace(target=target, verify_ir=verify_ir)
    note = on_stage or (lambda s: None)
    try:
        targets = resolve_targets(options.target, options.precision)
        if not pack_rows:
            options = options.replace(conv_row_widths=())
        options = options.for_targets(targets)
        if params:
            mod = bind_params(mod, params)
        note("passes")
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=options,
                           verify=options.verify_ir and options.verify_each_pass,
                           verify_result=options.verify_ir)
        note("codegen")
        funcs = list(mod.prim_funcs().values())
        targets = drop_idle_levels(targets, funcs)
        try:
            variants = compile_for_targets(funcs, targets, main_size_vars(mod), options)
        except KernelCompileError as exc:
            raise ExportError(
                f"LLVM aborted compiling {kernel_names(mod, exc.kernels, exc.serves)} for "
                f"{exc.target}, also with its conservative pipelines ({exc.reason}); export "
                "for other targets (--target) or report it") from None
        note("vm")
        program = emit_program(mod, _common_kernels(variants))
    except (TargetError, CodegenError, LoweringError, VMEmitError, BindError, BuilderError) as exc:
        raise ExportError(str(exc)) from None
    except SymbolicShapeError as exc:
        raise ExportError(f"{exc}: this model needs static shapes here; fix the input sizes "
                          f"with {_input_shape_example(mod)} (a named batch with --batch-sizes "
                          "gets one static plan per size)") from None
    return mod, variants, program


def kernel_names(mod: IRModule, kernels: Sequence[str], serves: Sequence[str]) -> str:
    """``kernels`` in words for a message, with the source-model nodes of every call of the
    prim funcs in ``serves``: "kernel recurrence (ONNX node lstm, DynamicQuantizeLSTM)"."""
    sources = merge_sources(*(b.source for fn in mod.functions.values()
                              if isinstance(fn, Function) for b in fn.bindings()
                              if isinstance(b.value, CallTIR) and b.value.func in serves))
    shown = ", ".join(kernels[:3]) + (f" and {len(kernels) - 3} more" if len(kernels) > 3
                                      else "")
    nodes = "; ".join(f"{s.name or '(unnamed)'}, {s.op}" for s in sources[:4]) + \
        (f"; {len(sources) - 4} more" if len(sources) > 4 else "")
    return (f"kernel{'s' if len(kernels) > 1 else ''} {shown}"
            + (f" (ONNX node{'s' if len(sources) > 1 else ''} {nodes})" if sources else ""))


def fallback_warnings(mod: IRModule, variants: Sequence[CompiledCode]) -> list[str]:
    """One line per kernel that LLVM aborted on under the default pipeline and that compiled
    with a conservative one (``codegen/parallel.py``)."""
    return [f"LLVM aborted compiling {kernel_names(mod, [fb.kernel], fb.serves)} for "
            f"{v.target.name} ({fb.reason}); compiled it with {fb.pipeline.name} instead"
            for v in variants for fb in v.fallbacks]


def _input_shape_example(mod: IRModule) -> str:
    """``--input-shape x=1,3,16,16``: the first input with symbolic dims, each of them at 1."""
    for p in mod.main.params:
        if any(not isinstance(d, int) for d in p.type.shape):
            dims = ",".join(str(d) if isinstance(d, int) else "1" for d in p.type.shape)
            return f"--input-shape {p.name}={dims}"
    return "--input-shape"


def _common_kernels(variants: list[CompiledCode]) -> dict[str, KernelInfo]:
    """Kernel facts every variant agrees with: the same signature, and the largest workspace
    (a kernel's scratch size may depend on the target's vector width)."""
    merged = {}
    for name, info in variants[0].kernels.items():
        infos = [v.kernels[name] for v in variants]
        if len({(k.symbol, k.num_inputs, k.num_outputs, k.parallel) for k in infos}) != 1:
            raise CodegenError(f"kernel {name} differs between targets "
                               f"{', '.join(v.target.name for v in variants)}; export them apart")
        merged[name] = dataclasses.replace(
            info, workspace_bytes=max(k.workspace_bytes for k in infos),
            workspace_expr=workspace_bound([k.workspace_expr for k in infos]))
    return merged


def workspace_bound(exprs: list) -> Any:
    """One size expression at least each variant's run-time workspace ``exprs`` (None where
    a kernel has no symbolic workspace): the bundle holds one expression per kernel, and the
    variant that runs may need more than the first's (a 512-bit tile's rows at small images:
    the open integer quad convolution of x86-64-v4+vnni wrote past a workspace sized by
    x86-64-v2's expression). Polynomials with no negative coefficient: the largest coefficient
    of each term (at least each, the size variables being >= 0); else their sum (each >= 0)."""
    exprs = [e for e in exprs if e is not None]
    if not exprs:
        return None
    if all(isinstance(e, int) for e in exprs):
        return max(exprs)
    if all(e == exprs[0] for e in exprs[1:]):
        return exprs[0]
    polys = [SymExpr({(): e}) if isinstance(e, int) else e for e in exprs]
    if all(c >= 0 for p in polys for c in p.terms.values()):
        terms: dict = {}
        for p in polys:
            for m, c in p.terms.items():
                terms[m] = max(terms.get(m, 0), c)
        return SymExpr(terms)._norm()
    total = polys[0]
    for p in polys[1:]:
        total = total + p
    return total


def _kernel_rows(program: Program, infos: list[KernelInfo], mod: IRModule
                 ) -> tuple[KernelRow, ...]:
    """The header's kernel table. Optional fields: ``source``, the source-model nodes the
    kernel's calls came from (``[{"name", "op"}]``), and ``macs``, a contraction's
    multiply-adds per call (the profiler's GFLOP/s)."""
    rows = []
    for name, k, sources in zip(program.kernels, infos, program.kernel_sources):
        macs = mod.functions[name].attrs.get("macs")
        rows.append(KernelRow(
            name, k.symbol, k.num_inputs, k.num_outputs, k.workspace_bytes, k.parallel,
            source=source_records(sources) if sources else None,
            # takes the sizes array last; its workspace size is a dim record
            symbolic=True if k.symbolic else None,
            workspace=freeze(to_record(k.workspace_expr))
            if k.symbolic and k.workspace_expr is not None else None,
            # symbolic kernels: per call, unknown here
            macs=int(macs) if macs and isinstance(macs, int) else None, kernel=k.choice))
    return tuple(rows)


def _size_bounds(program: Program) -> tuple[dict[str, int], list[str]]:
    """Each size variable's largest value from the inputs' ``--max-shape`` (a variable that is
    a whole dim of a bounded input, at that dim's bound; the smallest when several bound it),
    and the variables no bound reaches."""
    bounds: dict[str, int] = {}
    for row in program.inputs:
        if row.max_shape is None:
            continue
        for rec, m in zip(row.shape, row.max_shape):
            if isinstance(rec, str):
                bounds[rec] = min(bounds.get(rec, m), m)
    names = program.symbolic.vars
    dynamic = program.symbolic.dynamic or ()
    if dynamic and all(v in bounds for v in names if v not in program.symbolic.dynamic_names):
        for name, rec in dynamic:   # counted at run time: at most its bound's value
            bounds[name] = max(1, sym_evaluate(rec, bounds))
    return {v: bounds[v] for v in names if v in bounds}, [v for v in names if v not in bounds]


def _bound_plan(program: Program) -> tuple[SymbolicBound | None, str | None]:
    """The upper-bound memory plan of a symbolic program whose every size variable has a
    ``--max-shape`` bound, or None and why not (a note for the export's output; None without
    any bound: planning per shape is what the user asked for)."""
    bounds, missing = _size_bounds(program)
    if not bounds:
        return None, None
    if missing:
        return None, (f"memory planned per shape at run time: size variable(s) "
                      f"{', '.join(missing)} have no --max-shape bound")
    buffers = program.symbolic.buffers
    try:
        offsets, arena, _, loose = bounded_plan([plain(b[0]) for b in buffers],
                                                [(b[1], b[2]) for b in buffers], bounds)
    except UnboundedSizeError as exc:
        return None, f"memory planned per shape at run time: {exc}"
    sizes = ", ".join(f"{v} <= {n}" for v, n in bounds.items())
    how = (f" ({loose} buffer size(s) not monotone in the sizes: bounded by their largest "
           "value over every size within the bound)") if loose else ""
    return SymbolicBound(bounds, tuple(offsets), arena), \
        f"memory planned at export for {sizes}: one arena of {arena} B serves every shape{how}"


def _check_library_names(program: Program) -> None:
    for call in program.library_calls:
        if not isinstance(call.func, str) or "." not in call.func:
            raise ExportError(f"library function name {call.func!r} must be namespaced, "
                              "e.g. 'env.linear' or 'myapp.op'")


def export_module(mod: IRModule, path: str | os.PathLike, options: ExportOptions | None = None,
                  params: Mapping[str, np.ndarray] | None = None,
                  on_stage: Callable[[str], None] | None = None) -> ExportReport:
    """Compile ``mod`` (binding ``params`` to its ``main`` parameters) and write a bundle."""
    return _export({None: mod}, path, options, params, on_stage)


def export_batched(mods: Mapping[int, IRModule], path: str | os.PathLike,
                   options: ExportOptions | None = None,
                   params: Mapping[str, np.ndarray] | None = None,
                   on_stage: Callable[[str], None] | None = None) -> ExportReport:
    """One bundle serving several batch sizes: ``mods`` maps each batch size to the module
    built for it (the same model, its batched inputs and outputs with that first dimension).
    Each size gets its own plan (memory plan, bytecode, kernels per target); the weights are
    stored once. The runtime runs any batch: the smallest plan that holds it, padded, or
    chunks of the largest."""
    if not mods or not all(isinstance(b, int) and b > 0 for b in mods):
        raise ExportError("batch sizes must be positive integers")
    return _export(dict(sorted(mods.items())), path, options, params, on_stage)


def export_specialized(symbolic: IRModule, mods: Mapping[int, IRModule],
                       path: str | os.PathLike, options: ExportOptions | None = None,
                       params: Mapping[str, np.ndarray] | None = None,
                       on_stage: Callable[[str], None] | None = None) -> ExportReport:
    """``--batch-sizes`` over a symbolic batch: the symbolic plan of ``symbolic`` (runs every
    batch) and, beside it, a static plan per batch size (``mods``: batch -> the module with that
    batch and every other dim fixed), weights stored once. The runtime runs a static plan when
    the inputs' shapes match one exactly, the symbolic plan otherwise."""
    if not mods or not all(isinstance(b, int) and b > 0 for b in mods):
        raise ExportError("batch sizes must be positive integers")
    for mod in mods.values():   # before compiling anything
        params_ = [(p.name, tuple(p.type.shape)) for p in mod.main.params]
        if any(not isinstance(d, int) for _, shape in params_ for d in shape):
            raise ExportError(_batch_sizes_symbolic(params_))
    return _export({None: symbolic, **dict(sorted(mods.items()))}, path, options, params,
                   on_stage)


def _constant_key(data: np.ndarray) -> tuple:
    return (str(data.dtype), data.shape, hashlib.sha256(data.tobytes()).digest())


def _batched_names(rows_by_batch: dict[int, tuple[IORow, ...]], what: str) -> tuple[str, ...]:
    """The names of the rows (inputs or outputs) whose first dimension is the batch in every
    plan; the other rows must be identical in every plan."""
    sizes = list(rows_by_batch)
    first = rows_by_batch[sizes[0]]
    if len({len(rows) for rows in rows_by_batch.values()}) != 1:
        raise ExportError(f"the modules built for batch sizes {sizes} have different {what}s; "
                          "they must be the same model")
    batched = []
    for i, row in enumerate(first):
        others = [rows_by_batch[b][i] for b in sizes]
        if any(o.name != row.name or o.dtype != row.dtype or len(o.shape) != len(row.shape)
               for o in others):
            raise ExportError(f"the modules built for batch sizes {sizes} differ in {what} "
                              f"{row.name!r}; they must be the same model")
        if all(o.shape and o.shape[0] == b and o.shape[1:] == row.shape[1:]
               for b, o in zip(sizes, others)):
            batched.append(row.name)
        elif any(o.shape != row.shape for o in others):
            shapes = ", ".join(f"{list(o.shape)} at batch {b}" for b, o in zip(sizes, others))
            raise ExportError(f"{what} {row.name!r} changes with the batch but not as its "
                              f"first dimension ({shapes}); dynamic batch needs it there")
    return tuple(batched)


def _export(mods: dict[int | None, IRModule], path: str | os.PathLike,
            options: ExportOptions | None, params: Mapping[str, np.ndarray] | None,
            on_stage: Callable[[str], None] | None, fallback: bool = True,
            golden: Any = None) -> ExportReport | None:
    """Check (the reference runs first), compile one plan per batch size, write the bundle.
    ``fallback`` False (a bf16 export keeping the guard's choice of layers in fp32): None when
    that bundle is past the bound too, instead of the guard's next choice or fp32. ``golden``:
    the reference's run an export the bf16 guard starts again was given (the first export's:
    it depends on the source model and the check's options only, which the retries keep), so
    a retry does not run the reference again."""
    opts = options or ExportOptions()
    if opts.precision not in PRECISIONS:
        raise ExportError(f"precision {opts.precision!r} is not supported; choose "
                          + " or ".join(PRECISIONS))
    compile_options = opts.compile_options()   # the environment is read here, once
    t0 = time.perf_counter()
    clock = StageClock(on_stage)
    signer = None
    if opts.sign_key is not None:  # read the key first: a bad key fails before compiling
        from .signing import load_signer
        signer = load_signer(opts.sign_key)
    batched = None not in mods
    specialized = not batched and len(mods) > 1   # export_specialized: None is the symbolic one
    counted = sorted({v for b, m in mods.items() if b is not None for v in m.dynamic_sizes})
    if counted:   # a batch plan is static; a size a kernel counts needs the symbolic plan
        raise ExportError(f"batch plans cannot hold sizes counted at run time ({', '.join(counted)}: "
                          "NonZero, NonMaxSuppression, TopK with a run-time k...): drop "
                          "--batch-sizes (the symbolic plan runs every batch)")
    largest = max(mods) if batched else None
    bf16 = opts.precision == "bf16"
    reference = None
    if golden is None and (opts.check or bf16):
        # the reference runs on the source model, in a worker beside the passes and the
        # compile where it can (_GoldenRun); collected once the plans are compiled
        reference = _GoldenRun(mods[largest], params, opts, compile_options.cache_dir,
                               compile_options.cache_max_bytes)

    writer = BundleWriter()
    constants = _Constants(writer)
    plans: list[Plan] = []
    reports: list[dict] = []
    ir_text = None
    first_targets: list[Target] = []
    bf16_fp32 = ""   # the bf16 line's account of the layers left fp32 (precision.fp32_note)
    bf16_dot = False   # the bf16 layers multiply bf16 activations (vdpbf16ps, bfdot)
    bf16_macs: tuple[dict[str, int], int] = ({}, 0)   # precision.bf16_work
    bf16_wino = False   # a bf16 layer runs as Winograd by default (precision.bf16_winograd_used)
    try:
        for batch, mod in mods.items():
            # several plans read one transposed W (no one-row GEMV): the weights stay stored once
            try:
                plan, report, optimized, targets = _compile_plan(
                    batch, mod, len(mods), params, compile_options, clock, writer, constants,
                    pack_rows=not specialized)
            except ExportError as exc:
                if reference is not None:   # the reference's own refusal comes first
                    clock("golden reference")
                    reference.result()
                if specialized and batch is None:
                    raise SymbolicPlanError(str(exc)) from None
                raise
            if plan.symbolic is not None and batch is not None:
                raise ExportError(_batch_sizes_symbolic([(r.name, r.shape)
                                                         for r in plan.inputs]))
            if specialized and batch is None and plan.symbolic is None:
                raise ExportError("--batch-sizes specializes a symbolic batch, but the model "
                                  "has no symbolic dims")
            plans.append(plan)
            reports.append(report)
            if batch == largest:
                ir_text = module_text(optimized)
                first_targets = targets
                if bf16:
                    from .precision import bf16_winograd_used, bf16_work, fp32_note
                    resolved = compile_options.for_targets(targets)
                    bf16_fp32 = fp32_note(optimized, resolved, tuple(t.name for t in targets))
                    bf16_macs = bf16_work(optimized)
                    bf16_dot = resolved.bf16_dot
                    bf16_wino = compile_options.bf16_winograd is None \
                        and bf16_winograd_used(optimized)
    except BaseException:
        if reference is not None:
            reference.cancel()   # no worker is left running
        raise
    if reference is not None:
        clock("golden reference")   # what is left of it: it ran beside the compile
        golden = reference.result()
    spec_plans = None
    if specialized:
        spec_plans, plans = tuple(plans[1:]), plans[:1]
        _check_specialized(plans[0], spec_plans)
    header = _header(opts, plans, constants, _batch_info(plans) if batched else None,
                     writer.ref(ir_text.encode()))
    if spec_plans is not None:
        header = dataclasses.replace(header, specialized=spec_plans)
    precision_note = None
    if bf16:   # the accuracy guard: the bf16 bundle against the fp32 reference, or fp32
        from .precision import bf16_guard
        clock("bf16 guard")   # its run of the bundle, and its choice of layers kept fp32
        ok, precision_note = bf16_guard(writer, header, golden, opts, constants.bf16_bytes,
                                        bf16_fp32)
        if not ok:
            if not fallback:   # one of the guard's choices, past the bound too
                return None
            if bf16_wino:   # Winograd's extra rounding first: its layers direct, then the rest
                clock.stop()   # the export below times its own stages (_whole_export adds them)
                report = _export(mods, path, dataclasses.replace(
                    opts, compile=dataclasses.replace(compile_options, bf16_winograd=False)),
                    params, on_stage, golden=golden)
                return _whole_export(report, clock, t0)
            from .precision import (BF16_MIN_SHARE, bf16_layers, bf16_share, low_share_note,
                                    sensitive_weights)
            choices = [] if opts.bf16_keep is not None or "not measured" in precision_note \
                else sensitive_weights(mods[largest], params, golden, opts.bf16_max_error,
                                       activations=bf16_dot)
            low_share = None   # a choice that leaves bf16 too little work: none after it
            clock.stop()   # the exports below time their own stages (_whole_export adds them)
            for keep in choices:   # the layers whose bf16 weights cost the most stay fp32
                share = bf16_share(bf16_macs, keep)
                if share is not None and share < BF16_MIN_SHARE:
                    low_share = (keep, share)
                    break
                report = _export(mods, path, dataclasses.replace(opts, bf16_keep=keep,
                                                         compile=compile_options),
                                 params, on_stage, fallback=False, golden=golden)
                if report is not None:
                    return _whole_export(report, clock, t0)
            report = _export(mods, path, dataclasses.replace(opts, precision="fp32",
                                                     compile=compile_options), params,
                             on_stage, golden=golden if opts.check else None)
            report.precision_note = precision_note if low_share is None else \
                low_share_note(precision_note, *low_share, layers=bf16_layers(mods[largest]))
            return _whole_export(report, clock, t0)
        golden.rtol, golden.atol = (max(golden.rtol, opts.bf16_max_error),
                                    max(golden.atol, opts.bf16_max_error))
        if not opts.check:
            golden = None
    check_note = None
    if golden is not None:
        from .golden import embed_golden
        header, check_note = embed_golden(golden, writer, header)
    try:
        if golden is None:
            size = writer.write(path, header, signer=signer)
        else:
            from .golden import write_checked
            clock("golden check")   # writes the bundle, runs it, compares
            size, check_note = write_checked(writer, path, header, signer, golden, check_note)
    except BundleWriteError as exc:
        raise ExportError(str(exc)) from None
    clock.stop()
    main = reports[0] if specialized else reports[-1]
    return ExportReport(
        path=os.fspath(path), bundle_bytes=size, target=first_targets[0],
        kernels=main["kernels"], instructions=main["instructions"],
        weights_bytes=constants.nbytes,
        arena_bytes=main["arena_bytes"],
        intermediate_bytes=main["intermediate_bytes"],
        seconds=time.perf_counter() - t0, targets=first_targets,
        plans=reports if batched else reports[1:], check=check_note,
        bound_bytes=main["bound_bytes"], plan_note=main["plan_note"], specialized=specialized,
        check_warnings=list(golden.warnings) if golden is not None else [],
        stages=clock.seconds, stage_cpu=clock.cpu,
        compiles=[c for r in reports for c in r["compiles"]],
        compile_phases=[c for r in reports for c in r["phases"]],
        compile_warnings=list(dict.fromkeys(w for r in reports for w in r["warnings"])),
        precision=opts.precision, precision_note=precision_note)


def _whole_export(report: ExportReport, clock: StageClock, t0: float) -> ExportReport:
    """``report`` of the export the bf16 guard started again (its choice of layers, or fp32)
    with this one's stages and time added: ``seconds`` and ``--timings`` count both (a stage
    both ran, codegen say, sums them)."""
    clock.stop()
    for mine, theirs in ((clock.seconds, report.stages), (clock.cpu, report.stage_cpu)):
        merged = dict(mine)
        for name, spent in theirs.items():
            merged[name] = merged.get(name, 0.0) + spent
        theirs.clear()
        theirs.update(merged)
    report.seconds = time.perf_counter() - t0
    return report


class _GoldenRun:
    """``golden.prepare_golden`` (the reference run: ONNX Runtime and the IR's numpy reference)
    in a forked worker while this process runs the passes and the compile, for references that
    survive a fork (``golden.Reference.fork_safe``; the IR's own reference too); others run
    here, first, as before. ``result()`` gives the ``Golden`` (or raises its error)."""

    def __init__(self, mod: IRModule, params: Mapping[str, np.ndarray] | None,
                 opts: ExportOptions, cache_dir: str | None = None,
                 cache_max_bytes: int = 0) -> None:
        from . import golden_cache
        from .golden import Golden, prepare_golden
        self.opts = opts
        self.value = None
        self.background = None
        # a warm export finds the reference's run in the compile cache (golden_cache.py)
        self.cache = (cache_dir, golden_cache.golden_key(mod, params, opts) if cache_dir
                      else None, cache_max_bytes)
        cached = golden_cache.load(cache_dir, self.cache[1], Golden, opts)
        if cached is not None:
            cached.second = getattr(opts.reference, "second", None)
            self.value = cached
        elif opts.reference is None or getattr(opts.reference, "fork_safe", False):
            self.background = Background(_prepare_golden_here, (mod, params, opts))
        else:
            self.value = prepare_golden(mod, params, opts)
            self._store(self.value)

    def result(self):
        if self.background is not None:
            golden, had_second = self.background.result()
            if had_second:   # a Reference holds closures: it stayed here
                golden.second = getattr(self.opts.reference, "second", None)
            self.value, self.background = golden, None
            self._store(golden)
        return self.value

    def _store(self, golden) -> None:
        from . import golden_cache
        directory, key, limit = self.cache
        golden_cache.store(directory, key, golden, limit)

    def cancel(self) -> None:
        if self.background is not None:
            self.background.cancel()
            self.background = None


def _prepare_golden_here(mod: IRModule, params: Mapping[str, np.ndarray] | None,
                         opts: ExportOptions):
    """``prepare_golden`` as the worker sends it back: (golden without its second reference,
    whether it had one)."""
    from .golden import prepare_golden
    golden = prepare_golden(mod, params, opts)
    had_second = golden.second is not None
    golden.second = None
    return golden, had_second


class _Constants:
    """The bundle's constants: each weight stored once for every plan that reads it."""

    def __init__(self, writer: BundleWriter) -> None:
        self.writer = writer
        self.rows: list[ConstantRow] = []
        self.ids: dict[tuple, int] = {}
        self.nbytes = 0
        self.bf16_bytes = 0   # of nbytes, the bfloat16 weights (--precision bf16)
        self.stored = False   # a constant is stored as integers (format 1.5)

    def add(self, name: str, data: np.ndarray, stored: StoredInt | None = None) -> int:
        data = np.asarray(data, order="C")
        key = _constant_key(data)
        if key not in self.ids:
            self.ids[key] = len(self.rows)
            if stored is None:
                self.rows.append(ConstantRow(name, tuple(data.shape), str(data.dtype),
                                             self.writer.ref(data)))
                self.nbytes += data.nbytes
            else:   # float32 kept as its integers, expanded at load (format 1.5)
                record = StoredRecord(str(stored.q.dtype), tuple(stored.scale.shape),
                                      self.writer.ref(stored.scale),
                                      self.writer.ref(stored.zero_point))
                self.rows.append(ConstantRow(name, tuple(data.shape), str(data.dtype),
                                             self.writer.ref(stored.q), record))
                self.nbytes += stored.q.nbytes + stored.scale.nbytes + stored.zero_point.nbytes
                self.stored = True
            if str(data.dtype) == "bfloat16":
                self.bf16_bytes += data.nbytes
        return self.ids[key]


def _compile_plan(batch: int | None, mod: IRModule, n_plans: int,
                  params: Mapping[str, np.ndarray] | None, options: CompileOptions,
                  on_stage: Callable[[str], None] | None, writer: BundleWriter,
                  constants: _Constants, pack_rows: bool = True
                  ) -> tuple[Plan, dict, IRModule, list[Target]]:
    """Compile one batch size's module for every target: its plan record (weights, code and
    bytecode through ``writer``), a report row, the optimized module and the targets.
    ``pack_rows`` False: convolution weights stay [O, C, KH, KW] (a symbolic plan beside static
    ones keeps them so, and the plans share them). Several plans read one transposed W (no
    one-row GEMV), so that the weights stay stored once."""
    optimized, variants, program = compile_variants(
        mod, params, options.target, options.verify_ir, on_stage, pack_rows=pack_rows,
        options=options.replace(one_row_gemv=options.one_row_gemv and n_plans == 1))
    kernels = _common_kernels(variants)
    _check_library_names(program)
    if on_stage:
        on_stage("write")
    remap = {i: constants.add(c.name, c.data, c.stored) for i, c in enumerate(program.constants)}
    tensors = tuple(dataclasses.replace(row, ref=remap[row.ref]) if row.kind == CONST else row
                    for row in program.tensors)
    kernel_infos = [kernels[name] for name in program.kernels]
    code = []
    for compiled in variants:  # the weights, plan and bytecode are shared by all
        sizes = function_sizes(compiled.object_code)
        target = compiled.target.to_record()
        known = {f.name for f in dataclasses.fields(CodeVariant)}
        code.append(CodeVariant(
            **{k: freeze(v) for k, v in target.items() if k in known},
            object=writer.ref(compiled.object_code), externals=tuple(ALLOWED_EXTERNALS),
            code_sizes={k.symbol: sizes.get(k.symbol, 0) for k in kernel_infos},
            extra={k: freeze(v) for k, v in target.items() if k not in known}))
    bound, plan_note = _bound_plan(program) if program.symbolic is not None else (None, None)
    plan = Plan(
        inputs=tuple(program.inputs), outputs=tuple(program.outputs),
        kernels=_kernel_rows(program, kernel_infos, optimized), code=tuple(code),
        library_calls=tuple(program.library_calls),
        tensors=tensors,
        vm=VMRecord(writer.ref(program.bytecode), len(program.instructions),
                    program.branches or None, program.loops or None,
                    program.stores if program.stores or program.carried_checks else None,
                    tuple(program.grows) or None),
        memory_plan=MemoryPlan(program.arena_bytes, program.intermediate_bytes),
        symbolic=None if program.symbolic is None
        else dataclasses.replace(program.symbolic, bound=bound),
        batch=batch)
    report = {"batch": batch, "arena_bytes": program.arena_bytes,
              "intermediate_bytes": program.intermediate_bytes,
              "kernels": len(program.kernels), "instructions": len(program.instructions),
              "code_bytes": sum(len(v.object_code) for v in variants),
              "bound_bytes": bound.arena_bytes if bound is not None else None,
              "plan_note": plan_note, "warnings": fallback_warnings(optimized, variants),
              "compiles": [(v.target.name, v.seconds, v.from_cache) for v in variants],
              "phases": [(v.target.name, v.phases) for v in variants]}
    return plan, report, optimized, [v.target for v in variants]


def _batch_sizes_symbolic(inputs: Sequence[tuple[str, tuple]]) -> str:
    """The one-line error for --batch-sizes when dims other than the batch stay symbolic."""
    dims = [f"{name}=" + ",".join(str(d) if isinstance(d, int) else "?" for d in shape)
            for name, shape in inputs if any(not isinstance(d, int) for d in shape)]
    return ("--batch-sizes makes static plans per batch size, so every other dim must be fixed, "
            f"but {', '.join(dims)} keep symbolic dims: fix them with --input-shape (e.g. "
            "x=N,3,64,64), or drop --batch-sizes (the symbolic bundle runs every batch and size "
            "already)")


def _check_specialized(symbolic: Plan, plans: tuple[Plan, ...]) -> None:
    """Each specialized plan is the symbolic plan at one batch: the same inputs and outputs, each
    input's first dim that batch when the symbolic plan's is a size variable."""
    for plan in plans:
        for kind in ("inputs", "outputs"):
            mine, theirs = getattr(plan, kind), getattr(symbolic, kind)
            if [(r.name, r.dtype, len(r.shape)) for r in mine] != \
                    [(r.name, r.dtype, len(r.shape)) for r in theirs]:
                raise ExportError(f"the module built for batch {plan.batch} has other {kind} "
                                  "than the symbolic one; they must be the same model")


def _batch_info(plans: list[Plan]) -> BatchInfo:
    """Which inputs and outputs grow with the batch, over the plans of every batch size."""
    top = plans[-1]
    info = BatchInfo(
        tuple(p.batch for p in plans), _batched_names({p.batch: p.inputs for p in plans}, "input"),
        _batched_names({p.batch: p.outputs for p in plans}, "output"))
    if not info.inputs:
        raise ExportError("no input has the batch as its first dimension; dynamic batch "
                          "needs one (mark it with --input-shape x=N,...)")
    if len(info.outputs) != len(top.outputs):
        fixed = [o.name for o in top.outputs if o.name not in info.outputs]
        raise ExportError(f"output(s) {fixed} do not grow with the batch; dynamic batch "
                          "needs every output to have the batch as its first dimension")
    return info


def _header(opts: ExportOptions, plans: list[Plan], constants: _Constants,
            batch_info: BatchInfo | None, ir: Any) -> Header:
    # Readers of format 1.0 run every bundle this writes (a dynamic-batch bundle at its largest
    # batch, golden data ignored), so min_reader stays 1.0 (docs/bad-inputs.md); readers before
    # format 1.3 cannot plan memory at run time, so a symbolic bundle says 1.3.
    # A constant stored as integers (expanded at load) needs a 1.5 reader.
    symbolic = plans[-1].symbolic is not None   # the largest batch: what format 1.0 runs
    minor = STORED_MINOR if constants.stored else SYMBOLIC_MINOR if symbolic else None
    if symbolic and plans[-1].symbolic.dynamic:   # sizes counted at run time: a 1.6 reader
        minor = DYNAMIC_MINOR
    if symbolic and plans[-1].symbolic.values:   # sizes bound from inputs' values
        minor = VALUES_MINOR
    if symbolic and plans[-1].symbolic.scales:   # sizes from float scales fed at run time
        minor = SCALES_MINOR
    if any(p.vm.branches for p in plans):   # an If that runs only its taken branch
        minor = BRANCH_MINOR
    if any(p.vm.loops for p in plans):   # a Loop run by the VM (LOOP ... NEXT)
        minor = LOOP_MINOR
    if any(p.vm.stores is not None for p in plans):   # STORE rows, APPEND, TRAP 2
        minor = STORE_MINOR
    if any(p.vm.grows is not None for p in plans):   # carried values that grow (format 1.10)
        minor = GROW_MINOR
    return Header(
        format=(FORMAT_MAJOR, minor or FORMAT_MINOR),
        plans=tuple(plans), constants=tuple(constants.rows),
        min_reader=(FORMAT_MAJOR, minor or 0),
        compiler={"name": "mlcpack", "version": packager.__version__,
                  "llvmlite": llvmlite.__version__},
        model={"name": opts.model_name, "source": opts.source,
               "source_sha256": opts.source_sha256},
        preprocess=opts.preprocess, labels=tuple(opts.labels) if opts.labels else None,
        ir=ir, batch=batch_info)


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
