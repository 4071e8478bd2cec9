"""fp32 MatMul shapes of the corpus as one-node models (MatMul [+ bias] [+ activation]),
mlcpack against ONNX Runtime and OpenVINO f32, alternating in one process: the kernel's
GFLOP/s and ratio to the best fp32 peer, per shape.

Run: .venv/bin/python bench/matmul_shapes.py [SHAPE ...] [--threads 1] [--budget 1.0]
         [--target host] [--cpu-time] [--bundles A.mlc,...]
A SHAPE is ``[BATCHxx]MxKxN`` with optional suffixes: ``+b`` a bias, ``+g`` GELU after it
(Erf form), ``+r`` ReLU, ``/in`` B an input (not a constant; attention's products), ``:t`` the
model's A input transposed first (token mixing: Transpose then MatMul). Without SHAPE: the
corpus's (mlp_mixer, magika, ppocr_rec's SVTR neck and CTC head). ``--keep DIR`` leaves each
model and bundle there (for ``bench/bundle_ab.py``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402
from bench import time_interleaved  # noqa: E402

CORPUS = [
    "196x256x1024+b+g",     # mlp_mixer channel MLP fc1 (GELU)
    "196x1024x256+b",       # ... fc2
    "256x196x128+b+g:t",    # token MLP fc1, on the transposed tokens
    "256x128x196+b",        # ... fc2
    "2048x257x64+b",        # magika's first dense layer (one-hot bytes)
    "1x512x214+b",          # magika's head
    "40x120x360+b",         # ppocr_rec SVTR qkv
    "40x120x240+b+g",       # ... mlp fc1 (its activation is Swish; GELU here)
    "40x240x120+b",         # ... mlp fc2
    "40x120x6625+b",        # CTC head
    "8x40x15x40/in",        # attention q @ k^T (8 heads of 15)
    "8x40x40x15/in",        # attention p @ v
]

SHAPE = re.compile(r"^(?:(\d+)x)?(\d+)x(\d+)x(\d+)((?:\+[bgr])*)(/in)?(:t)?$")


def parse(spec: str) -> dict:
    m = SHAPE.match(spec)
    if not m:
        raise SystemExit(f"bad shape {spec!r}: [BATCHx]MxKxN[+b][+g][+r][/in][:t]")
    batch, M, K, N, flags, b_in, tr = m.groups()
    return {"batch": int(batch) if batch else None, "M": int(M), "K": int(K), "N": int(N),
            "bias": "+b" in flags, "gelu": "+g" in flags, "relu": "+r" in flags,
            "b_input": bool(b_in), "transposed": bool(tr)}


def build(s: dict, path: Path) -> dict[str, np.ndarray]:
    """Save the one-MatMul model of shape ``s`` at ``path``; its feeds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    lead = [s["batch"]] if s["batch"] else []
    a_shape = lead + ([s["K"], s["M"]] if s["transposed"] else [s["M"], s["K"]])
    b_shape = lead + [s["K"], s["N"]] if s["b_input"] else [s["K"], s["N"]]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    inits, nodes = [], []
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
    if s["b_input"]:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
        feeds["b"] = rng.standard_normal(b_shape).astype(np.float32)
    else:
        w = (rng.standard_normal(b_shape) / math.sqrt(s["K"])).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "b"))
    x = "a"
    if s["transposed"]:
        perm = list(range(len(a_shape)))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        nodes.append(helper.make_node("Transpose", ["a"], ["at"], perm=perm))
        x = "at"
    nodes.append(helper.make_node("MatMul", [x, "b"], ["y0"]))
    y = "y0"
    if s["bias"]:
        inits.append(numpy_helper.from_array(rng.standard_normal(s["N"]).astype(np.float32),
                                             "bias"))
        nodes.append(helper.make_node("Add", [y, "bias"], ["y1"]))
        y = "y1"
    if s["gelu"]:
        inits += [numpy_helper.from_array(np.array(1 / math.sqrt(2), np.float32), "rs2"),
                  numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                  numpy_helper.from_array(np.array(0.5, np.float32), "half")]
        nodes += [helper.make_node("Mul", [y, "rs2"], ["g0"]),
                  helper.make_node("Erf", ["g0"], ["g1"]),
                  helper.make_node("Add", ["g1", "one"], ["g2"]),
                  helper.make_node("Mul", [y, "g2"], ["g3"]),
                  helper.make_node("Mul", ["g3", "half"], ["g4"])]
        y = "g4"
    if s["relu"]:
        nodes.append(helper.make_node("Relu", [y], ["r0"]))
        y = "r0"
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    out_shape = lead + [s["M"], s["N"]]
    graph = helper.make_graph(nodes, "mm", inputs, [helper.make_tensor_value_info(
        "out", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return feeds


def export(onnx_path: Path, bundle: Path, target: str) -> None:
    mlcpack = Path(sys.executable).parent / "mlcpack"
    proc = subprocess.run([str(mlcpack), "export", str(onnx_path), "-o", str(bundle),
                           "--target", target], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"export {onnx_path}: {proc.stderr[-400:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=CORPUS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of runs per shape")
    ap.add_argument("--target", default="host")
    ap.add_argument("--cpu-time", action="store_true", help="time runs in CPU seconds")
    ap.add_argument("--no-peers", action="store_true", help="mlcpack only")
    ap.add_argument("--keep", help="a folder to leave the models and bundles in")
    args = ap.parse_args()
    from mlcpack.runtime import load

    clock = time.process_time if args.cpu_time else time.perf_counter
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mm_shapes"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{'shape':24} {'mlc us':>9} {'ORT us':>9} {'OV us':>9} {'mlc GF/s':>9} "
          f"{'/best':>6}   (median; min in brackets)")
    ratios = []
    for spec in args.shapes:
        s = parse(spec)
        tag = re.sub(r"[^0-9a-z]+", "_", spec)
        path, bundle = work / f"{tag}.onnx", work / f"{tag}.mlc"
        feeds = build(s, path)
        export(path, bundle, args.target)
        flops = 2.0 * (s["batch"] or 1) * s["M"] * s["K"] * s["N"]
        with load(bundle, threads=args.threads) as model:
            engines = [] if args.no_peers else (
                [peers.ort_engine(path, feeds, args.threads)]
                + [e for e in peers.openvino_engines(path, feeds, args.threads) if e.fp32])
            fns = [lambda m=model, f=feeds: m.run(f)] + [e.run for e in engines]
            res = time_interleaved(fns, args.budget, clock=clock)
        mlc = res[0]
        row = f"{spec:24} {mlc[0]:9.1f}"
        peer_meds = [r[0] for r in res[1:]]
        for r in res[1:]:
            row += f" {r[0]:9.1f}"
        row += " " * (10 * (2 - len(res[1:])))
        row += f" {flops / mlc[1] / 1e3:9.1f}"
        if peer_meds:
            ratio = mlc[0] / min(peer_meds)
            ratios.append(ratio)
            row += f" {ratio:6.2f}"
        row += "   [" + " ".join(f"{r[1]:.1f}" for r in res) + "]"
        print(row, flush=True)
    if ratios:
        print(f"geomean mlcpack / best fp32 peer: {math.exp(np.mean(np.log(ratios))):.3f}")
    if not args.keep:
        for f in work.iterdir():
            os.unlink(f)
        work.rmdir()


if __name__ == "__main__":
    main()
