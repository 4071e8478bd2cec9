"""Everything that steers the compiler besides the model: one frozen ``CompileOptions``.

The passes (``passes/pipeline.run_pipeline``) and kernel emission (``codegen/build.py``) read
their choices from the options object they are handed, never from context variables, module
state or the environment, so a pass's result is a function of its arguments. The environment
is read once, by ``from_environ``, at the entries: the command line (``packager/cli.py``) and
the Python export entries of ``packager/export.py`` when they are given no options.
``docs/env-vars.md`` lists every variable.

Adding a field: give it a default here that keeps today's behaviour (the default must be what
``mlcpack export`` does with an empty environment), validate it in ``__post_init__`` when it
takes few values, read it where it matters from the ``options`` argument (passes take
``(mod, options)``, kernel rules get ``options``), and if an environment variable or a command
line flag sets it, map it in ``from_environ`` or in cli.py and list it in docs/env-vars.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

from .codegen.threads import PARALLEL_MIN_MACS, PARALLEL_MIN_OUTPUTS, PARALLEL_MIN_WEIGHT_BYTES

PRECISIONS = ("fp32", "bf16")


class OptionsError(ValueError):
    """An option value the compiler does not know (one line, names the field)."""


@dataclass(frozen=True)
class CompileOptions:
    """The compiler's settings; frozen, so one object can be shared by every pass and target.

    Layout fields left ``None`` are chosen for the targets by ``for_targets`` (what an export
    does); ``run_pipeline`` resolves them the same way for ``target``."""

    # -- target: level names, comma-separated ("x86-64-v3", "aarch64+dotprod"); "host" this
    # CPU's level; None the portable set (x86-64-v2 up to this CPU's level), as export
    target: str | None = None
    # -- numeric precision of float kernels: "fp32", or "bf16": the packed matmul/convolution
    # weights stored as bfloat16, widened on load (passes/layout.py weights_to_bf16;
    # ``mlcpack export --precision bf16``)
    precision: str = "fp32"
    # under "bf16", the source weights kept float32 (names; set by export's accuracy guard,
    # packager/precision.py)
    bf16_keep: frozenset[str] = frozenset()
    # under "bf16", convolution weights (nn.conv2d_oc / nn.conv2d_rows) stored bf16 too, widened
    # on load: half their size, but slower than fp32 on AVX2 (ResNet-18 1.37x; docs/precision.md),
    # and no target has a bf16 convolution kernel yet, so off by default
    bf16_convs: bool = False
    # under "bf16" on targets without vdpbf16ps (no x86-64-v4+bf16 in the set), matmuls of
    # more than passes/layout.py BF16_WIDEN_MAX_ROWS rows (compute-bound: the widening costs
    # more than the halved weight bytes save) keep fp32 weights; True stores them bf16 anyway
    bf16_widen_all: bool = False
    # whether the targets multiply bf16 pairs with a dot instruction (vdpbf16ps on
    # x86-64-v4+bf16, bfdot on aarch64+bf16: codegen/target.py has_bf16_dot); None: chosen for
    # the targets (``for_targets``). The ``bf16_dot`` and ``bf16_pair_convs`` properties
    # derive from it.
    bf16_dot_targets: bool | None = None
    # under "bf16" where every target has vdpbf16ps at 16 lanes (``bf16_oc_targets``, chosen
    # by ``for_targets``): convolutions whose output channels fill 16-lane vectors take
    # nn.conv2d_oc with weights in input-channel pairs (output channels on the lanes,
    # codegen/conv_oc.py) instead of nn.conv2d_bf16p (pixels on the lanes: 7x7 planes compute
    # 31 % more outputs than they have) on output planes of up to 14x14, up to this many pixels
    # with 64 input channels or more, any strided stem of up to 4 (passes/layout.py _bf16_oc,
    # BF16_OC_1X1_PIXELS for 1x1 windows); 0: none. Measured on Zen 5 (1 thread, kernel CPU
    # minima, pair -> channel-lane): ResNet's 7x7 layers 0.75-0.84x, its 3x3s at 14x14
    # 0.93-0.95x, at 28x28 0.93-0.95x, at 56x56 0.96-0.97x (docs/performance.md)
    bf16_oc_pixels: int = 56 * 56
    bf16_oc_targets: bool | None = None
    # under "bf16" where ``bf16_oc_targets``: convolutions of few, odd input channels (C = 3
    # stems) pair a window row's adjacent taps instead of two input channels, on nn.conv2d_oc
    # at any plane size (passes/layout.py _bf16_tap_pairs); False: channel pairs as before
    bf16_tap_pairs: bool = True
    # under "bf16" where ``bf16_oc_targets``: 3x3 stride-1 convolutions that fp32 runs as
    # Winograd F(2x2, 3x3) (passes/layout.py ``uses_winograd``) take it in bf16 too: the
    # transformed weights and inputs as bf16 pairs in vdpbf16ps, float32 transforms and
    # accumulation (codegen/conv_oc.py; passes/layout.py _bf16_winograd). None (default):
    # every such convolution, and where the bf16 guard's check fails on such a bundle the
    # export is made again with False before any layer is kept fp32 (export.py); True: every
    # such convolution, no retry; False: none (direct bf16 pair kernels)
    bf16_winograd: bool | None = None
    # under "bf16" where ``bf16_oc_targets``: a tensor between a channel-lane bf16 convolution
    # and one bf16 convolution that alone reads it is written as the bf16 pair words the
    # reader multiplies (its copy into pair planes skipped; passes/bf16_pairs.py); False: every
    # tensor float32 as before
    bf16_pair_activations: bool = True
    # with it: a tensor read by a 1x1 bf16 convolution and as the residual of a pixel-lane
    # bf16 convolution's epilogue (a ResNet block's output) as pair words too, the residual
    # widened from bf16 (outputs change, within the bf16 guard); False: such tensors float32
    bf16_pair_residuals: bool = True
    # with it: a tensor read by several bf16 convolutions' reductions (a ResNet stage's first
    # block input: the block's first convolution and its downsample) as pair words too, read
    # in place or, by a strided 1x1 on pixel lanes, through its plane fill (bit for bit the
    # same outputs); False: such tensors float32
    bf16_pair_shared: bool = True
    # with it: a depthwise convolution's output read by one bf16 convolution's reduction alone
    # (a depthwise-separable block's depthwise -> 1x1) as pair words too, each channel's
    # values rounded in the depthwise epilogue into its half of the words (bit for bit the
    # same outputs); False: such tensors float32
    bf16_pair_depthwise: bool = True
    # with it: a bf16 convolution's output read by nothing but a float32 max pool (ResNet's
    # stem) as pair words too, the pool widening each load (its output bf16 of the float32
    # pool's; the next bf16 convolution rounds it to the same words). Off: on a loaded Zen 5
    # host the stem gained 30-110 us but the pool lost 10-30 us in the network (ResNet-18 /
    # -50 level, 0.99-1.02x; docs/performance.md)
    bf16_pair_pools: bool = False
    # under "bf16" where ``bf16_oc_targets``: a 1x1 convolution on a 1x1 image (a classifier
    # head after global pooling) with output channels in whole 16-lane vectors takes bf16
    # pair weights on the channel-lane kernel (passes/layout.py bf16_takes_conv) instead of
    # fp32's dot-product kernel (codegen/contraction/dot.py); False: fp32 as before
    bf16_one_pixel: bool = True
    # test only: the vdpbf16ps matmul's and convolution's data path (packing, loop order) with
    # vcvtne2ps2bf16 and vdpbf16ps written in portable IR (float32 FMAs, exact on normal
    # values), on any target: runs it on a CPU without avx512_bf16 (codegen/bf16dot.py,
    # bf16conv.py), and the passes choose as for a target set with the dot instruction
    bf16_emulate: bool = False
    # -- int8: quantized products take the integer kernels (codegen/qgemm.py); False: the
    # float32-exact chains they replaced, for comparison (MLCPACK_INT8_KERNELS=0)
    int8_kernels: bool = True
    # quantized elementwise chains as 8-bit lookup tables (passes/quantize_lut.py), with the
    # integer kernels; False: the chains stay as they are (tests compare the two)
    lut8: bool = True
    # dequantize(lut8(quantize(y))) after a float product as one qlookup in its epilogue, a
    # gather per 8 values (passes/quantize_lut.py lookup_dequantized_tables); off: measured
    # slower on Zen 4 with AVX2 (vgatherdps), docs/performance.md (MLCPACK_QLOOKUP=1: on)
    qlookup: bool = False
    # dequantize(lut8(quantize(y))) of run-time extents as one qtable kernel (float32 in and
    # out, one pass: passes/quantize_lut.py fuse_table_chains); False: the three kernels
    # (MLCPACK_QTABLE=0)
    qtable: bool = True
    # the VNNI qmatmul and qconv2d with vpdpbusd written in portable IR, on any target (tests:
    # runs the VNNI data path on a CPU without VNNI; MLCPACK_VNNI_EMULATE=1)
    vnni_emulate: bool = False
    # int8 convolution weights packed at export in the quad kernels' layout (passes/
    # quad_weights.py): the architecture ("x86_64", "aarch64") whose quad kernel (vpdpbusd,
    # sdot) every target runs, "" when some target does not; None: chosen for the targets
    # (``for_targets``; vnni_emulate makes every x86 target's a quad kernel)
    conv_quads: str | None = None
    # x86 targets whose quad kernel is not every level's: a convolution whose int8 weights all
    # fit 7 bits (|w| <= 64, ORT's reduce_range) still gets its weights packed as quads, and
    # the levels without VNNI run them with vpmaddubsw + vpmaddwd (exact: 255 * 64 * 2 <
    # 2**15; passes/quad_weights.py); None: chosen for the targets (every target x86-64);
    # False: those keep the k-pairs (MLCPACK_INT8_MADD7=0)
    conv_quads7: bool | None = None
    # x86 quad kernels on small output planes (rows of a few outputs, where the pixel-lane
    # kernel computes the planes' padding columns too): output channels on the lanes instead
    # (passes/quad_weights.py ``use_oc_lanes``); False: every quad convolution keeps pixel
    # lanes (MLCPACK_INT8_OC_LANES=0)
    conv_oc_lanes: bool = True
    # x86 quad kernels on full-range int8 weights in [-127, 127] whose byte pairs pass
    # vpmaddubsw's bound: int8 planes and vpmaddubsw(|x|, sign(w, x)), exact for any such
    # weights with no residual (passes/quad_weights.py ``signed_x``). None: where the
    # pixel-lane kernels would leave lanes idle (outputs 4-7 wide: the channel-lane sign kernel
    # beats the k-pair and fp32 kernels there), the split does not pay and no level has VNNI;
    # True: for all such weights (for comparison, MLCPACK_INT8_SIGNED_X=1); False: never
    # (MLCPACK_INT8_SIGNED_X=0)
    conv_signed_x: bool | None = None
    # x86 targets without an int8 dot instruction: 3x3 stride-1 convolutions with full-range
    # int8 weights (a split share past int8_cost.SPLIT_MAX_SHARE_FLOAT) on the exact integer
    # Winograd F(2x2, 3x3) kernel (passes/int8_cost.py ``int_winograd``). None: there; True: for
    # every such layer whatever its weights (MLCPACK_INT8_WINOGRAD=1); False: never (=0)
    conv_int_winograd: bool | None = None
    # ``--quantize int8`` keeps activations 8-bit between layers (QDQ on conv outputs, ReLU /
    # ReLU6 folded into the quantize, residual adds and MaxPool on bytes: calibrate.py
    # ``_chain_plan``); False: only the int8 layers' inputs are quantized (MLCPACK_INT8_CHAIN=0)
    int8_chain: bool = True
    # whether some target multiplies int8 quads with a dot instruction (vpdpbusd on
    # x86-64-v4+vnni, sdot on aarch64+dotprod; or vnni_emulate); None: chosen for the targets
    # (``for_targets``). Without one, int8_float_convs may keep convolutions float.
    int8_dot_targets: bool | None = None
    # quantized convolutions that the integer kernel would run slower than the fp32 kernel of
    # the same shape on targets without an int8 dot instruction (passes/int8_cost.py: 3x3
    # stride-1 layers that fp32 runs as Winograd, or on outputs under 8 wide) stay float: the
    # dequantized weights on the fp32 kernels (``--quantize int8`` leaves them unquantized).
    # False: every quantized convolution the integer kernels take (MLCPACK_INT8_FLOAT_CONVS=0)
    int8_float_convs: bool = True
    # -- layout and packing of constant weights (passes/layout.py). One-row products keep W
    # [N, K] for the dot-product kernel; export turns it off when several batch plans share W.
    one_row_gemv: bool = True
    # Winograd F(2x2, 3x3) for the convolutions passes/layout.py ``uses_winograd`` accepts
    winograd: bool = True
    # nn.conv2d_oc (with pack_conv_weights) also for convolutions whose image size is known at
    # run time only (codegen/conv_oc.py's run-time geometry); False: they keep nn.conv2d and the
    # symbolic register-blocked kernel (codegen/contraction/conv_symbolic.py), for comparison
    symbolic_conv_oc: bool = True
    # nn.conv2d_rows (with conv_row_widths) also for 1x1 convolutions whose image size is known
    # at run time only, on packed input panels (codegen/contraction/conv_packed_symbolic.py);
    # False: they keep nn.conv2d, their input read in place, for comparison
    symbolic_conv_rows: bool = True
    # None: chosen for the targets (``for_targets``): nn.conv2d_oc packing on AVX2 ...
    pack_conv_weights: bool | None = None
    # ... nn.conv2d_rows packing for these vector widths (() none) ...
    conv_row_widths: tuple[int, ...] | None = None
    # ... and matmul_packed column panels. conv_oc_wide: a target runs nn.conv2d_oc on
    # AVX-512's 16 lanes (chosen with pack_conv_weights; None / False: not): output channels
    # in whole 16-lane vectors only, and 1x1 convolutions of PACK_1X1_MIN_CHANNELS inputs on
    # it too (passes/layout.py)
    pack_matmul_weights: bool | None = None
    conv_oc_wide: bool | None = None
    # -- symbolic shapes: a symbolic convolution without a fast kernel gets the generic loop
    # nest instead of a refusal (debugging; MLCPACK_SYMBOLIC_GENERIC=1)
    symbolic_generic: bool = False
    # -- threads: the work from which a kernel splits over tasks (multiply-adds for the
    # contraction, depthwise and channel-lane kernels; outputs for the generic loop nest,
    # softmax and normalization; codegen/threads.py); tests set 0 to split every kernel. A
    # matmul of one to three rows splits as well once its second operand (the weights it
    # streams) has parallel_min_weight_bytes
    parallel_min_macs: int = PARALLEL_MIN_MACS
    parallel_min_weight_bytes: int = PARALLEL_MIN_WEIGHT_BYTES
    parallel_min_outputs: int = PARALLEL_MIN_OUTPUTS
    # -- build: compile a fat bundle's targets in forked workers (MLCPACK_PARALLEL_COMPILE=0
    # off); the on-disk object cache directory, None none (from_environ: MLCPACK_CACHE_DIR,
    # else the user's cache, codegen/cache.py cache_dir), and its size cap (MLCPACK_CACHE_SIZE)
    parallel_compile: bool = True
    cache_dir: str | None = None
    cache_max_bytes: int = 1 << 30
    # -- debug: check the IR invariants of the pipeline's result, and (verify_each_pass,
    # MLCPACK_VERIFY_EACH_PASS=1) before and after every pass, which costs ~60 % of the passes'
    # time and names the pass that broke an invariant
    verify_ir: bool = True
    verify_each_pass: bool = False
    # test only: make LLVM "abort" on a kernel whose name contains NAME ("NAME": the default
    # pipeline; "NAME:always": every pipeline), as an LLVM assertion does (codegen/build.py
    # _inject_fault; tests/export/test_llvm_abort_fails_one_kernel.py; MLCPACK_TEST_LLVM_ABORT)
    llvm_abort: str = ""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise OptionsError(f"precision {self.precision!r} is not supported; choose "
                               + " or ".join(PRECISIONS))
        if not isinstance(self.bf16_keep, frozenset):
            raise OptionsError(f"bf16_keep must be a frozenset of weight names, got "
                               f"{self.bf16_keep!r}")
        if self.conv_row_widths is not None:
            if not isinstance(self.conv_row_widths, tuple) or not all(
                    isinstance(w, int) and w > 0 for w in self.conv_row_widths):
                raise OptionsError(f"conv_row_widths must be a tuple of vector widths, got "
                                   f"{self.conv_row_widths!r}")

    @property
    def resolved(self) -> bool:
        """Whether every layout choice is made (no field left to ``for_targets``)."""
        return None not in (self.pack_conv_weights, self.conv_row_widths,
                            self.pack_matmul_weights, self.bf16_dot_targets, self.conv_quads,
                            self.int8_dot_targets, self.conv_quads7)

    @property
    def bf16_dot(self) -> bool:
        """Under "bf16", the targets multiply bf16 with a dot instruction
        (``bf16_dot_targets``, or vdpbf16ps's emulation): matmul weights are stored bf16
        whatever the row count."""
        return self.precision == "bf16" and bool(self.bf16_dot_targets or self.bf16_emulate)

    @property
    def bf16_pair_convs(self) -> bool:
        """Under "bf16", plain convolutions (ungrouped, undilated, static shapes) become
        nn.conv2d_bf16p (weights in input-channel pairs, codegen/bf16conv.py): the dot
        instruction where a variant has it (the bundle's other variants widen the same pair
        weights). The same targets as ``bf16_dot``: the two cannot disagree."""
        return self.bf16_dot

    def replace(self, **changes: object) -> CompileOptions:
        return dataclasses.replace(self, **changes)

    def for_targets(self, targets: Sequence | None = None) -> CompileOptions:
        """These options with the layout fields left ``None`` chosen for ``targets`` (resolved
        ``codegen.target.Target`` objects; default: ``target`` resolved), as an export for them
        chooses: conv weights packed for AVX2 8-lane and AVX-512 16-lane targets
        (``conv_oc.packs_conv_weights``; not for bf16 on 16 lanes),
        row-block packing and packed matmul panels where x86-64-v3 is the widest level
        (``codegen/contraction/geometry.py`` ``conv_row_widths``; AVX2 measured, its 128-bit
        level beside it neutral), packed matmul panels for fp32 also where a level has 16
        lanes (x86-64-v4 measured)."""
        if self.resolved:
            return self
        from .codegen import conv_oc
        from .codegen.contraction import geometry
        from .codegen.target import has_bf16_dot, has_int8_dot, quad_arch, resolve_targets
        if targets is None:
            targets = resolve_targets(self.target, self.precision)
        names = {t.name for t in targets}
        changes: dict[str, object] = {}
        if self.pack_conv_weights is None:
            # bf16 on AVX-512 levels without a bf16 dot keeps nn.conv2d (the register-blocked
            # kernel); with one (x86-64-v4+bf16), the convolutions weights_to_bf16 leaves fp32
            # (the guard's, run-time batches) take fp32's channel-lane kernels, the others
            # stay nn.conv2d for it (passes/layout.py bf16_takes_conv)
            wide = any(geometry.vector_width(t.name) == 16 for t in targets)
            changes["pack_conv_weights"] = conv_oc.packs_conv_weights(targets) and not (
                wide and self.precision == "bf16" and not has_bf16_dot(targets))
            if self.conv_oc_wide is None:
                changes["conv_oc_wide"] = changes["pack_conv_weights"] and wide
        if self.conv_row_widths is None:
            changes["conv_row_widths"] = geometry.conv_row_widths(targets)
        # bf16 with a dot instruction (vdpbf16ps on x86-64-v4+bf16, bfdot on aarch64+bf16):
        # every level of the set reads the K-pair panels (codegen/bf16dot.py)
        dot = self.precision == "bf16" and has_bf16_dot(targets)
        if self.pack_matmul_weights is None:
            # AVX2 (alone or beside its 128-bit level), bf16 dot targets, and fp32 where a
            # target has 16-lane vectors (every level of the set then reads the same 16-column
            # panels: x86-64-v4 measured, the lower levels as on AVX2)
            wide_fp32 = self.precision == "fp32" and any(
                geometry.vector_width(t.name) == geometry.WIDEST_VECTOR for t in targets)
            changes["pack_matmul_weights"] = (
                ("x86-64-v3" in names and names <= {"x86-64-v2", "x86-64-v3"}) or dot
                or wide_fp32)
        if self.bf16_dot_targets is None:
            changes["bf16_dot_targets"] = has_bf16_dot(targets)
        if self.bf16_oc_targets is None:
            from .codegen.bf16dot import VDPBF16PS, dot_kind
            changes["bf16_oc_targets"] = bool(targets) and all(
                geometry.vector_width(t.name) == 16 and dot_kind(t.llvm_features) == VDPBF16PS
                for t in targets)
        if self.conv_quads is None:
            changes["conv_quads"] = quad_arch(targets, self.vnni_emulate)
        if self.conv_quads7 is None:
            changes["conv_quads7"] = all(t.arch == "x86_64" for t in targets)
        if self.int8_dot_targets is None:
            changes["int8_dot_targets"] = has_int8_dot(targets) or self.vnni_emulate
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], **fields: object) -> CompileOptions:
        """Options from the ``MLCPACK_*`` variables of ``environ`` (docs/env-vars.md), then
        ``fields``; called by the entries only (the command line, export's Python entries)."""
        env: dict[str, object] = {}
        if environ.get("MLCPACK_INT8_KERNELS", "1") == "0":
            env["int8_kernels"] = False
        if environ.get("MLCPACK_INT8_FLOAT_CONVS", "1") == "0":
            env["int8_float_convs"] = False
        if environ.get("MLCPACK_INT8_MADD7", "1") == "0":
            env["conv_quads7"] = False
        if environ.get("MLCPACK_INT8_OC_LANES", "1") == "0":
            env["conv_oc_lanes"] = False
        if environ.get("MLCPACK_INT8_SIGNED_X", "") in ("0", "1"):
            env["conv_signed_x"] = environ["MLCPACK_INT8_SIGNED_X"] == "1"
        if environ.get("MLCPACK_INT8_WINOGRAD", "") in ("0", "1"):
            env["conv_int_winograd"] = environ["MLCPACK_INT8_WINOGRAD"] == "1"
        if environ.get("MLCPACK_INT8_CHAIN", "1") == "0":
            env["int8_chain"] = False
        if environ.get("MLCPACK_VNNI_EMULATE", "") == "1":
            env["vnni_emulate"] = True
        if environ.get("MLCPACK_QLOOKUP", "") == "1":
            env["qlookup"] = True
        if environ.get("MLCPACK_QTABLE", "1") == "0":
            env["qtable"] = False
        if environ.get("MLCPACK_SYMBOLIC_GENERIC"):
            env["symbolic_generic"] = True
        if environ.get("MLCPACK_PARALLEL_COMPILE", "1") == "0":
            env["parallel_compile"] = False
        if environ.get("MLCPACK_VERIFY_EACH_PASS", "") not in ("", "0"):
            env["verify_each_pass"] = True
        if environ.get("MLCPACK_TEST_LLVM_ABORT"):
            env["llvm_abort"] = environ["MLCPACK_TEST_LLVM_ABORT"]
        from .codegen import cache   # where the cache lives and its cap: its own rules
        directory = cache.cache_dir(environ)
        if directory is not None:
            env["cache_dir"] = str(directory)
        try:
            env["cache_max_bytes"] = cache.max_bytes(environ)
        except cache.CacheSettingError:   # the command line refuses it first; the API goes on
            pass
        return cls(**{**env, **fields})


# The layout of the old context variables' defaults: no target-specific packing (what a pass
# test that inspects the generic kernels wants; an export chooses per target instead).
UNPACKED = CompileOptions(pack_conv_weights=False, conv_row_widths=(), pack_matmul_weights=False,
                          bf16_dot_targets=False, conv_quads="", int8_dot_targets=False, conv_quads7=False)
