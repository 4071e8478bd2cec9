"""The expected saving of packing the VNNI convolution's weights at export
(passes/quad_weights.py), from instruction counts: a host without AVX-512 VNNI cannot time it.

- **Regrouping, per quad word** (one output channel x 4 input channels x one tap), measured:
  the dynamic instruction counts (valgrind's callgrind, ``Collected``) of the C runtime's
  ``mlcrun run`` on two x86-64-v3 bundles of one convolution with vpdpbusd written in portable
  IR (``vnni_emulate``), its weights regrouped per call (``QConv._vnni_weights``) and packed at
  export, differ by the regrouping plus the two kernels' other differences (LLVM's choices in
  their per-pixel loops). On a 2 x 2 image with many weights the per-pixel work is small, so
  the difference over the quad words is the regrouping's cost per word. That is AVX2 code
  (LLVM vectorizes the regrouping loop); x86-64-v4+vnni's, on 512-bit vectors, may be shorter.
- **The main loop, per call**, estimated for x86-64-v4+vnni: the ``vpdpbusd`` executed (6-row
  tiles x 16-pixel chunks x steps x 6 x 2) times the instructions per ``vpdpbusd`` of the
  innermost loop holding them in the emitted assembly (its loads, broadcasts, address
  arithmetic). The plane copy and the epilogue are left out (the same in both), so the saving
  printed, regroup / (regroup + main loop), is an upper bound of the kernel's.

Then per convolution of a ResNet-18 at 224 x 224 (batch 1): quad words x cost per word against
the main loop.

Run: .venv/bin/python bench/vnni_conv_quads.py   (needs valgrind and make -C runtime/c)
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from helpers import build_op_module  # noqa: E402
from mlcpack.packager.export import ExportOptions, export_module  # noqa: E402
from mlcpack.packager.options import CompileOptions  # noqa: E402
from mlcpack.packager.ops.qlinear import CONV_ROWS, pack_conv_weights  # noqa: E402

MASK = [False, True, True, True, True, True]
# name: C, H (= W), O, k, stride, pad
LAYERS = {
    "conv1 7x7/2 3->64 @224": (3, 224, 64, 7, 2, 3),
    "layer1 3x3 64->64 @56": (64, 56, 64, 3, 1, 1),
    "layer2 3x3/2 64->128 @56": (64, 56, 128, 3, 2, 1),
    "layer2 3x3 128->128 @28": (128, 28, 128, 3, 1, 1),
    "layer2 1x1/2 64->128 @56": (64, 56, 128, 1, 2, 0),
    "layer3 3x3/2 128->256 @28": (128, 28, 256, 3, 2, 1),
    "layer3 3x3 256->256 @14": (256, 14, 256, 3, 1, 1),
    "layer3 1x1/2 128->256 @28": (128, 28, 256, 1, 2, 0),
    "layer4 3x3/2 256->512 @14": (256, 14, 512, 3, 2, 1),
    "layer4 3x3 512->512 @7": (512, 7, 512, 3, 1, 1),
    "layer4 1x1/2 256->512 @14": (256, 14, 512, 1, 2, 0),
}
# How often each appears in ResNet-18 (the rest of the network's int8 convolutions)
REPEATS = {"layer1 3x3 64->64 @56": 4, "layer2 3x3 128->128 @28": 3,
           "layer3 3x3 256->256 @14": 3, "layer4 3x3 512->512 @7": 3}


def conv_args(c: int, hw: int, o: int, k: int, s: int, p: int, rng, batch: int = 1):
    x = rng.integers(0, 256, (batch, c, hw, hw)).astype(np.uint8)
    wd = rng.integers(-127, 128, (o, c, k, k))
    args = [x, pack_conv_weights(wd), np.array(128, np.int32),
            rng.integers(-3000, 3000, o).astype(np.int32),
            np.full(o, 1e-4, np.float32), np.array(3, np.float32)]
    attrs = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=(p,) * 4, dtype="uint8")
    return args, attrs


def collected(mlcrun: Path, bundle: Path, x: Path, out: Path) -> int:
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           str(mlcrun), "run", str(bundle), str(x), "-o", str(out),
                           "--threads", "1"], capture_output=True, text=True, timeout=3600)
    found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"valgrind failed on {bundle}:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def per_dpbusd(args, attrs) -> float:
    """Instructions per vpdpbusd in the x86-64-v4+vnni kernel's loop that holds them."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    target = resolve_target("x86-64-v4+vnni")
    opts = CompileOptions(target=target.name)
    mod = run_pipeline(build_op_module("qconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                       options=opts)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    lines = asm.splitlines()
    best = None
    for i, line in enumerate(lines):   # each loop: a label .. the jump back to it
        m = re.match(r"^(\.LBB\d+_\d+):", line)
        if not m:
            continue
        for j in range(i + 1, len(lines)):
            if re.match(rf"^\s+j\w+\s+{re.escape(m.group(1))}$", lines[j]):
                body = [ln for ln in lines[i + 1:j] if ln.startswith("\t")
                        and not ln.startswith("\t.") and not ln.startswith("\t#")]
                dots = sum("vpdpbusd" in ln for ln in body)
                # the innermost (full tile) loop: the fewest instructions per vpdpbusd
                if dots and (best is None or len(body) / dots < best):
                    best = len(body) / dots
                break
    assert best is not None, "no vpdpbusd loop"
    return best


def regroup_per_word(mlcrun: Path, tmp: Path, c: int, o: int) -> tuple[int, float]:
    """(quad words, instructions per word) of a 3x3 convolution C -> O on a 2 x 2 image."""
    args, attrs = conv_args(c, 2, o, 3, 1, 1, np.random.default_rng(0))
    np.save(tmp / "x.npy", args[0])
    counts = {}
    for label, quads in (("packed", None), ("per_call", "")):
        path = tmp / f"{label}.mlc"
        options = CompileOptions(vnni_emulate=True, conv_quads=quads, parallel_compile=False)
        export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                      ExportOptions(target="x86-64-v3", check=False, compile=options))
        counts[label] = collected(mlcrun, path, tmp / "x.npy", tmp / label)
    words = -(-o // CONV_ROWS) * CONV_ROWS * 9 * -(-c // 4)
    return words, (counts["per_call"] - counts["packed"]) / words


def main() -> None:
    mlcrun = HERE.parent / "runtime" / "c" / "build" / "mlcrun"
    if not mlcrun.exists():
        raise SystemExit("build the C runtime first: make -C runtime/c")
    print("host: x86-64 with AVX2 + FMA, no AVX-512: instruction counts, not times")
    with tempfile.TemporaryDirectory() as tmp:
        costs = []
        for c, o in ((256, 256), (512, 512)):
            words, per = regroup_per_word(mlcrun, Path(tmp), c, o)
            costs.append(per)
            print(f"regrouping, 3x3 {c}->{o} on 2x2 (x86-64-v3, vpdpbusd emulated): {words} "
                  f"quad words, {per:.1f} instructions per word", flush=True)
    low, per_word = min(costs), max(costs)
    print(f"per convolution at {per_word:.1f} instructions per word (the larger):")
    print(f"{'convolution':28} {'quad words':>10} {'regroup':>10} {'main loop':>11} "
          f"{'per vpdpbusd':>12} {'saving':>7}")
    total_regroup = total_main = total_low = 0.0
    for name, (c, hw, o, k, s, p) in LAYERS.items():
        args, attrs = conv_args(c, hw, o, k, s, p, np.random.default_rng(0))
        ot, cg, taps = -(-o // CONV_ROWS), -(-c // 4), k * k
        words = ot * CONV_ROWS * taps * cg
        oh = (hw + 2 * p - k) // s + 1
        wq = -(-(hw + 2 * p) // s)
        qpad = -(-(oh * wq) // 16) * 16
        dots = ot * (qpad // 16) * taps * cg * CONV_ROWS * 2
        ratio = per_dpbusd(args, attrs)
        regroup, main_loop = words * per_word, dots * ratio
        reps = REPEATS.get(name, 1)
        total_regroup += reps * regroup
        total_low += reps * words * low
        total_main += reps * main_loop
        print(f"{name:28} {words:10d} {regroup:10.3g} {main_loop:11.3g} {ratio:12.2f} "
              f"{regroup / (regroup + main_loop):7.1%}", flush=True)
    total = total_regroup + total_main
    print(f"ResNet-18's int8 convolutions (repeats counted): regrouping {total_regroup:.3g} of "
          f"{total:.3g} instructions ({total_regroup / total:.1%}) at {per_word:.1f} per word; "
          f"{total_low / (total_low + total_main):.1%} at {low:.1f} per word")


if __name__ == "__main__":
    main()
