"""numpy's BLAS held to one thread for a while (the golden check's numpy reference).

OpenBLAS, which numpy's wheels bundle, runs a matrix product on every core it finds and its
idle threads spin before they sleep. The export runs the IR's numpy reference (``golden.py``)
in a worker beside the compile workers on the same cores, so those threads only contend: on
yolo11n_seg_nms under load they doubled the reference's CPU time without shortening the
export. ``one_blas_thread()`` sets OpenBLAS's thread count to 1 inside and restores it after.
The float64 products (the convolutions' reference) came out bit-identical on one thread and
on two; a float32 one (``matmul``'s reference) may round its last bit differently, so a
recorded magnitude now is the one-thread value on every host instead of depending on the
exporting host's core count (docs/performance.md, the golden check's reference).
Where no OpenBLAS can be found (another BLAS, no ``/proc``) it does nothing."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from typing import Iterator

# (set, get) symbol pairs: scipy-openblas (numpy's wheels, 64-bit and 32-bit integers), then a
# system OpenBLAS
_SYMBOLS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
            ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
            ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
            ("openblas_set_num_threads", "openblas_get_num_threads"))


@functools.cache
def _openblas() -> tuple | None:
    """OpenBLAS's (set_num_threads, get_num_threads), from a library this process loaded."""
    import numpy  # noqa: F401  (numpy loads its BLAS)
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = dict.fromkeys(line.split(None, 5)[5].strip() for line in maps
                                  if line.count(" ") >= 5 and "openblas" in line.lower())
    except (OSError, IndexError):
        return None
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                set_, get = getattr(lib, set_name), getattr(lib, get_name)
                set_.argtypes, set_.restype, get.argtypes, get.restype = \
                    [ctypes.c_int], None, [], ctypes.c_int
                return set_, get
    return None


def blas_threads() -> int | None:
    """OpenBLAS's thread count now; None where it was not found."""
    found = _openblas()
    return None if found is None else int(found[1]())


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    found = _openblas()
    before = None if found is None else int(found[1]())
    if before is None or before <= 1:
        yield
        return
    found[0](1)
    try:
        yield
    finally:
        found[0](before)
