"""The restricted unpickler: pickles that would run code are refused before anything runs, and
pickles that hold the wrong things are refused with a message that names the problem."""

from __future__ import annotations

import _compat_pickle
import io
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from mlcpack.frontends.weights import WeightsError, load_weights

PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))
assert PROTOCOLS == [0, 1, 2, 3, 4, 5]


class Ref:
    """A global ``module.name`` written into a pickle by name, whether or not it exists here."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __reduce__(self) -> str:
        return self.name  # a string: pickle it as a global (see _Pickler.save_global)

    def __call__(self, *args: Any) -> Any:  # pickle checks that a reducer's func is callable
        raise AssertionError("a Ref is only ever pickled")


class Call:
    """Pickles as ``func(*args)``: what a malicious ``__reduce__`` returns."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return (self.func, self.args)

    def __call__(self, *args: Any) -> Any:  # a Call's result may be the func of another Call
        raise AssertionError("a Call is only ever pickled")


class _Pickler(pickle._Pickler):  # the pure-Python pickler, so save_global can be overridden
    def save_global(self, obj: Any, name: str | None = None) -> None:
        if not isinstance(obj, Ref):
            return super().save_global(obj, name)
        module, name = obj.module, obj.name
        if self.proto >= 4:
            self.save(module)
            self.save(name)
            self.write(pickle.STACK_GLOBAL)
        else:
            if self.proto < 3 and self.fix_imports:  # as pickle spells builtins for Python 2
                module = _compat_pickle.REVERSE_IMPORT_MAPPING.get(module, module)
            self.write(pickle.GLOBAL + module.encode() + b"\n" + name.encode() + b"\n")
        self.memoize(obj)


def dumps(obj: Any, protocol: int) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


def _payloads(marker: Path) -> dict[str, Any]:
    m = str(marker)
    touch = f"touch {m}"
    return {
        "os.system": Call(Ref("os", "system"), touch),
        "posix.system": Call(Ref("posix", "system"), touch),
        "nt.system": Call(Ref("nt", "system"), touch),
        "builtins.eval": Call(Ref("builtins", "eval"), f"__import__('os').system({touch!r})"),
        "builtins.exec": Call(Ref("builtins", "exec"), f"import os; os.system({touch!r})"),
        "builtins.getattr": Call(Call(Ref("builtins", "getattr"),
                                      Call(Ref("builtins", "__import__"), "os"), "system"),
                                 touch),
        "subprocess.Popen": Call(Ref("subprocess", "Popen"), ["touch", m]),
        "subprocess.check_call": Call(Ref("subprocess", "check_call"), ["touch", m]),
        "nested in a dict": {"w0": np.ones((2, 2), np.float32),
                             "b0": Call(Ref("os", "system"), touch)},
        "nested in a list in a dict": {"w0": [Call(Ref("posix", "system"), touch)]},
        "class instance": Call(Ref("collections", "UserDict"), {"w0": 1.0}),
    }


PAYLOAD_NAMES = list(_payloads(Path("/m")))
RUNS_HERE = [n for n in PAYLOAD_NAMES if n != "nt.system" and n != "class instance"
             and not (n == "posix.system" and sys.platform == "win32")]


@pytest.mark.parametrize("name", RUNS_HERE)
def test_payloads_are_live_under_plain_pickle(tmp_path: Path, name: str) -> None:
    """Sanity: without the restriction these pickles really do run the command, so the refusals
    below mean something."""
    marker = tmp_path / "ran"
    result = pickle.loads(dumps(_payloads(marker)[name], protocol=2))
    if hasattr(result, "wait"):
        result.wait()
    assert marker.exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", PAYLOAD_NAMES)
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path: Path, name: str, protocol: int
                                                      ) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(dumps(_payloads(marker)[name], protocol))
    with pytest.raises(WeightsError) as info:
        load_weights(evil)
    msg = str(info.value)
    assert "\n" not in msg
    assert "unsafe" in msg or "refused" in msg, msg
    if name == "subprocess.Popen":
        time.sleep(0.05)  # a started child would have had time to create the marker
    assert not marker.exists()


def _write(tmp_path: Path, obj: Any, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_valid_float_weights_load(tmp_path: Path, protocol: int) -> None:
    rng = np.random.default_rng(protocol)
    weights = {"w0": rng.standard_normal((16, 8)).astype(np.float32),
               "b0": rng.standard_normal(16).astype(np.float32),
               "w1": np.asfortranarray(rng.standard_normal((4, 16)).astype(np.float32)),
               "b1": np.float64(2.0) * np.ones(4)}  # float64: converted to float32
    loaded = load_weights(_write(tmp_path, weights, protocol))
    assert list(loaded) == list(weights)
    for key, value in weights.items():
        assert loaded[key].dtype == np.float32
        assert loaded[key].flags.c_contiguous
        np.testing.assert_array_equal(loaded[key], value.astype(np.float32))


@pytest.mark.parametrize(("obj", "expected"), [
    ({"w0": np.arange(6).reshape(2, 3)}, ["'w0'", "int64", "floating point"]),
    ({"w0": np.ones(3, np.float32), "b0": np.arange(3, dtype=np.int32)},
     ["'b0'", "int32", "floating point"]),
    ({"w0": np.array([1.0, "x", None], dtype=object)}, ["'w0'", "object"]),
    ([np.ones(3, np.float32)], ["list", "not a dict"]),
    ((np.ones(3, np.float32),), ["tuple", "not a dict"]),
    ({"w0": np.ones(3, np.float32), "b0": 1.5}, ["'b0'", "float", "not a numpy array"]),
    ({"w0": [1.0, 2.0]}, ["'w0'", "list", "not a numpy array"]),
    ({"w0": {"nested": np.ones(2, np.float32)}}, ["'w0'", "dict", "not a numpy array"]),
    ({1: np.ones(3, np.float32)}, ["names must be strings"]),
    ({}, ["no arrays"]),
])
def test_wrong_contents_are_refused_with_a_reason(tmp_path: Path, obj: Any,
                                                  expected: list[str]) -> None:
    for protocol in (2, 5):
        with pytest.raises(WeightsError) as info:
            load_weights(_write(tmp_path, obj, protocol))
        for word in expected:
            assert word in str(info.value), (word, str(info.value))


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.pkl"
    text.write_text("these are not weights\n")
    with pytest.raises(WeightsError, match="notes.pkl"):
        load_weights(text)
    truncated = tmp_path / "cut.pkl"
    truncated.write_bytes(pickle.dumps({"w0": np.ones((64, 64), np.float32)})[:200])
    with pytest.raises(WeightsError, match="cut.pkl"):
        load_weights(truncated)
    with pytest.raises(WeightsError, match="no such file"):
        load_weights(tmp_path / "missing.pkl")
    with pytest.raises(WeightsError, match="directory"):
        load_weights(tmp_path)


@pytest.mark.parametrize("name", ["os.system", "builtins.getattr", "nested in a dict"])
def test_cli_export_of_a_malicious_pickle(tmp_path: Path, run_cli: Callable, one_line_error:
                                          Callable, name: str) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(dumps(_payloads(marker)[name], protocol=4))
    proc = run_cli("export", "evil.pkl", "-o", "out.mlc", cwd=tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == WeightsError.exit_code
    assert "evil.pkl" in line
    assert not (tmp_path / "out.mlc").exists()
    assert not list(tmp_path.glob(".mlcpack-*"))
    assert not marker.exists()
