"""The accuracy guard of ``mlcpack export --precision bf16`` (docs/precision.md).

A bf16 export stores the packed contraction weights as bfloat16 (passes/layout.py
``weights_to_bf16``); before the bundle is written, ``bf16_guard`` runs it with the runtime on
the golden check's inputs and compares each output with the fp32 reference (ONNX Runtime, or
the IR's numpy reference): the error is the largest |bf16 - fp32| over the output, divided by
the output's scale (its largest finite |value|). Past ``ExportOptions.bf16_max_error`` (1 % by
default) on any output, ``sensitive_weights`` picks the layers to keep in fp32 and the export
compiles again, unless they would leave under BF16_MIN_SHARE of the model's multiply-adds in
bf16 (``bf16_share``: no speed to gain); past the bound still, or so, the whole model is
exported in fp32, with a one-line note."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from ..runtime.errors import CpuFeatureError, LibraryFunctionError


def output_errors(got: dict, ref: dict) -> dict[str, float]:
    """Per output: max |got - ref| / max |ref| (finite values; a scale of 0 counts as 1)."""
    errors = {}
    for name, r in ref.items():
        r = np.asarray(r, dtype=np.float64)
        g = np.asarray(got[name], dtype=np.float64).reshape(r.shape)
        finite = np.isfinite(r)
        if not finite.any():
            errors[name] = 0.0 if np.array_equal(g, r, equal_nan=True) else float("inf")
            continue
        scale = float(np.abs(r[finite]).max()) or 1.0
        diff = np.abs(g[finite] - r[finite])
        errors[name] = float(diff.max()) / scale if diff.size else 0.0
        if not np.isfinite(g[finite]).all():
            errors[name] = float("inf")
    return errors


def _percent(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{100 * x:.3g} %"


def _names(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def fp32_note(mod: Any, options: Any, targets: tuple[str, ...] = ()) -> str:
    """What a bf16 module (after the passes) left in fp32 and why, for the bf16 line: the
    matmuls ``passes/layout.py widened_matmul_stays_fp32`` kept (compute-bound without
    vdpbf16ps) and the convolutions with float32 weights. ``options``: the resolved
    CompileOptions; ``targets``: the bundle's level names. Empty when nothing but biases and
    the guard's choice stayed fp32."""
    from .codegen.target import BF16_LEVELS
    from .ir.graph import CallTIR, Constant, Function
    from .passes.layout import BF16_WIDEN_MAX_ROWS, _kept

    fn = mod.functions.get("main")
    if not isinstance(fn, Function):
        return ""
    matmuls, convs = [], []
    for b in fn.bindings():
        v = b.value
        if not isinstance(v, CallTIR):
            continue
        weights = [a.name for a in v.args   # the layer's weight: its first such constant
                   if isinstance(a, Constant) and a.data.dtype == np.float32
                   and a.data.ndim >= 2]
        if not weights or _kept(weights[0], options.bf16_keep) or any(
                isinstance(a, Constant) and str(a.data.dtype) == "bfloat16" for a in v.args):
            continue   # (a bf16 layer: its float32 constants are biases, BatchNorm's)
        if "matmul_packed" in v.func:
            matmuls.append(weights[0])
        elif "conv2d" in v.func and "bf16p" not in v.func:
            convs.append(weights[0])
    note = ""
    if matmuls:
        note += (f"; {len(matmuls)} compute-bound matmuls (more than {BF16_WIDEN_MAX_ROWS} "
                 f"rows) stay fp32: without x86-64-v4+bf16 (avx512_bf16) in the targets their "
                 f"widened bf16 weights are slower than fp32 ({_names(matmuls)})")
    if convs and options.bf16_pair_convs:
        note += (f"; {len(convs)} convolutions stay fp32 (grouped, dilated, depthwise or of "
                 f"one output pixel: no bf16 kernel; {_names(convs)})")
    elif convs and not options.bf16_convs:
        note += (f"; {len(convs)} convolutions stay fp32: bf16 convolutions (vdpbf16ps) need "
                 f"x86-64-v4+bf16 (avx512_bf16) in the targets (bfdot: aarch64+bf16), and "
                 f"widened they are slower than fp32")
    widened = [t for t in targets if t not in BF16_LEVELS]
    if options.bf16_pair_convs and widened and len(convs) < sum(
            1 for b in fn.bindings() if isinstance(b.value, CallTIR) and "conv2d" in b.value.func):
        feature = "bf16" if all(t.startswith("aarch64") for t in widened) else "avx512_bf16"
        note += (f"; the bundle's levels without {feature} ({', '.join(widened)}) widen the "
                 f"bf16 convolution weights: slower there than an fp32 bundle")
    return note


