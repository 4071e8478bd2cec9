"""Threads: parallel kernels give bit-identical results, and one model is safe to call from many
Python threads at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import SAMPLES
from mlcpack.runtime import load

SAMPLE = SAMPLES / "digit_7.png"


@pytest.fixture(scope="module")
def batch_bundle(tmp_path_factory, mlp_weights, export_weights):
    """The demo MLP over a batch of 96, so its first layer (9.6 M MACs) is big enough to run
    on several threads."""
    return export_weights(mlp_weights, tmp_path_factory.mktemp("threads") / "batch.mlc",
                          input_shape=(96, 784))


@pytest.mark.parametrize("which", ["single", "batch"])
def test_threads_give_bit_identical_results(which, mlp_bundle, batch_bundle, reference_mlp,
                                            mlp_weights) -> None:
    path = mlp_bundle[0] if which == "single" else batch_bundle
    rng = np.random.default_rng(3)
    models = {n: load(path, threads=n) for n in (1, 2, 3, 8)}
    try:
        assert models[2]._main._executor.threads == 2
        # small kernels stay on one thread (a hand-off costs more than their work)
        if which == "batch":
            assert any(k.get("parallel") for k in models[2].header["kernels"])
        shape = models[1].inputs[0].shape
        for _ in range(5):
            x = rng.standard_normal(shape).astype(np.float32)
            y1 = models[1](x)
            np.testing.assert_allclose(y1, reference_mlp(mlp_weights, x), rtol=1e-5, atol=1e-5)
            for n in (2, 3, 8):
                assert models[n](x).tobytes() == y1.tobytes(), n
    finally:
        for m in models.values():
            m.close()


def test_threads_from_environment(monkeypatch, mlp_bundle) -> None:
    monkeypatch.setenv("MLCPACK_NUM_THREADS", "2")
    with load(mlp_bundle[0]) as model:
        assert model._main._executor.threads == 2
    monkeypatch.setenv("MLCPACK_NUM_THREADS", "")
    with load(mlp_bundle[0]) as model:
        assert model._main._executor.threads == 1


@pytest.mark.parametrize("value", ["not a number", "abc", "0", "-1", "1.5"])
def test_bad_thread_counts_are_refused(monkeypatch, mlp_bundle, run_cli, value) -> None:
    """MLCPACK_NUM_THREADS=abc or 0 and load(threads=-2) are refused in one line (exit 2 on the
    command line), never taken silently as 1."""
    from mlcpack.runtime.errors import UsageError

    monkeypatch.setenv("MLCPACK_NUM_THREADS", value)
    with pytest.raises(UsageError, match="MLCPACK_NUM_THREADS"):
        load(mlp_bundle[0])
    monkeypatch.delenv("MLCPACK_NUM_THREADS")
    for threads in (0, -2, 1.5, True):
        with pytest.raises(UsageError, match="threads="):
            load(mlp_bundle[0], threads=threads)
    with load(mlp_bundle[0]) as model, pytest.raises(UsageError, match="threads="):
        model.session(threads=0)
    if value == "abc":
        proc = run_cli("infer", mlp_bundle[0], SAMPLE, env={"MLCPACK_NUM_THREADS": value})
        assert proc.returncode == 2 and proc.stderr.startswith("error: MLCPACK_NUM_THREADS='abc'")
        assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_one_model_many_python_threads(threads, batch_bundle) -> None:
    n_threads, calls = 8, 50
    rng = np.random.default_rng(4)
    with load(batch_bundle, threads=threads) as model:
        shape = model.inputs[0].shape
        inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n_threads)]
        expected = [model(x).tobytes() for x in inputs]
        assert len(set(expected)) == n_threads  # every thread's answer is distinguishable
        results: list[list[tuple[int, bytes]]] = [[] for _ in range(n_threads)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(n_threads)

        def work(i: int) -> None:
            try:
                barrier.wait()
                for k in range(calls):
                    # Alternate between own input and a neighbour's to interleave differently.
                    j = i if k % 2 == 0 else (i + 1) % n_threads
                    results[i].append((j, model(inputs[j]).tobytes()))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert not any(w.is_alive() for w in workers)
        assert not errors, errors
        for i in range(n_threads):
            assert len(results[i]) == calls
            for j, got in results[i]:
                assert got == expected[j], (i, j)


def _workers() -> int:
    return sum(t.name == "mlcpack-worker" for t in threading.enumerate())


def test_worker_threads_stop_on_close_and_when_dropped(batch_bundle) -> None:
    import gc

    before = _workers()
    model = load(batch_bundle, threads=3)
    assert _workers() >= before + 2
    x = np.ones(model.inputs[0].shape, np.float32)
    y = model(x)
    model.close()
    model.close()  # closing twice is harmless
    assert _workers() == before
    model = load(batch_bundle, threads=3)
    assert model(x).tobytes() == y.tobytes()
    del model  # never closed: its executors' finalizers stop the workers
    gc.collect()
    assert _workers() == before


def _pool(model):
    return model._main._executor._pool


def test_spinning_workers_sleep_when_idle_and_wake_for_the_next_call(batch_bundle, reference_mlp,
                                                                    mlp_weights) -> None:
    """After ~0.5 ms without work a worker parks (state PARKED in its slot); the next parallel
    kernel finds it asleep, wakes it through its lock, and the result is unchanged."""
    import time

    from mlcpack.runtime import vm

    rng = np.random.default_rng(8)
    with load(batch_bundle, threads=2) as model:
        pool = _pool(model)
        assert isinstance(pool, vm._SpinPool) and pool.spins > 0
        x = rng.standard_normal(model.inputs[0].shape).astype(np.float32)
        want = model(x)
        np.testing.assert_allclose(want, reference_mlp(mlp_weights, x), rtol=1e-5, atol=1e-5)
        for _ in range(3):
            deadline = time.monotonic() + 5
            while pool._slots[8] != 1 and time.monotonic() < deadline:  # worker 0's state
                time.sleep(0.005)
            assert pool._slots[8] == 1, "an idle worker should park"
            assert model(x).tobytes() == want.tobytes()
        word = int(pool._slots[0])
        ntasks = word >> 16 & 0xFFFF
        assert word >> 32 >= 4, "every parallel kernel is a job"
        # all done: every task counted finished, and both home ranges (the caller's on the job
        # line, worker 0's on its line) of the last job are empty
        assert ntasks in (2, vm.MAX_TASKS) and pool._slots[3] == ntasks
        for r in (int(pool._slots[6]), int(pool._slots[8 + 2])):
            assert r >> 32 == word >> 32 and r & 0xFFFF >= r >> 16 & 0xFFFF


def test_bundles_without_hand_off_code_use_lock_workers(monkeypatch, batch_bundle) -> None:
    """A bundle made before the hand-off functions existed still runs on several threads."""
    from mlcpack.runtime import vm

    monkeypatch.setattr(vm.PoolCode, "SYMBOLS", ("no_such_worker", "no_such_run",
                                                 "no_such_wait"))
    x = np.random.default_rng(9).standard_normal((96, 784)).astype(np.float32)
    with load(batch_bundle, threads=1) as one, load(batch_bundle, threads=3) as three:
        assert isinstance(_pool(three), vm._LockPool)
        assert three(x).tobytes() == one(x).tobytes()


def test_more_threads_than_cpus_do_not_spin(monkeypatch, batch_bundle) -> None:
    from mlcpack.runtime import vm

    monkeypatch.setattr(vm, "_usable_cpus", lambda: 2)
    x = np.random.default_rng(10).standard_normal((96, 784)).astype(np.float32)
    with load(batch_bundle, threads=1) as one, load(batch_bundle, threads=4) as four:
        assert _pool(four).spins == 0
        for _ in range(3):
            assert four(x).tobytes() == one(x).tobytes()


def test_a_forked_child_runs_without_the_parents_workers(batch_bundle) -> None:
    """Worker threads do not survive fork(); the child's calls claim every task themselves
    (the hand-off never waits for a particular worker), so they neither hang nor differ."""
    import os

    x = np.random.default_rng(11).standard_normal((96, 784)).astype(np.float32)
    with load(batch_bundle, threads=2) as model:
        want = model(x)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run twice (workers spinning, then "parked"), report, exit
            try:
                ok = all(model(x).tobytes() == want.tobytes() for _ in range(2))
                os.write(write, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        assert os.read(read, 1) == b"1" and status == 0
        os.close(read)
        assert model(x).tobytes() == want.tobytes()


def _segments(model):
    return model._main._executor._segments


def test_kernel_calls_run_in_one_native_call(monkeypatch, batch_bundle) -> None:
    """A bundle with the native step loop (``mlcpack_pool_steps``) runs each run of consecutive
    kernel calls in one native call; the results are the Python loop's, bit for bit, and a
    bundle without the loop (older) keeps the Python loop."""
    from mlcpack.runtime import vm

    x = np.random.default_rng(12).standard_normal((96, 784)).astype(np.float32)
    with load(batch_bundle, threads=1) as one, load(batch_bundle, threads=3) as three:
        kernels = sum(1 for ins in one._main._executor.program if ins.opcode == vm.OP_CALL_KERNEL)
        assert _segments(one) == [(0, kernels)] and _segments(three) == [(0, kernels)]
        # per call: kernel, void*[], task count (0: on the calling thread)
        counts = three._main._executor._table.reshape(-1, 3)[:, 2]
        assert set(counts.tolist()) == {0, 3}   # the small layers stay on one thread
        assert (one._main._executor._table.reshape(-1, 3)[:, 2] == 0).all()
        want = [one(x).tobytes(), three(x).tobytes()]
    monkeypatch.setattr(vm.PoolCode, "STEPS", "no_such_steps")
    with load(batch_bundle, threads=1) as one, load(batch_bundle, threads=3) as three:
        assert _segments(one) is None and _segments(three) is None
        assert isinstance(_pool(three), vm._SpinPool)
        assert [one(x).tobytes(), three(x).tobytes()] == want
    assert want[0] == want[1]


@pytest.mark.parametrize("threads", [2, 3])
def test_native_loop_hands_sleeping_workers_back_to_python(monkeypatch, batch_bundle,
                                                          threads) -> None:
    """Workers that park after every job: each parallel call inside the native loop finds them
    asleep, returns its index and status, Python wakes them, joins the job and resumes the loop
    at the next call. Every run still matches one thread's, bit for bit. Each run starts once
    every worker is parked (a loaded host may not have run a worker far enough to park between
    two runs, and the caller then runs its tasks itself: nothing to hand back)."""
    import time

    from mlcpack.packager.codegen.threadpool import LINE, PARKED, STATE
    from mlcpack.runtime import vm

    monkeypatch.setattr(vm, "SPIN_ITERATIONS", 1)
    finished = []
    finish = vm._SpinPool.finish
    monkeypatch.setattr(vm._SpinPool, "finish",
                        lambda self, status: (finished.append(status), finish(self, status)))
    rng = np.random.default_rng(13)
    with load(batch_bundle, threads=1) as one, load(batch_bundle, threads=threads) as many:
        pool = _pool(many)
        assert _segments(many) is not None and pool.spins <= 1
        for i in range(4):
            deadline = time.monotonic() + 60
            while not all(pool._slots[(1 + w) * LINE + STATE] == PARKED for w in range(pool.n)):
                assert time.monotonic() < deadline, "a worker never parked"
                time.sleep(0.001)
            x = rng.standard_normal((96, 784)).astype(np.float32)
            before = len(finished)
            assert many(x).tobytes() == one(x).tobytes()
            assert len(finished) > before, \
                f"run {i}: the native loop never handed a sleeping worker back to Python"


@pytest.mark.parametrize("threads", [2, 3])
def test_the_calling_thread_runs_task_0_of_every_job(batch_bundle, threads) -> None:
    """Task 0 is the caller's (the same half of every kernel on the same thread), whether the
    workers are spinning or asleep; every task runs exactly once."""
    import ctypes
    import time

    seen = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    def kernel(args, task, ntasks):
        seen.append((task, ntasks, threading.get_ident()))

    address = ctypes.cast(kernel, ctypes.c_void_p).value
    me = threading.get_ident()
    with load(batch_bundle, threads=threads) as model:
        job = _pool(model).step(None, address, 0, threads)
        for i in range(60):
            if i % 15 == 0:
                time.sleep(0.02)   # the workers park; the post wakes them
            seen.clear()
            job()
            assert sorted(task for task, _, _ in seen) == list(range(threads))
            assert {n for _, n, _ in seen} == {threads}
            assert [who for task, _, who in seen if task == 0] == [me], i


@pytest.mark.parametrize("threads", [2, 3])
def test_home_ranges_split_a_job_of_more_tasks_than_threads(batch_bundle, threads) -> None:
    """A bundle whose hand-off has home ranges (``mlcpack_pool_ranges``) takes more tasks than
    threads: each thread runs its own range bottom-up (the caller's from task 0) and then
    takes what is left of the others' from their top, so every task runs exactly once and a
    thread that is late (asleep here, every fifth call) leaves its part to the others."""
    import ctypes
    import time

    from mlcpack.runtime import vm

    seen = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    def kernel(args, task, ntasks):
        seen.append((task, ntasks, threading.get_ident()))

    address = ctypes.cast(kernel, ctypes.c_void_p).value
    me = threading.get_ident()
    ntasks = vm.task_count(threads, vm.FINE_TASK_MACS, True)
    assert ntasks == {2: 8, 3: 6}[threads] and vm.task_count(threads, None, True) == threads
    assert vm.task_count(threads, vm.FINE_TASK_MACS, False) == threads
    home = [range(t * ntasks // threads, (t + 1) * ntasks // threads) for t in range(threads)]
    with load(batch_bundle, threads=threads) as model:
        assert model._main._executor._code.ranges
        job = _pool(model).step(None, address, 0, ntasks)
        for i in range(40):
            if i % 5 == 0:
                time.sleep(0.02)   # the workers park; the caller takes over their ranges
            seen.clear()
            job()
            assert sorted(task for task, _, _ in seen) == list(range(ntasks)), i
            assert {n for _, n, _ in seen} == {ntasks}
            assert [who for task, _, who in seen if task == 0] == [me], i
            by_thread: dict[int, list[int]] = {}
            for task, _, who in seen:
                by_thread.setdefault(who, []).append(task)
            for tasks in by_thread.values():
                # of each range, a thread runs a run up from its bottom (its own) or takes
                # tasks down from its top (another's)
                for h in home:
                    part = [t for t in tasks if t in h]
                    if part and part[0] == h[0]:
                        assert part == list(h[:len(part)]), (i, part)
                    else:
                        assert all(a > b for a, b in zip(part, part[1:])), (i, part)
