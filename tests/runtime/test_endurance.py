"""Concurrency and endurance on a tiny model: 8 threads x 1000 calls bit-identical to one thread,
10 000 calls with flat memory, 1000 loads and unloads without leaking mappings or files."""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time

import numpy as np
import pytest
from mlcpack.runtime import load

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, export_weights):
    """A 16-32-8 MLP over a batch of 2: one call is a few microseconds of kernel time, so the
    tests measure the runtime, not the arithmetic."""
    rng = np.random.default_rng(12)
    weights = {"w0": rng.standard_normal((32, 16)).astype(np.float32),
               "b0": rng.standard_normal(32).astype(np.float32),
               "w1": rng.standard_normal((8, 32)).astype(np.float32),
               "b1": rng.standard_normal(8).astype(np.float32)}
    return export_weights(weights, tmp_path_factory.mktemp("endure") / "tiny.mlc",
                          input_shape=(2, 16))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _map_count() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kernel_threads", [1, 2])
def test_8_threads_x_1000_calls_bit_identical(tiny, kernel_threads) -> None:
    n_threads, calls = 8, 1000
    rng = np.random.default_rng(5)
    with load(tiny, threads=kernel_threads) as model:
        inputs = [rng.standard_normal((2, 16)).astype(np.float32) for _ in range(16)]
        with load(tiny, threads=1) as reference:  # single-threaded, separate instance
            expected = [reference(x).tobytes() for x in inputs]
        assert len(set(expected)) == len(inputs)
        mismatches: list[tuple[int, int, int]] = []
        errors: list[BaseException] = []
        counts = [0] * n_threads
        barrier = threading.Barrier(n_threads)

        def work(t: int) -> None:
            try:
                barrier.wait()
                for k in range(calls):
                    j = (t * 7 + k) % len(inputs)  # each thread walks the inputs differently
                    if model(inputs[j]).tobytes() != expected[j]:
                        mismatches.append((t, k, j))
                    counts[t] += 1
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        seconds = time.perf_counter() - start
    assert not any(w.is_alive() for w in workers)
    assert not errors, errors
    assert counts == [calls] * n_threads
    assert not mismatches, mismatches[:10]
    print(f"8x1000 calls in {seconds:.2f} s")


@needs_proc
def test_10000_calls_with_flat_memory(tiny) -> None:
    x = np.random.default_rng(6).standard_normal((2, 16)).astype(np.float32)
    with load(tiny) as model:
        first = model(x).tobytes()
        for _ in range(1000):  # warm up: allocator pools, caches
            model(x)
        gc.collect()
        before = _rss_bytes()
        for i in range(10_000):
            y = model(x)
            if i % 1000 == 0:
                assert y.tobytes() == first
        gc.collect()
        growth = _rss_bytes() - before
    print(f"RSS growth over 10000 calls: {growth} bytes")
    assert growth < 1 << 20, growth


@needs_proc
def test_1000_loads_and_unloads_leak_no_mappings(tiny, tmp_path) -> None:
    copies = []
    for i in range(20):  # distinct files, so nothing is shared between loads by accident
        copies.append(tmp_path / f"copy{i}.mlc")
        shutil.copy(tiny, copies[-1])
    x = np.ones((2, 16), np.float32)
    with load(tiny) as model:
        expected = model(x).tobytes()

    def cycle(n: int) -> None:
        for i in range(n):
            model = load(copies[i % len(copies)])
            if i % 100 == 0:
                assert model(x).tobytes() == expected
            model.close()

    cycle(50)  # warm up
    gc.collect()
    maps, fds, rss = _map_count(), _fd_count(), _rss_bytes()
    start = time.perf_counter()
    cycle(1000)
    seconds = time.perf_counter() - start
    gc.collect()
    print(f"1000 load+close in {seconds:.2f} s; maps {maps} -> {_map_count()}, "
          f"RSS +{_rss_bytes() - rss} bytes")
    assert _map_count() <= maps + 2, (maps, _map_count())
    assert _fd_count() <= fds, (fds, _fd_count())
    assert _rss_bytes() - rss < 4 << 20


@needs_proc
def test_unclosed_models_release_their_mappings_when_collected(tiny) -> None:
    """A model dropped without close() (as apps do) must not keep its code mapping forever."""
    x = np.ones((2, 16), np.float32)
    for _ in range(20):
        load(tiny)(x)
    gc.collect()
    maps = _map_count()
    for _ in range(300):
        load(tiny)(x)
    gc.collect()
    assert _map_count() <= maps + 2, (maps, _map_count())
