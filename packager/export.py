"""The export driver: IRModule -> passes -> LLVM object -> VM program -> bundle file."""

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
from ..runtime.errors import MlcpackError
from .bundle_writer import BundleWriteError, BundleWriter
from .codegen.build import ALLOWED_EXTERNALS, CodegenError, CompiledCode, compile_prim_funcs
from .codegen.lower import KernelInfo, LoweringError
from .codegen.objinfo import function_sizes
from .codegen.target import Target, TargetError, resolve_targets
from .ir.builder import BuilderError
from .ir.graph import IRModule
from .ir.printer import module_text
from .passes import DEFAULT_PIPELINE, bind_params, run_pipeline
from .passes.simplify import BindError
from .vm_emit import Program, VMEmitError, emit_program


class ExportError(MlcpackError):
    """The model could not be exported; the message says why and what to change."""

    exit_code = 11


@dataclass
class ExportOptions:
    target: str | None = None                 # level name(s), comma-separated; None: host's best
    preprocess: dict | None = None            # recorded for `mlcpack infer` on images
    labels: Sequence[str] | None = None
    model_name: str = "model"
    source: str | None = None                 # the file the model came from (name only)
    source_sha256: str | None = None
    verify_ir: bool = True
    sign_key: str | os.PathLike | None = None  # Ed25519 private key file: sign the bundle


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
    stages: dict[str, float] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)  # one code variant each


def compile_module(mod: IRModule, params: Mapping[str, np.ndarray] | None = None,
                   target: str | None = None, verify_ir: bool = True,
                   on_stage: Callable[[str], None] | None = None
                   ) -> tuple[IRModule, Any, Program]:
    """Run the pipeline and code generation; return (optimized module, compiled code, program).
    With several targets, the compiled code is the first target's (see ``compile_variants``)."""
    optimized, variants, program = compile_variants(mod, params, target, verify_ir, on_stage)
    return optimized, variants[0], program


def compile_variants(mod: IRModule, params: Mapping[str, np.ndarray] | None = None,
                     target: str | None = None, verify_ir: bool = True,
                     on_stage: Callable[[str], None] | None = None
                     ) -> tuple[IRModule, list[CompiledCode], Program]:
    """Like ``compile_module`` for a comma-separated list of targets: one object per target,
    and one VM program (and memory plan) that every object serves."""
    note = on_stage or (lambda s: None)
    try:
        targets = resolve_targets(target)
        if params:
            mod = bind_params(mod, params)
        note("passes")
        mod = run_pipeline(mod, DEFAULT_PIPELINE, verify=verify_ir)
        note("codegen")
        funcs = list(mod.prim_funcs().values())
        variants = [compile_prim_funcs(funcs, tgt) for tgt in targets]
        note("vm")
        program = emit_program(mod, _common_kernels(variants))
    except (TargetError, CodegenError, LoweringError, VMEmitError, BindError, BuilderError) as exc:
        raise ExportError(str(exc)) from None
    return mod, variants, program


def _common_kernels(variants: list[CompiledCode]) -> dict[str, KernelInfo]:
    """Kernel facts every variant agrees with: the same signature, and the largest workspace
    (a kernel's scratch size may depend on the target's vector width)."""
    merged = {}
    for name, info in variants[0].kernels.items():
        infos = [v.kernels[name] for v in variants]
        if len({(k.symbol, k.num_inputs, k.num_outputs, k.parallel) for k in infos}) != 1:
            raise CodegenError(f"kernel {name} differs between targets "
                               f"{', '.join(v.target.name for v in variants)}; export them apart")
        merged[name] = dataclasses.replace(info, workspace_bytes=max(k.workspace_bytes
                                                                     for k in infos))
    return merged


def _check_library_names(program: Program) -> None:
    for call in program.library_calls:
        if not isinstance(call["func"], str) or "." not in call["func"]:
            raise ExportError(f"library function name {call['func']!r} must be namespaced, "
                              "e.g. 'env.linear' or 'myapp.op'")


def export_module(mod: IRModule, path: str | os.PathLike, options: ExportOptions | None = None,
                  params: Mapping[str, np.ndarray] | None = None,
                  on_stage: Callable[[str], None] | None = None) -> ExportReport:
    """Compile ``mod`` (binding ``params`` to its ``main`` parameters) and write a bundle."""
    opts = options or ExportOptions()
    t0 = time.perf_counter()
    signer = None
    if opts.sign_key is not None:  # read the key first: a bad key fails before compiling
        from .signing import load_signer
        signer = load_signer(opts.sign_key)
    optimized, variants, program = compile_variants(mod, params, opts.target, opts.verify_ir,
                                                    on_stage)
    kernels = _common_kernels(variants)
    _check_library_names(program)
    if on_stage:
        on_stage("write")
    writer = BundleWriter()
    constants = []
    for c in program.constants:
        data = np.asarray(c.data, order="C")
        constants.append({"name": c.name, "shape": list(data.shape), "dtype": str(data.dtype),
                          "data": writer.add(data)})
    kernel_infos = [kernels[name] for name in program.kernels]
    code = []
    for compiled in variants:  # the weights, plan and bytecode below are shared by all
        sizes = function_sizes(compiled.object_code)
        code.append({**compiled.target.to_record(),
                     "object": writer.add(compiled.object_code),
                     "externals": list(ALLOWED_EXTERNALS),
                     "code_sizes": {k.symbol: sizes.get(k.symbol, 0) for k in kernel_infos}})
    ir_text = module_text(optimized)
    header = {
        "compiler": {"name": "mlcpack", "version": packager.__version__,
                     "llvmlite": llvmlite.__version__},
        "model": {"name": opts.model_name, "source": opts.source,
                  "source_sha256": opts.source_sha256},
        "inputs": program.inputs,
        "outputs": program.outputs,
        "preprocess": opts.preprocess,
        "labels": list(opts.labels) if opts.labels else None,
        "constants": constants,
        "kernels": [{"name": name, "symbol": k.symbol, "num_inputs": k.num_inputs,
                     "num_outputs": k.num_outputs, "workspace_bytes": k.workspace_bytes,
                     "parallel": k.parallel} for name, k in zip(program.kernels, kernel_infos)],
        "code": code,
        "library_calls": program.library_calls,
        "tensors": program.tensors,
        "vm": {"bytecode": writer.add(program.bytecode),
               "instructions": len(program.instructions)},
        "memory_plan": {"arena_bytes": program.arena_bytes,
                        "intermediate_bytes": program.intermediate_bytes},
        "ir": writer.add(ir_text.encode()),
    }
    try:
        size = writer.write(path, header, signer=signer)
    except BundleWriteError as exc:
        raise ExportError(str(exc)) from None
    return ExportReport(
        path=os.fspath(path), bundle_bytes=size, target=variants[0].target,
        kernels=len(program.kernels), instructions=len(program.instructions),
        weights_bytes=sum(c.data.nbytes for c in program.constants),
        arena_bytes=program.arena_bytes, intermediate_bytes=program.intermediate_bytes,
        seconds=time.perf_counter() - t0, targets=[v.target for v in variants])


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
