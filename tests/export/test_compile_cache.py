"""The compiled-object cache (packager/codegen/cache.py): a hit gives the same object without
running LLVM, a damaged entry is a miss and is rewritten, the key separates targets, and a
bundle exported through the cache is byte-identical to one exported without it. On by default
in the user's cache directory (XDG_CACHE_HOME or ~/.cache), capped in size (least recently
used entries go first), off with ``export --no-cache``; ``export --timings`` says where the
time went, cache hits included. Tests that export through the real command point
MLCPACK_CACHE_DIR or HOME/XDG_CACHE_HOME at tmp_path: none writes into the user's cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_in_process import run_cli_in_process
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen import build, cache, parallel
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
    monkeypatch.setenv(cache.ENV, "off")
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
    env_off = {cache.ENV: "off"}
    env_on = {cache.ENV: str(tmp_path / "cache")}
    outs = []
    for i, env in enumerate((env_off, env_on, env_on)):   # miss, store; then hit
        out = tmp_path / f"m{i}.mlc"
        proc = run_cli("export", onnx_path, "-o", out, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(out.read_bytes())
    assert _entries(tmp_path / "cache")
    assert outs[0] == outs[1] == outs[2]


# ---- where the cache lives, its cap, and the command line's switches ----------------------------

def test_directory_choice():
    home = {"HOME": "/home/u"}
    assert cache.cache_dir(home) == Path("/home/u/.cache/mlcpack/objects")
    assert cache.cache_dir({**home, "XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/mlcpack/objects")
    # a relative XDG_CACHE_HOME is ignored, as the XDG spec says
    assert cache.cache_dir({**home, "XDG_CACHE_HOME": "rel"}) == Path("/home/u/.cache/mlcpack/objects")
    assert cache.cache_dir({**home, cache.ENV: "/elsewhere"}) == Path("/elsewhere")
    assert cache.cache_dir({**home, cache.ENV: "off"}) is None
    assert cache.cache_dir({**home, cache.ENV: ""}) is None
    assert cache.cache_dir({}) is None   # no home: no cache, no failure


def test_size_setting():
    assert cache.max_bytes({}) == cache.DEFAULT_MAX_BYTES
    assert cache.max_bytes({cache.SIZE_ENV: "500M"}) == 500 << 20
    assert cache.max_bytes({cache.SIZE_ENV: "2GiB"}) == 2 << 30
    assert cache.max_bytes({cache.SIZE_ENV: "1.5k"}) == 1536
    assert cache.max_bytes({cache.SIZE_ENV: "4096"}) == 4096
    for bad in ("lots", "-1M", "inf", "nan", "5X"):
        with pytest.raises(cache.CacheSettingError, match=cache.SIZE_ENV):
            cache.max_bytes({cache.SIZE_ENV: bad})


def _fake_entry(directory: Path, key: str, size: int, mtime: float) -> Path:
    path = directory / key[:2] / f"{key}.obj"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    import os
    os.utime(path, (mtime, mtime))
    return path


def test_trim_deletes_least_recently_used_down_to_the_low_water_mark(tmp_path):
    keys = [f"{i:02x}" + "0" * 62 for i in range(10)]
    paths = [_fake_entry(tmp_path, k, 1000, 1_000_000 + i) for i, k in enumerate(keys)]
    (tmp_path / "notes.txt").write_text("not an entry: never counted or deleted")
    assert cache.trim(tmp_path, 10_000) == 0   # at the cap: nothing to do
    assert cache.trim(tmp_path, 9_000) == 3000   # over: down to 0.8 x 9000 = 7200 bytes
    assert [p.exists() for p in paths] == [False] * 3 + [True] * 7
    assert (tmp_path / "notes.txt").exists()
    # the newest entry stays even when it alone is over the cap
    assert cache.trim(tmp_path, 10) == 6000
    assert [p.exists() for p in paths] == [False] * 9 + [True]


def test_a_hit_marks_its_entry_recently_used(tmp_path, monkeypatch):
    import os
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    onnx_path = _model(tmp_path / "m.onnx")
    _compile(onnx_path)
    (entry,) = _entries(tmp_path / "cache")
    os.utime(entry, (1_000_000, 1_000_000))
    assert cache.load(tmp_path / "cache", entry.stem) is not None
    assert entry.stat().st_mtime > 1_000_000


def _export(run_cli, onnx_path: Path, out: Path, env: dict, *args: str):
    proc = run_cli("export", onnx_path, "-o", out, "--target", "host", *args, env=env,
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_on_by_default_in_the_user_cache_directory(tmp_path):
    """No MLCPACK_CACHE_DIR: the entries go to $XDG_CACHE_HOME/mlcpack/objects, or without it to
    ~/.cache/mlcpack/objects (HOME and XDG_CACHE_HOME point into tmp_path here)."""
    import os
    import subprocess

    from conftest import MLCPACK_EXE
    onnx_path = _model(tmp_path / "m.onnx")
    base = {k: v for k, v in os.environ.items() if k not in (cache.ENV, "XDG_CACHE_HOME")}
    base["HOME"] = str(tmp_path / "home")
    for i, env in enumerate(({**base, "XDG_CACHE_HOME": str(tmp_path / "xdg")}, base)):
        proc = subprocess.run([str(MLCPACK_EXE), "export", str(onnx_path), "-o",
                               str(tmp_path / f"{i}.mlc"), "--target", "host"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        if i == 0:
            assert len(_entries(tmp_path / "xdg" / "mlcpack" / "objects")) == 1
            assert not (tmp_path / "home").exists()
    assert len(_entries(tmp_path / "home" / ".cache" / "mlcpack" / "objects")) == 1


def test_no_cache_and_timings_through_the_command(tmp_path, run_cli):
    onnx_path = _model(tmp_path / "m.onnx")
    env = {cache.ENV: str(tmp_path / "cache")}
    outs = []
    procs = []
    for i, args in enumerate((["--no-cache"], [], [])):   # off; miss and store; hit
        out = tmp_path / f"m{i}.mlc"
        procs.append(_export(run_cli, onnx_path, out, env, "--timings", *args))
        outs.append(out.read_bytes())
        if i == 0:
            assert not (tmp_path / "cache").exists()
    assert outs[0] == outs[1] == outs[2]
    assert len(_entries(tmp_path / "cache")) == 1
    for proc, how in zip(procs, ("compiled", "compiled", "cache hit")):
        rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()
                if line.strip()}
        for stage in ("import", "golden", "passes", "codegen", "vm", "write", "total"):
            assert stage in rows, proc.stdout
        assert float(rows["total"][0]) >= float(rows["codegen"][0]) >= 0
        target = [v for k, v in rows.items() if k.startswith("x86-64") or k.startswith("aarch64")]
        assert len(target) == 1 and " ".join(target[0][1:]) == how, proc.stdout
        # a compile's CPU seconds per phase under its target; a hit spent none
        phases = [rows.get(p) for p in ("emit", "optimize", "object")]
        if how == "compiled":
            assert all(p is not None and float(p[-1]) >= 0 for p in phases), proc.stdout
            assert float(rows["optimize"][-1]) > 0, proc.stdout
        else:
            assert phases == [None] * 3, proc.stdout
    # without --timings, no table
    plain = _export(run_cli, onnx_path, tmp_path / "p.mlc", env)
    assert "export stage" not in plain.stdout and "export stage" in procs[0].stdout


def test_cap_through_the_command(tmp_path, run_cli):
    env = {cache.ENV: str(tmp_path / "cache"), cache.SIZE_ENV: "1"}
    a = _model(tmp_path / "a.onnx")
    b = tmp_path / "b.onnx"
    model = onnx.load(a)   # another module: other shapes
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    onnx.save(model, b)
    _export(run_cli, a, tmp_path / "a.mlc", env)
    (first,) = _entries(tmp_path / "cache")
    _export(run_cli, b, tmp_path / "b.mlc", env)
    (second,) = _entries(tmp_path / "cache")   # over the 1-byte cap: only the newest stays
    assert second != first


def test_bad_cache_size_is_one_line(tmp_path, one_line_error):
    proc = run_cli_in_process("export", _model(tmp_path / "m.onnx"), "-o", tmp_path / "m.mlc",
                              env={cache.SIZE_ENV: "lots"})
    assert proc.returncode == 2
    assert cache.SIZE_ENV in one_line_error(proc)
    assert not (tmp_path / "m.mlc").exists()


def test_damaged_cache_never_breaks_the_command(tmp_path, run_cli):
    onnx_path = _model(tmp_path / "m.onnx")
    env = {cache.ENV: str(tmp_path / "cache")}
    good = _export(run_cli, onnx_path, tmp_path / "good.mlc", env)
    assert good.returncode == 0
    (entry,) = _entries(tmp_path / "cache")
    entry.write_bytes(entry.read_bytes()[:-7])            # truncated
    (entry.parent / ".tmp-leftover").write_bytes(b"half")   # a dead writer's temporary file
    stray = tmp_path / "cache" / "zz"
    stray.write_text("a file where a bucket folder would be")
    _export(run_cli, onnx_path, tmp_path / "again.mlc", env)
    assert (tmp_path / "again.mlc").read_bytes() == (tmp_path / "good.mlc").read_bytes()
    assert cache.load(tmp_path / "cache", entry.stem) is not None   # rewritten whole
    # an entry that is a folder: a miss, and the store is skipped
    entry.unlink()
    entry.mkdir()
    _export(run_cli, onnx_path, tmp_path / "third.mlc", env)
    assert (tmp_path / "third.mlc").read_bytes() == (tmp_path / "good.mlc").read_bytes()


def test_objects_and_references_share_the_cap(tmp_path, monkeypatch):
    """MLCPACK_CACHE_SIZE caps the objects and the golden check's cached references together:
    an export stores each kind trimmed to its share (7/8 and 1/8), not the objects to the whole
    cap with the references on top."""
    from mlcpack.packager import api
    from mlcpack.packager.options import CompileOptions

    cap = 1 << 20
    limits: dict[str, int] = {}
    real = cache.store

    def spy(directory, key, obj, ir_text, notes=None, limit=cache.DEFAULT_MAX_BYTES,
            kernels=None, suffix=".obj"):
        limits[suffix] = limit
        return real(directory, key, obj, ir_text, notes, limit, kernels, suffix)

    monkeypatch.setattr(cache, "store", spy)
    # the objects compiled in this process (as without fork), so the spy sees their store
    monkeypatch.setattr(parallel.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    options = api.Options(target="host", compile=CompileOptions(
        cache_dir=str(tmp_path / "cache"), cache_max_bytes=cap))
    api.export(_model(tmp_path / "m.onnx"), tmp_path / "m.mlc", options)
    assert set(limits) == {".obj", ".ref"}, limits
    assert limits[".obj"] + limits[".ref"] == cap
    assert limits[".ref"] == cap // 8
