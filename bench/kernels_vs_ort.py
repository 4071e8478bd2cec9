"""Kernel by kernel: mlcpack's profile (``Model.profile``) against ONNX Runtime's per-node
profile (``SessionOptions.enable_profiling``) on one corpus model, or with ``--peer openvino``
against OpenVINO's (f32, ``PERF_COUNT``: each executed node's real time, its kernel in the
"ORT ops" column as ``type:exec_type``).

Run: .venv/bin/python bench/kernels_vs_ort.py MODEL|FILE.onnx [--threads 1] [--rounds 6] [--runs 10]
                                              [--top 30] [--bundle X.mlc] [--peer openvino]
The bundle is the corpus cache's (``bench/real.py`` exports it) unless ``--bundle`` names one.
Both engines run the model's realistic input in alternating rounds (``--runs`` runs each) so
that both see the same load; each kernel's and each ORT node's time is its minimum over all
runs (on a shared machine the minimum is what the code does when it has the core). Every ORT
node is charged to the mlcpack kernel whose source ONNX nodes contain its name (ORT's
``..._output_0_nchwc`` and ``.../QuickGeluFusion/`` suffixes stripped); ORT's layout reorders
and nodes that match no kernel (by node name, or by the name of the tensor a node writes, which
ORT's NCHWc nodes carry) are listed on their own lines. Rows are sorted by how much
longer mlcpack takes than ORT on them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402

_SUFFIXES = (re.compile(r"_output_\d+_nchwc$"), re.compile(r"/\w+Fusion/?$"),
             re.compile(r"_nchwc$"), re.compile(r"_token_\d+$"))


def ort_base_name(event_name: str) -> str:
    name = event_name[:-len("_kernel_time")] if event_name.endswith("_kernel_time") \
        else event_name
    for pattern in _SUFFIXES:
        name = pattern.sub("", name)
    return name


def ort_profile(onnx_path: Path, feeds, threads: int, runs: int, workdir: str
                ) -> dict[tuple[str, str, int], float]:
    """(base name, op, occurrence) -> min us over ``runs`` runs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(workdir, "ort")
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    # per run: the node events between two model_run events
    per_run: list[list[dict]] = []
    current: list[dict] = []
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            per_run.append(current)
            current = []
        elif e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            current.append(e)
    best: dict[tuple[str, str, int], float] = {}
    for run in per_run[1:]:          # the first is the warm-up
        seen: dict[tuple[str, str], int] = defaultdict(int)
        for e in run:
            op = e.get("args", {}).get("op_name", "?")
            base = ort_base_name(e["name"])
            k = (base, op)
            key = (base, op, seen[k])
            seen[k] += 1
            best[key] = min(best.get(key, float("inf")), float(e["dur"]))
    return best


_OV_REQUESTS: dict = {}


