"""From primitive functions to one relocatable object: emit LLVM IR, optimize at -O2, and write
position-independent, small-code-model ELF for the target: ``compile_in_process``. The
compiler calls it in worker processes (``codegen/parallel.py``: ``compile_prim_funcs``,
``compile_for_targets``), since an LLVM assertion aborts the process it fires in."""

from __future__ import annotations

import contextlib
import gc
import os
import time

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import llvmlite.binding as llvm
from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.structure import structural_key
from ..options import CompileOptions
from . import cache, fingerprint
from .contraction.geometry import vector_width
from .lower import KernelInfo
from .objinfo import undefined_symbols
from .rules import emit_function
from .target import Target
from .threadpool import emit_thread_pool

SYMBOL_PREFIX = "mlc_"
# The only symbols compiled kernels may import; the runtime resolves them from libc.
ALLOWED_EXTERNALS = ("memcpy", "memmove", "memset")


class CodegenError(Exception):
    """LLVM rejected the generated module, or the object imports something not allowed."""


class KernelCompileError(CodegenError):
    """LLVM aborted on these kernels under every pipeline (``codegen/parallel.py``):
    ``kernels`` the compiled prim funcs, ``serves`` every prim func they serve."""

    def __init__(self, kernels: Sequence[str], serves: Sequence[str], target: str,
                 reason: str) -> None:
        self.kernels, self.serves = tuple(kernels), tuple(serves)
        self.target, self.reason = target, reason
        shown = ", ".join(self.kernels[:3]) + (f" and {len(self.kernels) - 3} more"
                                               if len(self.kernels) > 3 else "")
        super().__init__(f"LLVM aborted compiling kernel{'s' if len(self.kernels) > 1 else ''} "
                         f"{shown} for {target} under every pipeline ({reason})")

    def __reduce__(self):   # a worker process sends it back pickled
        return (type(self), (self.kernels, self.serves, self.target, self.reason))


@dataclass(frozen=True)
class Pipeline:
    """How LLVM optimizes a module: the default -O2 with both vectorizers, or a conservative
    one for a kernel whose compile made LLVM abort (``codegen/parallel.py``)."""
    name: str                 # in warnings: "-O2 without the loop vectorizer"
    speed_level: int
    loop_vectorize: bool
    slp_vectorize: bool
    # LLVM's loop strength reduction (LSR) in the code generator; off: ``-disable-lsr``
    # around ``emit_object`` (the process-wide switch set back after it), and the pass runs at
    # the end of the optimizer instead, on every function but the kernels ``lsr_skipped`` names
    strength_reduction: bool = True
    # with the code generator's LSR (``strength_reduction``): False leaves the channel-lane
    # Winograd convolutions (``winograd_kernels``) without it: the object of a module that has
    # one is made without the code generator's LSR, the pass run on every other function after
    # linking (``_finish``); a module without one is made exactly as with LSR everywhere
    winograd_lsr: bool = True


# -O2, not -O3: the kernels' hot loops are vectorized and register-blocked by their emitters,
# and what -O3 adds (non-trivial loop unswitching, higher unroll thresholds, aggressive
# instcombine) made no kernel faster on the corpus (bench/bundle_ab.py --kernels: kernel time
# summed 0.994-0.995 of -O3's on YOLOv8n and PP-OCR det) while it cost 8-13 % of a cold
# export's CPU time, up to 17x on a generic loop nest (a concat: 0.39 -> 0.023 s).
#
# No loop strength reduction in the channel-lane Winograd convolutions (``winograd_lsr``): LSR
# was 0.57 of their object time at x86-64-v4 (yolo11n_seg_nms's 17: 1.27 -> 0.54 CPU-s; 1.43
# of that whole object's 3.4 CPU-s was LSR) and their speed did not move (docs/performance.md,
# "Export time at x86-64-v4: no loop strength reduction in the channel-lane Winograd
# convolutions"). The other kernels keep it: the channel-lane direct convolutions ran up to
# 1.24x slower without it at v4, the packed 1x1 convolutions 1.17x on v2.
DEFAULT_PIPELINE = Pipeline("-O2", 2, True, True, winograd_lsr=False)
# Tried in order for a kernel LLVM aborts on: the loop vectorizer is where LLVM's assertions
# have fired (a cost-model disagreement); -O2 without vectorizers is the last resort.
CONSERVATIVE_PIPELINES = (Pipeline("-O2 without the loop vectorizer", 2, False, True),
                          Pipeline("-O2 without vectorizers", 2, False, False))

