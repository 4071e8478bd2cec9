"""What ``mlcpack inspect`` shows: a bundle's header summarized, read without mapping its code."""

from __future__ import annotations

import os
from typing import Any

from . import cpu
from .bundle import BundleReader, nbytes_of
from .errors import BundleError, MlcpackError
from .header import STORE, Header, plain
from .profile import read_sources, sources_text
from .signing import fingerprint
from .symbolic import dim_text
from .vm import store_lead


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """A plain dict (JSON-ready) describing the bundle at ``path``; a header too malformed to
    summarize raises ``BundleError``."""
    with BundleReader(path) as reader:
        try:
            schema = Header.from_msgpack(reader.header, reader.data_size, reader.name)
        except BundleError as exc:
            raise BundleError(f"{reader.name}: header is malformed ({exc}); "
                              "export it again") from None
        return _summarize(path, schema, reader.name)


def _summarize(path: str | os.PathLike, h: Header, name: str) -> dict[str, Any]:
    plan = h.plan
    try:
        chosen: int | None = cpu.pick_variant([v.record() for v in plan.code], name)
        refusal = None
    except MlcpackError as exc:
        chosen, refusal = None, str(exc)
    code = []
    for i, v in enumerate(plan.code):
        try:
            flags = sorted(cpu.level(v.level).flags | set(v.features or ()))
        except KeyError:
            flags = list(v.features or ())
        code.append({"arch": v.arch, "level": v.level, "triple": v.triple, "cpu": v.cpu,
                     "features": flags, "object_bytes": v.object.size,
                     "code_sizes": dict(v.code_sizes or {}), "selected": i == chosen})
    sig = h.signature   # None when absent or malformed (a malformed one stays in h.extra)
    raw = h.extra.get("signature")
    signed_by = (fingerprint(sig.key) if sig is not None else
                 fingerprint(raw["key"]) if isinstance(raw, dict)
                 and isinstance(raw.get("key"), bytes) else None)
    return {
        "file": os.fspath(path),
        "bytes": os.path.getsize(path),
        "format": ".".join(map(str, h.format)),
        "compiler": plain(h.compiler),
        "model": plain(h.model),
        "inputs": _io(h, "inputs"),
        "outputs": _io(h, "outputs"),
        "preprocess": h.preprocess,
        "labels": [str(v) for v in h.labels or ()],
        "code": code,
        "runs_here": refusal is None,
        "refusal": refusal,
        "kernels": [k.to_msgpack() for k in plan.kernels],
        "library_functions": sorted({c.func for c in plan.library_calls or ()}),
        "weights": {"count": len(h.constants),
                    "bytes": sum(nbytes_of(c.shape, c.dtype) for c in h.constants)},
        "memory_plan": plan.memory_plan.to_msgpack(),
        "symbolic": None if plan.symbolic is None else plan.symbolic.to_msgpack(),
        "vm_instructions": plan.vm.instructions,
        # format 1.9: the size variables that count a row store's rows (grown at run time;
        # 1.10: a carried value's, after the 1s before its count)
        "row_counts": sorted({d for t in plan.tensors if t.kind == STORE
                              for d in t.shape[:1 + store_lead(t.shape)] if isinstance(d, str)}),
        "signed_by": signed_by,
        "plans": _plans(h, chosen),
        "specialized": _specialized(h, chosen),
        "golden": _golden(h),
    }


def _io(h: Header, kind: str) -> list[dict[str, Any]]:
    """The header's input or output rows; in a dynamic-batch bundle the batched ones also get
    ``dims``, the batch shown as "N" (as ``TensorSpec.dims``: any batch runs), beside ``shape``
    (the largest plan's)."""
    rows = [r.to_msgpack() for r in getattr(h.plan, kind)]
    if h.batch is None:
        return rows
    names = getattr(h.batch, kind)
    return [{**r, "dims": ["N", *r["shape"][1:]]} if r["name"] in names and r["shape"] else r
            for r in rows]


def _plan_row(p, chosen: int | None) -> dict[str, Any]:
    which = p.code[chosen] if chosen is not None and chosen < len(p.code) else p.code[0]
    return {"batch": p.batch, "arena_bytes": p.memory_plan.arena_bytes,
            "kernels": len(p.kernels), "vm_instructions": p.vm.instructions,
            "object_bytes": which.object.size}


def _plans(h: Header, chosen: int | None) -> list[dict[str, Any]] | None:
    """Dynamic-batch bundles: one row per plan (batch size)."""
    if h.batch is None:
        return None
    return [_plan_row(p, chosen) for p in h.plans]


