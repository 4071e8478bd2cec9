"""The format compatibility policy of docs/bad-inputs.md ("Format versions"), row by row: the
major must match, an older minor loads, a newer minor loads only if its ``min_reader`` allows;
and every bundle records the versions the policy needs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from mlcpack import packager
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.errors import FormatVersionError
from bundle_parts import pack, read_parts, write_parts


@pytest.fixture(scope="module")
def parts(tiny_policy_bundle):
    return read_parts(tiny_policy_bundle)


@pytest.fixture(scope="module")
def tiny_policy_bundle(tmp_path_factory, export_weights):
    rng = np.random.default_rng(2)
    weights = {"w0": rng.standard_normal((3, 4)).astype(np.float32),
               "b0": rng.standard_normal(3).astype(np.float32)}
    path = export_weights(weights, tmp_path_factory.mktemp("policy") / "p.mlc")
    return path


def _variant(tmp_path, parts, fmt, min_reader="same"):
    header, payloads = parts
    h = copy.deepcopy(header)
    h["format"] = list(fmt)
    if min_reader is None:
        h.pop("min_reader", None)
    else:
        h["min_reader"] = list(fmt) if min_reader == "same" else list(min_reader)
    return write_parts(tmp_path / f"v{fmt[0]}_{fmt[1]}.mlc", h, payloads)


def _runs_like(path, reference) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with load(path) as model, load(reference) as ref:
        np.testing.assert_array_equal(model(x), ref(x))


def test_every_bundle_records_its_versions(tiny_policy_bundle) -> None:
    with BundleReader(tiny_policy_bundle) as reader:
        h = reader.header
    assert h["format"] == [bundle_format.FORMAT_MAJOR, bundle_format.FORMAT_MINOR]
    # Format 1.1 added optional fields only (golden data; plans beside a runnable 1.0 header):
    # every bundle this compiler writes runs on a 1.0 reader, and min_reader says so.
    assert h["min_reader"] == [bundle_format.FORMAT_MAJOR, 0]
    assert h["compiler"]["name"] == "mlcpack" and h["compiler"]["version"] == packager.__version__
    assert h["compiler"]["llvmlite"]
    code = h["code"][0]
    assert {"arch", "level", "features", "triple", "cpu"} <= set(code)
    assert list(h)[:2] == ["format", "min_reader"]  # first, so a reader finds them early


@pytest.mark.parametrize("major_delta", [-1, 1, 2])
def test_major_must_match(tmp_path, parts, major_delta) -> None:
    major = bundle_format.FORMAT_MAJOR + major_delta
    path = _variant(tmp_path, parts, (major, 0))
    with pytest.raises(FormatVersionError) as info:
        load(path).close()
    msg = str(info.value)
    assert f"{major}.0" in msg and "\n" not in msg
    assert ("upgrade the runtime" if major_delta > 0 else "export the model again") in msg
    # Even a min_reader this runtime satisfies does not override a different major.
    path = _variant(tmp_path, parts, (major, 0), min_reader=(bundle_format.FORMAT_MAJOR, 0))
    with pytest.raises(FormatVersionError):
        load(path).close()


@pytest.mark.parametrize("runtime_minor_ahead", [1, 3])
def test_older_minor_loads_and_runs(tmp_path, parts, tiny_policy_bundle, monkeypatch,
                                    runtime_minor_ahead) -> None:
    major, minor = bundle_format.FORMAT_MAJOR, bundle_format.FORMAT_MINOR
    monkeypatch.setattr(bundle_format, "FORMAT_MINOR", minor + runtime_minor_ahead)
    for bundle_minor in range(minor, minor + runtime_minor_ahead):
        _runs_like(_variant(tmp_path, parts, (major, bundle_minor)), tiny_policy_bundle)


def test_newer_minor_follows_min_reader(tmp_path, parts, tiny_policy_bundle) -> None:
    major, minor = bundle_format.FORMAT_MAJOR, bundle_format.FORMAT_MINOR
    newer = (major, minor + 1)
    # min_reader at or below this runtime: the newer bundle only added fields we may ignore.
    for allowed in ((major, minor), (major, max(minor - 1, 0))):
        _runs_like(_variant(tmp_path, parts, newer, min_reader=allowed), tiny_policy_bundle)
    # min_reader above this runtime, or absent (then the bundle's own version is the minimum).
    for refused in ("same", (major, minor + 1), (major + 1, 0), None):
        if refused is None:  # BundleWriter always writes one: pack this bundle by hand
            header = {k: v for k, v in parts[0].items() if k != "min_reader"}
            path = _pack_without_min_reader(tmp_path, {**header, "format": list(newer)}, parts[1])
        else:
            path = _variant(tmp_path, parts, newer, min_reader=refused)
        with pytest.raises(FormatVersionError) as info:
            load(path).close()
        assert "upgrade the runtime" in str(info.value)


def _pack_without_min_reader(tmp_path, header, payloads):
    """Re-pack the bundle with no ``min_reader`` key (as a writer of format 1.0 might)."""
    head_len = len(pack(header, []))  # the header part does not depend on the payloads
    out = tmp_path / "nomin.mlc"
    out.write_bytes(pack(header, payloads))
    assert b"min_reader" not in out.read_bytes()[:head_len]
    return out


def test_runtime_constants_match_the_policy_doc() -> None:
    from conftest import ROOT

    text = (ROOT / "docs" / "bad-inputs.md").read_text()
    assert f"format {bundle_format.FORMAT_MAJOR}.{bundle_format.FORMAT_MINOR}" in text
