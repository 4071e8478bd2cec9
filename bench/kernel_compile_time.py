"""Where a cold export's LLVM time goes, kernel by kernel: each distinct kernel of a model
compiled alone, per code variant, with its phases' CPU seconds and its IR's size.

    .venv/bin/python bench/kernel_compile_time.py MODEL.onnx [--input-shape x=1,3,320,320]
        [--target portable] [--match TEXT] [--top 25] [--json OUT.json] [--compare A.json]

The model goes through ``mlcpack export``'s own path (``packager.api.export``, golden check off,
no compile cache) up to the first ``compile_for_targets`` call, whose arguments (prim funcs,
targets, size variables, options) are kept and the export stopped. Then, in this process, for
every target and every distinct kernel (structural twins share one kernel, as in
``codegen/build.py emit_module``): ``emit_module([func])`` (Python writing the IR: *emit*),
``_optimize`` (LLVM parsing, verifying and optimizing it at -O2: *opt*), ``emit_object``
(LLVM's code generator: *obj*; without loop strength reduction for a channel-lane
Winograd convolution, as the export's default pipeline makes it), each timed in CPU seconds
(``time.process_time``), and the emitted and optimized IR's instruction counts. A kernel
compiled alone costs about what it costs inside its group's module (the export optimizes four
groups per target and then makes one object per target).

Printed: the ``--top`` kernels by opt + obj summed over the targets, with their design
(``KernelInfo.choice``), then sums per target and per kernel family (the name's stem:
``fused_conv2d_oc``, ``concat``, ...). ``--json`` writes every row; ``--compare A.json`` prints
this run's rows beside another run's (the same model, e.g. main's checkout against this one),
kernel by kernel, where both hold the kernel's name, and how many objects are the same bytes.
``--pipeline`` compiles every kernel with another of LLVM's pipelines (``O2`` the default, as the
export's v3 and v4; ``O2-noloop`` without the loop vectorizer, ``O1-vec``, ``O1``: as
``codegen_phases.py`` names them; ``export``: each target's own, a portable bundle's x86-64-v2
the lean -O1 one): with ``--compare`` against a default run it says which kernels' objects a cheaper
pipeline leaves byte-identical (no speed risk) and what it saves. ``--classes`` prints, per
family, how many distinct kernels would be left if image sizes were run-time values (kernels
grouped by their tensors' shapes without the last two dims of 4-d ones, and by the name's stem,
i.e. the fused epilogue), and the CPU seconds of the kernels past each class's first: the
most that one compiled kernel per class could save.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path


class _Captured(BaseException):
    """Stops the export at its first compile (a BaseException: the export's handlers let it
    through)."""


def capture(model: str, shapes: dict[str, list], target: str | None = None
            ) -> tuple[list, list, tuple, object]:
    """(prim funcs, targets, size vars, options) of the model's first compile."""
    import mlcpack.packager.export as export_mod
    from mlcpack.packager import api

    seen = {}

    def fake(funcs, targets, size_vars=(), options=None):
        seen.update(funcs=list(funcs), targets=list(targets), size_vars=tuple(size_vars),
                    options=options)
        raise _Captured()

    real = export_mod.compile_for_targets
    export_mod.compile_for_targets = fake
    try:
        api.export(model, "/tmp/kernel_compile_time.mlc",
                   api.Options(input_shapes=shapes, target=target, check=False, cache=False))
    except _Captured:
        pass
    finally:
        export_mod.compile_for_targets = real
    if not seen:
        raise SystemExit("the export compiled nothing")
    return seen["funcs"], seen["targets"], seen["size_vars"], seen["options"]


_INSTR = re.compile(r"^  \S", re.M)


def instructions(text: str) -> int:
    """Instructions in LLVM IR text (llvmlite and LLVM indent them by two spaces)."""
    return len(_INSTR.findall(text))


def family(row: dict) -> str:
    """A kernel's family: its design's first words (``KernelInfo.choice`` up to a colon:
    "channel-lane Winograd F(2x2, 3x3)"), else its name without numbers (``concat``)."""
    choice = row["choice"].split(":")[0]
    return choice if choice else re.sub(r"\d+", "", row["kernel"])


PIPELINES = {"O2": (2, True, True), "O2-noloop": (2, False, True), "O2-novec": (2, False, False),
             "O1-vec": (1, True, True), "O1": (1, False, False)}


