"""The VM: decodes a bundle's bytecode once at load into a list of prepared native calls.

Instruction set (little-endian int32 words):

    CALL_KERNEL  1, kernel, n, t_1 .. t_n   call kernel ``kernel`` with tensors t_1..t_n: its
                                            inputs, outputs, then its workspace if it has one
    CALL_LIB     2, site, n, t_1 .. t_n     call the library function of call site ``site``
                                            with inputs t_1..t_{n-1} and output t_n
    COPY         3, src, dst                copy tensor ``src`` into tensor ``dst``

Every kernel has the C signature ``void k(void **args, int64_t task, int64_t ntasks)``. Tensor
addresses are fixed by the static memory plan, so each call's ``void*[]`` is built once here and
an inference is a loop of ctypes calls (which release the GIL) with no per-call allocation.

With ``threads`` > 1, a parallel kernel runs task 0 on the calling thread and tasks 1..n-1 on
persistent workers. A hand-off is one lock release to wake a worker and one acquire to wait for
it (no futures, queues or per-call objects): the cost that decides which kernels are worth
splitting (see ``PARALLEL_MIN_MACS`` in the packager).
"""

from __future__ import annotations

import _thread
import ctypes
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .errors import BundleError

OP_CALL_KERNEL, OP_CALL_LIB, OP_COPY = 1, 2, 3
KERNEL_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
MAX_OPERANDS = 4096


@dataclass(frozen=True)
class Instruction:
    opcode: int
    target: int            # kernel index, library call site, or source tensor (COPY)
    operands: tuple[int, ...]


def decode(bytecode: memoryview | bytes, num_tensors: int, num_kernels: int, num_sites: int,
           bundle_name: str) -> list[Instruction]:
    """Decode and validate the bytecode; every index is checked before use."""
    if len(bytecode) % 4:
        raise BundleError(f"{bundle_name}: bytecode length is not a multiple of 4")
    words = struct.unpack(f"<{len(bytecode) // 4}i", bytecode)
    out: list[Instruction] = []
    pc = 0

    def bad(why: str) -> BundleError:
        return BundleError(f"{bundle_name}: invalid bytecode at word {pc}: {why}")

    while pc < len(words):
        op = words[pc]
        if op == OP_COPY:
            if pc + 3 > len(words):
                raise bad("truncated COPY")
            src, dst = words[pc + 1], words[pc + 2]
            if not (0 <= src < num_tensors and 0 <= dst < num_tensors):
                raise bad("tensor index out of range")
            out.append(Instruction(op, src, (dst,)))
            pc += 3
            continue
        if op not in (OP_CALL_KERNEL, OP_CALL_LIB):
            raise bad(f"unknown opcode {op}")
        if pc + 3 > len(words):
            raise bad("truncated call")
        target, n = words[pc + 1], words[pc + 2]
        limit = num_kernels if op == OP_CALL_KERNEL else num_sites
        if not 0 <= target < limit:
            raise bad("call target out of range")
        if not 0 < n <= MAX_OPERANDS or pc + 3 + n > len(words):
            raise bad("bad operand count")
        operands = words[pc + 3:pc + 3 + n]
        if not all(0 <= t < num_tensors for t in operands):
            raise bad("tensor index out of range")
        out.append(Instruction(op, target, tuple(operands)))
        pc += 3 + n
    return out