def bf16_guard(writer: Any, header: Any, golden: Any, opts: Any, bf16_bytes: int,
               convs: str = "") -> tuple[bool, str]:
    """(keep bf16, the one line to print). Writes the bundle to a temporary file, runs it on
    ``golden.inputs`` and compares with ``golden.outputs`` (the fp32 reference). ``convs``:
    ``fp32_note``'s account of the layers left fp32."""
    bound = opts.bf16_max_error
    if bf16_bytes == 0:
        return True, ("bf16: no weight is stored as bf16 for this target (the bf16 kernels "
                      "read the packed weights of x86-64 matmuls and, with x86-64-v4+bf16 or "
                      "aarch64+bf16 in the bundle, matmuls and convolutions)" + convs
                      + "; the bundle computes as fp32")
    size = (f"{bf16_bytes / 1024:.1f} KiB of weights in bf16 (fp32: {bf16_bytes / 512:.1f} KiB)"
            + convs)
    if golden is None or golden.skipped or not golden.outputs:
        why = golden.skipped if golden is not None and golden.skipped else "no reference ran"
        return False, f"bf16: error against fp32 not measured ({why}); exported in fp32"
    from ..runtime import load

    fd, tmp = tempfile.mkstemp(prefix=".mlcpack-bf16-", suffix=".mlc")
    os.close(fd)
    try:
        writer.write(tmp, header)
        try:
            model = load(tmp)
        except (CpuFeatureError, LibraryFunctionError) as exc:
            return True, (f"bf16: {size}; error against fp32 not measured (this host cannot "
                          f"run the bundle: {exc})")
        with model:
            got = model.run(dict(golden.inputs))
    finally:
        os.unlink(tmp)
    errors = output_errors(got, golden.outputs)
    worst = max(errors, key=lambda n: errors[n])
    each = ", ".join(f"{n} {_percent(e)}" for n, e in errors.items())
    measured = (f"error against fp32 ({golden.reference}) on the check's inputs, of each "
                f"output's scale: {each} (bound {_percent(bound)})")
    kept = sorted(opts.bf16_keep or ())
    if not errors[worst] <= bound:
        return False, (f"bf16: {measured}; {worst} is past the bound"
                       + (f" with {len(kept)} layers kept in fp32" if kept else "")
                       + ", so the model is exported in fp32")
    return True, (f"bf16: {size}; {measured}"
                  + (f"; kept in fp32 (the most sensitive): {', '.join(kept)}" if kept else ""))


# The guard's choice of layers kept fp32 must leave at least this share of the model's
# multiply-adds (every contraction's, depthwise included) on bf16 kernels; else bf16 has no
# speed to gain and the model is exported in fp32 (``bf16_share``). Measured (1 thread, CPU
# minima, AVX-512 BF16 host): style transfer with 4 of 12 convolutions kept, 74 % in bf16,
# 0.73x its fp32 bundle's time; layout_cdla with 31 of its 71 ungrouped convolutions kept,
# 31 % in bf16, 1.02x (no gain, and 1.08 % of the output's scale off ONNX Runtime on a real
# page where the check's random inputs gave 0.36-0.59 %).
BF16_MIN_SHARE = 0.5