def measure(funcs, targets, size_vars, options, match: str = "", pipeline_name: str = "O2"
            ) -> list[dict]:
    from mlcpack.packager.ir.structure import structural_key
    from mlcpack.packager.codegen import build

    if pipeline_name == "export":   # each target's pipeline as the export picks it
        pipelines = dict(zip((t.name for t in targets), build.target_pipelines(targets)))
    else:
        level, loop_vec, slp = PIPELINES[pipeline_name]
        chosen = replace(build.DEFAULT_PIPELINE, name=pipeline_name, speed_level=level,
                         loop_vectorize=loop_vec, slp_vectorize=slp)
        pipelines = {t.name: chosen for t in targets}

    distinct: dict[object, list] = {}
    for f in funcs:
        distinct.setdefault(structural_key(f), []).append(f)
    rows = []
    for target in targets:
        tm = build._target_machine(target)
        for twins in distinct.values():
            f = twins[0]
            if match and match not in f.name:
                continue
            t0 = time.process_time()
            emitted = build.emit_module([f], target, size_vars, False, options)
            t1 = time.process_time()
            pipeline = pipelines[target.name]
            # a pipeline without the code generator's LSR (the lean x86-64-v2): the pass in
            # the optimizer but for the channel-lane kernels, as the export runs it
            mod = build._optimize(emitted.text, target, tm, pipeline, lsr_skip=None
                                  if pipeline.strength_reduction
                                  else build.lsr_skipped(emitted.kernels))
            t2 = time.process_time()
            if pipeline.strength_reduction and not pipeline.winograd_lsr \
                    and build.winograd_kernels(emitted.kernels):
                # a channel-lane Winograd convolution: no LSR, as the export makes it
                pipeline = replace(pipeline, strength_reduction=False)
            obj = build._emit_object(tm, mod, pipeline)
            t3 = time.process_time()
            optimized = str(mod)
            info = emitted.kernels[f.name]
            rows.append(dict(target=target.name, kernel=f.name, uses=len(twins),
                             choice=getattr(info, "choice", "") or "",
                             emit=t1 - t0, opt=t2 - t1, obj=t3 - t2,
                             ir=instructions(emitted.text), ir_opt=instructions(optimized),
                             obj_sha=hashlib.sha256(obj).hexdigest()[:16],
                             shapes=[_shape_class(t.shape) for t in (*f.inputs, *f.outputs)]))
            del mod
    return rows


def _shape_class(shape) -> list:
    """A tensor's shape without its last two dims when it has four (an image's height and
    width): what stays fixed if image sizes were run-time values."""
    shape = [str(d) for d in shape]
    return shape[:-2] if len(shape) == 4 else shape


def classes(rows: list[dict]) -> None:
    """Per family: distinct kernels, classes with image sizes left out (``--classes``), and
    CPU s (emit + opt + obj, all targets) of all of them and of those past each class's first."""
    cost: dict[str, float] = {}
    first: dict[str, dict] = {}
    for r in rows:
        cost[r["kernel"]] = cost.get(r["kernel"], 0.0) + r["emit"] + r["opt"] + r["obj"]
        first.setdefault(r["kernel"], r)
    fams: dict[str, dict[tuple, list[str]]] = {}
    for name, r in first.items():
        key = (json.dumps(r["shapes"]), re.sub(r"\d+", "", name))
        fams.setdefault(family(r), {}).setdefault(key, []).append(name)
    print("| family | distinct kernels | classes without image sizes | CPU s | CPU s past "
          "each class's first |")
    print("|---|---|---|---|---|")
    for fam, cls in sorted(fams.items(), key=lambda kv: -sum(cost[n] for v in kv[1].values()
                                                                for n in v)):
        names = [n for v in cls.values() for n in v]
        print(f"| {fam} | {len(names)} | {len(cls)} | {sum(cost[n] for n in names):.2f} | "
              f"{sum(cost[n] for v in cls.values() for n in v[1:]):.2f} |")