# The portable bundle's fallback level (x86-64-v2, SSE4.2) when a higher level of its
# architecture is compiled beside it: -O1 (vectorizers on), and no loop strength reduction in
# the channel-lane convolutions (``lsr_skipped``), where LSR's time sits (0.2-0.4 CPU-s per
# Winograd kernel): YOLOv8n's v2 object 8.5 -> 4.3 CPU-s. The other kernels keep LSR (the
# packed 1x1 convolutions ran 1.17x slower on v2 without it). The v2 code runs only on CPUs
# without AVX2 (before 2013-2015). Measured before it was kept: docs/performance.md, "Export
# time, sixth round". The host's own best level and a level exported alone keep
# DEFAULT_PIPELINE.
LEAN_PIPELINE = Pipeline("-O1, channel-lane kernels without loop strength reduction", 1,
                         True, True, False)


def lsr_skipped(kernels: dict[str, KernelInfo]) -> frozenset[str]:
    """The symbols of the kernels a pipeline without the code generator's LSR leaves without
    it (the others get it at the end of the optimizer): the channel-lane convolutions
    (``codegen/conv_oc.py``; their design, ``KernelInfo.choice``, says "channel-lane")."""
    return frozenset(k.symbol for k in kernels.values()
                     if (k.choice or "").startswith("channel-lane"))


def winograd_kernels(kernels: dict[str, KernelInfo]) -> frozenset[str]:
    """The symbols of the float32 channel-lane Winograd convolutions (``codegen/conv_oc.py``;
    their design, ``KernelInfo.choice``, says "channel-lane Winograd", not "bf16"): the kernels
    the default pipeline leaves without loop strength reduction. The bf16 ones keep it: an
    object without the code generator's LSR (LSR in the optimizer on the other functions) made
    yolox_neck's slices and sigmoid 2-12x slower in a bf16 bundle (fused_strided_slice7_sigmoid53
    18.6 -> 232 us), and the bf16 Winograd kernels themselves ran faster with it (52 -> 44 us)."""
    return frozenset(k.symbol for k in kernels.values()
                     if (k.choice or "").startswith("channel-lane Winograd")
                     and "bf16" not in k.choice)


def target_pipelines(targets: Sequence[Target]) -> list[Pipeline]:
    """The pipeline each of ``targets`` is compiled with: ``LEAN_PIPELINE`` for x86-64-v2
    beside a higher x86-64 level, else ``DEFAULT_PIPELINE``."""
    higher = {t.arch for t in targets if t.arch == "x86_64" and t.name != "x86-64-v2"}
    return [LEAN_PIPELINE if t.name == "x86-64-v2" and t.arch in higher else DEFAULT_PIPELINE
            for t in targets]


@dataclass(frozen=True)
class Fallback:
    """A kernel LLVM aborted on under the default pipeline, compiled with a conservative one."""
    kernel: str                 # the compiled prim func (EmittedModule.groups' key)
    serves: tuple[str, ...]     # every prim func that kernel serves (its group)
    pipeline: Pipeline
    reason: str                 # what LLVM said before it aborted, in one line


@dataclass(frozen=True)
class CompiledCode:
    target: Target
    object_code: bytes
    kernels: dict[str, KernelInfo]    # prim func name -> kernel
    llvm_ir: str
    # for `export --timings`: wall seconds of compile_in_process, and whether the object came
    # from the compile cache
    seconds: float = field(default=0.0, compare=False)
    from_cache: bool = field(default=False, compare=False)
    # kernels LLVM aborted on, compiled with a conservative pipeline (codegen/parallel.py)
    fallbacks: tuple[Fallback, ...] = ()
    # for `export --timings`: (phase, CPU seconds) per PHASES entry, summed over the workers
    # that compiled it; none for a cache hit
    phases: tuple[tuple[str, float], ...] = field(default=(), compare=False)


# Where a compile's CPU time goes: Python emitting the LLVM IR text; LLVM parsing, verifying
# and optimizing it (and linking the kernel groups); LLVM's code generator (the object, and the
# optimized IR's text the compile cache keeps).
PHASES = ("emit IR", "optimize", "object code")


def _add(*phases: Sequence[float]) -> tuple[float, ...]:
    return tuple(sum(p[i] for p in phases) for i in range(len(PHASES)))


@functools.cache
def _init_llvm() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def _target_machine(target: Target) -> llvm.TargetMachine:
    _init_llvm()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic",
        codemodel="small")


