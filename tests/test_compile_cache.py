"""The compiled-object cache (packager/codegen/cache.py, MLCPACK_CACHE_DIR): a hit gives the
same object without running LLVM, a damaged entry is a miss and is rewritten, the key
separates targets, and a bundle exported through the cache is byte-identical to one exported
without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen import build, cache
from mlcpack.packager.export import compile_module


def _model(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _compile(path: Path, target: str = "host"):
    mod, _ = import_onnx(str(path))
    return compile_module(mod, target=target)[1]


def _entries(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.obj"))


def test_hit_skips_llvm_and_gives_the_same_object(tmp_path, monkeypatch):
    onnx_path = _model(tmp_path / "m.onnx")
    monkeypatch.delenv(cache.ENV, raising=False)
    plain = _compile(onnx_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    first = _compile(onnx_path)
    assert len(_entries(tmp_path / "cache")) == 1
    assert first.object_code == plain.object_code and first.llvm_ir == plain.llvm_ir

    def no_llvm(*args, **kwargs):
        raise AssertionError("LLVM ran on a cache hit")
    monkeypatch.setattr(build.llvm, "parse_assembly", no_llvm)
    second = _compile(onnx_path)
    assert second.object_code == plain.object_code
    assert second.llvm_ir == plain.llvm_ir
    assert second.kernels.keys() == plain.kernels.keys()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_damaged_entry_is_a_miss_and_is_rewritten(tmp_path, monkeypatch, damage):
    onnx_path = _model(tmp_path / "m.onnx")
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    good = _compile(onnx_path).object_code
    (entry,) = _entries(tmp_path / "cache")
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-100] ^= 0x40      # inside the object or IR text: the digest no longer matches
    else:
        data = bytearray(b"not an entry")
    entry.write_bytes(bytes(data))
    assert cache.load(tmp_path / "cache", entry.stem) is None
    assert _compile(onnx_path).object_code == good
    assert cache.load(tmp_path / "cache", entry.stem) is not None   # rewritten whole


def test_key_separates_targets_and_modules(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    a = _compile(_model(tmp_path / "a.onnx", seed=0), "x86-64-v2")
    b = _compile(_model(tmp_path / "a.onnx", seed=0), "x86-64-v3")
    c = _compile(_model(tmp_path / "c.onnx", seed=1), "x86-64-v2")   # other weights
    assert len(_entries(tmp_path / "cache")) == 2   # weights are the bundle's constants, not
    assert a.object_code != b.object_code            # code: the same kernels, one entry
    assert c.object_code == a.object_code


def test_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv(cache.ENV, str(blocker))
    onnx_path = _model(tmp_path / "m.onnx")
    assert _compile(onnx_path).object_code


def test_cli_bundle_is_byte_identical_through_the_cache(tmp_path, run_cli):
    onnx_path = _model(tmp_path / "m.onnx")
    env_off = {cache.ENV: ""}
    env_on = {cache.ENV: str(tmp_path / "cache")}
    outs = []
    for i, env in enumerate((env_off, env_on, env_on)):   # miss, store; then hit
        out = tmp_path / f"m{i}.mlc"
        proc = run_cli("export", onnx_path, "-o", out, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(out.read_bytes())
    assert _entries(tmp_path / "cache")
    assert outs[0] == outs[1] == outs[2]