def report(rows: list[dict], top: int) -> None:
    targets = list(dict.fromkeys(r["target"] for r in rows))
    by_kernel: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"], {})[r["target"]] = r
    cost = {k: sum(r["opt"] + r["obj"] for r in v.values()) for k, v in by_kernel.items()}
    head = "".join(f" | {t} opt / obj s, IR in / out" for t in targets)
    print(f"| kernel (uses){head} | design |")
    print("|---" * (len(targets) + 2) + "|")
    for k in sorted(cost, key=lambda k: -cost[k])[:top]:
        v = by_kernel[k]
        first = next(iter(v.values()))
        cells = "".join(
            f" | {v[t]['opt']:.2f} / {v[t]['obj']:.2f}, {v[t]['ir']} / {v[t]['ir_opt']}"
            if t in v else " | -" for t in targets)
        print(f"| {k} ({first['uses']}){cells} | {first['choice'][:70]} |")
    print()
    print("| target | kernels | emit | opt | obj | IR in | IR out |")
    print("|---|---|---|---|---|---|---|")
    for t in targets:
        rs = [r for r in rows if r["target"] == t]
        print(f"| {t} | {len(rs)} | {sum(r['emit'] for r in rs):.2f} | "
              f"{sum(r['opt'] for r in rs):.2f} | {sum(r['obj'] for r in rs):.2f} | "
              f"{sum(r['ir'] for r in rs)} | {sum(r['ir_opt'] for r in rs)} |")
    print()
    fams: dict[str, list[dict]] = {}
    for r in rows:
        fams.setdefault(family(r), []).append(r)
    fcost = {f: sum(r["opt"] + r["obj"] for r in rs) for f, rs in fams.items()}
    print("| family | distinct kernels | emit | opt | obj (all targets) | IR in |")
    print("|---|---|---|---|---|---|")
    for f in sorted(fcost, key=lambda f: -fcost[f]):
        rs = fams[f]
        print(f"| {f} | {len({r['kernel'] for r in rs})} | {sum(r['emit'] for r in rs):.2f} | "
              f"{sum(r['opt'] for r in rs):.2f} | {sum(r['obj'] for r in rs):.2f} | "
              f"{sum(r['ir'] for r in rs)} |")


def compare(rows: list[dict], old: list[dict], top: int) -> None:
    """This run (B) beside ``old`` (A), per kernel and target."""
    a = {(r["target"], r["kernel"]): r for r in old}
    both = [(a[r["target"], r["kernel"]], r) for r in rows if (r["target"], r["kernel"]) in a]
    print("| target | kernel | A opt + obj | B opt + obj | B/A | IR A -> B |")
    print("|---|---|---|---|---|---|")
    both.sort(key=lambda p: -(p[0]["opt"] + p[0]["obj"]))
    for ra, rb in both[:top]:
        ca, cb = ra["opt"] + ra["obj"], rb["opt"] + rb["obj"]
        print(f"| {rb['target']} | {rb['kernel']} | {ca:.2f} | {cb:.2f} | "
              f"{cb / ca if ca else float('nan'):.2f} | {ra['ir']} -> {rb['ir']} |")
    for t in dict.fromkeys(r["target"] for _, r in both):
        sa = [p for p in both if p[1]["target"] == t]
        same = sum(1 for ra, rb in sa if ra.get("obj_sha") and ra.get("obj_sha") == rb.get("obj_sha"))
        print(f"{t}: {same} of {len(sa)} objects the same bytes")
        print(f"{t}: A emit / opt / obj "
              f"{sum(p[0]['emit'] for p in sa):.2f} / {sum(p[0]['opt'] for p in sa):.2f} / "
              f"{sum(p[0]['obj'] for p in sa):.2f}, B "
              f"{sum(p[1]['emit'] for p in sa):.2f} / {sum(p[1]['opt'] for p in sa):.2f} / "
              f"{sum(p[1]['obj'] for p in sa):.2f}; IR {sum(p[0]['ir'] for p in sa)} -> "
              f"{sum(p[1]['ir'] for p in sa)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS")
    ap.add_argument("--target", default=None, help="as export's --target (default: portable)")
    ap.add_argument("--match", default="", help="only kernels whose name holds this")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--compare", type=Path, default=None, metavar="A.json")
    ap.add_argument("--pipeline", default="O2", choices=sorted(PIPELINES) + ["export"],
                    help="export: each target's pipeline as the export picks it (a portable "
                    "bundle's x86-64-v2 the lean one)")
    ap.add_argument("--classes", action="store_true",
                    help="per family: kernels left if image sizes were run-time values")
    args = ap.parse_args()
    shapes = {}
    for s in args.input_shape:
        name, _, dims = s.partition("=")
        shapes[name] = [int(d) if d.lstrip("-").isdigit() else d for d in dims.split(",")]
    funcs, targets, size_vars, options = capture(args.model, shapes, args.target)
    print(f"{len(funcs)} prim funcs, targets {', '.join(t.name for t in targets)}, "
          f"size vars {size_vars}", file=sys.stderr)
    rows = measure(funcs, targets, size_vars, options, args.match, args.pipeline)
    report(rows, args.top)
    if args.classes:
        print()
        classes(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.compare:
        print()
        compare(rows, json.loads(args.compare.read_text()), args.top)


if __name__ == "__main__":
    main()