# The guard's first choice keeps in fp32 the fewest most sensitive layers (by their errors
# alone) whose bf16 remainder, run together in the reference, errs at most this fraction of the
# bound (the bundle is checked after, so the margin is for the kernels' summation order only);
# its second choice, where the first fails the bundle's check, the conservative one (the others'
# errors add up to at most half the bound). The first SELECT_LINEAR counts are tried in turn,
# then the least count is bisected up to all but one (``_fewest``).
SELECT_TARGET = 0.75
SELECT_LINEAR = 4


def _rounded(mod: Any, names: set, activations: bool, made: dict | None = None) -> Any:
    """``mod`` with the weights ``names`` (of ``matmul`` / ``nn.conv2d`` calls) rounded to
    bf16 and, with ``activations``, those calls' inputs too (vdpbf16ps and bfdot multiply
    bf16 activations: the kernels round them to nearest even before the dot products).
    ``made``: the rounded constants and the casts' Vars of earlier calls, reused (the same
    objects for the same layer: ``_RoundedRuns`` keeps values by Var)."""
    from .ir.graph import Binding, Call, Constant, DataflowBlock, Function, TensorType, Var
    from .passes.layout import to_bfloat16

    made = {} if made is None else made
    fn = mod.functions["main"]
    blocks = []
    for block in fn.blocks:
        out = DataflowBlock()
        for b in block.bindings:
            v = b.value
            if not isinstance(v, Call):
                out.bindings.append(b)
                continue
            args = list(v.args)
            w = args[1] if len(args) >= 2 else None
            if v.op in ("matmul", "nn.conv2d") and isinstance(w, Constant) and w.name in names:
                x = args[0]
                if activations and x.type.dtype == "float32":
                    if ("x", id(b.var)) not in made:
                        half = Var(f"{x.name}_bf16", TensorType(x.type.shape, "bfloat16"))
                        back = Var(f"{x.name}_bf16_f32", x.type)
                        made["x", id(b.var)] = [
                            Binding(half, Call("cast", [x], {"dtype": "bfloat16"}, half.type)),
                            Binding(back, Call("cast", [half], {"dtype": "float32"},
                                               back.type))]
                    casts = made["x", id(b.var)]
                    out.bindings += casts
                    args[0] = casts[-1].var
                if ("w", id(w)) not in made:
                    made["w", id(w)] = Constant(w.name, to_bfloat16(w.data).astype(np.float32))
                args[1] = made["w", id(w)]
            out.bindings.append(Binding(b.var, Call(v.op, args, v.attrs, v.type), b.source))
        blocks.append(out)
    rounded = mod.copy()
    rounded.functions["main"] = Function(fn.name, list(fn.params), blocks, list(fn.outputs),
                                         list(fn.output_names))
    return rounded


# ops whose reference runs read or set state outside their binding (branches, loops, sizes
# bound at run time): a module with one is evaluated whole for each rounding
_STATEFUL_OPS = frozenset(("if", "if_output", "check", "loop", "loop_output", "loop_rows",
                           "bind_size"))


