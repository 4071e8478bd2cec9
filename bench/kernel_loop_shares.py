"""Where a kernel's time goes, loop by loop: `perf record` samples of a bundle run in a loop
(1 thread), binned by the kernel's loops in its loaded machine code.

Run: .venv/bin/python bench/kernel_loop_shares.py BUNDLE.mlc [--seconds 8] [--kernel SUBSTRING]
                                                  [--top 3]
Needs `perf` (cycles events allowed) and binutils' `objdump`; x86-64. Feeds are random normal
values of the bundle's input shapes (open dimensions 1). Prints each kernel's share of the
samples in the bundle's code, then, for the ``--top`` kernels (or those whose name contains
``--kernel``), every loop (a backward jump's range, nested ranges included) with its share of
the kernel's samples and what its body holds: instructions, FMAs, broadcasts, vector moves,
prefetches, masked moves. The code is read from the process's own mapped image (what ran), so
no export or object file is needed.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"


def child(bundle: str, seconds: float, out_dir: str) -> None:
    """Load and run ``bundle`` for ``seconds``; write its code images and symbols first."""
    import gc

    import numpy as np

    from mlcpack.runtime import load
    from mlcpack.runtime.elf import CodeImage

    model = load(bundle, threads=1)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
             .astype(np.float32) for i in model.inputs}
    model.run(feeds)
    with open(os.path.join(out_dir, "symbols.txt"), "w") as f:
        for n, img in enumerate(o for o in gc.get_objects() if isinstance(o, CodeImage)):
            with open(os.path.join(out_dir, f"code{n}.bin"), "wb") as c:
                c.write(ctypes.string_at(img.base, img.code_size))
            f.write(f"@image {n} {img.base} {img.code_size}\n")
            for name, addr in img.symbols.items():
                f.write(f"{name} {addr}\n")
    t0, runs = time.time(), 0
    while time.time() - t0 < seconds:
        model.run(feeds)
        runs += 1
    with open(os.path.join(out_dir, "runs.txt"), "w") as f:
        f.write(str(runs))


def disassemble(code: bytes, vma: int, tmp: str) -> list[tuple[int, str]]:
    path = os.path.join(tmp, "fn.bin")
    with open(path, "wb") as f:
        f.write(code)
    text = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64",
                           "--no-show-raw-insn", f"--adjust-vma={vma:#x}", path],
                          capture_output=True, text=True, check=True).stdout
    insns = []
    for line in text.splitlines():
        m = re.match(r"\s+([0-9a-f]+):\s+(\S.*)", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2)))
    return insns


def describe(body: list[str]) -> str:
    ops = [t.split()[0] for t in body]
    k = collections.Counter(ops)
    fma = sum(v for o, v in k.items() if o.startswith("vfmadd") or o.startswith("vfnmadd"))
    moves = sum(v for o, v in k.items() if o in ("vmovups", "vmovaps"))
    pf = sum(v for o, v in k.items() if o.startswith("prefetch"))
    mask = sum(v for o, v in k.items() if o.startswith("vmaskmov"))
    stack = sum(1 for t in body if "(%rsp)" in t)
    return (f"{len(body):4d} instr, {fma:3d} fma, {k['vbroadcastss']:3d} bcast, {moves:3d} vmov, "
            f"{pf:2d} prefetch, {mask:2d} masked, {stack:2d} stack")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--kernel", default=None, help="kernels whose name contains this")
    ap.add_argument("--top", type=int, default=3, help="kernels to break down (by samples)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.bundle, args.seconds, args.child[1])
        return
    if not os.path.isfile(args.bundle):
        sys.exit(f"error: no such bundle: {args.bundle}")
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            sys.exit(f"error: `{tool}` is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        rec = subprocess.run(["perf", "record", "-q", "-e", "cycles", "-F", "4000", "-o", data,
                              sys.executable, os.path.abspath(__file__), args.bundle,
                              "--seconds", str(args.seconds), "--child", "1", tmp],
                             capture_output=True, text=True)
        if rec.returncode != 0 or not os.path.exists(os.path.join(tmp, "runs.txt")):
            sys.exit(f"error: perf record failed: {rec.stderr.strip().splitlines()[-1:]}")
        ips = [int(x, 16) for x in subprocess.run(
            ["perf", "script", "-i", data, "-F", "ip"], capture_output=True, text=True
        ).stdout.split()]
        runs = int(open(os.path.join(tmp, "runs.txt")).read())
        images, syms = [], []
        for line in open(os.path.join(tmp, "symbols.txt")):
            p = line.split()
            if p[0] == "@image":
                images.append((int(p[2]), int(p[3]), int(p[1])))
            else:
                syms.append((int(p[1]), p[0]))
        syms.sort()
        starts = [a for a, _ in syms]

        def where(ip: int) -> tuple[str, int, int, int] | None:
            for base, size, n in images:
                if base <= ip < base + size:
                    i = bisect.bisect_right(starts, ip) - 1
                    if i < 0 or starts[i] < base:
                        return None
                    end = starts[i + 1] if i + 1 < len(starts) and starts[i + 1] < base + size \
                        else base + size
                    return syms[i][1], starts[i], end, n
            return None

        per_fn: dict[str, list[int]] = collections.defaultdict(list)
        spans = {}
        for ip in ips:
            w = where(ip)
            if w:
                per_fn[w[0]].append(ip)
                spans[w[0]] = w[1:]
        in_code = sum(len(v) for v in per_fn.values())
        print(f"{args.bundle}: {runs} runs, {len(ips)} samples, {in_code} in the bundle's code")
        ranked = sorted(per_fn, key=lambda f: -len(per_fn[f]))
        for fn in ranked:
            print(f"  {100 * len(per_fn[fn]) / max(1, in_code):5.1f} %  {fn}")
        chosen = [f for f in ranked if args.kernel in f] if args.kernel else ranked[:args.top]
        for fn in chosen:
            start, end, n = spans[fn]
            base = next(b for b, _, i in images if i == n)
            code = open(os.path.join(tmp, f"code{n}.bin"), "rb").read()[start - base:end - base]
            insns = disassemble(code, start, tmp)
            loops = []
            for a, t in insns:
                m = re.match(r"j\w+\s+(?:0x)?([0-9a-f]+)", t)
                if m and start <= int(m.group(1), 16) < a:
                    loops.append((int(m.group(1), 16), a))
            samples = per_fn[fn]
            print(f"\n{fn}: {len(samples)} samples, {len(samples) / runs:.2f} per run")
            for lo, hi in sorted(set(loops), key=lambda r: (r[0], -r[1])):
                share = sum(lo <= ip <= hi for ip in samples) / len(samples)
                if share < 0.005:
                    continue
                body = [t for a, t in insns if lo <= a <= hi]
                print(f"  loop {lo - start:#6x}-{hi - start:#6x}  {100 * share:5.1f} %  "
                      f"{describe(body)}")
            inside = sum(any(lo <= ip <= hi for lo, hi in loops) for ip in samples)
            print(f"  outside every loop: {100 * (1 - inside / len(samples)):5.1f} %")


if __name__ == "__main__":
    main()
