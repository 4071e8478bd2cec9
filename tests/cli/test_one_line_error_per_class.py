"""One real ``mlcpack`` run per error class: one line on stderr, no traceback, the class's own
exit code; and the same run with ``--debug`` shows the traceback."""

from __future__ import annotations

import pickle
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from mlcpack.frontends.arch import ArchError
from mlcpack.frontends.weights import WeightsError
from mlcpack.packager.export import ExportError
from mlcpack.runtime.errors import (BundleError, CodeLoadError, CpuFeatureError,
                                    FormatVersionError, InputError, LibraryFunctionError,
                                    MlcpackError, SignatureError)
from bundle_parts import payload_spans, read_parts, write_parts

USAGE = 2


def _library_bundle(folder: Path) -> Path:
    from mlcpack.packager.export import export_module
    from mlcpack.packager.ir.builder import BlockBuilder
    from mlcpack.packager.ir.graph import TensorType

    bb = BlockBuilder()
    x = bb.input("x", (1, 784))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.call_library("myapp.swish", [x],
                                                 TensorType((1, 784), "float32")))
        bb.emit_func_output(out)
    path = folder / "lib.mlc"
    export_module(bb.get(), path)
    return path


def _garbage_code_bundle(source: Path, folder: Path) -> Path:
    header, payloads = read_parts(source)
    code = header["code"][0]["object"]
    offsets = payload_spans(header)
    i = offsets.index((code["offset"], code["size"]))
    payloads = list(payloads)
    payloads[i] = b"\x7fELF" + b"\xff" * (code["size"] - 4)
    return write_parts(folder / "badcode.mlc", header, payloads)


@pytest.fixture(scope="module")
def cases(tmp_path_factory, mlp_bundle, paths) -> dict[str, tuple[list, dict, int, str]]:
    """error class name -> (mlcpack arguments, extra environment, exit code, word in message)."""
    folder = tmp_path_factory.mktemp("errors")
    bundle = mlp_bundle[0]
    npy = paths["samples"] / "digit_7.npy"
    newer = folder / "newer.mlc"
    data = bundle.read_bytes()
    newer.write_bytes(data.replace(b"\xa6format\x92\x01\x02", b"\xa6format\x92\x02\x01"))
    wrong = folder / "wrong.npy"
    np.save(wrong, np.zeros((1, 783), np.float32))
    evil = folder / "evil.pkl"
    evil.write_bytes(b"cos\nsystem\n(S'true'\ntR.")  # protocol 0: os.system("true")
    nochain = folder / "nochain.pkl"
    nochain.write_bytes(pickle.dumps({"w0": np.zeros((4, 6), np.float32),
                                      "w1": np.zeros((2, 5), np.float32)}))
    good = folder / "good.pkl"
    good.write_bytes(pickle.dumps({"w0": np.zeros((4, 6), np.float32)}))
    out = folder / "out.mlc"
    (folder / "model.xyz").write_bytes(b"\0" * 8)
    from mlcpack.packager.signing import generate_key

    _, trusted, _ = generate_key(folder / "app.pem")  # the bundle is not signed with it
    return {
        "usage": (["export", folder / "model.xyz"], {}, USAGE, "unknown model type"),
        "BundleError": (["infer", folder / "missing.mlc", npy], {}, BundleError.exit_code,
                        "no such file"),
        "FormatVersionError": (["infer", newer, npy], {}, FormatVersionError.exit_code,
                               "upgrade the runtime"),
        "CpuFeatureError": (["infer", bundle, npy], {"MLCPACK_CPU_ARCH": "aarch64",
                                                     "MLCPACK_CPU_FEATURES": "fp,asimd"},
                            CpuFeatureError.exit_code, "--target aarch64"),
        "CodeLoadError": (["infer", _garbage_code_bundle(bundle, folder), npy], {},
                          CodeLoadError.exit_code, "object code"),
        "InputError": (["infer", bundle, wrong], {}, InputError.exit_code, "(1, 783)"),
        "LibraryFunctionError": (["infer", _library_bundle(folder), npy], {},
                                 LibraryFunctionError.exit_code, "myapp.swish"),
        "WeightsError": (["export", evil, "-o", out], {}, WeightsError.exit_code,
                         "nothing from it was run"),
        "ArchError": (["export", nochain, "-o", out], {}, ArchError.exit_code, "w1"),
        "ExportError": (["export", paths["artifacts"] / "cnn.onnx", "--batch-sizes", "1,8",
                         "-o", out], {}, ExportError.exit_code, "symbolic first dimension"),
        "SignatureError": (["infer", bundle, npy, "--trusted-key", trusted], {},
                           SignatureError.exit_code, "is not signed"),
    }


CLASS_NAMES = ["usage", "BundleError", "FormatVersionError", "CpuFeatureError", "CodeLoadError",
               "InputError", "LibraryFunctionError", "WeightsError", "ArchError", "ExportError",
               "SignatureError"]


@pytest.fixture(scope="module")
def results(cases, run_cli) -> dict[tuple[str, bool], subprocess.CompletedProcess]:
    """Every case run with and without --debug, in parallel (each is a fresh interpreter)."""
    def run(key: tuple[str, bool]) -> subprocess.CompletedProcess:
        args, env, _, _ = cases[key[0]]
        return run_cli(*args, *(["--debug"] if key[1] else []), env=env, timeout=120)

    keys = [(name, debug) for name in CLASS_NAMES for debug in (False, True)]
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(keys, pool.map(run, keys)))


def test_every_error_class_has_a_case() -> None:
    classes = {c.__name__ for c in (BundleError, FormatVersionError, CpuFeatureError,
                                    CodeLoadError, InputError, LibraryFunctionError, WeightsError,
                                    ArchError, ExportError, SignatureError)}
    assert classes <= set(CLASS_NAMES)
    assert all(issubclass(c, MlcpackError) for c in (WeightsError, ArchError, ExportError))


@pytest.mark.parametrize("name", CLASS_NAMES)
def test_one_line_distinct_exit_code(name, cases, results, one_line_error: Callable) -> None:
    proc = results[(name, False)]
    line = one_line_error(proc)
    code, word = cases[name][2], cases[name][3]
    assert proc.returncode == code, (name, proc.returncode, line)
    assert word in line, (word, line)
    assert proc.stdout == ""


def test_exit_codes_differ_between_classes(cases) -> None:
    codes = [cases[name][2] for name in CLASS_NAMES]
    assert len(set(codes)) == len(codes), codes


@pytest.mark.parametrize("name", [n for n in CLASS_NAMES if n != "usage"])
def test_debug_shows_the_traceback(name, results) -> None:
    proc = results[(name, True)]
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr, proc.stderr
    assert f"{name}: " in proc.stderr, proc.stderr[-500:]
