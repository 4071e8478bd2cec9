"""The C runtime (runtime/c: libmlcrt, mlcrun, the classify example) against the Python runtime:
the same bundles give bit-identical outputs at 1 and 2 threads (demo models, conv nets with
parallel kernels, a quantized net, batch plans, fat bundles pinned to each x86 level), its
SHA-256 and msgpack reader agree with hashlib and msgpack, and damaged bundles are refused with
the README's exit codes by an AddressSanitizer + UndefinedBehaviorSanitizer build, which the
project's bundle fuzzer (tests/fuzzing.py) is also pointed at.

Built with ``make -C runtime/c`` (and ``make sanitize``) in the tree's gitignored build folders;
skipped, saying why, only where there is no C compiler."""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import msgpack
import numpy as np
import pytest
from mlcpack.runtime import load
from mlcpack.runtime import elf

from bundle_parts import pack, read_parts
from conftest import ARTIFACTS, MLP_PICKLE, X86_V2, X86_V3, X86_V4

CDIR = Path(__file__).resolve().parents[2] / "runtime" / "c"
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
HOST_X86 = elf._real_arch() == "x86_64"
HOST_FLAGS = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) on this machine: "
                                "the C runtime cannot be built")
ENV_KEYS = ("MLCPACK_CPU_FEATURES", "MLCPACK_CPU_ARCH", "MLCPACK_NUM_THREADS")
# LeakSanitizer on, and a sanitizer report fails the process with a code no refusal uses
ASAN = {"ASAN_OPTIONS": "detect_leaks=1:exitcode=99:abort_on_error=0",
        "UBSAN_OPTIONS": "halt_on_error=1:exitcode=98:print_stacktrace=1"}


def _make(*targets: str) -> None:
    proc = subprocess.run(["make", "-C", str(CDIR), "-j2", f"CC={CC}", *targets],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def build() -> Path:
    _make("all")
    return CDIR / "build"


@pytest.fixture(scope="module")
def asan() -> Path:
    _make("sanitize")
    return CDIR / "build-asan"


def mlcrun(build_dir: Path, *args, env: dict | None = None, timeout: float = 60
           ) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    full.update(env or {})
    return subprocess.run([str(build_dir / "mlcrun"), *map(str, args)], capture_output=True,
                          text=True, env=full, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def c_outputs(build_dir: Path, bundle: Path, feeds: list[np.ndarray], tmp: Path, threads: int,
              env: dict | None = None) -> list[np.ndarray]:
    tmp.mkdir(parents=True, exist_ok=True)
    names = []
    for i, x in enumerate(feeds):
        np.save(tmp / f"in{i}.npy", x)
        names.append(tmp / f"in{i}.npy")
    proc = mlcrun(build_dir, "run", bundle, *names, "-o", tmp / "out", "--threads", threads,
                  env=env)
    assert proc.returncode == 0, proc.stderr
    n = len(proc.stdout.splitlines())
    return [np.load(tmp / "out" / f"out{i}.npy") for i in range(n)]


def assert_bit_identical(build_dir: Path, bundle: Path, feeds: dict, tmp: Path,
                         threads=(1, 2), env: dict | None = None) -> None:
    for t in threads:
        with load(bundle, threads=t) as model:
            want = model.run(feeds)
            names = [s.name for s in model.outputs]
        got = c_outputs(build_dir, bundle, list(feeds.values()), tmp / f"t{t}", t, env)
        assert len(got) == len(names)
        for name, g in zip(names, got):
            w = want[name]
            assert g.dtype == w.dtype and g.shape == w.shape, (name, g.shape, w.shape)
            assert g.tobytes() == w.tobytes(), f"{bundle.name} output {name} at {t} threads"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, run_cli, mlp_bundle) -> dict[str, Path]:
    """The demo models (the MLP pickle as conftest exports it, the CNN as the default portable
    export: fat, x86-64-v2 .. this host's level), the MLP with batch plans, a conv net with
    parallel kernels, an int8 QDQ conv net, a dynamically quantized one."""
    from conv_models import conv_model
    from quant_models import conv_net, ort_quantize

    folder = tmp_path_factory.mktemp("cbundles")
    conv = folder / "conv.onnx"
    import onnx
    onnx.save(conv_model(1, 16, 24, 24, 32, 3, 1, act="silu", residual=True), conv)
    qdq = ort_quantize(conv_net(folder / "qnet.onnx"), folder / "qnet_qdq.onnx", "QDQ")
    jobs = {"mlp_onnx": [ARTIFACTS / "mlp.onnx", "--target", "host"],
            "cnn": [ARTIFACTS / "cnn.onnx"],
            "batch": [MLP_PICKLE, "--batch-sizes", "1,4", "--target", "host"],
            "conv": [conv, "--target", "host"], "qdq": [qdq, "--target", "host"],
            # uint8 weights with zero points stored as integers, expanded at load (format 1.5)
            "dyn": [ort_quantize(conv_net(folder / "dnet.onnx"), folder / "dnet_dyn.onnx",
                                 "dynamic", per_channel=True), "--target", "host"]}
    out = {"mlp_pkl": mlp_bundle[0]}
    for name, args in jobs.items():
        path = folder / f"{name}.mlc"
        proc = run_cli("export", args[0], "-o", path, *args[1:], timeout=300)
        assert proc.returncode == 0, proc.stderr
        out[name] = path
    return out


def _feeds(bundle: Path, seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    with load(bundle) as model:
        specs = model.inputs
    out = {}
    for s in specs:
        shape = tuple(batch if d == "N" else d for d in s.dims)
        out[s.name] = rng.standard_normal(shape).astype(s.dtype)
    return out


# ---- building blocks ---------------------------------------------------------------------------

def test_sha256_matches_hashlib(build, tmp_path) -> None:
    rng = random.Random(5)
    for size in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 70000):
        data = bytes(rng.randrange(256) for _ in range(size))
        (tmp_path / "d").write_bytes(data)
        # the portable C code, and the SHA extensions where this CPU has them
        paths = set()
        for mode in ("sha256c", "sha256"):
            out = subprocess.run([build / "test_units", mode, tmp_path / "d"],
                                 capture_output=True, text=True, check=True).stdout.split()
            assert out[0] == hashlib.sha256(data).hexdigest(), (size, out)
            paths.add(out[1])
        assert "c" in paths
    if "sha_ni" in HOST_FLAGS:
        assert paths == {"c", "accel"}


def test_msgpack_reader_is_strict(build, tmp_path) -> None:
    cases = {
        "map": (msgpack.packb({"a": [1, -2, 3.5, None, True, b"x", "é"]}), "ok"),
        "nested deep": (b"\x91" * 63 + b"\x00", "ok"),
        "nested too deep": (b"\x91" * 65 + b"\x00", "error 3"),
        "array past the end": (b"\xdd\xff\xff\xff\xff\x00", "error 3"),
        "str past the end": (b"\xdb\x00\x00\x10\x00abc", "error 3"),
        "bad utf-8": (b"\xa2\xff\xfe", "error 3"),
        "int key": (b"\x81\x01\x02", "error 3"),
        "bin key": (b"\x81\xc4\x01k\x02", "ok"),
        "ext type": (b"\xd4\x01\x00", "error 3"),
        "reserved byte": (b"\xc1", "error 3"),
        "empty": (b"", "error 3"),
    }
    for what, (blob, want) in cases.items():
        (tmp_path / "m").write_bytes(blob)
        out = subprocess.run([build / "test_units", "msgpack", tmp_path / "m"],
                             capture_output=True, text=True, check=True).stdout
        assert out.startswith(want), (what, out)
        if want == "ok" and what == "map":
            assert out.split()[1] == str(len(blob))


def test_shared_library_api(build, bundles) -> None:
    lib = ctypes.CDLL(str(build / "libmlcrt.so"))
    lib.mlc_version.restype = ctypes.c_char_p
    assert lib.mlc_version().startswith(b"0.1")
    err = ctypes.create_string_buffer(600)
    model = ctypes.c_void_p()
    lib.mlc_open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p]
    assert lib.mlc_open_file(str(bundles["cnn"]).encode(), None, ctypes.byref(model), err) == 0
    lib.mlc_input_count.argtypes = lib.mlc_output_count.argtypes = [ctypes.c_void_p]
    assert lib.mlc_input_count(model) == 1 and lib.mlc_output_count(model) == 1
    lib.mlc_close.argtypes = [ctypes.c_void_p]
    lib.mlc_close(model)
    assert lib.mlc_open_file(b"/nonexistent.mlc", None, ctypes.byref(model), err) == 3
    assert b"no such file" in err.raw[4:]