def _specialized(h: Header, chosen: int | None) -> list[dict[str, Any]] | None:
    """Symbolic bundles with --batch-sizes: one row per static plan beside the symbolic one."""
    if not h.specialized:
        return None
    return [{**_plan_row(p, chosen), "inputs": {r.name: list(r.shape) for r in p.inputs}}
            for p in h.specialized]


def _golden(h: Header) -> dict[str, Any] | None:
    g = h.golden
    if g is None:
        return None
    return {"inputs": [{"name": r.name, "shape": list(r.shape), "dtype": r.dtype}
                       for r in g.inputs],
            "reference": plain(g.reference), "seed": plain(g.seed), "rtol": g.rtol,
            "atol": g.atol, "bytes": sum(r.data.size for r in g.inputs + g.outputs)}


def ir_text(path: str | os.PathLike) -> str:
    """The IRModule text the compiler stored in the bundle."""
    with BundleReader(path) as reader:
        ref = Header.from_msgpack(reader.header, reader.data_size, reader.name).ir
        if ref is None:
            raise BundleError(f"{reader.name} holds no IR text")
        return bytes(reader.payload(ref)).decode("utf-8", errors="replace")


def _kib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:.1f} KiB"


def _symbolic_plan_lines(sym: dict[str, Any], rows: Any = (), shown: int = 6) -> list[str]:
    """A symbolic bundle's memory plan: with a ``--max-shape`` bound, the one arena planned at
    export; otherwise how it is planned per shape and its buffers' sizes as formulas over the
    size variables (the distinct ones, largest first at every size 64, with their counts)."""
    from .symbolic import PLAN_CACHE, dim_text, example_shape

    names = ", ".join(map(str, sym.get("vars", [])))
    buffers = sym.get("buffers", [])
    bound = sym.get("bound")
    counted = [f"{d[0]} <= {dim_text(d[1])}" for d in sym.get("dynamic") or ()
               if d[0] not in rows]
    stored = [f"{d[0]} <= {dim_text(d[1])}" for d in sym.get("dynamic") or () if d[0] in rows]
    counted_line = [f"sizes counted at run time by kernels (each allocated at its bound): "
                    f"{', '.join(counted)}"] if counted else []
    if stored:   # format 1.9
        counted_line.append(f"rows a Loop appends at run time (memory grown as they come): "
                            f"{', '.join(stored)}")
    if isinstance(bound, dict):
        sizes = ", ".join(f"{v} <= {n}" for v, n in bound.get("sizes", {}).items())
        why = "(--max-shape)" if len(counted) + len(stored) < len(bound.get("sizes", {})) else \
            "(the inputs' sizes are fixed)"
        return [f"memory plan: one arena of {bound.get('arena_bytes')} B "
                f"({_kib(bound.get('arena_bytes'))}), planned at export for the bound {sizes} "
                f"{why}; {len(buffers)} buffers, every shape within the bound runs in it",
                *counted_line]
    counts: dict[str, int] = {}
    value: dict[str, int] = {}
    for b in buffers:
        text = dim_text(b[0])
        counts[text] = counts.get(text, 0) + 1
        value[text] = example_shape([b[0]], 64)[0]
    order = sorted(counts, key=lambda t: -value[t])
    return [f"memory plan: made at run time for each input shape (size variables {names}; "
             f"{len(buffers)} buffers, first fit; the last {PLAN_CACHE} shapes' plans cached; "
             "export with --max-shape on every size to plan once)",
             f"  buffer sizes in bytes, {len(order)} distinct, largest first: "
             + ", ".join(f"{t}" + (f" (x{counts[t]})" if counts[t] > 1 else "")
                         for t in order[:shown])
             + (f", ... {len(order) - shown} more" if len(order) > shown else ""),
             *counted_line]


def describe_text(info: dict[str, Any]) -> str:
    try:
        return _text(info)
    except (TypeError, KeyError, AttributeError, ValueError, IndexError) as exc:
        raise BundleError(f"{info.get('file')}: header is malformed ({type(exc).__name__}: "
                          f"{exc}); export it again") from None


