"""Damaged, truncated, foreign-version and malformed bundles are refused with BundleError (and
its subclasses); a failed export leaves nothing behind."""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlcpack.packager.export import ExportError
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.bundle import ALIGN, MAGIC, BundleReader, PayloadRef
from mlcpack.runtime.errors import BundleError, FormatVersionError, MlcpackError

from bundle_parts import read_parts, write_parts


@pytest.fixture(scope="module")
def parts(mlp_bundle) -> tuple[dict, list[bytes]]:
    return read_parts(mlp_bundle[0])


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory, export_weights) -> Path:
    """A small MLP bundle (a few KB) for the sweeps that load it thousands of times."""
    rng = np.random.default_rng(0)
    weights = {"w0": rng.standard_normal((5, 6)).astype(np.float32),
               "b0": rng.standard_normal(5).astype(np.float32),
               "w1": rng.standard_normal((3, 5)).astype(np.float32),
               "b1": rng.standard_normal(3).astype(np.float32)}
    return export_weights(weights, tmp_path_factory.mktemp("tiny") / "tiny.mlc",
                          labels=["a", "b", "c"])


def _data_start(path: Path) -> int:
    with BundleReader(path) as reader:
        return reader.data_start


def _load_and_close(path: Path, **kwargs: Any) -> None:
    load(path, **kwargs).close()


def test_round_trip_through_the_writer_still_loads(tmp_path, parts, mlp_bundle) -> None:
    header, payloads = parts
    copy_path = write_parts(tmp_path / "copy.mlc", header, payloads)
    assert copy_path.read_bytes() == mlp_bundle[0].read_bytes()
    x = np.random.default_rng(0).random((1, 784), dtype=np.float32)
    with load(copy_path) as a, load(mlp_bundle[0]) as b:
        np.testing.assert_array_equal(a(x), b(x))


# ---- truncation and bit flips ------------------------------------------------------------------

def test_truncated_bundles_are_refused(tmp_path, mlp_bundle_bytes, mlp_bundle) -> None:
    data = mlp_bundle_bytes
    size = len(data)
    start = _data_start(mlp_bundle[0])
    lengths = {0, 1, 7, 8, 9, len(MAGIC), 20, 100, start // 2, start - 40, start - 4, start - 1,
               start, start + 1, start + 64, start + 1000, size // 2, size - 4096, size - 64,
               size - 2, size - 1}
    lengths |= {int(v) for v in np.linspace(2, size - 1, 21)}
    assert len(lengths) >= 38
    path = tmp_path / "cut.mlc"
    for n in sorted(lengths):
        path.write_bytes(data[:n])
        with pytest.raises(BundleError) as info:
            _load_and_close(path)
        assert "\n" not in str(info.value)
        with pytest.raises(BundleError):
            _load_and_close(path, verify=False)


def test_every_bit_flip_is_caught_by_the_digest(tmp_path, mlp_bundle_bytes, mlp_bundle) -> None:
    data = mlp_bundle_bytes
    start = _data_start(mlp_bundle[0])
    rng = random.Random(1234)
    # Spread over the whole file: header, digest and data-length trailer, every payload.
    positions = ([rng.randrange(0, start) for _ in range(90)]
                 + list(range(start - 45, start))                 # digest key, digest, data key
                 + [rng.randrange(start, len(data)) for _ in range(70)]
                 + [len(data) - 1, len(data) - 100, start + 401408 + 3])
    assert len(positions) >= 200
    path = tmp_path / "flipped.mlc"
    with BundleReader(mlp_bundle[0]) as reader:
        code = reader.header["code"][0]["object"]
    positions += [start + code["offset"] + rng.randrange(code["size"]) for _ in range(10)]
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(flipped)
        with pytest.raises(BundleError) as info:
            _load_and_close(path)
        assert "\n" not in str(info.value)


def test_payload_flips_name_the_content_check(tmp_path, mlp_bundle_bytes, mlp_bundle) -> None:
    start = _data_start(mlp_bundle[0])
    flipped = bytearray(mlp_bundle_bytes)
    flipped[start + 1000] ^= 0x10  # inside w0
    path = tmp_path / "w0.mlc"
    path.write_bytes(flipped)
    with pytest.raises(BundleError, match="SHA-256"):
        _load_and_close(path)


