"""The typed bundle header (runtime/header.py) and 64-bit payload areas (format 1.4).

The exporter builds a ``Header`` and the writer packs ``Header.to_msgpack()``; these tests check
that this changes no bundle (formats 1.0-1.3: the typed header reproduces the file's head byte for
byte, and writing the decoded map through the writer's map path, the path every bundle took
before the types existed, gives the same file), that every record is validated with one
BundleError naming the field, and that a payload area past 4 GiB (a sparse file, never read in
full) is read at offsets above 2**32.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from pathlib import Path

import msgpack
import numpy as np
import onnx
import pytest
from bundle_parts import pack, read_parts, write_parts
from helpers import onnx_mlp

from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager import bundle_writer
from mlcpack.packager.bundle_writer import BundleWriter, head_bytes
from mlcpack.packager.export import ExportOptions, export_batched, export_module
from mlcpack.frontends.reference import onnx_reference
from mlcpack.runtime.bundle import (DATA_KEY, DIGEST_ALG, DIGEST_KEY, MAGIC, BundleReader,
                                    PayloadRef, check_disjoint, content_digest, payload_ref,
                                    tree_leaves)
from mlcpack.runtime.describe import describe
from mlcpack.runtime.errors import BundleError, FormatVersionError
from mlcpack.runtime.header import Header, PayloadArea
from mlcpack.runtime.model import load

RNG = np.random.default_rng(13)
W1 = (RNG.standard_normal((16, 8)) * 0.3).astype(np.float32)
B1 = RNG.standard_normal(8).astype(np.float32)
W2 = (RNG.standard_normal((4, 8)) * 0.3).astype(np.float32)
B2 = RNG.standard_normal(4).astype(np.float32)
LABELS = ["a", "b", "c", "d"]
PREPROCESS = {"size": [4, 4], "color": "gray", "scale": 1 / 255, "mean": [0.5], "std": [0.25],
              "layout": "NCHW"}


def _onnx_mlp(batch: int | str) -> onnx.ModelProto:
    return onnx_mlp(W1, B1, W2, B2, batch)


def _numpy_mlp(x: np.ndarray) -> np.ndarray:
    y = np.maximum(x @ W1 + B1, 0) @ W2.T + B2
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _mod(batch: int | str):
    shapes = None if isinstance(batch, str) else {"x": [batch, 16]}
    return import_onnx(_onnx_mlp("n"), input_shapes=shapes)[0]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """One bundle of each kind the exporter writes: formats 1.0 (plain; golden), 1.1 (dynamic
    batch), 1.2 (tree digest) and 1.3 (symbolic shapes; with golden)."""
    folder = tmp_path_factory.mktemp("header")
    out = {name: folder / f"{name}.mlc" for name in
           ("plain", "golden", "batch", "batch_golden", "tree", "symbolic", "symbolic_golden")}
    host = dict(target="host", labels=LABELS, preprocess=PREPROCESS)
    export_module(_mod(1), out["plain"], ExportOptions(**host, model_name="plain"))
    export_module(_mod(1), out["golden"], ExportOptions(target="host", check=True))
    export_batched({b: _mod(b) for b in (1, 4, 8)}, out["batch"], ExportOptions(target="host"))
    export_batched({b: _mod(b) for b in (1, 4)}, out["batch_golden"],
                   ExportOptions(target="host", check=True))
    with pytest.MonkeyPatch.context() as mp:   # a tree digest without an 8 MiB model
        mp.setattr(bundle_writer, "TREE_MIN_BYTES", 0)
        mp.setattr(bundle_writer, "TREE_CHUNK", 1 << 12)
        export_module(_mod(1), out["tree"], ExportOptions(target="host"))
    export_module(_mod("n"), out["symbolic"], ExportOptions(target="host"))
    # The IR's own numpy reference plans no symbolic shapes: onnxruntime makes this pair.
    ref, ref_name = onnx_reference(_onnx_mlp("n").SerializeToString(), {"x": "x"})
    export_module(_mod("n"), out["symbolic_golden"],
                  ExportOptions(target="host", check=True, reference=ref,
                                reference_name=ref_name))
    return out


KINDS = ["plain", "golden", "batch", "batch_golden", "tree", "symbolic", "symbolic_golden"]
PLAN = ["inputs", "outputs", "preprocess", "labels", "constants", "kernels", "code",
        "library_calls", "tensors", "vm", "memory_plan"]
TOP = {  # the top-level keys, in the order the writer wrote them before the typed header
    "plain": ["format", "min_reader", "compiler", "model", *PLAN, "ir", "pad"],
    "golden": ["format", "min_reader", "compiler", "model", *PLAN, "ir", "golden", "pad"],
    "batch": ["format", "min_reader", "compiler", "model", *PLAN, "ir", "batch", "plans", "pad"],
    "batch_golden": ["format", "min_reader", "compiler", "model", *PLAN, "ir", "batch", "plans",
                     "golden", "pad"],
    "tree": ["format", "min_reader", "compiler", "model", *PLAN, "ir", "digest", "pad"],
    "symbolic": ["format", "min_reader", "compiler", "model", *PLAN, "symbolic", "ir", "pad"],
    "symbolic_golden": ["format", "min_reader", "compiler", "model", *PLAN, "symbolic", "ir",
                        "golden", "pad"],
}
FORMATS = {"plain": ([1, 2], [1, 0]), "golden": ([1, 2], [1, 0]), "batch": ([1, 2], [1, 0]),
           "batch_golden": ([1, 2], [1, 0]), "tree": ([1, 2], [1, 2]),
           "symbolic": ([1, 3], [1, 3]), "symbolic_golden": ([1, 3], [1, 3])}


@pytest.mark.parametrize("kind", KINDS)
def test_typed_header_reproduces_the_file(bundles, kind) -> None:
    """from_msgpack(to_msgpack(h)) == h, and to_msgpack() packs to the file's own head."""
    path = bundles[kind]
    with BundleReader(path) as reader:
        raw = reader.header
        h = Header.from_msgpack(raw, reader.data_size, reader.name)
        again = h.to_msgpack()
        assert Header.from_msgpack(again, reader.data_size) == h
        assert list(again) == TOP[kind] == list(raw)
        assert [raw["format"], raw["min_reader"]] == list(FORMATS[kind])
        head = path.read_bytes()[:reader.header_end]
        assert head == MAGIC + msgpack.packb(again, use_bin_type=True)
    # The records' own key order, as before (the byte check above covers the values).
    top = h.plan
    assert list(top.kernels[0].to_msgpack())[:6] == ["name", "symbol", "num_inputs",
                                                     "num_outputs", "workspace_bytes", "parallel"]
    assert list(top.code[0].to_msgpack()) == ["arch", "level", "features", "triple", "cpu",
                                              "llvm_features", "object", "externals",
                                              "code_sizes"]
    assert list(top.inputs[0].to_msgpack()) == ["name", "shape", "dtype", "tensor", "views"]
    assert (h.batch is not None) == kind.startswith("batch")
    assert len(h.plans) == {"batch": 3, "batch_golden": 2}.get(kind, 1)
    if h.golden is not None:
        assert list(h.golden.to_msgpack()) == ["inputs", "outputs", "rtol", "atol", "reference",
                                               "seed"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_map_path_writes_the_same_bytes(bundles, kind, tmp_path) -> None:
    """The decoded header written as a plain map (how every bundle was written before the
    typed header) gives the identical file; and the bundle runs as the numpy MLP does."""
    header, payloads = read_parts(bundles[kind])
    again = write_parts(tmp_path / "again.mlc", header, payloads)  # "digest" kept as given
    assert again.read_bytes() == bundles[kind].read_bytes()
    x = RNG.standard_normal((4 if kind.startswith(("batch", "symbolic")) else 1, 16),
                            dtype=np.float32)
    with load(bundles[kind]) as model:
        assert model.schema.format == tuple(FORMATS[kind][0])
        if kind == "plain":
            assert model.labels == LABELS and model.preprocess == PREPROCESS
        np.testing.assert_allclose(model.run({"x": x})["p"], _numpy_mlp(x), rtol=1e-5,
                                   atol=1e-6)


def _header(bundles, kind: str) -> tuple[dict, int]:
    with BundleReader(bundles[kind]) as reader:
        return copy.deepcopy(reader.header), reader.data_size


@pytest.mark.parametrize("kind, where, value, message", [
    ("plain", ("kernels", 0, "num_inputs"), -1, "kernel 0 num_inputs"),
    ("plain", ("kernels", 0, "parallel"), "yes", "kernel 0 has a flag"),
    ("plain", ("constants", 0, "data", "offset"), 3, "constant 0 is not 64-byte aligned"),
    ("plain", ("constants", 0, "dtype"), "complex64", "constant 0 has an unsupported dtype"),
    ("plain", ("code", 0, "object"), {"offset": 0, "size": 64}, "overlap"),
    ("plain", ("tensors", 0), [0, 0, [2], "float32", 9], "tensor 0 is malformed"),
    ("plain", ("inputs", 0, "tensor"), 999, "inputs[0] tensor"),
    ("plain", ("memory_plan", "arena_bytes"), -5, "memory plan has no valid arena size"),
    ("plain", ("vm", "bytecode", "size"), 1 << 40, "bytecode points past the end"),
    ("plain", ("ir",), "text", "IR text is not a payload record"),
    ("plain", ("labels",), "abcd", "labels must be a list"),
    ("plain", ("digest",), {"alg": "md5", "chunk": 4096}, "digest record is invalid"),
    ("batch", ("plans", 0, "batch"), 2, "plan batch sizes"),
    ("batch", ("plans", 2, "inputs", 0, "shape"), [7, 16], "top-level plan differs"),
    ("batch", ("batch", "outputs"), [], "output 'p' of the batch-1 plan does not have the"),
    ("symbolic", ("symbolic", "buffers", 0), [1, 2], "symbolic buffer 0 is malformed"),
    ("symbolic", ("inputs", 0, "shape", 0), ["?", "n"], "malformed dim record"),
    ("golden", ("golden", "rtol"), -1, "golden rtol is not a valid tolerance"),
    ("golden", ("golden", "outputs", 0, "shape"), [-1], "golden output 0 has an invalid shape"),
])
def test_every_record_is_checked_up_front(bundles, kind, where, value, message) -> None:
    raw, size = _header(bundles, kind)
    obj = raw
    for key in where[:-1]:
        obj = obj[key]
    obj[where[-1]] = value
    with pytest.raises(BundleError, match=re.escape(message)) as info:
        Header.from_msgpack(raw, size, "m.mlc")
    assert "\n" not in str(info.value)


def test_format_1_4_payload_after_the_map(bundles, tmp_path) -> None:
    """The 4 GiB layout, forced on a small bundle: "data" is empty, the area follows the map at
    the header's offset; it loads with its digest checked and runs; readers that do not know
    the record refuse it by its version."""
    header, payloads = read_parts(bundles["plain"])
    writer = BundleWriter(payload64_min_bytes=0)
    for data in payloads:
        writer.add(data)
    path = tmp_path / "large.mlc"
    size = writer.write(path, header)
    blob = path.read_bytes()
    assert size == len(blob)
    with BundleReader(path) as reader:
        h = Header.from_msgpack(reader.header, reader.data_size)
        assert h.format == (1, 4) and h.min_reader == (1, 4)
        assert h.payload == PayloadArea(reader.data_start, sum(len(p) + -len(p) % 64
                                                               for p in payloads))
        assert blob[reader.data_start - 4:reader.data_start] == bytes(4)  # bin32 of length 0
        assert reader.data_start % 64 == 0 and reader.data_start + h.payload.size == len(blob)
    x = RNG.standard_normal((1, 16), dtype=np.float32)
    with load(path) as model:
        np.testing.assert_allclose(model(x), _numpy_mlp(x), rtol=1e-5, atol=1e-6)
    assert describe(path)["format"] == "1.4"
    # A damaged record, or the record missing (a reader of 1.2 knows no "payload"), is refused.
    at = blob.index(b"\xa6offset", blob.index(b"\xa7payload")) + 7   # the offset's int type
    width = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}[blob[at]]
    moved = bytearray(blob)
    moved[at + width] ^= 0x40    # the offset 64 bytes off
    (tmp_path / "moved.mlc").write_bytes(bytes(moved))
    with pytest.raises(BundleError, match="invalid payload area record"):
        load(tmp_path / "moved.mlc", verify=False)
    bare = {k: v for k, v in header.items() if k != "payload"}
    bare.update(format=[1, 4], min_reader=[1, 4])
    (tmp_path / "bare.mlc").write_bytes(pack(bare, payloads))
    with pytest.raises(FormatVersionError, match=r"format 1\.4 and needs a runtime"):
        load(tmp_path / "bare.mlc")