# ---- bit-identical outputs ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mlp_pkl", "mlp_onnx", "cnn", "conv", "qdq", "dyn"])
def test_outputs_are_bit_identical_to_the_python_runtime(build, bundles, tmp_path, name) -> None:
    assert_bit_identical(build, bundles[name], _feeds(bundles[name]), tmp_path)


def test_channel_split_views_bit_identical(build, tmp_path) -> None:
    """A batch-1 plan whose channel Split/Slice are views at offsets into their input's buffer
    (tests/passes/test_channel_slices_are_views.py): the C runtime reads them where the Python
    runtime does."""
    import onnx
    from mlcpack.packager.api import Options, export
    from test_channel_slices_are_views import _model

    onnx.save(_model(1), tmp_path / "m.onnx")
    export(tmp_path / "m.onnx", tmp_path / "m.mlc", Options(cache=False, check=False))
    x = np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype(np.float32)
    assert_bit_identical(build, tmp_path / "m.mlc", {"x": x}, tmp_path)


def test_concats_in_place_bit_identical(build, tmp_path) -> None:
    """A batch-1 plan whose channel Concats are made in place (kernels writing at offsets into
    the concat's buffer, COPY instructions for the other parts; tests/passes/
    test_concats_in_place.py): the C runtime gives the Python runtime's bytes."""
    import onnx
    from mlcpack.packager.api import Options, export
    from test_concats_in_place import _model

    onnx.save(_model(1), tmp_path / "m.onnx")
    export(tmp_path / "m.onnx", tmp_path / "m.mlc", Options(cache=False, check=False))
    x = np.random.default_rng(4).standard_normal((1, 8, 6, 6)).astype(np.float32)
    assert_bit_identical(build, tmp_path / "m.mlc", {"x": x}, tmp_path)


def test_conv_net_has_parallel_kernels_and_zero_copy(build, bundles) -> None:
    """So the 2-thread runs above go through the bundle's hand-off code and the C workers, and
    the kernels read the input where mlcrun holds it and write the output into its buffer."""
    with load(bundles["conv"], threads=2) as model:
        assert model.has_parallel_kernels
    proc = mlcrun(build, "inspect", bundles["conv"])
    assert "zero-copy: 2 inputs read in place, 1 output written in place" in proc.stdout, \
        proc.stdout


def test_mlp_first_layer_split_by_columns_is_bit_identical(build, bundles, tmp_path) -> None:
    """The demo MLP's first layer is split over threads for its weights' bytes
    (codegen/threads.py PARALLEL_MIN_WEIGHT_BYTES): each thread computes its column panels.
    C and Python, 1 and 2 threads: the same bytes, all four."""
    from mlcpack.runtime.describe import describe

    bundle = bundles["mlp_onnx"]
    kernels = describe(bundle)["kernels"]
    assert [k["parallel"] for k in kernels] == [True, False], kernels
    feeds = _feeds(bundle, seed=3)
    outs = []
    for t in (1, 2):
        with load(bundle, threads=t) as model:
            outs.extend(model.run(feeds).values())
        outs.extend(c_outputs(build, bundle, list(feeds.values()), tmp_path / f"t{t}", t))
    assert len(outs) == 4 and len({o.tobytes() for o in outs}) == 1


@pytest.mark.parametrize("batch", [1, 3, 4, 9])
def test_batch_plans(build, bundles, tmp_path, batch) -> None:
    assert_bit_identical(build, bundles["batch"], _feeds(bundles["batch"], batch=batch),
                         tmp_path, threads=(1,))


@pytest.mark.skipif(not HOST_X86, reason="runs x86-64 code variants")
@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "x86-64-v4"])
def test_fat_bundle_pinned_to_each_level(build, bundles, tmp_path, level) -> None:
    from mlcpack.runtime import cpu

    flags = {"x86-64-v2": X86_V2, "x86-64-v3": X86_V3, "x86-64-v4": X86_V4}[level]
    if not set(flags.split(",")) <= cpu._detected_features():
        pytest.skip(f"needs a host with {level} to run its code")
    env = {"MLCPACK_CPU_ARCH": "x86_64", "MLCPACK_CPU_FEATURES": flags}
    proc = mlcrun(build, "inspect", bundles["cnn"], env=env)
    assert proc.returncode == 0, proc.stderr
    os.environ.update(env)
    try:
        with load(bundles["cnn"]) as model:
            python_level = model.code_variant["level"]
        assert f"code {python_level} " in proc.stdout
        assert_bit_identical(build, bundles["cnn"], _feeds(bundles["cnn"]), tmp_path, env=env)
    finally:
        for k in env:
            os.environ.pop(k)


def test_verify_and_bench(build, bundles) -> None:
    for name in ("cnn", "batch", "qdq"):
        proc = mlcrun(build, "verify", bundles[name])
        assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "PASS", proc.stdout
    proc = mlcrun(build, "bench", bundles["mlp_pkl"], "--runs", "20", "--threads", "2")
    assert proc.returncode == 0 and "p50" in proc.stdout and "(20 runs, 2 threads)" in proc.stdout


@pytest.mark.skipif(not HOST_X86 or "avx2" not in HOST_FLAGS,
                    reason="bench/c_kernel_floor.c reads with AVX2: needs an x86-64 host with it")