class _RoundedRuns:
    """The IR's numpy reference of ``_rounded(mod, names, activations)`` for many ``names``,
    each run recomputing only the bindings whose value differs from a run kept (its cone:
    the layers rounded in one and not the other, and what they reach), the others' values
    taken from it: the unrounded run (``base``) or the last run, whichever leaves less to
    compute. The values are a whole run's, bit for bit (the same numpy calls on the same
    arrays). A module the cone cannot be cut from (branches, loops, sizes bound at run time
    or from input values, symbolic inputs) runs whole each time."""

    def __init__(self, mod: Any, inputs: Any, params: Any, activations: bool) -> None:
        from .golden import evaluate_ir
        from .ir.graph import Call, Function

        self.mod, self.inputs, self.params, self.activations = mod, inputs, params, activations
        self.made: dict = {}   # _rounded's constants and casts, the same objects every run
        values: dict[int, np.ndarray] = {}
        self.base = evaluate_ir(mod, inputs, params, values=values)
        self.kept = [(frozenset(), values, self.base)]   # (names, values by Var id, outputs)
        fn = mod.functions["main"]
        self.cut = (isinstance(fn, Function) and not mod.dynamic_sizes and not mod.value_vars
                    and all(isinstance(d, int) for p in fn.params for d in p.type.shape)
                    and not any(isinstance(b.value, Call) and b.value.op in _STATEFUL_OPS
                                for b in fn.bindings()))

    @staticmethod
    def _cone(fn: Any, changed: frozenset, values: dict) -> tuple[list, dict]:
        """The bindings of ``fn`` whose values differ from ``values`` (a run with the layers
        ``changed`` rounded the other way), and the Vars they read from it, by id."""
        from .ir.graph import Call, Constant, Var, used_values

        dirty: set[int] = set()
        cone, frontier = [], {}
        for b in fn.bindings():
            v, args = b.value, used_values(b.value)
            w = v.args[1] if isinstance(v, Call) and len(v.args) >= 2 else None
            if (id(b.var) not in values   # a cast that run did not have
                    or (isinstance(w, Constant) and v.op in ("matmul", "nn.conv2d")
                        and w.name in changed)
                    or any(id(a) in dirty for a in args)):
                dirty.add(id(b.var))
                cone.append(b)
                frontier.update((id(a), a) for a in args
                                if isinstance(a, Var) and id(a) not in dirty)
        return cone, frontier

    def __call__(self, names: Any) -> dict[str, np.ndarray]:
        from .golden import evaluate_ir
        from .ir.graph import DataflowBlock, Function

        names = frozenset(names)
        rounded = _rounded(self.mod, names, self.activations, self.made)
        if not self.cut:
            return evaluate_ir(rounded, self.inputs, self.params)
        fn = rounded.functions["main"]
        (cone, frontier), (_, known, outputs) = min(
            ((self._cone(fn, names ^ k[0], k[1]), k) for k in self.kept),
            key=lambda c: len(c[0][0]))
        feeds = {a.name: known[i] for i, a in frontier.items()}
        values: dict[int, np.ndarray] = {}
        if len(feeds) < len(frontier):   # two Vars of one name: the whole run
            got = evaluate_ir(rounded, self.inputs, self.params, values=values)
        else:
            ids = {id(b.var) for b in cone}
            outs = [(n, o) for n, o in zip(fn.output_names, fn.outputs) if id(o) in ids]
            sub = rounded.copy()
            sub.functions["main"] = Function(fn.name, list(frontier.values()),
                                             [DataflowBlock(cone)], [o for _, o in outs],
                                             [n for n, _ in outs])
            got = evaluate_ir(sub, feeds, values=values) if cone else {}
            # this run's values: of its own Vars only (a cast of a layer rounded in an earlier
            # run, not in this one, would read as current in the next)
            values = {id(v): values[id(v)] if id(v) in values else known[id(v)]
                      for v in (*fn.params, *(b.var for b in fn.bindings()))}
            got = {n: got[n] if n in got else outputs[n] for n in fn.output_names}
        self.kept[1:] = [(names, values, got)]
        return got

    def error(self, names: Any) -> float:
        """The worst output's error (``output_errors``) of ``names`` rounded."""
        return max(output_errors(self(names), self.base).values())

    def errors(self, sets: list) -> list[float]:
        """``error`` of each of ``sets``, in forked workers where this process may use more
        than one CPU and the memory holds a run's values per worker (the kept run's values
        shared); a worker that dies leaves its sets to this process. The values are the
        same wherever they are computed."""
        import multiprocessing

        from .codegen.parallel import _run, _usable_cpus

        need = sum(a.nbytes for a in self.kept[0][1].values() if isinstance(a, np.ndarray))
        workers = min(len(sets), _usable_cpus(), max(1, _available_bytes() // max(need, 1)))
        if workers < 2 or not self.cut or "fork" not in multiprocessing.get_all_start_methods() \
                or multiprocessing.current_process().daemon:   # a daemon may not fork
            return [self.error(s) for s in sets]
        parts = [sets[i::workers] for i in range(workers)]
        outcomes = _run([(_errors_of, (self, part)) for part in parts], workers)
        got = []
        for part, outcome in zip(parts, outcomes):
            if outcome.error is not None:
                raise outcome.error
            got.append(outcome.value if outcome.died is None else _errors_of(None, self, part))
        return [got[i % workers][i // workers] for i in range(len(sets))]


def _errors_of(report: Any, runs: _RoundedRuns, sets: list) -> list[float]:
    """A worker's part of ``_RoundedRuns.errors`` (``report``: the worker's progress call)."""
    from .blas_threads import one_blas_thread

    with np.errstate(all="ignore"), one_blas_thread():
        return [runs.error(s) for s in sets]


def _available_bytes() -> int:
    """The memory the system can give without swapping (Linux's MemAvailable: free pages and
    the page cache it can drop), else the free pages, else 0 (no workers)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _fewest(n: int, fits) -> int | None:
    """The least k in 1 .. n - 1 with ``fits(k)``: 1 .. SELECT_LINEAR in turn, then bisected
    (the remainder's error falls about monotonically as k grows; the bundle's check decides);
    None when not even n - 1 fits."""
    for k in range(1, min(SELECT_LINEAR, n - 1) + 1):
        if fits(k):
            return k
    lo, hi = SELECT_LINEAR + 1, n - 1
    if lo > hi or not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _candidates(fn: Any) -> list[str]:
    """The weights ``sensitive_weights`` weighs, in order: each ungrouped matmul's or
    convolution's constant float32 weight (of the module before the passes)."""
    from .ir.graph import Call, Constant

    weights = []
    for b in fn.bindings():
        v = b.value
        if (isinstance(v, Call) and v.op in ("matmul", "nn.conv2d") and len(v.args) >= 2
                and isinstance(v.args[1], Constant) and v.args[1].data.dtype == np.float32
                and v.args[1].data.ndim >= 2 and int(v.attrs.get("groups", 1)) == 1):
            weights.append(v.args[1].name)
    return list(dict.fromkeys(weights))


def bf16_layers(mod: Any) -> int:
    """How many layers the guard weighs (``_candidates``) in ``mod`` before the passes."""
    from .ir.graph import Function

    fn = mod.functions.get("main")
    return len(_candidates(fn)) if isinstance(fn, Function) else 0


def sensitive_weights(mod: Any, params: Any, golden: Any, bound: float,
                      activations: bool = False) -> list[frozenset]:
    """The sets of weights to keep in fp32 so that bf16 stays within ``bound``, to try in
    order. Each matmul's or convolution's constant weight rounded to bf16 alone (with
    ``activations``, its input too: the targets multiply with vdpbf16ps or bfdot), in the
    IR's numpy reference on the check's inputs, costs an error (as ``output_errors``, the
    worst output, against the unrounded reference). First: the fewest largest kept fp32 whose
    remainder, rounded together, errs at most SELECT_TARGET of the bound (``_fewest``);
    then: the largest kept fp32 until the others' errors add up to at most half the bound
    (errors of independent roundings add about so, or less). Empty when the reference cannot
    run or every weight would stay fp32."""
    from .blas_threads import one_blas_thread
    from .golden import _REFERENCE_ERRORS
    from .ir.graph import Function

    fn = mod.functions.get("main")
    if not isinstance(fn, Function):
        return []
    weights = _candidates(fn)
    if not weights:
        return []

    try:
        with np.errstate(all="ignore"), one_blas_thread():
            runs = _RoundedRuns(mod, golden.inputs, params, activations)
            costs = dict(zip(weights, runs.errors([[name] for name in weights])))
            order = sorted(weights, key=lambda n: -costs[n])
            k = _fewest(len(order), lambda k: runs.error(order[k:]) <= SELECT_TARGET * bound)
            fewest = frozenset(order[:k]) if k else None
    except _REFERENCE_ERRORS:   # the reference cannot run this model: no selection
        return []
    return _choices(order, costs, fewest, bound)


def _choices(order: list[str], costs: dict[str, float], fewest: frozenset[str] | None,
             bound: float) -> list[frozenset[str]]:
    """The sets of layers to keep fp32 the selection offers, in order: ``fewest`` (the fewest
    most sensitive layers whose rounding stays under the target), then the most sensitive
    layers (``order``) until the others' single-layer errors (``costs``) sum to half the bound,
    where that is another set and not every layer."""
    keep, rest = set(), sum(costs.values())
    for name in order:
        if rest <= bound / 2:
            break
        keep.add(name)
        rest -= costs[name]
    choices = [fewest] if fewest else []
    if keep and len(keep) < len(order) and keep != fewest:
        choices.append(frozenset(keep))
    return choices


def bf16_winograd_used(mod: Any) -> bool:
    """Whether a compiled ``main`` (after the passes) runs a bf16 layer as Winograd (reads a
    ``{weight}_wino_bf16`` constant, passes/layout.py ``weights_to_bf16``): where the guard's
    check fails on such a bundle, the export is made again with ``bf16_winograd`` False (its
    extra rounding of the transformed weights and inputs off) before any layer is kept fp32."""
    from .ir.graph import Constant, Function

    fn = mod.functions.get("main")
    return isinstance(fn, Function) and any(
        isinstance(a, Constant) and a.name.endswith("_wino_bf16")
        for b in fn.bindings() for a in getattr(b.value, "args", ()))


def bf16_work(mod: Any) -> tuple[dict[str, int], int]:
    """(each bf16 layer's multiply-adds per run, by its bf16 weight's name; the multiply-adds
    of every contraction) of a compiled ``main`` (after the passes: the prim functions'
    ``macs``, fused ones their sum). Kernels whose work is known only at run time count 0."""
    from .ir.graph import CallTIR, Constant, Function, PrimFunc

    fn = mod.functions.get("main")
    layers: dict[str, int] = {}
    total = 0
    if not isinstance(fn, Function):
        return layers, total
    for b in fn.bindings():
        v = b.value
        if not isinstance(v, CallTIR):
            continue
        func = mod.functions.get(v.func)
        macs = func.attrs.get("macs", 0) if isinstance(func, PrimFunc) else 0
        if not isinstance(macs, int) or not macs:
            continue
        total += macs
        bf16 = [a.name for a in v.args
                if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16"]
        if bf16:
            layers[bf16[0]] = layers.get(bf16[0], 0) + macs
    return layers, total


def bf16_share(work: tuple[dict[str, int], int], keep: frozenset) -> float | None:
    """The share of the multiply-adds ``bf16_work`` found on bf16 kernels that stays there
    with the weights ``keep`` in fp32 (source names, as ``CompileOptions.bf16_keep``); None
    when the module's work is not known at export."""
    from .passes.layout import _kept

    layers, total = work
    if total <= 0:
        return None
    return sum(m for name, m in layers.items() if not _kept(name, keep)) / total


def low_share_note(note: str, keep: frozenset, share: float, layers: int) -> str:
    """The guard's fp32 line (``note``, past the bound) when its choice of ``keep`` leaves only
    ``share`` of the multiply-adds in bf16 (under BF16_MIN_SHARE)."""
    head = note.removesuffix(", so the model is exported in fp32")
    return (f"{head}; the layers that would bring it under the bound ({len(keep)} of "
            f"{layers} kept in fp32) leave {100 * share:.0f} % of the multiply-adds in bf16 "
            f"(under {100 * BF16_MIN_SHARE:.0f} %: no speed to gain), so the model is exported "
            f"in fp32 (--check-input with your own data measures bf16 on it)")
