"""The rows of docs/bad-inputs.md that no other test file covers: malformed ONNX graphs, an empty
file, odd images, a full disk, huge declared lengths, a broken code object, and inputs that must
be refused (wrong name, rank) or computed (non-contiguous, NaN)."""

from __future__ import annotations

import copy
import errno
import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager import bundle_writer
from mlcpack.packager.export import ExportError
from mlcpack.runtime import load
from mlcpack.runtime.bundle import MAGIC, BundleReader
from mlcpack.runtime.errors import BundleError, CodeLoadError, InputError
from mlcpack.runtime.model import TensorSpec
from mlcpack.runtime.preprocess import load_input
from onnx import TensorProto, helper
from PIL import Image
from bundle_parts import payload_spans, read_parts, write_parts
from cli_in_process import run_cli_in_process

# ---- ONNX graphs the checker or the importer must refuse -----------------------------------------


def _onnx_model(nodes: list, outputs: tuple[str, ...] = ("y",)) -> onnx.ModelProto:
    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    graph = helper.make_graph(nodes, "g", [info("x")], [info(o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _relu(src: str, dst: str) -> onnx.NodeProto:
    return helper.make_node("Relu", [src], [dst])


ONNX_BAD_GRAPHS = {
    "cycle": (_onnx_model([_relu("b", "a"), _relu("a", "b"), helper.make_node("Add", ["x", "b"],
                                                                             ["y"])]),
              "topologically sorted"),
    "self-loop": (_onnx_model([helper.make_node("Add", ["x", "y"], ["y"])]),
                  "topologically sorted"),
    "dangling input": (_onnx_model([helper.make_node("Add", ["x", "nowhere"], ["y"])]),
                       "'nowhere'"),
    "duplicate node output": (_onnx_model([_relu("x", "y"), helper.make_node("Sigmoid", ["x"],
                                                                             ["y"])]),
                              "'y' has been used as output names multiple times"),
    "duplicate graph output": (_onnx_model([_relu("x", "y")], outputs=("y", "y")),
                               "lists graph output 'y' more than once"),
    "output no node makes": (_onnx_model([_relu("x", "z")]), "'y'"),
}


@pytest.mark.parametrize("case", list(ONNX_BAD_GRAPHS))
def test_malformed_onnx_graphs_are_refused(tmp_path: Path, case: str) -> None:
    model, words = ONNX_BAD_GRAPHS[case]
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(ExportError) as info:
        import_onnx(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("bad.onnx"), msg
    assert words in msg, msg


def test_truncated_onnx_is_refused(tmp_path: Path) -> None:
    data = _onnx_model([_relu("x", "y")]).SerializeToString()
    path = tmp_path / "cut.onnx"
    for n in (1, len(data) // 3, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:n])
        with pytest.raises(ExportError, match="^cut.onnx is not a valid ONNX") as info:
            import_onnx(path)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("case", ["cycle", "dangling input", "duplicate graph output"])
def test_cli_export_of_a_malformed_onnx(tmp_path, one_line_error, case) -> None:
    onnx.save(ONNX_BAD_GRAPHS[case][0], tmp_path / "bad.onnx")
    proc = run_cli_in_process("export", "bad.onnx", "-o", "bad.mlc", cwd=tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == ExportError.exit_code and "bad.onnx" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


@pytest.mark.parametrize(("name", "cls_code"), [("empty.onnx", ExportError.exit_code),
                                                ("empty.pkl", 9), ("empty.npz", 9)])
def test_cli_export_of_an_empty_file(tmp_path, one_line_error, name, cls_code) -> None:
    (tmp_path / name).write_bytes(b"")
    proc = run_cli_in_process("export", name, "-o", "out.mlc", cwd=tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == cls_code and name in line and "internal error" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


# ---- output paths that cannot be written -----------------------------------------------------


@pytest.fixture()
def small_weights(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "w.pkl"
    path.write_bytes(pickle.dumps({"w0": rng.standard_normal((3, 4)).astype(np.float32),
                                   "b0": np.zeros(3, np.float32)}))
    return path


def test_output_path_that_is_a_directory(tmp_path, small_weights, one_line_error
                                         ) -> None:
    (tmp_path / "out.mlc").mkdir()
    proc = run_cli_in_process("export", small_weights, "-o", "out.mlc", cwd=tmp_path)
    line = one_line_error(proc)
    # checked before any compile work: a usage error (2) that shows the file name to give
    assert proc.returncode == 2 and "out.mlc is a directory" in line
    assert (tmp_path / "out.mlc").is_dir()
    assert not list(tmp_path.glob(".mlcpack-*"))


class _FullDisk:
    """A file object that accepts ``room`` bytes, then fails like a full disk (ENOSPC)."""

    def __init__(self, f, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= n
        return self._f.write(data)

    def __getattr__(self, name: str):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


@pytest.mark.parametrize("room", [0, 100, 5000])
def test_full_disk_leaves_no_partial_bundle(tmp_path, monkeypatch, mlp_weights, export_weights,
                                            room) -> None:
    real_fdopen = os.fdopen
    monkeypatch.setattr(bundle_writer.os, "fdopen",
                        lambda fd, *a, **k: _FullDisk(real_fdopen(fd, *a, **k), room))
    old = tmp_path / "m.mlc"
    old.write_bytes(b"the previous bundle")
    with pytest.raises(ExportError) as info:
        export_weights(mlp_weights, old)
    msg = str(info.value)
    assert "No space left on device" in msg and "m.mlc" in msg and "\n" not in msg
    assert old.read_bytes() == b"the previous bundle"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlc"]


def test_cli_full_disk_is_one_line(tmp_path, small_weights, one_line_error) -> None:
    """The real command line with its writes failing after 64 bytes (injected: ENOSPC)."""
    code = ("import errno, os, sys\n"
            "real = os.fdopen\n"
            "class Full:\n"
            "    def __init__(self, f): self.f, self.room = f, 64\n"
            "    def write(self, b):\n"
            "        n = memoryview(b).nbytes\n"
            "        if n > self.room: raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
            "        self.room -= n; return self.f.write(b)\n"
            "    def __getattr__(self, k): return getattr(self.f, k)\n"
            "    def __enter__(self): return self\n"
            "    def __exit__(self, *e): self.f.close()\n"
            "os.fdopen = lambda fd, *a, **k: Full(real(fd, *a, **k))\n"
            "from mlcpack.packager.cli import main\n"
            "sys.argv = ['mlcpack', 'export', sys.argv[1], '-o', 'full.mlc']\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code, str(small_weights)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    line = one_line_error(proc)
    assert proc.returncode == ExportError.exit_code
    assert "No space left on device" in line and "full.mlc" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pkl"]


def test_real_full_tmpfs(tmp_path, paths, run_cli, one_line_error) -> None:
    """The demo MLP (400 KB) onto a real 64 KiB tmpfs, where this process may mount one (root on
    Linux); skipped otherwise."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", f"tmpfs-{uuid.uuid4().hex[:8]}",
                           str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        (mount / "filler").write_bytes(b"\0" * 16 * 1024)
        proc = run_cli("export", paths["mlp_pickle"], "-o", mount / "m.mlc", cwd=tmp_path)
        line = one_line_error(proc)
        assert proc.returncode == ExportError.exit_code and "No space left" in line
        assert sorted(p.name for p in mount.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


# ---- bundles with huge declared lengths, or a broken code object ---------------------------------


def test_huge_declared_lengths_are_refused(tmp_path, tiny_bundle_bytes) -> None:
    data = tiny_bundle_bytes
    path = tmp_path / "huge.mlc"
    cases = {
        # the payload area's bin32 length (the file's last 4-byte field before the payloads)
        "data length": None,
        "map32 header of 2**32-1 entries": MAGIC + b"\xdf\xff\xff\xff\xff" + data[len(MAGIC) + 1:],
        "array32 header": MAGIC + b"\xdd\xff\xff\xff\xff" + data[len(MAGIC) + 1:],
        "str32 header": MAGIC + b"\xdb\xff\xff\xff\xff" + data[len(MAGIC) + 1:],
        "bin32 header": MAGIC + b"\xc6\x7f\xff\xff\xff" + data[len(MAGIC) + 1:],
    }
    with BundleReader(_write(path, data)) as reader:
        start = reader.data_start
    cut = bytearray(data)
    cut[start - 4:start] = b"\xff\xff\xff\xff"
    cases["data length"] = bytes(cut)
    for what, blob in cases.items():
        path.write_bytes(blob)
        for verify in (True, False):
            with pytest.raises(BundleError) as info:
                load(path, verify=verify).close()
            assert "\n" not in str(info.value), what


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def tiny_bundle_bytes(tiny_bundle) -> bytes:
    return tiny_bundle.read_bytes()


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory, export_weights) -> Path:
    rng = np.random.default_rng(0)
    weights = {"w0": rng.standard_normal((5, 6)).astype(np.float32),
               "b0": rng.standard_normal(5).astype(np.float32)}
    return export_weights(weights, tmp_path_factory.mktemp("tinybad") / "tiny.mlc")


@pytest.mark.parametrize(("where", "value", "words"), [
    (("constants", 0, "data", "size"), 1 << 62, "past the end"),
    (("constants", 0, "shape"), [1 << 39, 1 << 39], "does not match"),
    (("memory_plan", "arena_bytes"), (1 << 40) - 64, ""),
    (("tensors", 0, 2), [1 << 39, 1 << 39], "outside its storage"),
    (("vm", "bytecode", "offset"), 1 << 60, "past the end"),
])
def test_huge_values_in_a_valid_header(tmp_path, tiny_bundle, where, value, words) -> None:
    header, payloads = read_parts(tiny_bundle)
    parent = header
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    path = write_parts(tmp_path / "big.mlc", header, payloads)
    try:
        load(path).close()  # only load+close: a mutated table is never run
    except BundleError as exc:
        assert words in str(exc) and "\n" not in str(exc), str(exc)
    else:
        assert where[0] == "memory_plan"  # a 1 TiB arena may be allocated lazily on some hosts


def test_garbage_code_object_is_a_code_load_error(tmp_path, tiny_bundle) -> None:
    header, payloads = read_parts(tiny_bundle)
    code = header["code"][0]["object"]
    refs = payload_spans(header)
    i = refs.index((code["offset"], code["size"]))
    for garbage in (b"\x7fELF" + b"\xff" * (code["size"] - 4), b"\0" * code["size"]):
        parts = list(payloads)
        parts[i] = garbage
        path = write_parts(tmp_path / "code.mlc", copy.deepcopy(header), parts)
        with pytest.raises(CodeLoadError) as info:
            load(path).close()
        assert "\n" not in str(info.value)


# ---- inputs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch_model(tmp_path_factory, mlp_weights, export_weights):
    path = export_weights(mlp_weights, tmp_path_factory.mktemp("batch") / "b.mlc",
                          input_shape=(8, 784))
    with load(path) as model:
        yield model


def test_wrong_input_name_rank_shape_dtype(batch_model) -> None:
    x = np.zeros((8, 784), np.float32)
    cases = [
        (lambda: batch_model.run({"image": x}), ["unknown: ['image']", "missing: ['x']"]),
        (lambda: batch_model.run({}), ["missing: ['x']"]),
        (lambda: batch_model(x.reshape(8 * 784)), ["rank 1", "rank 2"]),
        (lambda: batch_model(x.reshape(1, 8, 784)), ["rank 3"]),
        (lambda: batch_model(x[:4]), ["(4, 784)", "(8, 784)"]),
        (lambda: batch_model(x.astype(np.float64)), ["float64", "astype(np.float32)"]),
        (lambda: batch_model(x.astype(np.int32)), ["int32"]),
        (lambda: batch_model("a string"), ["dtype"]),
        (lambda: batch_model(x, x), ["takes 1 input(s), got 2"]),
        (lambda: batch_model(x, x=x), ["given twice"]),
    ]
    for call, words in cases:
        with pytest.raises(InputError) as info:
            call()
        msg = str(info.value)
        assert "\n" not in msg
        for w in words:
            assert w in msg, (w, msg)


def test_non_contiguous_inputs_are_computed_correctly(batch_model, mlp_weights, reference_mlp
                                                      ) -> None:
    rng = np.random.default_rng(7)
    x = rng.random((8, 784), dtype=np.float32)
    expected = batch_model(x)
    np.testing.assert_allclose(expected, reference_mlp(mlp_weights, x), rtol=1e-5, atol=1e-5)
    wide = np.zeros((8, 1568), np.float32)
    wide[:, ::2] = x
    views = {
        "strided": wide[:, ::2],
        "fortran": np.asfortranarray(x),
        "transposed twice": np.ascontiguousarray(x.T).T,
        "reversed rows": x[::-1][::-1],
        "read-only": np.frombuffer(x.tobytes(), np.float32).reshape(8, 784),
    }
    for what, view in views.items():
        assert not view.flags.c_contiguous or what == "read-only" or what == "reversed rows"
        np.testing.assert_array_equal(batch_model(view), expected, err_msg=what)


def test_nan_and_inf_inputs_are_computed_not_crashed(batch_model, mlp_weights, reference_mlp
                                                     ) -> None:
    rng = np.random.default_rng(8)
    x = rng.random((8, 784), dtype=np.float32)
    clean = batch_model(x)
    bad = x.copy()
    bad[3, 100] = np.nan
    bad[5, :] = np.inf
    out = batch_model(bad)
    assert out.shape == clean.shape and out.dtype == np.float32
    others = [i for i in range(8) if i not in (3, 5)]
    np.testing.assert_array_equal(out[others], clean[others])  # rows are independent
    assert not np.isfinite(out[3]).all()                        # NaN propagates to its row
    all_nan = batch_model(np.full((8, 784), np.nan, np.float32))
    assert all_nan.shape == clean.shape
    np.testing.assert_array_equal(batch_model(x), clean)     # nothing stays poisoned


# ---- images ----------------------------------------------------------------------------------

MLP_SPEC = TensorSpec("x", (1, 784), "float32", 0)
MLP_PRE = {"size": [28, 28], "color": "L", "scale": 1 / 255, "mean": [0.0], "std": [1.0],
           "layout": "flat"}


def test_sixteen_bit_png_matches_its_eight_bit_version(tmp_path, paths) -> None:
    with Image.open(paths["samples"] / "digit_7.png") as img:
        gray8 = np.asarray(img.convert("L"), dtype=np.uint16)
    # Scale to the full 16-bit range so the darkest/brightest pixels map back exactly.
    peak = max(int(gray8.max()), 1)
    png16 = tmp_path / "digit16.png"
    Image.fromarray((gray8.astype(np.uint32) * 65535 // peak).astype(np.uint16)).save(png16)
    with Image.open(png16) as img:
        assert img.mode.startswith("I")  # really a 16-bit image
    x16 = load_input(png16, MLP_SPEC, MLP_PRE)
    x8 = (gray8.astype(np.float32) / peak).reshape(1, 784)
    assert x16.shape == (1, 784) and x16.dtype == np.float32
    np.testing.assert_allclose(x16, x8, atol=1.5 / 255)


def test_rgba_png_for_a_grayscale_model(tmp_path, paths, mlp_bundle, run_cli) -> None:
    with Image.open(paths["samples"] / "digit_7.png") as img:
        gray = img.convert("L")
    rgba = gray.convert("RGBA")
    rgba.putalpha(200)
    path = tmp_path / "digit_rgba.png"
    rgba.save(path)
    x = load_input(path, MLP_SPEC, MLP_PRE)
    np.testing.assert_allclose(x, np.asarray(gray, np.float32).reshape(1, 784) / 255, atol=1e-6)
    proc = run_cli("infer", mlp_bundle[0], path, "-k", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "digit_rgba.png: 7"


@pytest.mark.parametrize("content", [b"", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"GIF89a junk",
                                     b"plain text\n" * 5])
def test_an_image_that_is_not_an_image(tmp_path, content) -> None:
    path = tmp_path / "fake.png"
    path.write_bytes(content)
    with pytest.raises(InputError, match="fake.png is not a readable image") as info:
        load_input(path, MLP_SPEC, MLP_PRE)
    assert "\n" not in str(info.value)


def test_npy_holding_pickled_objects_is_refused(tmp_path) -> None:
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="objects.npy is not a readable .npy file"):
        load_input(path, MLP_SPEC, MLP_PRE)