def test_payload_area_past_4_gib_is_read_in_place(bundles, tmp_path) -> None:
    """A format-1.4 bundle with a 4 GiB + 64 B payload area, made sparse with truncate: the
    plain bundle's payloads first, then a hole, then one more constant at offset 2**32. The
    constant is checked by payload_ref, viewed through the mapping and its chunk of the tree
    digest hashed, and the model loads and runs, all without reading the 4 GiB."""
    chunk, big = 1 << 20, 1 << 32
    area = big + 64
    header, payloads = read_parts(bundles["plain"])
    body = b"".join(p + bytes(-len(p) % 64) for p in payloads)
    assert len(body) < chunk
    high = np.arange(16, dtype=np.float32) * 2 + 0.25
    header.update(format=[1, 4], min_reader=[1, 4], digest={"alg": DIGEST_ALG, "chunk": chunk})
    header["constants"].append({"name": "high", "shape": [16], "dtype": "float32",
                                "data": {"offset": big, "size": 64}})
    head = head_bytes(header, area)
    first = hashlib.sha256(body + bytes(chunk - len(body))).digest()
    zero = hashlib.sha256(bytes(chunk)).digest()
    last = hashlib.sha256(high.tobytes()).digest()
    leaves = first + zero * (big // chunk - 1) + last
    digest = content_digest(head, [leaves])
    start = len(head) + len(DIGEST_KEY) + 32 + len(DATA_KEY) + 4
    path = tmp_path / "sparse.mlc"
    with open(path, "wb") as f:
        f.write(head + DIGEST_KEY + digest + DATA_KEY + bytes(4))
        f.write(body)
        f.truncate(start + area)
        f.seek(start + big)
        f.write(high.tobytes())
    assert os.path.getsize(path) == start + area
    with BundleReader(path, verify=False) as reader:
        assert reader.data_start == start and reader.data_size == area
        h = Header.from_msgpack(reader.header, reader.data_size, reader.name)
        assert h.payload == PayloadArea(start, area) and h.format == (1, 4)
        ref = h.constants[-1].data
        assert ref == PayloadRef(big, 64) == payload_ref({"offset": big, "size": 64}, "c", area)
        np.testing.assert_array_equal(reader.array(ref, (16,), "float32"), high)
        # The tree digest's chunks past 2**32, hashed from the mapping (the last two chunks).
        tail = reader.payload(PayloadRef(big - chunk, chunk + 64))
        assert tree_leaves([tail], chunk) == zero + last
        tail.release()
        head_view = reader.payload(PayloadRef(0, chunk))
        assert tree_leaves([head_view], chunk) == first
        head_view.release()
        # The reader's digest over the head it reads, with those leaves (the 4094 chunks in
        # between are zero: truncate wrote no byte there).
        reader._leaves = leaves
        assert reader.content_digest() == digest
        with pytest.raises(BundleError, match="past the end"):
            payload_ref({"offset": big, "size": 128}, "c", area)
        with pytest.raises(BundleError, match="overlap"):
            check_disjoint([("a", PayloadRef(big, 64)), ("b", PayloadRef(big + 32, 64))], "m")
    x = RNG.standard_normal((1, 16), dtype=np.float32)
    with load(path, verify=False) as model:
        assert model.schema.constants[-1].data.offset == big
        np.testing.assert_allclose(model(x), _numpy_mlp(x), rtol=1e-5, atol=1e-6)


def test_the_writer_never_writes_a_header_the_runtime_refuses(bundles, tmp_path) -> None:
    """An export whose header would not validate (a compiler bug, as a dim record past the
    runtime's bounds once was) fails in one line and leaves no file."""
    import dataclasses

    from mlcpack.packager.bundle_writer import BundleWriteError, BundleWriter

    obj, size = _header(bundles, "plain")
    good = Header.from_msgpack(obj, size)
    bad = dataclasses.replace(good, labels=42)   # not a list: refused at load
    out = tmp_path / "bad.mlc"
    with pytest.raises(BundleWriteError, match="the runtime would refuse this bundle"):
        BundleWriter().write(out, bad)
    assert not out.exists()