@pytest.mark.parametrize("which", ["tiny", "mlp"])
def test_unverified_header_flips_refuse_or_load_never_crash(tmp_path, tiny_bundle, mlp_bundle,
                                                            which) -> None:
    """With verify=False nothing catches corruption but the header checks themselves: header
    bytes (one seeded bit each; all of them for the tiny bundle, 250 for the MLP) either load or
    raise an MlcpackError. Only load+close: corrupted code is never run."""
    source = tiny_bundle if which == "tiny" else mlp_bundle[0]
    data = source.read_bytes()
    start = _data_start(source)
    rng = random.Random(99)
    path = tmp_path / "flipped.mlc"
    outcomes: dict[str, int] = {}
    positions = range(start) if which == "tiny" else sorted(rng.sample(range(start), 250))
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(flipped)
        try:
            _load_and_close(path, verify=False)
            kind = "loaded"
        except MlcpackError as exc:
            assert "\n" not in str(exc)
            kind = type(exc).__name__
        outcomes[kind] = outcomes.get(kind, 0) + 1
    assert outcomes.get("BundleError", 0) > len(positions) // 4, outcomes


_WRONG_VALUES = [None, "x", -1, 1 << 40, {}, [], 1.5, True, [1, 2], {"a": 1}, 0, 7, b"xx"]


def _header_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _header_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _header_paths(v, prefix + (i,))
    return out