class Executor:
    """Prepared calls for one arena; ``run()`` executes the program once."""

    def __init__(self, program: list[Instruction], kernels: list[tuple[int, bool]],
                 sites: list[tuple[Callable[..., Any], dict]], addresses: list[int],
                 views: list[np.ndarray], threads: int = 1) -> None:
        self._keep: list[Any] = []  # ctypes arrays the prepared calls point into
        self._steps: list[Callable[[], Any]] = []
        self._program = program
        self._args: list[Any] = []  # per instruction: its kernel's void*[] (None otherwise)
        self.threads = max(1, int(threads))
        self._workers = [_Worker() for _ in range(self.threads - 1)]
        # An executor dropped without close() still stops its workers.
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        for ins in program:
            if ins.opcode == OP_CALL_KERNEL:
                address, parallel = kernels[ins.target]
                self._steps.append(self._kernel_step(address, parallel,
                                                     [addresses[t] for t in ins.operands]))
                self._args.append(self._keep[-1])
                continue
            self._args.append(None)
            if ins.opcode == OP_CALL_LIB:
                fn, attrs = sites[ins.target]
                *ins_views, out_view = [views[t] for t in ins.operands]
                self._steps.append(_library_step(fn, ins_views, out_view, attrs))
            else:
                self._steps.append(_copy_step(views[ins.operands[0]], views[ins.target]))

    def _kernel_step(self, address: int, parallel: bool, pointers: list[int]
                     ) -> Callable[[], Any]:
        fn = KERNEL_SIGNATURE(address)
        args = (ctypes.c_void_p * len(pointers))(*pointers)
        self._keep.append(args)
        args_address = ctypes.addressof(args)
        workers, n = self._workers, self.threads
        if not workers or not parallel:
            return lambda: fn(args_address, 0, 1)
        jobs = [(w, (fn, args_address, t, n)) for t, w in enumerate(workers, start=1)]

        def run_tasks() -> None:
            for w, job in jobs:
                w.job = job
                w.start.release()
            fn(args_address, 0, n)
            for w, _ in jobs:
                w.done.acquire()
        return run_tasks

    def run(self) -> None:
        for step in self._steps:
            step()

    def close(self) -> None:
        self._finalizer()

    def input_binding(self, tensors: frozenset[int], num_inputs: list[int], address: int
                      ) -> InputBinding | None:
        """Where the prepared calls read the input stored as ``tensors`` (its row and the rows of
        its reshapes), so a run can point them at the caller's array instead of copying it into
        the arena at ``address``. None unless every use is a kernel reading it as an input (a
        library call, a copy, or a kernel writing it needs the arena's copy)."""
        slots = []
        for ins, args in zip(self._program, self._args):
            if ins.opcode == OP_COPY:
                if ins.target in tensors or ins.operands[0] in tensors:
                    return None
                continue
            used = [i for i, t in enumerate(ins.operands) if t in tensors]
            if not used:
                continue
            if ins.opcode != OP_CALL_KERNEL or max(used) >= num_inputs[ins.target]:
                return None
            slots += [(args, i) for i in used]
        return InputBinding(slots, address)


class InputBinding:
    """The kernel argument slots that hold one input's address; ``bind(addr)`` repoints them
    (``bind(arena)`` puts back the arena's copy)."""

    def __init__(self, slots: list[tuple[Any, int]], arena: int) -> None:
        self.slots, self.arena, self.current = slots, arena, arena

    def bind(self, address: int) -> None:
        if address != self.current:
            for args, i in self.slots:
                args[i] = address
            self.current = address


class _Worker:
    """A thread that runs one kernel task each time ``start`` is released, then releases
    ``done``. Both are plain locks used as binary semaphores (held = nothing to do)."""

    def __init__(self) -> None:
        self.start = _thread.allocate_lock()
        self.done = _thread.allocate_lock()
        self.start.acquire()
        self.done.acquire()
        self.job: tuple | None = None
        self.thread = threading.Thread(target=self._loop, name="mlcpack-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        start, done = self.start, self.done
        while True:
            start.acquire()
            job = self.job
            if job is None:
                return
            fn, args, task, ntasks = job
            fn(args, task, ntasks)
            done.release()

    def stop(self) -> None:
        self.job = None
        self.start.release()
        if self.thread is not threading.current_thread():
            self.thread.join()


def _stop_workers(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()
    workers.clear()


def _library_step(fn: Callable[..., Any], inputs: list[np.ndarray], out: np.ndarray,
                  attrs: dict) -> Callable[[], Any]:
    return lambda: fn(*inputs, out=out, **attrs)


def _copy_step(dst: np.ndarray, src: np.ndarray) -> Callable[[], Any]:
    return lambda: np.copyto(dst, src.reshape(dst.shape))