def openvino_profile(onnx_path: Path, feeds, threads: int, runs: int, workdir: str
                     ) -> dict[tuple[str, str, int], float]:
    """OpenVINO f32 with PERF_COUNT: (node name, ``type:exec_type``, 0) -> min us over ``runs``
    runs (OpenVINO's fused nodes carry the name of the node they were fused into; Reorders and
    nodes it adds are named after no ONNX node and end up unmatched)."""
    req = _OV_REQUESTS.get((onnx_path, threads))
    if req is None:   # compiled once, warmed up: every round then times the same compiled model
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(onnx_path))
        model.reshape({name: list(np.asarray(a).shape) for name, a in feeds.items()})
        compiled = core.compile_model(model, "CPU", {
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False, "PERF_COUNT": True, "INFERENCE_PRECISION_HINT": "f32"})
        req = _OV_REQUESTS[(onnx_path, threads)] = compiled.create_infer_request()
        for _ in range(20):
            req.infer(feeds)
    best: dict[tuple[str, str, int], float] = {}
    for _ in range(runs):
        req.infer(feeds)
        # an executed node, then the nodes fused into it (NOT_RUN; they keep their ONNX names
        # where the executed one got a new name, e.g. a Conv with its BatchNormalization folded
        # in): the key's name is all of their names joined by "|"
        nodes: list[list] = []
        for p in req.profiling_info:
            if p.status == p.status.EXECUTED:
                op = "Reorder" if p.node_type == "Reorder" else f"{p.node_type}:{p.exec_type}"
                nodes.append([[p.node_name.removesuffix("/WithoutBiases")], op,
                              p.real_time.total_seconds() * 1e6])
            elif nodes:
                nodes[-1][0].append(p.node_name)
        for names, op, us in nodes:
            if us > 0:
                key = ("|".join(names), op, 0)
                best[key] = min(best.get(key, float("inf")), us)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--bundle", help="a bundle of the model (default: the corpus cache's)")
    ap.add_argument("--peer", choices=("ort", "openvino"), default="ort",
                    help="the peer whose per-node profile is set beside ours")
    args = ap.parse_args()
    from mlcpack.runtime import load

    if args.model.endswith(".onnx"):   # any ONNX file (its bundle given), seeded random inputs
        import onnxruntime as ort

        onnx_path = Path(args.model)
        if not args.bundle:
            ap.error("an .onnx file needs --bundle")
        bundle = Path(args.bundle)
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
                 .astype(np.float32)
                 for i in ort.InferenceSession(str(onnx_path)).get_inputs()}
    else:
        onnx_path = corpus.model_path(args.model)
        bundle = Path(args.bundle) if args.bundle else \
            corpus.cache_dir() / "bundles" / f"{args.model}.mlc"
        feeds = corpus.realistic_inputs(args.model)
    ours: dict[int, float] = {}
    steps = {}
    theirs: dict[tuple[str, str, int], float] = {}
    totals = {"mlcpack": float("inf"), "ort": float("inf")}
    with tempfile.TemporaryDirectory() as work, load(bundle, threads=args.threads) as mlc:
        for _ in range(args.rounds):
            peer_profile = openvino_profile if args.peer == "openvino" else ort_profile
            for key, us in peer_profile(onnx_path, feeds, args.threads, args.runs,
                                        work).items():
                theirs[key] = min(theirs.get(key, float("inf")), us)
            prof = mlc.profile(feeds, runs=args.runs)
            totals["mlcpack"] = min(totals["mlcpack"], prof.total_min_us)
            for t in prof.instructions:
                steps[t.index] = t.step
                ours[t.index] = min(ours.get(t.index, float("inf")), t.min_us)
    owner: dict[str, int] = {}
    for i, step in steps.items():
        for s in step.sources:
            owner.setdefault(s.name, i)
    # ORT names a layout-transformed (NCHWc) node after the tensor it writes
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    for node in graph.node:
        if node.name in owner:
            for out in node.output:
                owner.setdefault(out, owner[node.name])
    charged: dict[int, list[tuple[str, float]]] = defaultdict(list)
    loose: dict[str, float] = defaultdict(float)
    unmatched_convs = []
    for (base, op, _), us in theirs.items():
        # OpenVINO's key names the executed node and the nodes fused into it ("a|b|c")
        i = next((owner[n] for n in base.split("|") if n in owner), None)
        if i is None and op.split(":")[0] in ("Convolution", "GroupConvolution"):
            unmatched_convs.append((op, us))
        elif i is None:
            loose[op if op.startswith("Reorder") else f"{op} (unmatched)"] += us
        else:
            charged[i].append((op, us))
    # OpenVINO renames a convolution whose BatchNormalization it folded ("Multiply_123"), and
    # models with unnamed activations leave no name to match: where as many convolution kernels
    # of ours as such nodes are left, they are paired in execution order
    free = [i for i in sorted(steps) if "conv2d" in steps[i].name and i not in charged]
    if unmatched_convs and len(free) == len(unmatched_convs):
        for i, (op, us) in zip(free, unmatched_convs):
            charged[i].append((op, us))
    else:
        for op, us in unmatched_convs:
            loose[f"{op} (unmatched)"] += us
    rows = []
    for i, step in steps.items():
        ort_us = sum(us for _, us in charged.get(i, []))
        ops = "+".join(sorted({op for op, _ in charged.get(i, [])})) or "-"
        src = step.sources[0].name if step.sources else step.name
        rows.append((ours[i] - ort_us, i, step.name, src, ops, ours[i], ort_us))
    rows.sort(reverse=True)
    mlc_sum, ort_sum = sum(ours.values()), sum(theirs.values())
    peer = "OV" if args.peer == "openvino" else "ORT"
    print(f"{args.model}, {args.threads} thread(s), min over {args.rounds}x{args.runs} runs: "
          f"mlcpack kernels {mlc_sum / 1e3:.2f} ms (run min {totals['mlcpack'] / 1e3:.2f}), "
          f"{peer} nodes {ort_sum / 1e3:.2f} ms")
    print(f"{'mlc us':>8} {peer + ' us':>8} {'diff':>8}  {peer + ' ops':<28} "
          f"kernel / first source")
    for diff, _i, name, src, ops, m, o in rows[:args.top or None]:
        print(f"{m:8.1f} {o:8.1f} {diff:+8.1f}  {ops[:28]:<28} {name[:48]}  {src[-60:]}")
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for _diff, _i, name, _src, _ops, m, o in rows:
        kind = re.sub(r"\d+", "", name.replace("fused_", ""))
        by_kind[kind][0] += m
        by_kind[kind][1] += o
    print(f"\nby kernel kind (digits dropped): mlc us, {peer} us")
    for kind, (m, o) in sorted(by_kind.items(), key=lambda kv: -(kv[1][0] - kv[1][1]))[:20]:
        print(f"{m:8.1f} {o:8.1f} {m - o:+8.1f}  {kind[:90]}")
    if loose:
        print(f"\n{peer} nodes charged to no kernel: " + ", ".join(
            f"{k} {v:.0f} us" for k, v in sorted(loose.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