# Test-only fault injection (``CompileOptions.llvm_abort``, from this variable at the entries):
# "NAME" makes the default pipeline abort the process (as an LLVM assertion does) while
# optimizing a module that defines a kernel whose name contains NAME; "NAME:always" makes every
# pipeline abort on it. tests/export/test_llvm_abort_fails_one_kernel.py uses it through the real command
# line; nothing
# else sets it.
FAULT_ENV = "MLCPACK_TEST_LLVM_ABORT"


@dataclass(frozen=True)
class EmittedModule:
    """The LLVM IR of a set of prim funcs for one target, before LLVM has seen it."""
    text: str
    kernels: dict[str, KernelInfo]          # prim func name -> kernel
    groups: dict[str, tuple[str, ...]]      # compiled func name -> every func it serves


def emit_module(funcs: Sequence[PrimFunc], target: Target, size_vars: tuple[str, ...] = (),
                thread_pool: bool = True,
                options: CompileOptions = CompileOptions()) -> EmittedModule:
    """The LLVM IR text of ``funcs`` for ``target`` (kernel symbols ``mlc_<name>``), with the
    thread pool's hand-off functions unless ``thread_pool`` is False; ``options`` the kernel
    choices (VNNI emulation, symbolic fallback). Functions that differ only
    in names (unrolled recurrences, repeated layers) share one compiled kernel: the first one's
    symbol serves them all."""
    with _without_cycle_collection():
        module = ir.Module(name="mlcpack_kernels")
        module.triple = target.triple
        vl = vector_width(target.name)
        kernels: dict[str, KernelInfo] = {}
        first: dict[object, str] = {}
        groups: dict[str, list[str]] = {}
        for f in funcs:
            key = structural_key(f)
            if key in first:
                kernels[f.name] = kernels[first[key]]
                groups[first[key]].append(f.name)
            else:
                first[key] = f.name
                groups[f.name] = [f.name]
                kernels[f.name] = emit_function(module, f, SYMBOL_PREFIX + f.name, vl,
                                                size_vars, target, options)
        if thread_pool:
            emit_thread_pool(module, target)
        text = str(module)
    return EmittedModule(text, kernels, {k: tuple(v) for k, v in groups.items()})


