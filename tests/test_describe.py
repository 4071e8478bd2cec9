"""`inspect` on well-formed and malformed bundles."""

from __future__ import annotations

import pytest

from mlcpack.packager.bundle_writer import BundleWriter
from mlcpack.runtime.describe import describe, describe_text
from mlcpack.runtime.errors import BundleError


def test_describe_real_bundle(mlp_bundle):
    path, _ = mlp_bundle
    info = describe(path)
    assert info["inputs"][0]["shape"] == [1, 784]
    assert info["code"][0]["selected"] and info["vm_instructions"] == 2
    text = describe_text(info)
    assert "memory plan: arena" in text and "x86_64" in text


@pytest.mark.parametrize("header", [
    {"compiler": None, "code": [], "constants": []},
    {"compiler": {}, "code": "not a list", "constants": []},
    {"compiler": {}, "code": [], "constants": [{"dtype": "float32"}]},
])
def test_describe_malformed_header_is_a_bundle_error(header, tmp_path):
    path = tmp_path / "bad.mlc"
    BundleWriter().write(path, header)
    with pytest.raises(BundleError, match="malformed"):
        describe_text(describe(path))