def _text(info: dict[str, Any]) -> str:
    lines = [f"{info['file']}  ({_kib(info['bytes'])}, bundle format {info['format']}, made by "
             f"mlcpack {info['compiler'].get('version')} with llvmlite "
             f"{info['compiler'].get('llvmlite')})"]
    model = info.get("model") or {}
    if model.get("source"):
        lines.append(f"model: {model.get('name')} from {model['source']}")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            dims = "[" + ", ".join(map(dim_text, t.get("dims", t["shape"]))) + "]"
            lines.append(f"{kind[:-1]:>6}: {t['name']} {dims} {t['dtype']}")
    if info.get("preprocess"):
        p = info["preprocess"]
        lines.append(f"preprocess: {p.get('size')} {p.get('color')} x{p.get('scale'):.6g} "
                     f"mean {p.get('mean')} std {p.get('std')} layout {p.get('layout')}")
    if info["labels"]:
        labels = info["labels"]
        shown = ", ".join(labels[:10]) + (", ..." if len(labels) > 10 else "")
        lines.append(f"labels: {len(labels)} ({shown})")
    for v in info["code"]:
        mark = " (selected on this machine)" if v["selected"] else ""
        lines.append(f"target: {v['triple']} level {v['level']} (LLVM cpu {v['cpu']}){mark}")
        lines.append(f"  features: {' '.join(v['features'])}")
        lines.append(f"  object code: {v['object_bytes']} bytes")
    if not info["runs_here"]:
        lines.append(f"this machine cannot run it: {info['refusal']}")
    shown = [v for v in info["code"] if v["selected"]] or info["code"][:1]
    which = f" (code sizes for {shown[0]['level']})" if len(info["code"]) > 1 and shown else ""
    lines.append(f"kernels: {len(info['kernels'])}{which}")
    sizes = shown[0]["code_sizes"] if shown else {}
    for i, k in enumerate(info["kernels"]):
        extra = f", workspace {k['workspace_bytes']} B" if k.get("workspace_bytes") else ""
        sources = sources_text(read_sources(k.get("source"), f"kernel {i}"), shown=3)
        lines.append(f"  {k['name']:<40} {sizes.get(k['symbol'], '?'):>7} B code"
                     f"{', parallel' if k.get('parallel') else ''}{extra}"
                     + (f"  <- {sources}" if sources else ""))
        if isinstance(k.get("kernel"), str):
            lines.append(f"      kernel: {k['kernel']}")
    if info["library_functions"]:
        lines.append(f"library functions: {', '.join(info['library_functions'])}")
    w = info["weights"]
    lines.append(f"weights: {w['count']} tensors, {_kib(w['bytes'])}")
    plan = info.get("memory_plan") or {}
    arena, total = plan.get("arena_bytes"), plan.get("intermediate_bytes")
    saved = f" ({100 * (1 - arena / total):.0f}% saved by reuse)" if arena and total else ""
    sym = info.get("symbolic")
    if isinstance(sym, dict):   # format 1.3 (runtime/symbolic.py)
        lines += _symbolic_plan_lines(sym, info.get("row_counts") or ())
    else:
        lines.append(f"memory plan: arena {_kib(arena)} vs {_kib(total)} for all tensors"
                     f"{saved}")
    lines.append(f"vm: {info['vm_instructions']} instructions")
    if info.get("plans"):
        sizes = ", ".join(str(p["batch"]) for p in info["plans"])
        lines.append(f"batch plans: {sizes} (any batch runs: padded up to the next plan, or in "
                     f"chunks of {info['plans'][-1]['batch']}; the figures above are the largest "
                     "plan's)")
        for p in info["plans"]:
            lines.append(f"  batch {p['batch']:>5}: arena {_kib(p['arena_bytes'])}, "
                         f"{p['kernels']} kernels, {p['vm_instructions']} instructions, code "
                         f"{_kib(p['object_bytes'])}")
    if info.get("specialized"):
        rows = info["specialized"]
        lines.append(f"specialized plans: batch {', '.join(str(p['batch']) for p in rows)} "
                     "(static, run when the inputs' shapes match one exactly; the symbolic plan "
                     "runs every other shape)")
        for p in rows:
            shapes = ", ".join(f"{k} {v}" for k, v in p["inputs"].items())
            lines.append(f"  batch {p['batch']:>5}: {shapes}; arena {_kib(p['arena_bytes'])}, "
                         f"{p['kernels']} kernels, {p['vm_instructions']} instructions, code "
                         f"{_kib(p['object_bytes'])}")
    g = info.get("golden")
    if g:
        ins = ", ".join(f"{r['name']} {r['shape']}" for r in g["inputs"])
        seed = f" seed {g['seed']}" if g.get("seed") is not None else ""
        lines.append(f"golden check: {ins} vs {g['reference']}{seed}, rtol {g['rtol']:g} atol "
                     f"{g['atol']:g} ({_kib(g['bytes'])}; `mlcpack verify` re-runs it)")
    else:
        lines.append("golden check: none embedded")
    if info.get("signed_by"):
        lines.append(f"signature: ed25519 key {info['signed_by']} (checked when loaded with "
                     "trusted keys, e.g. infer --trusted-key)")
    return "\n".join(lines)