def test_malformed_headers_with_valid_digest_are_refused(tmp_path, tiny_bundle) -> None:
    """A bundle whose digest is right but whose header holds wrong types or values (a buggy or
    hostile writer) loads or raises an MlcpackError, never a TypeError/KeyError/..."""
    header, payloads = read_parts(tiny_bundle)
    path = tmp_path / "malformed.mlc"
    failures = []
    refused = 0
    for where in _header_paths(header):
        if where[0] in ("format", "min_reader"):
            continue  # versions have their own tests
        for value in _WRONG_VALUES + ["<deleted>"]:
            h = copy.deepcopy(header)
            parent = h
            for key in where[:-1]:
                parent = parent[key]
            if value == "<deleted>":
                if isinstance(parent, list):
                    continue
                del parent[where[-1]]
            else:
                parent[where[-1]] = value
            write_parts(path, h, payloads)
            try:
                _load_and_close(path)
            except MlcpackError:
                refused += 1
            except Exception as exc:  # noqa: BLE001 - the point is to catch everything else
                failures.append(f"{where}={value!r}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures[:20])
    assert refused > 500


@pytest.mark.parametrize(("where", "value"), [
    (("inputs", 0, "dtype"), {}),
    (("inputs", 0, "dtype"), ["float32"]),
    (("kernels", 0, "num_inputs"), "3"),
    (("kernels", 0, "num_outputs"), None),
    (("kernels", 0, "workspace_bytes"), "big"),
    (("tensors", 0, 2), [True, 6]),
    (("constants", 0, "shape"), [5, 6.0]),
])
def test_specific_malformed_header_fields(tmp_path, tiny_bundle, where, value) -> None:
    header, payloads = read_parts(tiny_bundle)
    parent = header
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    with pytest.raises(BundleError):
        _load_and_close(write_parts(tmp_path / "bad.mlc", header, payloads))


# ---- format versions --------------------------------------------------------------------------

def _with(header: dict, **changes: Any) -> dict:
    h = copy.deepcopy(header)
    h.update(changes)
    return h


def test_newer_format_major_is_refused(tmp_path, parts) -> None:
    header, payloads = parts
    major = bundle_format.FORMAT_MAJOR
    path = write_parts(tmp_path / "v2.mlc", _with(header, format=[major + 1, 0],
                                                  min_reader=[major + 1, 0]), payloads)
    with pytest.raises(FormatVersionError) as info:
        _load_and_close(path)
    msg = str(info.value)
    assert f"{major + 1}.0" in msg and "upgrade the runtime" in msg
    assert info.value.exit_code == FormatVersionError.exit_code != BundleError.exit_code


def test_older_format_major_is_refused(tmp_path, parts) -> None:
    header, payloads = parts
    path = write_parts(tmp_path / "v0.mlc", _with(header, format=[0, 9], min_reader=[0, 9]),
                       payloads)
    with pytest.raises(FormatVersionError, match="export the model again"):
        _load_and_close(path)


def test_same_major_older_minor_loads(tmp_path, parts, monkeypatch, reference_mlp, mlp_bundle
                                      ) -> None:
    header, payloads = parts
    major = bundle_format.FORMAT_MAJOR
    # Simulate a runtime two minors ahead of the bundle.
    monkeypatch.setattr(bundle_format, "FORMAT_MINOR", bundle_format.FORMAT_MINOR + 2)
    path = write_parts(tmp_path / "old.mlc", _with(header, format=[major, bundle_format.
                                                                    FORMAT_MINOR - 1]), payloads)
    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    with load(path) as model:
        np.testing.assert_allclose(model(x), reference_mlp(mlp_bundle[1], x), rtol=1e-5,
                                   atol=1e-5)


def test_newer_minor_depends_on_min_reader(tmp_path, parts) -> None:
    header, payloads = parts
    major, minor = bundle_format.FORMAT_MAJOR, bundle_format.FORMAT_MINOR
    newer = [major, minor + 1]
    path = tmp_path / "newer.mlc"

    write_parts(path, _with(header, format=newer, min_reader=newer), payloads)
    with pytest.raises(FormatVersionError) as info:
        _load_and_close(path)
    assert f"{major}.{minor + 1}" in str(info.value) and "upgrade" in str(info.value)

    no_min = _with(header, format=newer)
    no_min.pop("min_reader")
    write_parts(path, no_min, payloads)  # the writer puts its own min_reader first...
    with BundleReader(path) as reader:
        assert reader.header["min_reader"] == [major, minor]
    _load_and_close(path)

    for bad in (None, "1.0", [major], [major, "0"], [major, minor, 0]):
        write_parts(path, _with(header, format=newer, min_reader=bad), payloads)
        with pytest.raises(FormatVersionError):
            _load_and_close(path)

    write_parts(path, _with(header, format=newer, min_reader=[major, minor]), payloads)
    _load_and_close(path)  # a newer minor that this runtime can read


@pytest.mark.parametrize("fmt", [None, "1.0", [1], [1, 0, 0], ["1", "0"], {"major": 1}])
def test_malformed_format_field_is_refused(tmp_path, parts, fmt) -> None:
    header, payloads = parts
    path = write_parts(tmp_path / "fmt.mlc", _with(header, format=fmt), payloads)
    with pytest.raises(BundleError, match="format"):
        _load_and_close(path)


# ---- files that are not bundles ----------------------------------------------------------------

def test_trailing_garbage_is_refused(tmp_path, mlp_bundle_bytes) -> None:
    path = tmp_path / "long.mlc"
    for extra in (b"\0", b"x" * 63, b"\0" * 64, mlp_bundle_bytes[:100]):
        path.write_bytes(mlp_bundle_bytes + extra)
        with pytest.raises(BundleError, match="trailing"):
            _load_and_close(path)
        with pytest.raises(BundleError):
            _load_and_close(path, verify=False)


def test_not_a_bundle(tmp_path, mlp_bundle_bytes) -> None:
    cases: list[tuple[Path, str]] = []
    folder = tmp_path / "folder.mlc"
    folder.mkdir()
    cases.append((folder, "directory"))
    empty = tmp_path / "empty.mlc"
    empty.write_bytes(b"")
    cases.append((empty, "too small"))
    text = tmp_path / "notes.mlc"
    text.write_text("this is a text file, not a bundle\n" * 20)
    cases.append((text, "not an mlcpack bundle"))
    other_msgpack = tmp_path / "other.mlc"
    other_msgpack.write_bytes(b"\x83\xa7mlcpacx" + mlp_bundle_bytes[len(MAGIC):])
    cases.append((other_msgpack, "not an mlcpack bundle"))
    cases.append((tmp_path / "missing.mlc", "no such file"))
    for path, words in cases:
        with pytest.raises(BundleError) as info:
            _load_and_close(path)
        msg = str(info.value)
        assert words in msg and path.name in msg and "\n" not in msg, msg


# ---- payload records ---------------------------------------------------------------------------

def _set(header: dict, where: tuple, value: Any) -> dict:
    h = copy.deepcopy(header)
    parent = h
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    return h


def test_payload_records_past_the_end_are_refused(tmp_path, parts) -> None:
    header, payloads = parts
    data_size = sum(len(p) + (-len(p) % ALIGN) for p in payloads)
    path = tmp_path / "past.mlc"
    code = header["code"][0]["object"]
    bytecode = header["vm"]["bytecode"]
    for where, ref in [
        (("constants", 1, "data"), {"offset": data_size, "size": 512}),
        (("constants", 1, "data"), {"offset": data_size - 64, "size": 512}),
        (("constants", 0, "data"), {"offset": 1 << 40, "size": 401408}),
        (("code", 0, "object"), {"offset": code["offset"], "size": data_size}),
        (("code", 0, "object"), {"offset": data_size + 64, "size": 0}),
        (("vm", "bytecode"), {"offset": bytecode["offset"] + data_size, "size": 8}),
        (("vm", "bytecode"), {"offset": -64, "size": 8}),
        (("vm", "bytecode"), {"offset": bytecode["offset"], "size": -8}),
        (("vm", "bytecode"), {"offset": bytecode["offset"] + 4, "size": 8}),  # misaligned
    ]:
        write_parts(path, _set(header, where, ref), payloads)
        with pytest.raises(BundleError) as info:
            _load_and_close(path)
        assert "\n" not in str(info.value)


def test_overlapping_payload_records_are_refused(tmp_path, parts) -> None:
    header, payloads = parts
    w0 = header["constants"][0]["data"]
    code = header["code"][0]["object"]
    path = tmp_path / "overlap.mlc"
    for where, ref in [
        # b0 (512 bytes) moved inside w0: right size and dtype, in bounds, aligned.
        (("constants", 1, "data"), {"offset": w0["offset"] + 4096, "size": 512}),
        # the code object read from the weights
        (("code", 0, "object"), {"offset": w0["offset"], "size": code["size"]}),
        # the bytecode read from the end of the code object
        (("vm", "bytecode"), {"offset": code["offset"] + 1024, "size": 56}),
    ]:
        write_parts(path, _set(header, where, ref), payloads)
        with pytest.raises(BundleError, match="overlap"):
            _load_and_close(path)


def test_check_disjoint_rules() -> None:
    def ref(o: int, s: int) -> tuple[str, PayloadRef]:
        return (f"[{o}, {o + s})", PayloadRef(o, s))

    bundle_format.check_disjoint([ref(0, 64), ref(64, 10), ref(128, 0), ref(128, 64)], "b")
    bundle_format.check_disjoint([ref(0, 64), ref(0, 64), ref(64, 64)], "b")  # shared payload
    bundle_format.check_disjoint([ref(0, 640), ref(64, 0)], "b")  # empty payloads never overlap
    for refs in ([ref(0, 65), ref(64, 10)], [ref(0, 640), ref(64, 64)],
                 [ref(0, 64), ref(0, 64), ref(0, 128)], [ref(128, 8), ref(0, 1024)]):
        with pytest.raises(BundleError, match="overlap"):
            bundle_format.check_disjoint(refs, "b")


# ---- failed exports leave nothing behind ------------------------------------------------------

@pytest.fixture(scope="module")
def small_module(mlp_weights):
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec

    return build_from_spec(infer_mlp_spec(mlp_weights), mlp_weights)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("fails", ["replace", "fsync", "write"])
def test_failed_export_leaves_nothing_behind(tmp_path, monkeypatch, small_module, fails) -> None:
    from mlcpack.packager.export import export_module

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "model.mlc"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    if fails == "write":
        real_fdopen = os.fdopen

        class BrokenFile:
            def __init__(self, f: Any) -> None:
                self.f = f

            def __enter__(self) -> BrokenFile:
                return self

            def __exit__(self, *exc: object) -> None:
                self.f.close()

            def write(self, data: Any) -> int:
                self.f.write(bytes(memoryview(data)[:10]))
                raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: BrokenFile(real_fdopen(fd, *a, **k)))
    else:
        monkeypatch.setattr(os, fails, broken)
    with pytest.raises(ExportError) as info:
        export_module(small_module, target)
    monkeypatch.undo()
    assert "No space left on device" in str(info.value) and "model.mlc" in str(info.value)
    assert _leftovers(out_dir) == []


def test_failed_export_keeps_the_previous_bundle(tmp_path, monkeypatch, small_module) -> None:
    from mlcpack.packager.export import export_module

    target = tmp_path / "model.mlc"
    export_module(small_module, target)
    before = target.read_bytes()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(ExportError):
        export_module(small_module, target)
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert _leftovers(tmp_path) == ["model.mlc"]
    _load_and_close(target)


def test_export_into_missing_folder(tmp_path, small_module) -> None:
    from mlcpack.packager.export import export_module

    with pytest.raises(ExportError, match="cannot write"):
        export_module(small_module, tmp_path / "no" / "such" / "dir" / "m.mlc")
    assert _leftovers(tmp_path) == []


def test_export_into_read_only_folder(tmp_path, small_module) -> None:
    from mlcpack.packager.export import export_module

    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions (the monkeypatched failures cover it)")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        with pytest.raises(ExportError, match="cannot write"):
            export_module(small_module, ro / "m.mlc")
        assert _leftovers(ro) == []
    finally:
        os.chmod(ro, 0o700)
