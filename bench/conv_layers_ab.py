"""Per convolution layer, the kernels of several bundles of one ONNX model side by side (e.g.
an open-size export before and after a change, and the fixed-shape export): each bundle's
``Model.profile`` in alternating rounds, 1 thread, each kernel's minimum over all rounds, matched
across bundles by the kernel's first source Conv node; GFLOP/s from the layer's multiply-adds at
the given input shape (computed from the ONNX graph: an open-size bundle does not record them)
as a share of ``--peak``.

Run: .venv/bin/python bench/conv_layers_ab.py MODEL.onnx N,C,H,W A.mlc B.mlc [C.mlc ...]
                                              [--rounds 8] [--peak 103]
The model's first input is fed at N,C,H,W (random, seeded). Prints one row per Conv node,
slowest first in the first bundle, and the sums of the conv kernels' minimums.
"""

from __future__ import annotations

import argparse

import numpy as np


def conv_layers(onnx_path: str, shape: tuple[int, ...]) -> tuple[dict, dict]:
    """(Conv node name -> multiply-adds, -> "C->O KxK on HxW") at input ``shape``."""
    import onnx
    from onnx import shape_inference

    m = onnx.load(onnx_path)
    dims = m.graph.input[0].type.tensor_type.shape
    dims.Clear()
    for d in shape:
        dims.dim.add().dim_value = d
    for o in m.graph.output:
        o.type.tensor_type.shape.Clear()
    m = shape_inference.infer_shapes(m)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(m.graph.value_info) + list(m.graph.output)}
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    macs, desc = {}, {}
    for n in m.graph.node:
        if n.op_type == "Conv" and n.input[1] in inits and n.output[0] in shapes:
            w, out = inits[n.input[1]], shapes[n.output[0]]
            macs[n.name] = int(np.prod(out)) * int(np.prod(w[1:]))
            desc[n.name] = f"{w[1]}->{w[0]} {w[2]}x{w[3]} on {out[2]}x{out[3]}"
    return macs, desc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("shape", help="N,C,H,W of the first input")
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--peak", type=float, default=103.0, help="GFLOP/s the %% columns use")
    args = ap.parse_args()
    from mlcpack.runtime.model import load

    shape = tuple(int(d) for d in args.shape.split(","))
    macs, desc = conv_layers(args.model, shape)
    models = [load(p, threads=1) for p in args.bundles]
    feeds = {models[0].inputs[0].name:
             np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    for m in models:
        m.run(feeds)
    best: list[list] = [[] for _ in models]
    for _ in range(args.rounds):
        for i, m in enumerate(models):
            best[i].append([t.min_us for t in m.profile(feeds, runs=10).instructions])
    rows: dict[str, list] = {}
    for i, m in enumerate(models):
        steps = m.profile(feeds, runs=1).instructions
        for s, t in zip(steps, np.min(np.array(best[i]), axis=0)):
            convs = [src.name for src in s.step.sources if src.op == "Conv"]
            if s.step.kind == "kernel" and convs:
                rows.setdefault(convs[0], [None] * len(models))[i] = float(t)
    totals = [0.0] * len(models)
    print(f"{'layer':32s} {'shape':24s} " + " ".join(f"{'#' + str(i) + ' us':>9s} {'%pk':>4s}"
                                                     for i in range(len(models))))
    for name, vals in sorted(rows.items(), key=lambda kv: -(kv[1][0] or 0.0)):
        cells = []
        for i, t in enumerate(vals):
            if t is None:
                cells.append(f"{'-':>9s} {'':>4s}")
                continue
            totals[i] += t
            share = 100 * 2 * macs.get(name, 0) / t / 1e3 / args.peak
            cells.append(f"{t:9.1f} {share:4.0f}")
        print(f"{name[-32:]:32s} {desc.get(name, ''):24s} " + " ".join(cells))
    print("sum of the conv kernels' minimums (us): " + " ".join(f"{t:.0f}" for t in totals))


if __name__ == "__main__":
    main()
