"""The C runtime (runtime/c) beside the Python runtime: footprint and speed (docs/c-runtime.md).

    .venv/bin/python bench/c_runtime.py [--rounds 5] [--sections mlp,cold]

Prints: the stripped libmlcrt.so and what each part costs (text + data of each object), the
per-run overhead of a bundle with no kernels, the demo MLP at batch 1 end to end (C mlc_run,
Python Model.run, ONNX Runtime's C API (bench/ort_c_run.c) and its Python API, 1 thread; then
C, Python and ONNX Runtime's C API at 2 threads, with the load average) and
where the C run's time goes (each kernel alone, and the floor a kernel has: a plain read of the
weights' bytes, bench/c_kernel_floor.c), a 64-channel 3x3 conv layer at 1 and 2 threads (kernel
time: the same code), and cold start (process start to first result, the demo CNN) with the
process's peak RSS. Timings alternate between the engines for ``--rounds`` rounds;
each round's median (p50) and min are kept and the table shows the median of the rounds' p50s
and the smallest min. The C side is timed inside C (mlcrun bench: clock_gettime around each
mlc_run), the Python side with perf_counter_ns around each Model.run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CDIR = ROOT / "runtime" / "c"
MLCRUN = CDIR / "build" / "mlcrun"
sys.path.insert(0, str(ROOT / "tests"))


def host_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    flags = set(re.search(r"^flags\s*:(.*)$", text, re.M).group(1).split())
    model = re.search(r"^model name\s*:(.*)$", text, re.M).group(1).strip()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    return (f"{model}; {os.cpu_count()} vCPU; avx2 {'avx2' in flags}, fma {'fma' in flags}, "
            f"avx512: {', '.join(avx512) or 'none'}")


def footprint(tmp: Path) -> None:
    subprocess.run(["make", "-C", str(CDIR), "-j2", "all"], check=True, capture_output=True)
    so = tmp / "libmlcrt.so"
    subprocess.run(["strip", "-o", str(so), str(CDIR / "build" / "libmlcrt.so")], check=True)
    print(f"libmlcrt.so stripped: {so.stat().st_size / 1024:.1f} KiB "
          f"({so.stat().st_size / 1000:.1f} KB) "
          f"(unstripped {(CDIR / 'build' / 'libmlcrt.so').stat().st_size / 1024:.1f} KiB); "
          f"mlcrun (static libmlcrt, dynamic libc) "
          f"{(CDIR / 'build' / 'mlcrun').stat().st_size / 1024:.1f} KiB unstripped")
    # what each object costs in the linked library (after --gc-sections): its code, read-only
    # data and data sections as the linker map places them
    text = (CDIR / "build" / "libmlcrt.map").read_text()
    cost: dict[str, int] = {}
    pending = None
    for line in text[text.index("Linker script and memory map"):].splitlines():
        if m := re.match(r"^ (\.\S+)\s*$", line):
            pending = m.group(1)
            continue
        m = re.match(r"^ (\.\S+)?\s+0x[0-9a-f]+\s+0x([0-9a-f]+)\s+(\S+\.o)\s*$", line)
        name, pending = (m.group(1) or pending) if m else None, None
        if m and name.startswith((".text", ".rodata", ".data")):
            part = Path(m.group(3)).stem
            cost[part] = cost.get(part, 0) + int(m.group(2), 16)
    total = sum(cost.values())
    print(f"parts in the linked library (code + read-only data + data, after --gc-sections; "
          f"{total / 1024:.1f} KiB of the stripped file, the rest ELF tables and alignment):")
    print("  " + ", ".join(f"{k} {v / 1024:.1f}" for k, v in
                           sorted(cost.items(), key=lambda kv: -kv[1]) if v >= 512))


def p50_min(text: str) -> tuple[float, float]:
    return (float(re.search(r"p50 ([\d.]+) us", text).group(1)),
            float(re.search(r"min ([\d.]+) us", text).group(1)))


def c_bench(bundle: Path, runs: int, threads: int = 1, exe: Path = MLCRUN
            ) -> tuple[float, float]:
    proc = subprocess.run([str(exe), "bench", str(bundle), "--runs", str(runs), "--threads",
                           str(threads)], capture_output=True, text=True, check=True)
    return p50_min(proc.stdout)


def build_helpers(tmp: Path) -> tuple[Path, Path]:
    """bench/c_kernel_floor.c (against libmlcrt's internal headers) and bench/ort_c_run.c."""
    floor, ortc = tmp / "c_kernel_floor", tmp / "ort_c_run"
    subprocess.run(["cc", "-O3", "-mavx2", f"-I{CDIR / 'include'}", f"-I{CDIR / 'src'}",
                    str(ROOT / "bench" / "c_kernel_floor.c"), str(CDIR / "build" / "libmlcrt.a"),
                    "-lpthread", "-lm", "-o", str(floor)], check=True)
    subprocess.run(["cc", "-O2", "-std=gnu11", str(ROOT / "bench" / "ort_c_run.c"), "-ldl",
                    "-o", str(ortc)], check=True)
    return floor, ortc


def ort_library() -> Path:
    import onnxruntime
    libs = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    return libs[0]


def ort_c_bench(exe: Path, model: Path, names: tuple[str, str], dims: tuple[str, str],
                runs: int, threads: int = 1) -> tuple[float, float]:
    proc = subprocess.run([str(exe), str(ort_library()), str(model), *names, *dims, str(runs),
                           str(threads)], capture_output=True, text=True, check=True)
    return p50_min(proc.stdout)


def where_time_goes(floor: Path, bundle: Path, c_min: float, py_min: float) -> None:
    """Each kernel alone and the read floor of the large constants (bench/c_kernel_floor.c),
    and what they bound: the Python / C ratio if the kernels ran at that floor."""
    proc = subprocess.run([str(floor), str(bundle), "20000"], capture_output=True, text=True,
                          check=True)
    kernels, splits, reads = {}, {}, {}
    for line in proc.stdout.splitlines():
        what, name, _, low, _, mid, *rest = line.split()
        {"kernel": kernels, "split": splits, "read": reads}[what][name] = (float(low),
                                                                           float(mid), rest)
    print("  where the C run's time goes (each call alone, clock_gettime; min / p50 us):")
    for name, (low, mid, _) in kernels.items():
        print(f"    kernel {name:34s} {low:7.3f} / {mid:7.3f}")
        if name in splits:
            print(f"      split over 2 threads (as mlc_run posts it; blocks alternating with "
                  f"the line above) {splits[name][0]:7.3f} / {splits[name][1]:7.3f}")
    for name, (low, mid, rest) in reads.items():
        print(f"    plain AVX2 read of {name} ({int(rest[1]) / 1024:.1f} KiB where the bundle "
              f"maps it) {low:7.3f} / {mid:7.3f}  ({rest[-1]} GB/s)")
    ksum = sum(v[0] for v in kernels.values())
    floor_us = sum(v[0] for v in reads.values())
    c_own, py_own = c_min - ksum, py_min - ksum
    print(f"    kernels' mins sum {ksum:.3f} us; C's own time per run {c_own:.3f} us, the Python "
          f"runtime's {py_own:.3f} us (each run's min minus the kernels')")
    if floor_us:
        print(f"    ratio ceiling by mins, Python / C, were the kernels as fast as reading their "
              f"weights once and C's own time zero: ({py_own:.2f} + {floor_us:.2f}) / "
              f"{floor_us:.2f} = {(py_own + floor_us) / floor_us:.2f}")


def py_bench(run, runs: int) -> tuple[float, float]:
    for _ in range(min(runs, 200)):
        run()
    times = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        t0 = clock()
        run()
        times.append(clock() - t0)
    return statistics.median(times) / 1e3, min(times) / 1e3


def compare(title: str, engines: dict, rounds: int) -> dict[str, tuple[float, float]]:
    """engines: name -> () -> (p50 us, min us); alternated for ``rounds`` rounds. Returns each
    engine's (median p50, smallest min)."""
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, fn in engines.items():
            got[name].append(fn())
    print(title)
    first = None
    result = {}
    for name, rows in got.items():
        p50 = statistics.median(r[0] for r in rows)
        low = min(r[1] for r in rows)
        first = first or (p50, low)
        result[name] = (p50, low)
        print(f"  {name:34s} p50 {p50:9.2f} us   min {low:9.2f} us   / first: p50 "
              f"{p50 / first[0]:5.2f}  min {low / first[1]:5.2f}")
    return result


def cold_start(cmd: list[str], runs: int) -> tuple[float, float, float, float, float]:
    """Wall ms of ``cmd`` (spawn to exit, output discarded): median and min, and its CPU time
    (user + system, from wait4's rusage): median and min; and its peak RSS in MiB (GNU time's
    %M, which forks from its own small process: a child spawned straight from this Python
    process would count this process's pages in its maximum). On a shared host the wall time
    includes waiting for a core; the CPU time is the process's own work."""
    walls, cpus, rss = [], [], []
    timer = shutil.which("time") or "/usr/bin/time"
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        _pid, status, usage = os.wait4(proc.pid, 0)
        walls.append((time.perf_counter() - t0) * 1e3)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0, cmd
        cpus.append((usage.ru_utime + usage.ru_stime) * 1e3)
    if os.path.exists(timer):
        proc = subprocess.run([timer, "-f", "%M", *cmd], check=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        rss.append(int(proc.stderr.strip().splitlines()[-1]) / 1024)
    return (statistics.median(walls), min(walls), statistics.median(cpus), min(cpus),
            statistics.median(rss) if rss else float("nan"))


SECTIONS = ("size", "overhead", "mlp", "widths", "conv", "cold")


def mlp_model(hidden: int, seed: int = 0):
    """An MLP 784-hidden-10 as torch exports the demo one (Gemm transB, Relu, Gemm)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal((hidden, 784)) / 28).astype(np.float32)
    w1 = (rng.standard_normal((10, hidden)) / np.sqrt(hidden)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w0, "w0"), (np.zeros(hidden, np.float32), "b0"), (w1, "w1"),
              (np.zeros(10, np.float32), "b1"))]
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w1", "b1"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, f"mlp{hidden}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 784])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mlp_two_threads(bundle: Path, ortc: Path, names: tuple[str, str], x: np.ndarray,
                    rounds: int) -> None:
    """The demo MLP at 2 threads in every engine: its first layer (392 KiB of weights) splits
    by output columns (codegen/threads.py PARALLEL_MIN_WEIGHT_BYTES), each core reading half
    of the weights. The machine's load beside it: on a shared host the worker thread waits for
    a core, and then the calling thread runs both halves."""
    from mlcpack.runtime import load

    with load(bundle, threads=2) as mlp:
        assert mlp.has_parallel_kernels
        print(f"  load average before: {os.getloadavg()[0]:.2f}")
        got = compare(
            "demo MLP 784-128-10, batch 1, end to end, 2 threads",
            {"C mlc_run": lambda: c_bench(bundle, 20000, 2),
             "Python Model.run": lambda: py_bench(lambda: mlp.run({"x": x}), 5000),
             "ONNX Runtime (C API)": lambda: ort_c_bench(
                 ortc, ROOT / "artifacts" / "mlp.onnx", names, ("1,784", "1,10"), 20000, 2)},
            rounds)
        print(f"  load average after: {os.getloadavg()[0]:.2f}")
    c, py, orc = got["C mlc_run"], got["Python Model.run"], got["ONNX Runtime (C API)"]
    print(f"  Python runtime / C runtime (both at 2 threads): p50 {py[0] / c[0]:.2f}x, "
          f"min {py[1] / c[1]:.2f}x; ONNX Runtime C API / C runtime: p50 {orc[0] / c[0]:.2f}x, "
          f"min {orc[1] / c[1]:.2f}x")


def widths(tmp: Path, rounds: int) -> None:
    """The Python / C ratio as the first layer's weights grow (784-h-10 MLPs, batch 1): the
    runtimes' own times are fixed, the kernels' time grows with the weights' bytes."""
    import onnx
    from mlcpack.runtime import load
    exe = ROOT / ".venv" / "bin" / "mlcpack"
    x = np.random.default_rng(2).random((1, 784), dtype=np.float32)
    print("MLP 784-h-10 at batch 1, 1 thread, by hidden width h (C mlc_run vs Python Model.run, "
          "alternated)")
    for hidden in (32, 64, 96, 128, 256):
        onnx.save(mlp_model(hidden), tmp / f"mlp{hidden}.onnx")
        bundle = tmp / f"mlp{hidden}.mlc"
        subprocess.run([str(exe), "export", str(tmp / f"mlp{hidden}.onnx"), "-o", str(bundle),
                        "--target", "host"], check=True, capture_output=True)
        model = load(bundle)
        c, py = [], []
        for _ in range(rounds):
            c.append(c_bench(bundle, 20000))
            py.append(py_bench(lambda m=model: m.run({"x": x}), 5000))
        cp, cm = statistics.median(r[0] for r in c), min(r[1] for r in c)
        pp, pm = statistics.median(r[0] for r in py), min(r[1] for r in py)
        print(f"  h {hidden:4d} ({hidden * 784 * 4 / 1024:6.1f} KiB of first-layer weights): "
              f"C p50 {cp:6.2f} min {cm:6.2f} us, Python p50 {pp:6.2f} min {pm:6.2f} us, "
              f"Python / C: p50 {pp / cp:4.2f}x min {pm / cm:4.2f}x")
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-mlcrun", type=Path, default=None,
                    help="another build's mlcrun (e.g. main's) timed beside this one: MLP and "
                         "cold start rows")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        ap.error(f"--sections: choose from {', '.join(SECTIONS)}")
    import onnx
    import onnxruntime as ort
    from conv_models import conv_model
    from mlcpack.runtime import load

    print(host_flags())
    tmp = Path(tempfile.mkdtemp(prefix="cbench"))
    try:
        if "size" in sections:
            footprint(tmp)
        else:
            subprocess.run(["make", "-C", str(CDIR), "-j2", "all"], check=True,
                           capture_output=True)
        floor, ortc = build_helpers(tmp)
        exe = ROOT / ".venv" / "bin" / "mlcpack"
        from onnx import TensorProto, helper, numpy_helper
        g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "id",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.array([4], np.int64), "s")])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                  tmp / "none.onnx")
        onnx.save(conv_model(1, 64, 56, 56, 64, 3, 1), tmp / "conv.onnx")
        jobs = {"none": [tmp / "none.onnx", "--target", "host"],
                "mlp": [ROOT / "artifacts" / "mlp.onnx", "--target", "host"],
                "cnn": [ROOT / "artifacts" / "cnn.onnx"],
                "conv": [tmp / "conv.onnx", "--target", "host"]}
        needed = {"none": "overhead", "mlp": "mlp", "cnn": "cold", "conv": "conv"}
        for name, a in jobs.items():
            if needed[name] in sections:
                subprocess.run([str(exe), "export", str(a[0]), "-o", str(tmp / f"{name}.mlc"),
                                *map(str, a[1:])], check=True, capture_output=True)
        rng = np.random.default_rng(0)

        if "overhead" in sections:
            none = load(tmp / "none.mlc")
            feeds_none = {"x": rng.random((1, 4), dtype=np.float32)}
            compare("per-run overhead, a bundle with no kernels (one input, one output copied)",
                    {"C mlc_run": lambda: c_bench(tmp / "none.mlc", 200000),
                     "Python Model.run": lambda: py_bench(lambda: none.run(feeds_none), 20000)},
                    args.rounds)

        base = args.baseline_mlcrun
        if "mlp" in sections:
            mlp = load(tmp / "mlp.mlc")
            x = rng.random((1, 784), dtype=np.float32)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            sess = ort.InferenceSession(str(ROOT / "artifacts" / "mlp.onnx"), opts,
                                        providers=["CPUExecutionProvider"])
            name = sess.get_inputs()[0].name
            out = {k: np.empty_like(v) for k, v in mlp.run({"x": x}).items()}
            baseline = {} if base is None else {
                "C mlc_run, baseline build": lambda: c_bench(tmp / "mlp.mlc", 20000, exe=base)}
            got = compare(
                "demo MLP 784-128-10, batch 1, end to end, 1 thread",
                {"C mlc_run": lambda: c_bench(tmp / "mlp.mlc", 20000), **baseline,
                 "Python Model.run": lambda: py_bench(lambda: mlp.run({"x": x}), 5000),
                 "Python Model.run(out=)": lambda: py_bench(lambda: mlp.run({"x": x}, out=out),
                                                            5000),
                 "ONNX Runtime (C API)": lambda: ort_c_bench(
                     ortc, ROOT / "artifacts" / "mlp.onnx", (name, sess.get_outputs()[0].name),
                     ("1,784", "1,10"), 20000),
                 "ONNX Runtime (Python API)": lambda: py_bench(lambda: sess.run(None, {name: x}),
                                                               5000)},
                args.rounds)
            c, py, orc = got["C mlc_run"], got["Python Model.run"], got["ONNX Runtime (C API)"]
            print(f"  Python runtime / C runtime: p50 {py[0] / c[0]:.2f}x, min {py[1] / c[1]:.2f}x; "
                  f"ONNX Runtime C API / C runtime: p50 {orc[0] / c[0]:.2f}x, "
                  f"min {orc[1] / c[1]:.2f}x")
            where_time_goes(floor, tmp / "mlp.mlc", c[1], py[1])
            mlp_two_threads(tmp / "mlp.mlc", ortc, (name, sess.get_outputs()[0].name), x,
                            args.rounds)

        if "widths" in sections:
            widths(tmp, args.rounds)

        for threads in (1, 2) if "conv" in sections else ():
            conv = load(tmp / "conv.mlc", threads=threads)
            xc = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
            compare(f"conv 64->64 3x3 on 56x56 (kernel time: the same code), {threads} "
                    f"thread{'s' if threads > 1 else ''}",
                    {"C mlc_run": lambda t=threads: c_bench(tmp / "conv.mlc", 200, t),
                     "Python Model.run": lambda c=conv, f={"x": xc}: py_bench(lambda: c.run(f), 200)},
                    args.rounds)
            conv.close()

        if "cold" in sections:
            cold(tmp, args.rounds, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cold(tmp: Path, rounds: int, base: Path | None) -> None:
    """Cold start of the demo CNN (``tmp/cnn.mlc``): process start to first result."""
    rng = np.random.default_rng(1)
    np.save(tmp / "x.npy", rng.random((1, 1, 28, 28), dtype=np.float32))
    subprocess.run(["make", "-C", str(CDIR), "static"], check=True, capture_output=True)
    cmds = {f"C: {prog.name} run (load, run, write .npy)":
            [str(prog), "run", str(tmp / "cnn.mlc"), str(tmp / "x.npy"), "-o",
             str(tmp / "out")] for prog in (MLCRUN, MLCRUN.with_name("mlcrun-static"))}
    if base is not None:
        cmds["C: baseline build's mlcrun run"] = [str(base), *cmds[next(iter(cmds))][1:]]
    cmds["Python: load + run"] = [
        sys.executable, "-c", "import sys, numpy as np; from mlcpack.runtime import load; "
        f"m = load({str(tmp / 'cnn.mlc')!r}); m.run({{'x': np.load({str(tmp / 'x.npy')!r})}})"]
    cmds["(baseline: /bin/true)"] = ["/bin/true"]
    rows = {name: [] for name in cmds}
    for _ in range(rounds):
        for name, cmd in cmds.items():
            rows[name].append(cold_start(cmd, 1 if name.startswith("Python") else 9))
    print("cold start, the demo CNN: process start to first result (fork/exec to exit)")
    for name, vals in rows.items():
        print(f"  {name:44s} wall median {statistics.median(v[0] for v in vals):7.2f} ms  "
              f"min {min(v[1] for v in vals):7.2f} ms   CPU median "
              f"{statistics.median(v[2] for v in vals):7.2f} ms  min "
              f"{min(v[3] for v in vals):7.2f} ms   peak RSS "
              f"{statistics.median(v[4] for v in vals):6.1f} MiB")
    for exe in (MLCRUN, MLCRUN.with_name("mlcrun-static")):
        proc = subprocess.run([str(exe), "bench", str(tmp / "cnn.mlc"), "--runs", "100"],
                              capture_output=True, text=True, check=True)
        print(f"  {exe.name} bench: {proc.stdout.strip().splitlines()[-1]}")
    print(f"  (peak RSS of `mlcrun-static --version`, the process alone: "
          f"{cold_start([str(MLCRUN.with_name('mlcrun-static')), '--version'], 1)[4]:.2f} MiB)")
    cnn_size = (tmp / "cnn.mlc").stat().st_size / 2**20
    print(f"  (cnn.mlc is {cnn_size:.2f} MiB: weights, two code variants, golden pair)")


if __name__ == "__main__":
    main()
