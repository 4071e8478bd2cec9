"""The ``--quantize int8`` recognizer's integer 1x1 convolutions alone, as the bundle runs them:
a QDQ model of three 1x1 convolutions (C -> O, O -> O, O -> O at H x W) each followed by
Paddle2ONNX's chain (affine, x * clip(x + 3, 0, 6) / 6, affine, per tensor) and the next layer's
quantize, uint8 activations, per-channel int8 weights: the form ``mlcpack export --quantize
int8`` writes for PP-OCRv4's 240 / 480-channel 1x1s (``qconv2d`` with a float32 result and the
chain fused into its copy out, codegen/qgemm_conv.py).

    .venv/bin/python bench/qconv_pointwise.py [SHAPE ...] [--rounds 8] [--runs 40]
        [--bin NAME=PATH/mlcpack ...] [--asm DIR] [--peak GMACS] [--open]

SHAPE: ``C,O,H,W`` (default the recognizer's 128,240,12,80 240,240,12,80 240,480,6,80
480,480,6,80 480,480,3,80). Each shape's model is exported (``--target host``, golden check
off) by this checkout's ``mlcpack`` and by each ``--bin`` (another checkout: a baseline); the
bundles are profiled in alternating rounds in one process (``Model.profile``, 1 thread) and
each convolution's minimum over all rounds printed, in us and GMAC/s (and its share of
``--peak`` GMAC/s, the host's 512-bit vpdpbusd loop: bench/int8_peak.py). ``--asm DIR``: the
host-level assembly of this checkout's kernels, one file per shape. ``--open``: the model's
batch, height and width open (the run-time-size kernels), run at the shape's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

DEFAULT = ["128,240,12,80", "240,240,12,80", "240,480,6,80", "480,480,6,80", "480,480,3,80"]


def model(path: Path, c: int, o: int, hh: int, ww: int, seed: int = 0,
          open_dims: bool = False) -> Path:
    import quant_models as qm
    from onnx import TensorProto as T
    from onnx import helper as h

    rng = np.random.default_rng(seed)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    inits: dict = {}
    nodes: list = []

    def dq_w(name, w):
        s = (np.abs(w).reshape(w.shape[0], -1).max(1) / 127).astype(np.float32)
        inits.update({name + "_q": np.clip(np.round(w / s.reshape(-1, 1, 1, 1)), -127, 127)
                      .astype(np.int8), name + "_s": s, name + "_z": np.zeros(len(s), np.int8)})
        nodes.append(h.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"],
                                 [name], axis=0))

    def qdq(x, y, scale, zp):
        inits.update({y + "_s": np.float32(scale), y + "_z": np.uint8(zp)})
        nodes.extend([h.make_node("QuantizeLinear", [x, y + "_s", y + "_z"], [y + "_q"]),
                      h.make_node("DequantizeLinear", [y + "_q", y + "_s", y + "_z"], [y])])

    def paddle(x, y, t):    # Paddle2ONNX's: affine, x * clip(x + 3, 0, 6) / 6, affine
        inits.update({t + "a": np.float32(1.1), t + "b": np.float32(0.05),
                      t + "3": np.float32(3), t + "0": np.float32(0), t + "6": np.float32(6),
                      t + "c": np.float32(1.2), t + "d": np.float32(0.1)})
        nodes.extend([h.make_node("Mul", [t + "a", x], [t + "m"]),
                      h.make_node("Add", [t + "m", t + "b"], [t + "ab"]),
                      h.make_node("Add", [t + "ab", t + "3"], [t + "p3"]),
                      h.make_node("Clip", [t + "p3", t + "0", t + "6"], [t + "cl"]),
                      h.make_node("Mul", [t + "ab", t + "cl"], [t + "mm"]),
                      h.make_node("Div", [t + "mm", t + "6"], [t + "hs"]),
                      h.make_node("Mul", [t + "c", t + "hs"], [t + "m2"]),
                      h.make_node("Add", [t + "m2", t + "d"], [y])])

    qdq("x", "x0", 0.02, 128)
    prev, ch = "x0", c
    for i in range(3):
        dq_w(f"w{i}", f(o, ch, 1, 1, sd=1.0 / np.sqrt(ch)))
        inits[f"b{i}"] = f(o, sd=0.1)
        nodes.append(h.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"]))
        paddle(f"c{i}", f"h{i}", f"k{i}")
        if i < 2:
            qdq(f"h{i}", f"q{i}", 0.03, 20)
            prev = f"q{i}"
        ch = o
    nodes.append(h.make_node("Identity", ["h2"], ["y"]))
    dims = ["N", c, "H", "W"] if open_dims else [1, c, hh, ww]
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits, path)


def asm_of(onnx_path: Path) -> str:
    import llvmlite.binding as llvm

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
    from mlcpack.packager.vm_emit import main_size_vars

    mod, _ = import_onnx(str(onnx_path))
    target = resolve_target("host")
    opts = CompileOptions(target=target.name)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)
             and "conv2d" in f.name]
    code = compile_prim_funcs(funcs, target, main_size_vars(mod),
                              options=opts.for_targets([target]))
    return _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="*", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--bin", action="append", default=[], help="NAME=PATH to another mlcpack")
    ap.add_argument("--asm", default=None)
    ap.add_argument("--peak", type=float, default=None, help="GMAC/s of the vpdpbusd loop")
    ap.add_argument("--work", default=None)
    ap.add_argument("--open", action="store_true", help="batch, height and width open")
    a = ap.parse_args()

    from mlcpack.runtime import load

    bins = [("this", str(Path(sys.executable).parent / "mlcpack"))]
    bins += [tuple(b.split("=", 1)) for b in a.bin]
    work = Path(a.work or tempfile.mkdtemp(prefix="qconv_pw_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLCPACK_CACHE_DIR"}
    for shape in a.shapes:
        c, o, hh, ww = (int(v) for v in shape.split(","))
        src = model(work / f"pw_{c}_{o}_{hh}_{ww}.onnx", c, o, hh, ww, open_dims=a.open)
        if a.asm:
            Path(a.asm).mkdir(parents=True, exist_ok=True)
            (Path(a.asm) / f"{c}_{o}_{hh}_{ww}.s").write_text(asm_of(src))
        paths = {}
        for name, exe in bins:
            out = work / f"{name}_{c}_{o}_{hh}_{ww}.mlc"
            res = subprocess.run([exe, "export", str(src), "-o", str(out), "--target", "host",
                                  "--no-check"], capture_output=True, text=True, env=env)
            if res.returncode:
                sys.exit(f"{name}: export failed\n{res.stderr[-2000:]}")
            paths[name] = out
        x = np.random.default_rng(1).normal(0, 1, (1, c, hh, ww)).astype(np.float32)
        models = {n: load(p, threads=1) for n, p in paths.items()}
        best: dict[str, np.ndarray] = {}
        steps = {}
        outs = {n: m.run({"x": x})["y"] for n, m in models.items()}
        for _ in range(a.rounds):
            for n, m in models.items():
                prof = m.profile({"x": x}, runs=a.runs)
                mins = prof.durations_ns.min(axis=0) / 1e3
                best[n] = mins if n not in best else np.minimum(best[n], mins)
                steps[n] = prof.steps
        ref = outs["this"]
        print(f"C {c} -> O {o} at {hh}x{ww} ({c * o * hh * ww / 1e6:.1f} MMAC first, "
              f"{o * o * hh * ww / 1e6:.1f} the others)")
        for n in models:
            diff = float(np.abs(outs[n] - ref).max())
            conv = [(i, st) for i, st in enumerate(steps[n]) if "conv" in st.name]
            parts = []
            for k, (i, _st) in enumerate(conv):
                macs = (c if k == 0 else o) * o * hh * ww
                g = macs / best[n][i] / 1e3
                pk = f" {100 * g / a.peak:.0f}%" if a.peak else ""
                parts.append(f"{best[n][i]:7.1f} us {g:5.0f} GMAC/s{pk}")
            print(f"  {n:10s} sum {best[n].sum():7.1f} us | " + " | ".join(parts)
                  + f" | max |y - this| {diff:.3g}")
        for m in models.values():
            m.close()


if __name__ == "__main__":
    main()
