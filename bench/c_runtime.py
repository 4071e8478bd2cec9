"""The C runtime (runtime/c) beside the Python runtime: footprint and speed (docs/c-runtime.md).

    .venv/bin/python bench/c_runtime.py [--rounds 5]

Prints: the stripped libmlcrt.so and what each part costs (text + data of each object), the
per-run overhead of a bundle with no kernels, the demo MLP at batch 1 end to end (C mlc_run,
Python Model.run, ONNX Runtime's Python API, 1 thread), a 64-channel 3x3 conv layer at 1 and 2
threads (kernel time: the same code), and cold start (process start to first result, the demo
CNN) with the process's peak RSS. Timings alternate between the engines for ``--rounds`` rounds;
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


def c_bench(bundle: Path, runs: int, threads: int = 1, exe: Path = MLCRUN
            ) -> tuple[float, float]:
    proc = subprocess.run([str(exe), "bench", str(bundle), "--runs", str(runs), "--threads",
                           str(threads)], capture_output=True, text=True, check=True)
    p50 = float(re.search(r"p50 ([\d.]+) us", proc.stdout).group(1))
    low = float(re.search(r"min ([\d.]+) us", proc.stdout).group(1))
    return p50, low


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


def compare(title: str, engines: dict, rounds: int) -> None:
    """engines: name -> () -> (p50 us, min us); alternated for ``rounds`` rounds."""
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, fn in engines.items():
            got[name].append(fn())
    print(title)
    first = None
    for name, rows in got.items():
        p50 = statistics.median(r[0] for r in rows)
        low = min(r[1] for r in rows)
        first = first or p50
        print(f"  {name:34s} p50 {p50:9.2f} us   min {low:9.2f} us   p50 / first {p50 / first:5.2f}")


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-mlcrun", type=Path, default=None,
                    help="another build's mlcrun (e.g. main's) timed beside this one: MLP and "
                         "cold start rows")
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort
    from conv_models import conv_model
    from mlcpack.runtime import load

    print(host_flags())
    tmp = Path(tempfile.mkdtemp(prefix="cbench"))
    try:
        footprint(tmp)
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
        for name, a in jobs.items():
            subprocess.run([str(exe), "export", str(a[0]), "-o", str(tmp / f"{name}.mlc"),
                            *map(str, a[1:])], check=True, capture_output=True)
        rng = np.random.default_rng(0)

        none = load(tmp / "none.mlc")
        feeds_none = {"x": rng.random((1, 4), dtype=np.float32)}
        compare("per-run overhead, a bundle with no kernels (one input, one output copied)",
                {"C mlc_run": lambda: c_bench(tmp / "none.mlc", 200000),
                 "Python Model.run": lambda: py_bench(lambda: none.run(feeds_none), 20000)},
                args.rounds)

        mlp = load(tmp / "mlp.mlc")
        x = rng.random((1, 784), dtype=np.float32)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(ROOT / "artifacts" / "mlp.onnx"), opts,
                                    providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        out = {k: np.empty_like(v) for k, v in mlp.run({"x": x}).items()}
        base = args.baseline_mlcrun
        baseline = {} if base is None else {
            "C mlc_run, baseline build": lambda: c_bench(tmp / "mlp.mlc", 20000, exe=base)}
        compare("demo MLP 784-128-10, batch 1, end to end, 1 thread",
                {"C mlc_run": lambda: c_bench(tmp / "mlp.mlc", 20000), **baseline,
                 "Python Model.run": lambda: py_bench(lambda: mlp.run({"x": x}), 5000),
                 "Python Model.run(out=)": lambda: py_bench(lambda: mlp.run({"x": x}, out=out),
                                                            5000),
                 "ONNX Runtime (Python API)": lambda: py_bench(lambda: sess.run(None, {name: x}),
                                                               5000)},
                args.rounds)

        for threads in (1, 2):
            conv = load(tmp / "conv.mlc", threads=threads)
            xc = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
            compare(f"conv 64->64 3x3 on 56x56 (kernel time: the same code), {threads} "
                    f"thread{'s' if threads > 1 else ''}",
                    {"C mlc_run": lambda t=threads: c_bench(tmp / "conv.mlc", 200, t),
                     "Python Model.run": lambda c=conv, f={"x": xc}: py_bench(lambda: c.run(f), 200)},
                    args.rounds)
            conv.close()

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
        for _ in range(args.rounds):
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
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