def test_bench_helpers_time_the_mlp(build, bundles, tmp_path) -> None:
    """bench/c_runtime.py's C helpers still build and measure: c_kernel_floor.c (libmlcrt's
    internal headers) times each kernel of the MLP alone (the parallel one also split over 2
    threads) and a read of its large weights;
    ort_c_run.c runs ONNX Runtime through its C API by OrtApi index (its thread-count check
    passes) and gives ONNX Runtime's Python API's answer for the same input."""
    import onnxruntime as ort
    bench = Path(__file__).resolve().parents[2] / "bench"
    floor, ortc = tmp_path / "floor", tmp_path / "ortc"
    for args in ([f"-I{CDIR / 'include'}", f"-I{CDIR / 'src'}", "-mavx2",
                  bench / "c_kernel_floor.c", build / "libmlcrt.a", "-lpthread", "-lm", "-o",
                  floor],
                 ["-std=gnu11", bench / "ort_c_run.c", "-ldl", "-o", ortc]):
        proc = subprocess.run([CC, "-O2", "-Wall", "-Wextra", "-Werror", *map(str, args)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(floor), str(bundles["mlp_onnx"]), "100"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    # the two layers' kernels (named by the host level's choice: the first one's weights are
    # packed in panels on AVX2 hosts, not on AVX-512 ones)
    kernels = [r[1] for r in rows if r[0] == "kernel"]
    assert len(kernels) == 2 and kernels[0].endswith("_add_relu"), proc.stdout
    assert all(k.startswith("fused_matmul") for k in kernels), proc.stdout
    # the first layer is a parallel kernel: also timed split over 2 threads
    assert [r[1] for r in rows if r[0] == "split"] == kernels[:1]
    reads = [r for r in rows if r[0] == "read"]   # the 128 x 784 float32 weights
    assert len(reads) == 1 and reads[0][reads[0].index("bytes") + 1] == str(128 * 784 * 4)
    lib = sorted((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so*"))[0]
    model = ARTIFACTS / "mlp.onnx"
    proc = subprocess.run([str(ortc), str(lib), str(model), "x", "logits", "1,784", "1,10",
                           "20", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"C API: p50 [\d.]+ us, min [\d.]+ us \(20 runs, 1 thread\)", proc.stdout)
    got = np.array(proc.stdout.split("output:")[1].split(), np.float32)
    x = (np.arange(784, dtype=np.uint64) * 7919 % 1000).astype(np.float32) / np.float32(1000)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    want = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"]).run(
        None, {"x": x.reshape(1, 784)})[0].ravel()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

def test_classify_example(build, bundles, tmp_path) -> None:
    """runtime/c/examples/classify.c: a raw RGB image in, top-k out, as the Python runtime
    computes it on the same pixels."""
    from PIL import Image

    rgb = np.asarray(Image.open(ARTIFACTS / "samples" / "digit_3.png").convert("RGB"))
    h, w, _ = rgb.shape
    (tmp_path / "img.rgb").write_bytes(rgb.tobytes())
    proc = subprocess.run([build / "classify", bundles["cnn"], tmp_path / "img.rgb", str(w),
                           str(h), "3"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    # the example's preprocessing: nearest-neighbour to 28x28, luma / 255
    ys, xs = np.arange(28) * h // 28, np.arange(28) * w // 28
    px = rgb[ys][:, xs].astype(np.float32)
    luma = (np.float32(0.299) * px[..., 0] + np.float32(0.587) * px[..., 1]
            + np.float32(0.114) * px[..., 2]) / np.float32(255)
    with load(bundles["cnn"]) as model:
        scores = model(luma.reshape(1, 1, 28, 28).astype(np.float32))[0]
    order = np.argsort(-scores, kind="stable")[:3]
    assert [int(r[1]) for r in rows] == order.tolist()
    assert int(rows[0][1]) == 3
    np.testing.assert_allclose([float(r[2]) for r in rows], scores[order], rtol=1e-5)


# ---- damaged bundles and bad inputs, under ASan + UBSan -----------------------------------------

def _damaged(src: Path, tmp: Path) -> dict[str, tuple[Path, int, str]]:
    """docs/bad-inputs.md's bundle cases: (file, exit code, words in the message)."""
    data = src.read_bytes()
    header, payloads = read_parts(src)
    cases: dict[str, tuple[bytes, int, str]] = {
        "empty file": (b"", 3, "too small"),
        "not a bundle": (b"PK\x03\x04" + b"\0" * 100, 3, "not an mlcpack bundle"),
        "truncated in the header": (data[:40], 3, ""),
        "truncated in the payloads": (data[:-100], 3, "truncated"),
        "trailing bytes": (data + b"\0", 3, "trailing"),
        "flipped payload byte": (data[:-50] + bytes([data[-50] ^ 1]) + data[-49:], 3, "SHA-256"),
        "flipped header byte": (data[:30] + bytes([data[30] ^ 0x20]) + data[31:], 3, ""),
    }
    newer = dict(header, format=[2, 0])
    cases["newer major"] = (pack(newer, payloads), 4, "upgrade the runtime")
    minor = dict(header, format=[1, 9], min_reader=[1, 9])
    cases["newer minor"] = (pack(minor, payloads), 4, "upgrade the runtime")
    huge = dict(header, tensors=[list(t) for t in header["tensors"]])
    huge["tensors"][0][2] = [1 << 39, 1 << 39]
    cases["oversized dims"] = (pack(huge, payloads), 3, "outside its storage")
    past = dict(header, constants=[dict(c) for c in header["constants"]])
    past["constants"][0]["data"] = {"offset": 0, "size": 1 << 62}
    cases["payload past the end"] = (pack(past, payloads), 3, "past the end")
    code = dict(header, code=[dict(v) for v in header["code"]])
    for v in code["code"]:
        v["level"] = "x86-64-v9"
    cases["unknown level"] = (pack(code, payloads), 5, "unknown to this runtime")
    lib = dict(header, library_calls=[{"func": "myapp.nothing"}])
    cases["missing library function"] = (pack(lib, payloads), 8, "myapp.nothing")
    out = {}
    for name, (blob, code_, words) in cases.items():
        path = tmp / (name.replace(" ", "_") + ".mlc")
        path.write_bytes(blob)
        out[name] = (path, code_, words)
    return out


def test_damaged_bundles_are_refused_under_sanitizers(asan, bundles, tmp_path) -> None:
    for name, (path, code, words) in _damaged(bundles["mlp_pkl"], tmp_path).items():
        for cmd in ("inspect", "verify"):
            proc = mlcrun(asan, cmd, path, env=ASAN)
            line = one_line_error(proc)
            assert proc.returncode == code, (name, proc.returncode, line)
            assert words in line, (name, line)
    # a directory, a missing file
    for path, words in ((tmp_path, "is a directory"), (tmp_path / "nope.mlc", "no such file")):
        proc = mlcrun(asan, "inspect", path, env=ASAN)
        assert proc.returncode == 3 and words in one_line_error(proc)


def test_both_readers_refuse_the_same_damaged_headers(asan, bundles, tmp_path) -> None:
    """Header damage the C reader refused and the Python reader once let through (an IO row
    that disagrees with its tensor row; a boolean payload offset, which Python reads as 0):
    both refuse it at load, exit 3, with the same words (docs/format.md sections 5 and 16)."""
    from mlcpack.runtime.errors import BundleError

    header, payloads = read_parts(bundles["mlp_pkl"])
    cases = {}
    for kind, key, value in (("input", "shape", [1, 783]), ("output", "shape", [2, 10]),
                             ("input", "dtype", "float64"), ("output", "dtype", "int32")):
        bad = dict(header, **{f"{kind}s": [dict(r) for r in header[f"{kind}s"]]})
        bad[f"{kind}s"][0][key] = value
        cases[f"{kind} {key}"] = (bad, f"{kind} '{header[f'{kind}s'][0]['name']}' does not "
                                  "match its tensor row")
    # the payload at offset 0, its offset given as msgpack false
    at0 = next(i for i, c in enumerate(header["constants"]) if c["data"]["offset"] == 0)
    bad = dict(header, constants=[dict(c) for c in header["constants"]])
    bad["constants"][at0]["data"] = dict(bad["constants"][at0]["data"], offset=False)
    cases["boolean offset"] = (bad, "invalid offset/size")
    for name, (bad, words) in cases.items():
        path = tmp_path / (name.replace(" ", "_") + ".mlc")
        path.write_bytes(pack(bad, payloads))
        proc = mlcrun(asan, "inspect", path, env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 3 and words in line, (name, line)
        with pytest.raises(BundleError, match=re.escape(words)) as info:
            load(path)
        assert info.value.exit_code == 3, name


@pytest.mark.skipif(not HOST_X86, reason="pins x86-64 CPU features")
def test_wrong_cpu_is_refused_before_mapping(asan, bundles) -> None:
    env = dict(ASAN, MLCPACK_CPU_ARCH="x86_64", MLCPACK_CPU_FEATURES="fpu,cx8,cmov,fxsr,mmx,sse,sse2")
    proc = mlcrun(asan, "inspect", bundles["cnn"], env=env)
    line = one_line_error(proc)
    assert proc.returncode == 5 and "x86-64-v2 needs" in line and "--target" in line
    proc = mlcrun(asan, "inspect", bundles["cnn"], env=dict(ASAN, MLCPACK_CPU_ARCH="aarch64",
                                                            MLCPACK_CPU_FEATURES="fp,asimd"))
    assert proc.returncode == 5 and "for x86_64 machines" in one_line_error(proc)


def test_bad_inputs_are_refused_under_sanitizers(asan, bundles, tmp_path) -> None:
    bundle = bundles["cnn"]
    cases = {
        "wrong dtype": (np.zeros((1, 1, 28, 28), np.float64), "has dtype float64"),
        "wrong shape": (np.zeros((1, 1, 28, 27), np.float32), "has shape (1, 1, 28, 27)"),
        "wrong rank": (np.zeros((1, 784), np.float32), "has rank 2"),
    }
    for name, (x, words) in cases.items():
        np.save(tmp_path / "x.npy", x)
        proc = mlcrun(asan, "run", bundle, tmp_path / "x.npy", "-o", tmp_path / "o", env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 7 and words in line, (name, line)
        assert not (tmp_path / "o").exists()   # nothing written
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'")
    for args in (["bad.npy"], ["missing.npy"], []):
        proc = mlcrun(asan, "run", bundle, *[tmp_path / a for a in args], "-o", tmp_path / "o",
                      env=ASAN)
        assert proc.returncode == 7, proc.stderr
        one_line_error(proc)
    for args in (["--threads", "0"], ["--runs", "-3"], ["--frobnicate"]):
        proc = mlcrun(asan, "bench", bundle, *args, env=ASAN)
        assert proc.returncode == 2
        one_line_error(proc)
    # a good run under the sanitizers, batch plans and 2 threads included
    assert_bit_identical(asan, bundles["conv"], _feeds(bundles["conv"]), tmp_path / "conv")
    assert_bit_identical(asan, bundles["batch"], _feeds(bundles["batch"], batch=6),
                         tmp_path / "batch", threads=(1,))


def test_bundle_fuzzer_against_mlcrun(asan, bundles, tmp_path) -> None:
    """tests/fuzzing.py's mutations (bytes, and headers re-packed with a valid digest), a bounded
    number, through the sanitizer build: a one-line refusal with a README code, or a load (and,
    where the Python property runs it, the original answer); never a crash, a sanitizer report,
    a leak or a hang."""
    import fuzzing

    seed = fuzzing.make_seed(bundles["mlp_pkl"])
    paths = fuzzing.header_paths(seed.header)
    rng = random.Random(1234)
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(ASAN)
    outcomes: dict[str, int] = {}
    for i in range(120):
        case = None
        while case is None:
            case = (fuzzing.random_header_case(seed, rng, paths) if i % 2
                    else fuzzing.random_byte_case(seed, rng))
        got = fuzzing.check_c(seed, case, tmp_path / "case.mlc", asan / "mlcrun", env)
        outcomes[got] = outcomes.get(got, 0) + 1
    print("C fuzz outcomes", outcomes)
    assert sum(v for k, v in outcomes.items() if k.startswith("exit")) > 20
    assert outcomes.get("ran", 0) > 5


# ---- symbolic plans, through the shared library (several shapes in one process) ----------------

class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int), ("dims", ctypes.c_int64 * 16)]


class Session:
    """libmlcrt.so through ctypes: open, run float32 arrays, close."""

    def __init__(self, lib: ctypes.CDLL, path: Path, threads: int) -> None:
        class Options(ctypes.Structure):
            _fields_ = [("threads", ctypes.c_int), ("skip_digest", ctypes.c_int),
                        ("cpu_features", ctypes.c_char_p), ("cpu_arch", ctypes.c_char_p),
                        ("library", ctypes.c_void_p), ("library_count", ctypes.c_size_t),
                        ("trusted_keys", ctypes.c_void_p), ("trusted_key_count", ctypes.c_size_t),
                        ("require_signature", ctypes.c_int)]
        self.lib, self.err = lib, ctypes.create_string_buffer(520)
        self.model = ctypes.c_void_p()
        opts = Options(threads=threads)
        lib.mlc_open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_void_p]
        lib.mlc_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.mlc_close.argtypes = [ctypes.c_void_p]
        status = lib.mlc_open_file(str(path).encode(), ctypes.byref(opts),
                                   ctypes.byref(self.model), self.err)
        assert status == 0, self.message

    @property
    def message(self) -> str:
        return self.err.raw[4:].split(b"\0")[0].decode()

    def run(self, x: np.ndarray, out_bytes: int) -> tuple[int, np.ndarray | None]:
        x = np.ascontiguousarray(x, np.float32)
        t_in = Tensor(x.ctypes.data, x.nbytes, 0, x.ndim)
        t_in.dims[:x.ndim] = x.shape
        buf = np.zeros(out_bytes // 4 + 1, np.float32)
        t_out = Tensor(buf.ctypes.data, buf.nbytes)
        status = self.lib.mlc_run(self.model, ctypes.byref(t_in), 1, ctypes.byref(t_out), 1,
                                  self.err)
        if status:
            return status, None
        shape = tuple(t_out.dims[:t_out.ndim])
        return 0, buf[:int(np.prod(shape))].reshape(shape)

    def close(self) -> None:
        self.lib.mlc_close(self.model)


@pytest.fixture(scope="module")
def symbolic_bundles(tmp_path_factory, run_cli) -> dict[str, Path]:
    """The conv net of test_symbolic_plans (batch n, height h, width w symbolic) exported with a
    --max-shape bound and without; its symbolic-batch MLP with --batch-sizes 1,4."""
    import onnx
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from test_symbolic_memory_plans import conv_model, mlp_model

    folder = tmp_path_factory.mktemp("csym")
    out = {"bound": folder / "bound.mlc", "open": folder / "open.mlc"}
    for name, bounds in (("bound", {"x": (2, 3, 40, 48)}), ("open", None)):
        mod, _ = import_onnx(conv_model(), max_shapes=bounds)
        export_module(mod, out[name], ExportOptions(target="host"))
    onnx.save(mlp_model(), folder / "mlp.onnx")
    out["spec"] = folder / "spec.mlc"
    proc = run_cli("export", folder / "mlp.onnx", "-o", out["spec"], "--batch-sizes", "1,4",
                   "--target", "host")
    assert proc.returncode == 0, proc.stderr
    return out


SYM_SHAPES = {"bound": [(1, 3, 8, 8), (2, 3, 40, 48), (1, 3, 17, 33), (2, 3, 5, 2), (1, 3, 8, 8)],
              "open": [(1, 3, 8, 8), (3, 3, 64, 50), (2, 3, 5, 2), (1, 3, 17, 33), (1, 3, 8, 8)],
              "spec": [(1, 12), (3, 12), (4, 12), (9, 12), (1, 12)]}


@pytest.mark.parametrize("name", ["bound", "open", "spec"])
@pytest.mark.parametrize("threads", [1, 2])
def test_symbolic_bundles_at_several_sizes(build, symbolic_bundles, name, threads) -> None:
    lib = ctypes.CDLL(str(build / "libmlcrt.so"))
    rng = np.random.default_rng(4)
    session = Session(lib, symbolic_bundles[name], threads)
    try:
        with load(symbolic_bundles[name], threads=threads) as model:
            for shape in SYM_SHAPES[name]:
                x = rng.standard_normal(shape).astype(np.float32)
                want = model.run({"x": x})["y"]
                status, got = session.run(x, want.nbytes)
                assert status == 0, session.message
                assert got.shape == want.shape and got.tobytes() == want.tobytes(), shape
        if name == "bound":   # beyond the bound, and a rank it does not take: input errors
            assert session.run(np.zeros((1, 3, 41, 8), np.float32), 1 << 20)[0] == 7
            assert "beyond the bundle's bound" in session.message
            assert session.run(np.zeros((3, 8, 8), np.float32), 1 << 20)[0] == 7
            assert "has rank 3" in session.message
    finally:
        session.close()


@pytest.fixture(scope="module")
def counted_bundle(tmp_path_factory) -> Path:
    """A format 1.6 bundle whose output sizes kernels count at run time
    (``tests/export/dynamic_models.py``: the detector head with NMS inside, the NonZero / TopK /
    Compress / Unique graph, the open-N NonZero model, an If whose branches give different
    shapes, in one graph), the very file tests/export/test_data_dependent_shapes.py checks:
    exported once per test run, whichever xdist worker needs it first."""
    from dynamic_models import exported

    return exported(tmp_path_factory)[1]


def test_counted_sizes_bit_identical(build, asan, counted_bundle, tmp_path) -> None:
    """The C runtime returns each output at the size the run counted, bit-identical to the
    Python runtime (counts from 0 up, 1 and 2 threads; under the sanitizers too), and refuses a
    TopK k beyond its axis in one line with the input-error code."""
    from dynamic_models import combined_feeds

    for seed, zeros, n in ((0, False, 1), (3, False, 6), (9, True, 6)):
        feeds = combined_feeds(seed, zeros, n)
        feeds["o_x"][feeds["o_x"] < 0] = 0
        assert_bit_identical(build, counted_bundle, feeds, tmp_path / f"c{seed}")
        if seed:
            assert_bit_identical(asan, counted_bundle, feeds, tmp_path / f"a{seed}",
                                 threads=(1,), env=ASAN)
    feeds = combined_feeds(1)
    feeds["c_k"] = np.array([5], np.int64)
    for i, v in enumerate(feeds.values()):
        np.save(tmp_path / f"k{i}.npy", v)
    proc = mlcrun(asan, "run", counted_bundle,
                  *[tmp_path / f"k{i}.npy" for i in range(len(feeds))], "-o", tmp_path / "ko",
                  env=ASAN)
    assert proc.returncode == 7 and "is 5, outside [0, 4]" in one_line_error(proc)


def test_open_detector_bit_identical(build, asan, tmp_path_factory, tmp_path) -> None:
    """NMS over a run-time batch and box count, and the Slices along its counted rows
    (tests/export/dynamic_models.py ``open_detector``): bit-identical to the Python runtime at
    batch 1 and 3, counts 0 and up, 1 and 2 threads, and under the sanitizers."""
    from dynamic_models import exported, open_detector_feeds

    bundle = exported(tmp_path_factory, "open_detector")[1]
    for k, (b, h, w, scale) in enumerate(((3, 16, 12, 1.5), (1, 24, 32, 1.5), (1, 8, 8, 0.01),
                                          (1, 4, 2, 1.5))):
        feeds = open_detector_feeds(b, h, w, 100 * b + h, scale)
        assert_bit_identical(build, bundle, feeds, tmp_path / f"c{k}")
        assert_bit_identical(asan, bundle, feeds, tmp_path / f"a{k}", threads=(1,), env=ASAN)


def test_padded_detector_bit_identical(build, asan, tmp_path_factory, tmp_path) -> None:
    """Ultralytics' end-to-end NMS post-processing (tests/export/dynamic_models.py
    ``padded_detector``: one count for three NonZero, a Pad whose pads are computed from the
    count): bit-identical to the Python runtime at 0, 4 and 20 kept rows, 1 and 2 threads, and
    under the sanitizers (0 rows: the pad reads nothing outside its buffer)."""
    from dynamic_models import exported, padded_detector_feeds

    bundle = exported(tmp_path_factory, "padded_detector")[1]
    for k, (seed, scale) in enumerate(((4, 0.01), (0, 0.5), (0, 2.0))):
        feeds = padded_detector_feeds(seed, scale)
        assert_bit_identical(build, bundle, feeds, tmp_path / f"c{k}")
        assert_bit_identical(asan, bundle, feeds, tmp_path / f"a{k}", threads=(1,), env=ASAN)

@pytest.fixture(scope="module")
def branch_bundle(tmp_path_factory) -> Path:
    """The format 1.7 bundle of tests/export/test_if_branches.py (an If on the sample rate
    whose branches give different shapes, each with an If on a size; only the taken branch
    runs), the very file that module checks against ONNX Runtime."""
    from branch_models import exported

    return exported(tmp_path_factory)[1]


def test_taken_branch_bit_identical_and_damaged_jumps_refused(build, asan, branch_bundle,
                                                              tmp_path) -> None:
    """The C runtime jumps over the untaken branch as the Python runtime does: outputs of the
    taken branch's shapes, bit-identical (1 and 2 threads, and under the sanitizers); sizes
    that take a left-out branch are refused with the input-error code; a damaged jump (not
    forward, past the end, inside an instruction, a condition that is not one bool, an unknown
    TRAP reason) is refused at load with the bundle-error code, in one line."""
    from branch_models import damaged_bytecode, feeds

    for n, length, rate in ((1, 12, 16000), (4, 8, 8000), (2, 16, 16000)):
        assert_bit_identical(build, branch_bundle, feeds(n, length, rate), tmp_path / f"b{n}")
        assert_bit_identical(asan, branch_bundle, feeds(n, length, rate), tmp_path / f"a{n}",
                             threads=(1,), env=ASAN)
    for i, v in enumerate(feeds(1, 12, 8000).values()):
        np.save(tmp_path / f"t{i}.npy", v)
    proc = mlcrun(asan, "run", branch_bundle, tmp_path / "t0.npy", tmp_path / "t1.npy", "-o",
                  tmp_path / "to", env=ASAN)
    assert proc.returncode == 7 and "branch of one of the model's If" in one_line_error(proc)
    for change in ("backward", "past_end", "mid_instruction", "not_bool", "trap_reason"):
        path = damaged_bytecode(branch_bundle, tmp_path / f"{change}.mlc", change)
        proc = mlcrun(asan, "inspect", path, env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 3 and "invalid bytecode" in line, (change, line)


def test_counted_loop_bit_identical_and_damaged_loops_refused(build, asan, tmp_path_factory,
                                                            tmp_path) -> None:
    """The C runtime runs format 1.8's LOOP ... NEXT as the Python runtime does (the bundles of
    tests/export/test_run_time_loops.py: the counted loop, symbolic (per-shape plans, and one
    arena planned under --max-shape) and with static shapes, at
    trip counts 0, 1, 7, negative and 2**63 - 1 with a break, a false condition; a Scan over an
    open axis; a Loop over an input's rows with a scan output and a break; two nested Loops):
    bit-identical at 1
    and 2 threads and under the sanitizers. Damaged loops (a NEXT that names no LOOP or one
    after it, a LOOP whose end is elsewhere, a float count, a constant iteration number, a
    jump out of the body) are refused at load with the bundle-error code, in one line."""
    from loop_models import (DAMAGE, damaged_bytecode, exported, feeds, nested_feeds,
                             open_scan_feeds, rows_loop_feeds)

    bundles = [exported(tmp_path_factory)[1], exported(tmp_path_factory, "counted-static")[1],
               exported(tmp_path_factory, "counted-bounded")[1]]
    cases = [(0, True, 1e9), (1, True, 1e9), (7, True, 1e9), (7, False, 1e9), (-3, True, 1e9),
             ((1 << 63) - 1, True, 2.0)]
    for b, bundle in enumerate(bundles):
        for k, (m, cond, lim) in enumerate(cases):
            f = feeds(m, cond, lim, n=3 if b == 1 else 3 + 9 * k, seed=k)
            assert_bit_identical(build, bundle, f, tmp_path / f"b{b}c{k}")
            assert_bit_identical(asan, bundle, f, tmp_path / f"b{b}a{k}", threads=(1,), env=ASAN)
    # scan outputs planned at an input size: a Scan over an open axis, a Loop over x's rows
    for k, (kind, f) in enumerate((("open-scan", open_scan_feeds(5)),
                                   ("rows-loop", rows_loop_feeds(6, 2.5)),
                                   ("rows-loop", rows_loop_feeds(3, 1e9)),
                                   ("nested", nested_feeds(3, 2)), ("nested", nested_feeds(2, 0)))):
        bundle = exported(tmp_path_factory, kind)[1]
        assert_bit_identical(build, bundle, f, tmp_path / f"s{k}")
        assert_bit_identical(asan, bundle, f, tmp_path / f"s{k}a", threads=(1,), env=ASAN)
    for change in DAMAGE:
        path = damaged_bytecode(bundles[0], tmp_path / f"{change}.mlc", change)
        proc = mlcrun(asan, "inspect", path, env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 3 and "invalid bytecode" in line, (change, line)


def test_row_stores_bit_identical_and_damaged_stores_refused(build, asan, tmp_path_factory,
                                                            tmp_path) -> None:
    """Format 1.9's row stores (tests/export/test_run_time_loops.py's "stored" bundle: a Loop on
    a fed trip count whose two scan outputs have no bound at export): bit-identical to the
    Python runtime at 0, 1, 7 and 40 rows and 2**63 - 1 stopped by a break, at 1 and 2 threads
    and under the sanitizers (the stores grow by doubling, freed at close); a loop past the
    rows' cap refused with the input-error code; ONNX's test_loop11 (a Slice by the iteration
    number) bit-identical at 0, 3 and 5 iterations and refused at 6 (TRAP 2: a carried value
    that changes shape) with the input-error code; damaged stores (an APPEND into an arena row,
    of a row of another shape, a COPY reading a STORE row) refused at load with the
    bundle-error code, in one line."""
    from loop_models import (STORE_DAMAGE, damaged_bytecode, exported, loop11_feeds,
                             stored_feeds)

    bundle = exported(tmp_path_factory, "stored")[1]
    for k, (m, lim) in enumerate(((0, 1e9), (1, 1e9), (7, 1e9), (40, 1e9),
                                  ((1 << 63) - 1, 30.0))):
        f = stored_feeds(m, lim, seed=k)
        assert_bit_identical(build, bundle, f, tmp_path / f"c{k}")
        assert_bit_identical(asan, bundle, f, tmp_path / f"a{k}", threads=(1,), env=ASAN)
    open_bundle = exported(tmp_path_factory, "stored-open")[1]   # planned per shape
    for k, (m, lim, n) in enumerate(((9, 5.0, 2), (30, 1e9, 3))):
        f = stored_feeds(m, lim, seed=k, n=n)
        assert_bit_identical(build, open_bundle, f, tmp_path / f"o{k}")
        assert_bit_identical(asan, open_bundle, f, tmp_path / f"o{k}a", threads=(1,), env=ASAN)
    for i, v in enumerate(stored_feeds(41).values()):
        np.save(tmp_path / f"m{i}.npy", v)
    proc = mlcrun(asan, "run", bundle, *[tmp_path / f"m{i}.npy" for i in range(3)], "-o",
                  tmp_path / "mo", env=ASAN)
    assert proc.returncode == 7 and "would pass its cap" in one_line_error(proc)
    # test_loop11: a Slice by the iteration number, a carried extent checked at run time
    loop11 = exported(tmp_path_factory, "loop11")[1]
    for m in (0, 3, 5):
        f = loop11_feeds(m)
        assert_bit_identical(build, loop11, f, tmp_path / f"l{m}")
        assert_bit_identical(asan, loop11, f, tmp_path / f"l{m}a", threads=(1,), env=ASAN)
    for i, v in enumerate(loop11_feeds(6).values()):
        np.save(tmp_path / f"e{i}.npy", v)
    proc = mlcrun(asan, "run", loop11, *[tmp_path / f"e{i}.npy" for i in range(3)], "-o",
                  tmp_path / "eo", env=ASAN)
    assert proc.returncode == 7 and "changes shape between iterations" in one_line_error(proc)
    for change in STORE_DAMAGE:
        path = damaged_bytecode(bundle, tmp_path / f"{change}.mlc", change)
        proc = mlcrun(asan, "inspect", path, env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 3 and ("APPEND" in line or "STORE" in line), (change, line)


def test_grown_values_bit_identical_and_damaged_grows_refused(build, asan, tmp_path_factory,
                                                              tmp_path) -> None:
    """Format 1.10's carried values that grow (tests/export/test_run_time_loops.py's "grown"
    bundle: a greedy decode appending a token, a hidden-state row and a counted number of
    values each iteration to carried values only a Concat reads): bit-identical to the Python
    runtime at 0, 1, 5 and 40 iterations and 2**63 - 1 stopped by a break, prompts of 1 to 3
    tokens, at 1 and 2 threads and under the sanitizers; a loop past a value's cap refused with
    the input-error code; damaged grows (a multi-row APPEND to a store not in grows, a grows
    entry that is an arena row, a multi-row APPEND of another shape) refused at load with the
    bundle-error code, in one line."""
    from loop_models import GROWN_DAMAGE, damaged_grows, exported, grown_feeds

    bundle = exported(tmp_path_factory, "grown")[1]
    for k, (m, lim, t) in enumerate(((0, 1e9, 2), (1, 1e9, 1), (5, 1e9, 3), (40, 1e9, 2),
                                     ((1 << 63) - 1, 0.5, 2))):
        f = grown_feeds(m, lim, seed=k, t=t, k=1 + k % 2)
        assert_bit_identical(build, bundle, f, tmp_path / f"c{k}")
        if k in (0, 2, 4):
            assert_bit_identical(asan, bundle, f, tmp_path / f"a{k}", threads=(1,), env=ASAN)
    for i, v in enumerate(grown_feeds(100).values()):   # hist passes its 64 rows
        np.save(tmp_path / f"m{i}.npy", v)
    proc = mlcrun(asan, "run", bundle, *[tmp_path / f"m{i}.npy" for i in range(5)], "-o",
                  tmp_path / "mo", env=ASAN)
    assert proc.returncode == 7 and "would grow past its cap" in one_line_error(proc)
    for change in GROWN_DAMAGE:
        path = damaged_grows(bundle, tmp_path / f"{change}.mlc", change)
        proc = mlcrun(asan, "inspect", path, env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 3 and ("APPEND" in line or "grows" in line), (change, line)
    # tests/fuzzing.py aimed at the loop: APPEND words rewritten, its vm record, STORE rows and
    # run-time sizes mutated (bench/fuzz_bundle.py --loops runs thousands)
    import fuzzing

    seed = fuzzing.make_seed(bundle, grown_feeds(5, seed=1))
    paths, rng = fuzzing.loop_paths(seed.header), random.Random(37)
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(ASAN)
    outcomes: dict[str, int] = {}
    for i in range(16):
        case = None
        while case is None:
            case = (fuzzing.random_append_case(seed, rng) if i % 2
                    else fuzzing.random_header_case(seed, rng, paths))
        got = fuzzing.check_c(seed, case, tmp_path / "case.mlc", asan / "mlcrun", env)
        outcomes[got] = outcomes.get(got, 0) + 1
    assert outcomes.get("exit 3", 0) >= 8, outcomes


def test_carried_values_the_body_reads_bit_identical(build, asan, tmp_path_factory,
                                                    tmp_path) -> None:
    """A decoder loop whose body reads carried values that grow (a KV cache along its third
    axis, two heads before it), shrink (a queue to empty) or are recomputed at a counted size
    (tests/export/test_run_time_loops.py's "kv" bundle: BIND_SIZE of each ``carriedK`` inside
    the body, a kernel copying each new value into its state): bit-identical to the Python
    runtime at 0, 1, 5, 7 and 40 iterations and 2**63 - 1 stopped by a break, at
    1 and 2 threads and under the sanitizers; a loop past the cache's bound refused with the
    input-error code in one line."""
    from loop_models import exported, kv_feeds

    bundle = exported(tmp_path_factory, "kv")[1]
    cases = ((0, 1e9, 0, 2, 3, 1), (1, 1e9, 1, 1, 2, 2), (5, 1e9, 2, 3, 3, 1),
             (40, 1e9, 3, 2, 5, 4), (7, 1e9, 4, 1, 1, 1), ((1 << 63) - 1, 2.0, 4, 3, 2, 2))
    for k, (m, lim, seed, p, q, n) in enumerate(cases):
        f = kv_feeds(m, lim, seed=seed, p=p, q=q, s=n)
        assert_bit_identical(build, bundle, f, tmp_path / f"c{k}")
        if k in (2, 3, 5):
            assert_bit_identical(asan, bundle, f, tmp_path / f"a{k}", threads=(1,), env=ASAN)
    for i, v in enumerate(kv_feeds(100).values()):   # the cache passes its 64 rows
        np.save(tmp_path / f"m{i}.npy", v)
    proc = mlcrun(asan, "run", bundle, *[tmp_path / f"m{i}.npy" for i in range(7)], "-o",
                  tmp_path / "mo", env=ASAN)
    assert proc.returncode == 7 and "grown past its cap" in one_line_error(proc)


class _Tensor(ctypes.Structure):   # mlcrt.h's mlc_tensor
    _fields_ = [("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int), ("dims", ctypes.c_int64 * 16)]


def test_row_store_output_buffer_too_small_names_the_bytes(build, tmp_path_factory) -> None:
    """mlc_run on a row store's output (format 1.9) whose buffer is smaller than this run's
    rows: the usage code and a message naming the rows and the bytes needed; with that many
    bytes the same run gives the Python runtime's rows and dims."""
    from loop_models import exported, stored_feeds

    bundle = exported(tmp_path_factory, "stored")[1]
    feeds = stored_feeds(7, 1e9, seed=3)
    with load(bundle) as model:
        want = model.run(feeds)
    lib = ctypes.CDLL(str(build / "libmlcrt.so"))
    lib.mlc_open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p]
    lib.mlc_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p]
    lib.mlc_close.argtypes = [ctypes.c_void_p]
    err = ctypes.create_string_buffer(600)
    model = ctypes.c_void_p()
    assert lib.mlc_open_file(str(bundle).encode(), None, ctypes.byref(model), err) == 0
    arrays = [np.array(v, order="C") for v in feeds.values()]   # 0-d stays 0-d
    inputs = (_Tensor * 3)()
    for t, a in zip(inputs, arrays):
        t.data, t.nbytes, t.ndim = a.ctypes.data, a.nbytes, a.ndim
        t.dtype = {"int64": 6, "float32": 0}[a.dtype.name]
        t.dims[:a.ndim] = a.shape
    try:
        for rows_bytes in (3 * 12, 7 * 12):
            out = [np.zeros(3, np.float32), np.zeros(rows_bytes // 4, np.float32),
                   np.zeros(7, np.int64)]
            outputs = (_Tensor * 3)()
            for t, a in zip(outputs, out):
                t.data, t.nbytes = a.ctypes.data, a.nbytes
            rc = lib.mlc_run(model, inputs, 3, outputs, 3, err)
            message = err.raw[4:].split(b"\0")[0].decode()
            if rows_bytes < 7 * 12:
                assert rc == 2 and "'rows' has 7 rows this run and needs a buffer of 84 bytes" \
                    in message, (rc, message)
                continue
            assert rc == 0, message
            assert list(outputs[1].dims[:outputs[1].ndim]) == [7, 3]
            assert out[1].reshape(7, 3).tobytes() == want["rows"].tobytes()
            assert out[2].tobytes() == want["iters"].tobytes()
    finally:
        lib.mlc_close(model)


# ---- Ed25519 signatures (vendored Monocypher) --------------------------------------------------

def test_signatures(asan, tmp_path) -> None:
    pytest.importorskip("cryptography")
    import copy

    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.signing import generate_key

    rng = np.random.default_rng(21)
    weights = {"w0": rng.standard_normal((4, 6)).astype(np.float32),
               "b0": rng.standard_normal(4).astype(np.float32)}
    good, good_pub, fp = generate_key(tmp_path / "good.pem")
    _, other_pub, _ = generate_key(tmp_path / "other.pem")
    paths = {}
    for name, key in (("signed", good), ("unsigned", None)):
        paths[name] = tmp_path / f"{name}.mlc"
        export_module(build_from_spec(infer_mlp_spec(weights), weights, None), paths[name],
                      ExportOptions(sign_key=key, check=True))
    header, payloads = read_parts(paths["signed"])
    h = copy.deepcopy(header)
    h["signature"]["sig"] = bytes([h["signature"]["sig"][0] ^ 1]) + h["signature"]["sig"][1:]
    paths["tampered"] = tmp_path / "tampered.mlc"
    paths["tampered"].write_bytes(pack(h, payloads))
    changed = list(payloads)
    changed[0] = bytes([changed[0][0] ^ 0x40]) + changed[0][1:]
    paths["weights"] = tmp_path / "weights.mlc"
    paths["weights"].write_bytes(pack(header, changed))
    raw = tmp_path / "good.raw"
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_public_key(good_pub.read_bytes())
    raw.write_bytes(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    for trusted in (good_pub, raw):
        proc = mlcrun(asan, "verify", paths["signed"], "--trusted-key", trusted, env=ASAN)
        assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stderr
    assert mlcrun(asan, "verify", paths["signed"], env=ASAN).returncode == 0  # no keys: no check
    cases = [("unsigned", good_pub, "is not signed"),
             ("signed", other_pub, f"signed by key {fp}, which is not one of the trusted"),
             ("tampered", good_pub, "does not verify"), ("weights", good_pub, "does not verify")]
    for name, trusted, words in cases:
        proc = mlcrun(asan, "verify", paths[name], "--trusted-key", trusted, env=ASAN)
        line = one_line_error(proc)
        assert proc.returncode == 12 and words in line, (name, line)


# ---- AArch64: cross-built, run under qemu-user beside the Python runtime under qemu ------------

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64-static")


@pytest.mark.skipif(not HOST_X86, reason="cross-builds from an x86-64 host")
@pytest.mark.skipif(CROSS is None or QEMU is None, reason="needs Debian's gcc-aarch64-linux-gnu "
                    "and qemu-user-static (apt-get install gcc-aarch64-linux-gnu "
                    "qemu-user-static)")
def test_aarch64_cross_build_under_qemu(mlp_weights, tmp_path, monkeypatch) -> None:
    """`make aarch64` (static, so qemu needs no arm64 libc), then the demo CNN (aarch64) and the
    MLP with every kernel split over threads (aarch64+dotprod; 1 and 2 threads: the hand-off
    code's atomics under the C workers) give the bytes the Python runtime gives under qemu."""
    from arm64_root import arm64_root_or_fail, run_bundles
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    from conftest import ROOT
    from helpers import force_parallel_kernels

    _make("aarch64")
    # SHA-256 both ways (qemu's CPU has the SHA2 extension) against hashlib
    data = np.random.default_rng(3).integers(0, 256, 70001, dtype=np.uint8).tobytes()
    (tmp_path / "d").write_bytes(data)
    paths = set()
    for mode in ("sha256c", "sha256"):
        out = subprocess.run([QEMU, CDIR / "build-aarch64" / "test_units", mode, tmp_path / "d"],
                             capture_output=True, text=True, timeout=60).stdout.split()
        assert out[0] == hashlib.sha256(data).hexdigest(), (mode, out)
        paths.add(out[1])
    assert paths == {"c", "accel"}
    root = arm64_root_or_fail()
    rng = np.random.default_rng(7)
    force_parallel_kernels(monkeypatch)
    cnn, _ = import_onnx(str(ARTIFACTS / "cnn.onnx"))
    jobs = {"cnn": (cnn, "aarch64", {"x": rng.random((1, 1, 28, 28), dtype=np.float32)}),
            "mlp": (build_from_spec(infer_mlp_spec(mlp_weights), mlp_weights, None),
                    "aarch64+dotprod", {"x": rng.random((1, 784), dtype=np.float32)})}
    bundles = {}
    for name, (mod, level, feeds) in jobs.items():
        path = tmp_path / f"{name}.mlc"
        export_module(mod, path, ExportOptions(target=level))
        bundles[name] = (path, feeds)
    bundles["mlp-2"] = bundles["mlp"]
    report, python = run_bundles(root, tmp_path, ROOT, bundles, threads={"mlp-2": 2})
    assert report["machine"] == "aarch64"
    for name, (path, feeds) in bundles.items():
        x = next(iter(feeds.values()))
        np.save(tmp_path / "x.npy", x)
        threads = "2" if name == "mlp-2" else "1"
        proc = subprocess.run([QEMU, CDIR / "build-aarch64" / "mlcrun", "run", path,
                               tmp_path / "x.npy", "-o", tmp_path / name, "--threads", threads],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        got = np.load(tmp_path / name / "out0.npy")
        want = next(iter(python[name].values()))
        assert got.tobytes() == want.tobytes(), name
    proc = subprocess.run([QEMU, CDIR / "build-aarch64" / "mlcrun", "inspect", bundles["mlp"][0]],
                          capture_output=True, text=True, timeout=60)
    assert "code aarch64+dotprod (aarch64" in proc.stdout, proc.stdout + proc.stderr