@contextlib.contextmanager
def _without_cycle_collection():
    """Python's cycle collector off while a module is emitted: llvmlite's values point at
    their parents (cycles), so the collector ran over the growing module again and again,
    finding nothing to free (YOLOv8n, x86-64-v3, one process, alternating: 6.6-6.8 CPU-s
    with it, 3.9-5.2 without; the text is the same). Reference counting still frees what
    emission drops; the collector runs again afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compile_in_process(funcs: Sequence[PrimFunc], target: Target, size_vars: tuple[str, ...] = (),
                       fallbacks: Sequence[Fallback] = (), use_cache: bool = True,
                       thread_pool: bool = True,
                       options: CompileOptions = CompileOptions(),
                       key: str | None = None,
                       pipeline: Pipeline = DEFAULT_PIPELINE) -> CompiledCode:
    """Compile ``funcs`` into one object for ``target`` in this process (an LLVM abort ends
    the process: ``parallel.compile_prim_funcs`` runs this in a worker); kernel symbols are
    ``mlc_<name>``. ``size_vars`` (a symbolic module's size variables, in the order of the
    runtime's sizes array) gives symbolic kernels their run-time extents; ``options`` the
    kernel choices, the object cache (``cache_dir``, None: none; ``cache_max_bytes``) and the
    test-only ``llvm_abort``. ``fallbacks`` name kernels to optimize with their conservative
    pipeline, in modules of their own linked in after optimization; the others get
    ``pipeline`` (``target_pipelines``: the default, or the lean one of a portable fallback).
    ``thread_pool`` False leaves out the pool's hand-off functions (a kernel compiled alone to
    see whether LLVM survives it). ``key``: ``object_key``'s, when the caller has it. The
    compile cache (``codegen/cache.py``) keys the result by the module's inputs (``object_key``:
    a hit emits no IR) or, where they hold a value that key cannot encode, by its IR; an entry
    remembers the fallbacks, so a hit reports them again."""
    start = time.perf_counter()
    cpu0 = time.process_time()
    conservative = {fb.kernel: fb.pipeline for fb in fallbacks}
    directory = Path(options.cache_dir) if use_cache and options.cache_dir else None
    if directory is not None and key is None:
        key = object_key(funcs, target, size_vars, thread_pool, options, pipeline)
    if key is not None:   # keyed by its inputs: a hit emits no IR at all
        hit = _hit(directory, key, target, None, start)
        if hit is not None:
            return hit
    emitted = emit_module(funcs, target, size_vars, thread_pool, options)
    record = fingerprint.kernels_record(emitted.kernels)
    if directory is not None and (key is None or record is None):   # keyed by its IR
        key = cache.cache_key(emitted.text, target, _key_part(pipeline))
        hit = _hit(directory, key, target, emitted.kernels, start)
        if hit is not None:
            return hit
    tm = _target_machine(target)
    cpu1 = time.process_time()
    # the object is made with `pipeline`'s code generator: without its LSR, the pass runs in
    # the optimizer, conservative parts included
    skip = None if pipeline.strength_reduction else lsr_skipped(emitted.kernels)
    if conservative:
        rest = [f for f in funcs if not any(f.name in emitted.groups[c] for c in conservative)]
        linked = _optimize(emit_module(rest, target, size_vars, thread_pool, options).text,
                           target, tm, pipeline, options.llvm_abort, skip)
        for part_pipeline in dict.fromkeys(conservative.values()):
            names = [c for c, p in conservative.items() if p == part_pipeline]
            part = [f for f in funcs if f.name in names]
            text = emit_module(part, target, size_vars, False, options).text
            linked.link_in(_optimize(text, target, tm, part_pipeline, options.llvm_abort,
                                     skip))
    else:
        linked = _optimize(emitted.text, target, tm, pipeline, options.llvm_abort, skip)
    # (a module with fallbacks emits IR again per pipeline: counted as optimizing)
    spent = (cpu1 - cpu0, time.process_time() - cpu1, 0.0)
    return _finish(linked, tm, target, emitted.kernels, options,
                   key if directory is not None else None, start, fallbacks, spent, pipeline)


@dataclass(frozen=True)
class OptimizedGroup:
    """A kernel group's module after LLVM's optimizer (``optimize_group``), as bitcode."""
    bitcode: bytes
    kernels: dict[str, KernelInfo]          # prim func name -> kernel
    phases: tuple[float, ...] = (0.0, 0.0, 0.0)   # CPU seconds (PHASES): emit, optimize


def optimize_group(funcs: Sequence[PrimFunc], target: Target, size_vars: tuple[str, ...] = (),
                   options: CompileOptions = CompileOptions(),
                   pipeline: Pipeline = DEFAULT_PIPELINE) -> OptimizedGroup:
    """Emit and optimize one group of kernels (``codegen/parallel.py`` groups a module's
    kernels and optimizes the groups side by side; ``link_groups`` makes the object). Every
    function structurally equal to one in the group must be in it (they share its symbol)."""
    cpu0 = time.process_time()
    emitted = emit_module(funcs, target, size_vars, False, options)
    tm = _target_machine(target)
    cpu1 = time.process_time()
    module = _optimize(emitted.text, target, tm, pipeline, options.llvm_abort,
                       None if pipeline.strength_reduction else lsr_skipped(emitted.kernels))
    bitcode = module.as_bitcode()
    return OptimizedGroup(bitcode, emitted.kernels,
                          (cpu1 - cpu0, time.process_time() - cpu1, 0.0))


def link_groups(groups: Sequence[OptimizedGroup], target: Target,
                options: CompileOptions = CompileOptions(), key: str | None = None,
                start: float | None = None, pipeline: Pipeline = DEFAULT_PIPELINE
                ) -> CompiledCode:
    """The object of optimized kernel groups, linked in order, with the thread pool's
    hand-off functions after them (optimized on their own), made with ``pipeline`` (the one
    the groups were optimized with: its code generator options); stored in the compile cache under
    ``key`` (``object_key`` of the whole module) when given. Raises ``CodegenError`` when the
    groups do not link (the caller then compiles the module whole)."""
    start = time.perf_counter() if start is None else start
    cpu0 = time.process_time()
    tm = _target_machine(target)
    pool = emit_module([], target, (), True, options)
    linked = _optimize(pool.text, target, tm, pipeline, options.llvm_abort,
                       None if pipeline.strength_reduction else frozenset())
    try:
        parts = [llvm.parse_bitcode(g.bitcode) for g in groups]
        head = parts[0]
        for part in parts[1:] + [linked]:
            head.link_in(part)
    except RuntimeError as exc:
        raise CodegenError(f"the kernel groups do not link: {exc}") from None
    kernels = {name: k for g in groups for name, k in g.kernels.items()}
    linking = (0.0, time.process_time() - cpu0, 0.0)
    return _finish(head, tm, target, kernels, options, key, start, (),
                   _add(linking, *(g.phases for g in groups)), pipeline)


def _finish(linked: llvm.ModuleRef, tm: llvm.TargetMachine, target: Target,
            kernels: dict[str, KernelInfo], options: CompileOptions, key: str | None,
            start: float, fallbacks: Sequence[Fallback],
            spent: tuple[float, ...] = (0.0, 0.0, 0.0),
            pipeline: Pipeline = DEFAULT_PIPELINE) -> CompiledCode:
    """Code generation of an optimized module (with ``pipeline``'s code generator options),
    the import check, and the cache store; ``spent``: CPU seconds per phase so far
    (``PHASES``), the object's added."""
    cpu0 = time.process_time()
    undefined = sorted(f.name for f in linked.functions
                       if f.is_declaration and not f.name.startswith("llvm.")
                       and f.name not in ALLOWED_EXTERNALS)
    if undefined:
        raise CodegenError(f"kernels would import {', '.join(undefined)}, which the runtime "
                           "does not provide")
    skip = winograd_kernels(kernels) if pipeline.strength_reduction \
        and not pipeline.winograd_lsr else frozenset()
    if skip:   # LSR in the optimizer's place on the others, none in the code generator
        _reduce_strength(linked, tm, pipeline, skip)
        pipeline = replace(pipeline, strength_reduction=False)
    obj = _emit_object(tm, linked, pipeline)
    _check_imports(obj, target)
    optimized = str(linked)
    if options.cache_dir and key:
        notes = [{"kernel": fb.kernel, "serves": list(fb.serves), "pipeline": fb.pipeline.name,
                  "reason": fb.reason} for fb in fallbacks]
        cache.store(Path(options.cache_dir), key, obj, optimized, notes,
                    cache.object_limit(options.cache_max_bytes),
                    fingerprint.kernels_record(kernels))
    return CompiledCode(target, obj, kernels, optimized,
                        seconds=time.perf_counter() - start, fallbacks=tuple(fallbacks),
                        phases=tuple(zip(PHASES, _add(spent, (0.0, 0.0,
                                                              time.process_time() - cpu0)))))


def object_key(funcs: Sequence[PrimFunc], target: Target, size_vars: tuple[str, ...] = (),
               thread_pool: bool = True, options: CompileOptions = CompileOptions(),
               pipeline: Pipeline = DEFAULT_PIPELINE) -> str | None:
    """The compile cache's key for compiling ``funcs`` into one module for ``target`` with
    ``pipeline``, from the kernels' inputs (``codegen/fingerprint.py``), before any IR is
    emitted; None when they hold a value the encoding does not know (the module is then
    keyed by its IR)."""
    return object_keys(funcs, [target], size_vars, thread_pool, options, [pipeline])[0]


def object_keys(funcs: Sequence[PrimFunc], targets: Sequence[Target],
                size_vars: tuple[str, ...] = (), thread_pool: bool = True,
                options: CompileOptions = CompileOptions(),
                pipelines: Sequence[Pipeline] | None = None) -> list[str | None]:
    """``object_key`` for each of ``targets`` (the functions are encoded once), each with its
    pipeline (None: the default for all)."""
    parts = fingerprint.encode_funcs(funcs, size_vars, thread_pool, options)
    pipelines = pipelines or [DEFAULT_PIPELINE] * len(targets)
    return [None if parts is None else cache.object_key(parts, t, _key_part(p))
            for t, p in zip(targets, pipelines)]


def _key_part(pipeline: Pipeline) -> str:
    """What a pipeline adds to a cache key: nothing for the default (``cache.PIPELINE`` names
    it), else its name."""
    return "" if pipeline == DEFAULT_PIPELINE else pipeline.name


def cached_code(key: str | None, target: Target, options: CompileOptions) -> CompiledCode | None:
    """The object for ``key`` (``object_key``) from the compile cache, without emitting IR or
    running LLVM; None on a miss (or no cache)."""
    if not options.cache_dir or key is None:
        return None
    return _hit(Path(options.cache_dir), key, target, None, time.perf_counter())


def _hit(directory: Path, key: str, target: Target, kernels: dict[str, KernelInfo] | None,
         start: float) -> CompiledCode | None:
    """The cache entry ``key`` as compiled code (``kernels`` None: the entry's own), or None."""
    entry = cache.load(directory, key)
    if entry is None:
        return None
    if kernels is None:
        kernels = fingerprint.kernels_from_record(entry.kernels) \
            if entry.kernels is not None else None
        if kernels is None:
            return None
    _check_imports(entry.object_code, target)
    return CompiledCode(target, entry.object_code, kernels, entry.llvm_ir,
                        seconds=time.perf_counter() - start, from_cache=True,
                        fallbacks=_from_notes(entry.fallbacks))


def _from_notes(notes: Sequence[dict]) -> tuple[Fallback, ...]:
    """The fallbacks a cache entry recorded (``cache.load`` checked their fields)."""
    pipelines = {p.name: p for p in CONSERVATIVE_PIPELINES}
    return tuple(Fallback(n["kernel"], tuple(n["serves"]), pipelines[n["pipeline"]], n["reason"])
                 for n in notes if n["pipeline"] in pipelines)


def _optimize(text: str, target: Target, tm: llvm.TargetMachine, pipeline: Pipeline,
              fault: str = "", lsr_skip: frozenset[str] | None = None) -> llvm.ModuleRef:
    """Parse, verify and optimize ``text`` with ``pipeline`` (``fault``: the test-only abort,
    ``CompileOptions.llvm_abort``); ``lsr_skip`` not None: then loop strength reduction on
    every function but those kernels (and their bodies, ``<symbol>.body``), for an object
    made without the code generator's LSR."""
    try:
        parsed = llvm.parse_assembly(text)
        parsed.verify()
    except RuntimeError as exc:
        raise CodegenError(f"LLVM rejected the generated kernels: {exc}") from None
    _inject_fault(parsed, pipeline, fault)
    parsed.triple = target.triple
    parsed.data_layout = str(tm.target_data)
    tuning = llvm.PipelineTuningOptions(speed_level=pipeline.speed_level)
    tuning.loop_vectorization = pipeline.loop_vectorize
    # llvmlite leaves the SLP vectorizer off; without it an inner loop that the unroller
    # flattens (a 64-float row of a transpose) stays scalar.
    tuning.slp_vectorization = pipeline.slp_vectorize
    pb = llvm.create_pass_builder(tm, tuning)
    pb.getModulePassManager().run(parsed, pb)
    if lsr_skip is not None:
        _reduce_strength(parsed, tm, pipeline, lsr_skip, pb)
    return parsed


def _reduce_strength(module: llvm.ModuleRef, tm: llvm.TargetMachine, pipeline: Pipeline,
                     skip: frozenset[str], pb: llvm.PassBuilder | None = None) -> None:
    """Loop strength reduction as an IR pass on every function of ``module`` but the kernels
    ``skip`` names (and their bodies, ``<symbol>.body``), for an object made without the code
    generator's LSR."""
    if pb is None:
        tuning = llvm.PipelineTuningOptions(speed_level=pipeline.speed_level)
        tuning.loop_vectorization = pipeline.loop_vectorize
        tuning.slp_vectorization = pipeline.slp_vectorize
        pb = llvm.create_pass_builder(tm, tuning)
    fpm = llvm.create_new_function_pass_manager()
    fpm.add_loop_strength_reduce_pass()
    for fn in module.functions:
        if not fn.is_declaration and fn.name.split(".")[0] not in skip:
            fpm.run(fn, pb)


def _inject_fault(module: llvm.ModuleRef, pipeline: Pipeline, spec: str) -> None:
    """The test-only abort ``spec`` (``FAULT_ENV``, ``CompileOptions.llvm_abort``)."""
    if not spec:
        return
    name, _, when = spec.partition(":")
    if pipeline in CONSERVATIVE_PIPELINES and when != "always":
        return
    if any(name in f.name for f in module.functions
           if f.name.startswith(SYMBOL_PREFIX) and not f.is_declaration):
        os.abort()


def _emit_object(tm: llvm.TargetMachine, module: llvm.ModuleRef, pipeline: Pipeline) -> bytes:
    """``module``'s object code; without loop strength reduction where ``pipeline`` says so
    (the switch is process-wide: set back to LLVM's default afterwards)."""
    if pipeline.strength_reduction:
        return tm.emit_object(module)
    llvm.set_option("mlcpack", "-disable-lsr=true")
    try:
        return tm.emit_object(module)
    finally:
        llvm.set_option("mlcpack", "-disable-lsr=false")


def _check_imports(obj: bytes, target: Target) -> None:
    imported = sorted(undefined_symbols(obj) - set(ALLOWED_EXTERNALS))
    if imported:
        raise CodegenError(f"kernels for {target.name} would import {', '.join(imported)}, "
                           "which the runtime does not provide")
