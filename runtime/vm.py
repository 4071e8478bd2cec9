"""The VM: decodes a bundle's bytecode once at load into a list of prepared native calls.

Instruction set (little-endian int32 words):

    CALL_KERNEL  1, kernel, n, t_1 .. t_n   call kernel ``kernel`` with tensors t_1..t_n: its
                                            inputs, outputs, then its workspace if it has one
    CALL_LIB     2, site, n, t_1 .. t_n     call the library function of call site ``site``
                                            with inputs t_1..t_{n-1} and output t_n
    COPY         3, src, dst                copy tensor ``src`` into tensor ``dst``
    BIND_SIZE    4, var, t                  (symbolic plans, format 1.6) size variable ``var``
                                            takes the int64 count in tensor ``t``, which a
                                            kernel wrote: refused unless 0 <= count <= the
                                            variable's bound for this run's input sizes
    JUMP_UNLESS  5, t, w                    (format 1.7) unless tensor ``t`` (one bool) holds
                                            true, continue at word ``w``: an If's condition
    JUMP         6, w                       (format 1.7) continue at word ``w``
    TRAP         7, reason                  (format 1.7) refuse this run: reason 0, its input
                                            sizes take a branch of an If that was not compiled;
                                            1, they break a size relation of the taken branch;
                                            2 (format 1.9), a Loop's carried value changes shape
    LOOP         8, m, c, i, w              (format 1.8) a counted loop's head: its count is
                                            tensor ``m`` (one int64, read once here); unless
                                            m > 0 and tensor ``c`` (one bool) holds, continue at
                                            word ``w`` (after its NEXT); else iteration 0 runs,
                                            its number written into tensor ``i`` (one int64)
    NEXT         9, c, h                    (format 1.8) the loop's end, its head LOOP at word
                                            ``h``: the next iteration runs (its number into
                                            ``i``, from the instruction after the head) while it
                                            is below the count and tensor ``c`` (one bool) holds
    APPEND      10, s, r                    (format 1.9) append tensor ``r`` (an arena row) as
                                            one more row of tensor ``s``, a STORE row: the rows
                                            of a scan output with no bound at export, kept by
                                            the VM (empty at each run's start, grown by
                                            doubling, at most its count variable's bound and
                                            STORE_MAX_BYTES); (format 1.10) to a STORE row of
                                            the vm record's ``grows`` (a Loop's carried value
                                            that grows), ``r`` of the STORE's rank appends its
                                            extent along the count's axis as that many rows, and
                                            APPEND may run before the loop (the initial value's
                                            rows); no other instruction names a STORE

A jump's word ``w`` must start an instruction (or be the bytecode's end) and lie after the jump
itself: jumps only go forward, and an If runs only its taken branch. The only backward edge is a
NEXT's, to its own LOOP's body: a LOOP names the word after its NEXT, that NEXT names the LOOP,
loops nest (their regions are disjoint or one inside the other) and no jump enters or leaves a
loop's body (a jump's target lies in the body of the innermost loop around the jump, or is its
NEXT). The count lives in the VM, not in a tensor a kernel could write: each loop runs at most
``m`` iterations (``m`` as read at its LOOP), so every run ends (a Loop whose count is 2**63 - 1
and whose condition stays true runs that long, as ONNX Runtime would).

Every kernel has the C signature ``void k(void **args, int64_t task, int64_t ntasks)``. Tensor
addresses are fixed by the static memory plan, so each call's ``void*[]`` is built once here and
an inference makes no per-call allocation. Bundles that carry the native step loop
(``mlcpack_pool_steps``) run each stretch of consecutive kernel calls in one ctypes call (which
releases the GIL), with no Python between the kernels: 1-3 us per kernel saved, 1-4 % of
MobileNetV2's time. Library calls and copies run between those stretches, and profiling
(``run_timed``) and older bundles call the kernels one ctypes call at a time.

With ``threads`` > 1, a parallel kernel runs task 0 on the calling thread and tasks 1..n-1 on
persistent workers. Bundles carry the hand-off code (the packager's ``codegen/threadpool.py``):
workers wait for tasks spinning in native code, and a parallel kernel is one native call that
posts the tasks, runs task 0 and waits, a fraction of a microsecond. A worker idle for about
50 microseconds (``SPIN_ITERATIONS``) sleeps on a Python lock and the next call wakes it (tens
of microseconds, the futex and the GIL). Older bundles use the lock for every hand-off. The
hand-off cost decides which kernels are worth splitting (``PARALLEL_MIN_MACS`` and friends in
the packager).
"""

from __future__ import annotations

import _thread
import ctypes
import functools
import os
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .errors import BundleError, CodeLoadError, InputError
from .vm_loops import RowStore, append_step, link_loops, loop_step, next_step
from .header import (ARENA, OP_APPEND, OP_BIND_SIZE, OP_CALL_KERNEL, OP_CALL_LIB, OP_COPY,
                     OP_JUMP, OP_JUMP_UNLESS, OP_LOOP, OP_NEXT, OP_TRAP, STORE)

KERNEL_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
MAX_OPERANDS = 4096


# instructions whose step returns the instruction to continue at
JUMPS = (OP_JUMP_UNLESS, OP_JUMP, OP_LOOP, OP_NEXT)
TRAP_REASONS = {0: "these input sizes take a branch of one of the model's If nodes that the "
                   "export could not compile (the other branch was compiled): give inputs of the "
                   "sizes the model is made for",
                1: "these input sizes break a size relation that the branch of one of the "
                   "model's If nodes they take needs (a Squeeze of an axis whose size is not 1, "
                   "a Reshape whose element counts differ): give inputs of the sizes the model "
                   "is made for",
                # format 1.9
                2: "at these inputs a carried value of one of the model's Loop nodes changes "
                   "shape between iterations (a size the loop's body computes), which this "
                   "bundle's loop does not run: its export assumed the shape stays"}


@dataclass(frozen=True)
class Instruction:
    opcode: int
    # kernel index, library call site, source tensor (COPY), size variable (BIND_SIZE), the
    # instruction a jump continues at (decoded from its word; len(program): the end), a TRAP's
    # reason, the instruction after a LOOP's NEXT, or a NEXT's LOOP
    target: int
    operands: tuple[int, ...]


def decode(bytecode: memoryview | bytes, num_tensors: int, num_kernels: int, num_sites: int,
           bundle_name: str, num_vars: int = 0) -> list[Instruction]:
    """Decode and validate the bytecode; every index is checked before use (``num_vars``: the
    size variables BIND_SIZE may name, none in a static plan)."""
    if len(bytecode) % 4:
        raise BundleError(f"{bundle_name}: bytecode length is not a multiple of 4")
    words = struct.unpack(f"<{len(bytecode) // 4}i", bytecode)
    out: list[Instruction] = []
    pc = 0

    def bad(why: str) -> BundleError:
        return BundleError(f"{bundle_name}: invalid bytecode at word {pc}: {why}")

    starts: dict[int, int] = {}   # word -> instruction index, for the jumps' targets
    jumps: list[tuple[int, int]] = []   # (instruction index, its target word)
    loops: list[tuple[int, int, int]] = []   # LOOP and NEXT: (instruction index, word, its word)
    while pc < len(words):
        op = words[pc]
        starts[pc] = len(out)
        if op in (OP_JUMP, OP_TRAP):
            if pc + 2 > len(words):
                raise bad("truncated JUMP or TRAP")
            arg = words[pc + 1]
            if op == OP_TRAP:
                if arg not in TRAP_REASONS:
                    raise bad(f"unknown TRAP reason {arg}")
                out.append(Instruction(op, arg, ()))
            else:
                if not pc < arg <= len(words):
                    raise bad("JUMP target outside the bytecode or not forward")
                jumps.append((len(out), arg))
                out.append(Instruction(op, -1, ()))
            pc += 2
            continue
        if op == OP_JUMP_UNLESS:
            if pc + 3 > len(words):
                raise bad("truncated JUMP_UNLESS")
            t, arg = words[pc + 1], words[pc + 2]
            if not 0 <= t < num_tensors:
                raise bad("tensor index out of range")
            if not pc < arg <= len(words):
                raise bad("JUMP_UNLESS target outside the bytecode or not forward")
            jumps.append((len(out), arg))
            out.append(Instruction(op, -1, (t,)))
            pc += 3
            continue
        if op in (OP_LOOP, OP_NEXT):
            size = 5 if op == OP_LOOP else 3
            if pc + size > len(words):
                raise bad("truncated LOOP or NEXT")
            tensors = words[pc + 1:pc + size - 1]
            if not all(0 <= t < num_tensors for t in tensors):
                raise bad("tensor index out of range")
            arg = words[pc + size - 1]
            if op == OP_LOOP and not pc + size + 3 <= arg <= len(words):
                raise bad("LOOP's end outside the bytecode or not after it")
            if op == OP_NEXT and not 0 <= arg < pc:
                raise bad("NEXT's head is not before it")
            loops.append((len(out), pc, arg))
            out.append(Instruction(op, -1, tuple(tensors)))
            pc += size
            continue
        if op == OP_APPEND:
            if pc + 3 > len(words):
                raise bad("truncated APPEND")
            store, t = words[pc + 1], words[pc + 2]
            if not (0 <= store < num_tensors and 0 <= t < num_tensors):
                raise bad("tensor index out of range")
            out.append(Instruction(op, store, (t,)))
            pc += 3
            continue
        if op == OP_COPY:
            if pc + 3 > len(words):
                raise bad("truncated COPY")
            src, dst = words[pc + 1], words[pc + 2]
            if not (0 <= src < num_tensors and 0 <= dst < num_tensors):
                raise bad("tensor index out of range")
            out.append(Instruction(op, src, (dst,)))
            pc += 3
            continue
        if op == OP_BIND_SIZE:
            if pc + 3 > len(words):
                raise bad("truncated BIND_SIZE")
            var, t = words[pc + 1], words[pc + 2]
            if not (0 <= var < num_vars and 0 <= t < num_tensors):
                raise bad("BIND_SIZE names no size variable or tensor of this plan")
            out.append(Instruction(op, var, (t,)))
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
    starts[len(words)] = len(out)
    for index, word in jumps:
        if word not in starts:
            pc = word
            raise bad("a jump lands inside an instruction")
        ins = out[index]
        out[index] = Instruction(ins.opcode, starts[word], ins.operands)
    if loops:
        link_loops(out, loops, starts, words, bad_at=lambda at, why: BundleError(
            f"{bundle_name}: invalid bytecode at word {at}: {why}"))
    return out


def store_lead(shape: Any) -> int:
    """The axis of a STORE row's count: its dims before it are 1s (format 1.10's grown values
    along an axis with only 1s before it; 0 for every 1.9 row store)."""
    lead = 0
    while lead < len(shape) and type(shape[lead]) is int and shape[lead] == 1:
        lead += 1
    return lead


def appends_rows(store: Any, row: Any) -> bool | None:
    """Whether APPEND of tensor row ``row`` to STORE row ``store`` appends several rows (format
    1.10: ``row`` has the STORE's rank and its dims but at the count's axis), one (its dims are
    the STORE's without the count's: format 1.9), or neither (None)."""
    lead, shape, got = store_lead(store.shape), tuple(store.shape), tuple(row.shape)
    if got == shape[:lead] + shape[lead + 1:]:
        return False
    if len(got) == len(shape) and got[:lead] == shape[:lead] and got[lead + 1:] == shape[lead + 1:]:
        return True
    return None


def check_branches(program: list[Instruction], tensors: Any, bundle_name: str,
                   grows: tuple[int, ...] = ()) -> None:
    """Refuse a JUMP_UNLESS, LOOP or NEXT whose tensors are not what it reads or writes
    (``tensors``: the plan's rows): a condition is one bool, a LOOP's count one int64 and its
    iteration number one int64 in the arena (the VM writes it); an APPEND that does not append
    an arena row to a STORE row of its dtype, and a STORE row any other instruction names."""
    want = {OP_JUMP_UNLESS: ("bool",), OP_LOOP: ("int64", "bool", "int64"), OP_NEXT: ("bool",)}
    depth = 0   # loops around the instruction (they nest: link_loops checked)
    for ins in program:
        depth += (ins.opcode == OP_LOOP) - (ins.opcode == OP_NEXT)
        named = ins.operands + ((ins.target,) if ins.opcode == OP_COPY else ())
        if any(tensors[t].kind == STORE for t in named):
            raise BundleError(f"{bundle_name}: bundle header: a STORE row is named by an "
                              "instruction other than APPEND")
        if ins.opcode == OP_APPEND:
            store, row = tensors[ins.target], tensors[ins.operands[0]]
            several = appends_rows(store, row) if store.kind == STORE else None
            if store.kind != STORE or row.kind != ARENA or store.dtype != row.dtype \
                    or several is None:
                raise BundleError(f"{bundle_name}: bundle header: APPEND {ins.target}, "
                                  f"{ins.operands[0]}: a row of the STORE's dtype and row "
                                  "shape, in the arena, expected")
            if (several or not depth) and ins.target not in grows:
                raise BundleError(f"{bundle_name}: bundle header: APPEND {ins.target}, "
                                  f"{ins.operands[0]}: only a STORE row of the vm record's "
                                  "grows takes several rows at once or rows before its loop")
        for k, dtype in enumerate(want.get(ins.opcode, ())):
            t = ins.operands[k]
            row = tensors[t]
            if row.dtype != dtype or tuple(row.shape) not in ((1,), ()) \
                    or (k == 2 and row.kind != ARENA):
                name = {OP_JUMP_UNLESS: "JUMP_UNLESS", OP_LOOP: "LOOP", OP_NEXT: "NEXT"}
                what = "one int64 in the arena" if k == 2 else f"one {dtype}"
                raise BundleError(f"{bundle_name}: bundle header: {name[ins.opcode]} reads "
                                  f"tensor {t}: {what} expected")


class Executor:
    """Prepared calls for one arena; ``run()`` executes the program once."""

    def __init__(self, program: list[Instruction], kernels: list[tuple[int, bool]],
                 sites: list[tuple[Callable[..., Any], dict]], addresses: list[int],
                 views: list[np.ndarray], threads: int = 1,
                 pool: PoolCode | None = None, sizes: np.ndarray | None = None,
                 limits: np.ndarray | None = None, stores: dict[int, tuple] | None = None,
                 extents: dict[int, Callable[[], int]] | None = None,
                 macs: list[int | None] | None = None) -> None:
        """``sizes`` is the sizes array the kernels read and ``limits`` each variable's largest
        value for this plan (symbolic plans with BIND_SIZE instructions); ``stores`` maps each
        STORE row (format 1.9) to the size variable that counts its rows, the axis of that
        count and whether it holds a carried value that grows (format 1.10); ``extents`` maps
        each tensor that an APPEND appends as several rows to its row count at run time;
        ``macs`` gives each kernel's multiply-adds (the header's, None where it has none), which
        decide how many tasks a parallel kernel is posted as (``task_count``)."""
        self._steps: list[Callable[[], Any]] = []
        # format 1.9: each STORE row's rows, kept across runs (emptied at each run's start)
        self.stores = {t: RowStore(*spec) for t, spec in (stores or {}).items()}
        self._extents = extents or {}
        self._loops: dict[int, list[int]] = {}   # per LOOP: its iteration and count (format 1.8)
        self._sizes, self._limits = sizes, limits
        self._program = program
        self._sites = sites
        # per instruction: its kernel's void*[] (None otherwise), which the prepared calls use
        self._args: list[Any] = []
        self.threads = max(1, min(int(threads), MAX_THREADS))
        self._pool: _SpinPool | _LockPool | None = None
        if self.threads > 1:
            self._pool = (_SpinPool(self.threads - 1, pool) if pool is not None
                          else _LockPool(self.threads - 1))
        # An executor dropped without close() still stops its workers.
        self._finalizer = weakref.finalize(self, _stop_pool, self._pool)
        calls = []   # per kernel call: (its instruction, kernel, void*[], task count or 0)
        ranges = pool is not None and pool.ranges
        for i, ins in enumerate(program):
            if ins.opcode == OP_CALL_KERNEL:
                address, parallel = kernels[ins.target]
                ntasks = task_count(self.threads, macs[ins.target] if macs else None, ranges)
                step, args = self._kernel_step(address, parallel,
                                               [addresses[t] for t in ins.operands], ntasks)
                self._steps.append(step)
                self._args.append(args)
                # a parallel kernel is posted to the pool (a _SpinPool whenever there is code)
                split = parallel and self._pool is not None
                calls.append((i, address, ctypes.addressof(args), ntasks if split else 0))
                continue
            self._args.append(None)
            self._steps.append(self._view_step(ins, views))
        # with jumps (format 1.7): each jump's step returns the instruction to continue at
        self._jumping = any(ins.opcode in JUMPS for ins in program)
        self._plan: tuple[list[Callable[[], Any]], list[bool], list[int]] | None = None
        self._segments = self._native_segments(calls, pool)

    def _native_segments(self, calls: list[tuple[int, int, int, int]], pool: PoolCode | None
                         ) -> list[tuple[int, int]] | None:
        """``run``'s plan when the bundle has the native step loop (``PoolCode.steps``): the
        table of every kernel call (kernel, void*[], task count: 0 runs it on this thread) and
        the program cut into runs of consecutive kernel calls, each (start, end) in the table,
        and single library calls or copies, (-1 - instruction, 0). None: the Python loop."""
        if pool is None or not pool.steps or not calls:
            return None
        self._table = np.array([c[1:] for c in calls], dtype=np.uint64).reshape(-1)
        self._status = np.zeros(1, dtype=np.uint64)
        self._native = _POOL_STEPS(pool.steps)
        self._code = pool   # keeps the image that holds the loop mapped
        # the loop's fixed arguments, once (``ndarray.ctypes.data`` costs about a microsecond)
        workers = (self._pool.address, self._pool.n) if self._pool is not None else (0, 0)
        self._native_args = (*workers, self._table.ctypes.data)
        self._status_address = self._status.ctypes.data
        segments: list[tuple[int, int]] = []
        # a jump's target starts a segment; _segment_at maps it (and the end) to that segment
        targets = {ins.target for ins in self._program if ins.opcode in JUMPS}
        self._segment_at: dict[int, int] = {}
        k = 0
        for i in range(len(self._program)):
            # where instruction i's segment begins, if it begins one (a jump's target, or the
            # instruction after a jump: every jump is a segment of its own)
            self._segment_at[i] = len(segments)
            if k < len(calls) and calls[k][0] == i:
                if segments and segments[-1][0] >= 0 and segments[-1][1] == k \
                        and i not in targets:
                    segments[-1] = (segments[-1][0], k + 1)
                else:
                    segments.append((k, k + 1))
                k += 1
            else:
                segments.append((-1 - i, 0))
        self._segment_at[len(self._program)] = len(segments)
        return segments

    def _view_step(self, ins: Instruction, views: Any) -> Callable[[], Any]:
        """The prepared call of a library call or a copy, on ``views`` (tensor id -> array)."""
        if ins.opcode == OP_CALL_LIB:
            fn, attrs = self._sites[ins.target]
            *ins_views, out_view = [views[t] for t in ins.operands]
            return _library_step(fn, ins_views, out_view, attrs)
        if ins.opcode == OP_BIND_SIZE:
            return _bind_step(views[ins.operands[0]], self._sizes, self._limits, ins.target)
        if ins.opcode == OP_JUMP_UNLESS:
            return _branch_step(views[ins.operands[0]], ins.target, index_after(self._program,
                                                                               ins))
        if ins.opcode == OP_JUMP:
            target = ins.target
            return lambda: target
        if ins.opcode == OP_TRAP:
            return _trap_step(ins.target)
        if ins.opcode == OP_LOOP:
            m, c, i = (views[t] for t in ins.operands)
            return loop_step(m, c, i, self._loop_state(ins), index_after(self._program, ins),
                              ins.target)
        if ins.opcode == OP_APPEND:
            if self._limits is None or ins.target not in self.stores:
                raise BundleError("bundle header: APPEND outside a plan with run-time sizes")
            return append_step(views[ins.operands[0]], self.stores[ins.target], self._limits,
                               self._extents.get(ins.operands[0]))
        if ins.opcode == OP_NEXT:
            head = self._program[ins.target]
            return next_step(views[ins.operands[0]], views[head.operands[2]],
                              self._loop_state(head), index_after(self._program, ins),
                              ins.target + 1)
        return _copy_step(views[ins.operands[0]], views[ins.target])

    def _loop_state(self, head: Instruction) -> list[int]:
        """The count of the loop whose LOOP is ``head``, kept by the VM: [iteration, limit]."""
        return self._loops.setdefault(id(head), [0, 0])

    def set_views(self, index: int, views: Any) -> None:
        """Prepare instruction ``index``, a library call or a copy, again on ``views`` (tensor
        id -> array: a list or a dict holding at least its operands). Kernel calls take
        addresses, which do not change; library calls and copies take numpy views, whose
        shapes do: a symbolic bundle's bounded plan (one arena, every shape) re-points them
        when the shape changes."""
        ins = self._program[index]
        if ins.opcode == OP_CALL_KERNEL:
            raise ValueError(f"instruction {index} is a kernel call: its addresses are fixed")
        self._steps[index] = self._view_step(ins, views)
        self._plan = None   # _run_jumping's plan holds the old step

    def _kernel_step(self, address: int, parallel: bool, pointers: list[int], ntasks: int
                     ) -> tuple[Callable[[], Any], Any]:
        """The prepared call and the ``void*[]`` it passes (kept alive by ``_args``)."""
        fn = KERNEL_SIGNATURE(address)
        args = (ctypes.c_void_p * len(pointers))(*pointers)
        args_address = ctypes.addressof(args)
        if self._pool is None or not parallel:
            return (lambda: fn(args_address, 0, 1)), args
        return self._pool.step(fn, address, args_address, ntasks), args

    def run(self) -> None:
        for store in self.stores.values():   # format 1.9: each run appends from row 0
            store.count = 0
        if self._jumping:
            self._run_jumping()
            return
        if self._segments is None:
            for step in self._steps:
                step()
            return
        native, (pool_address, nworkers, table) = self._native, self._native_args
        status_address = self._status_address
        for start, end in self._segments:
            if start < 0:   # a library call or a copy
                self._steps[-1 - start]()
                continue
            while start < end:
                at = native(pool_address, nworkers, table, start, end, JOIN_SPINS,
                            status_address)
                if at >= end:
                    break
                # workers to wake, or a late one to wait for
                self._pool.finish(int(self._status[0]))
                start = at + 1

    def _run_jumping(self) -> None:
        """``run`` for a program with jumps (format 1.7): a jump's step gives the instruction
        to continue at (forward, or a NEXT's back to its loop's body, format 1.8). The loop
        runs on a plan prepared once (``_jump_plan``): per segment its call and whether it
        jumps, and where each instruction's segment starts, all in lists (no per-step lookup
        of the program, no dict)."""
        plan = self._plan
        if plan is None:
            plan = self._plan = self._jump_plan()
        calls, jumps, at = plan
        s, n = 0, len(calls)
        while s < n:
            if jumps[s]:
                s = at[calls[s]()]
            else:
                calls[s]()
                s += 1

    def _jump_plan(self) -> tuple[list[Callable[[], Any]], list[bool], list[int]]:
        """``_run_jumping``'s plan: per segment (an instruction when there is no native step
        loop) its prepared call and whether it returns the instruction to continue at, and
        per instruction (and the end) the segment it starts. A run of kernel calls with no
        worker pool is one pre-bound call of the native step loop (it runs them all on this
        thread); with a pool, ``_run_native`` (workers to wake)."""
        program, steps = self._program, self._steps
        if self._segments is None:
            return (list(steps), [ins.opcode in JUMPS for ins in program],
                    list(range(len(program) + 1)))
        calls: list[Callable[[], Any]] = []
        jumps: list[bool] = []
        native, (pool_address, nworkers, table) = self._native, self._native_args
        for start, end in self._segments:
            if start < 0:
                calls.append(steps[-1 - start])
                jumps.append(program[-1 - start].opcode in JUMPS)
            elif self._pool is None:
                # arguments as ctypes objects of the prototype's types: ctypes passes them
                # as they are (Python ints are converted at every call: ~0.4 us more)
                calls.append(functools.partial(native, *(
                    kind(value) for kind, value in zip(_POOL_STEPS._argtypes_, (
                        pool_address, nworkers, table, start, end, JOIN_SPINS,
                        self._status_address)))))
                jumps.append(False)
            else:
                calls.append(functools.partial(self._run_native, start, end))
                jumps.append(False)
        return calls, jumps, [self._segment_at[i] for i in range(len(program) + 1)]

    def _run_native(self, start: int, end: int) -> None:
        """Kernel calls ``start`` .. ``end`` of the table in the bundle's native step loop."""
        native, (pool_address, nworkers, table) = self._native, self._native_args
        status_address = self._status_address
        while start < end:
            at = native(pool_address, nworkers, table, start, end, JOIN_SPINS, status_address)
            if at >= end:
                break
            self._pool.finish(int(self._status[0]))
            start = at + 1

    def run_timed(self) -> tuple[list[int], list[int], int, int]:
        """Run once timing every prepared call with ``time.perf_counter_ns``: (each
        instruction's start, each one's duration, the run's start, the run's end), all in ns.
        A method apart from ``run`` so that the untimed path pays nothing for it."""
        clock = time.perf_counter_ns
        program, steps = self._program, self._steps
        for store in self.stores.values():
            store.count = 0
        # instructions a jump skipped: no time; one a loop ran again: the sum of its runs
        begin = clock()
        starts = [begin] * len(steps)
        durations = [0] * len(steps)
        ran = [False] * len(steps)
        i = 0
        while i < len(steps):
            t0 = clock()
            after = steps[i]()
            t1 = clock()
            if not ran[i]:
                starts[i], ran[i] = t0, True
            durations[i] += t1 - t0
            i = after if program[i].opcode in JUMPS else i + 1
        return starts, durations, begin, clock()

    @property
    def program(self) -> list[Instruction]:
        """The decoded instructions, in the order ``run`` executes them."""
        return self._program

    def close(self) -> None:
        self._finalizer()

    def input_binding(self, tensors: frozenset[int], num_inputs: list[int], address: int
                      ) -> InputBinding | None:
        """Where the prepared calls read the input stored as ``tensors`` (its row and the rows of
        its reshapes), so a run can point them at the caller's array instead of copying it into
        the arena at ``address``. None unless every use is a kernel reading it as an input (a
        library call, a copy, or a kernel writing it needs the arena's copy)."""
        slots = self._kernel_slots(tensors, num_inputs)
        return None if slots is None else InputBinding(slots, address)

    def output_binding(self, tensors: frozenset[int], address: int) -> InputBinding | None:
        """Where the prepared calls write (and read back) the output stored as ``tensors`` (its
        row and the rows of its reshapes), so a run can have its kernels write the array it
        returns instead of copying the arena's bytes out. None unless every use is a kernel
        call (library calls and copies work on the arena's numpy views)."""
        slots = self._kernel_slots(tensors)
        return InputBinding(slots, address) if slots else None

    def _kernel_slots(self, tensors: frozenset[int], num_inputs: list[int] | None = None
                      ) -> list[tuple[Any, int]] | None:
        """The (void*[], index) slots where kernel calls take ``tensors``; None if a library
        call or a copy uses them, or (``num_inputs`` given) a kernel takes them past its
        inputs."""
        slots = []
        for ins, args in zip(self._program, self._args):
            if ins.opcode == OP_COPY:
                if ins.target in tensors or ins.operands[0] in tensors:
                    return None
                continue
            used = [i for i, t in enumerate(ins.operands) if t in tensors]
            if not used:
                continue
            if ins.opcode != OP_CALL_KERNEL or (num_inputs is not None
                                                and max(used) >= num_inputs[ins.target]):
                return None
            slots += [(args, i) for i in used]
        return slots


# An input up to this size is copied into the arena rather than read in place: copying 16 KB
# (~0.8 us) costs less than asking numpy for the array's address (``ndarray.ctypes.data``,
# ~1.2 us), which matters when a whole run takes ~10 us.
INPLACE_MIN_BYTES = 16384


class InputBinding:
    """The kernel argument slots that hold one input's address; ``bind(addr)`` repoints them
    (``bind(arena)`` puts back the arena's copy); ``feed`` is a run's choice between them. An
    output's slots (``Executor.output_binding``) are the same kind of record, bound by
    ``Session.run`` to the array it returns and back to the arena after the run."""

    def __init__(self, slots: list[tuple[Any, int]], arena: int) -> None:
        self.slots, self.arena, self.current = slots, arena, arena

    def feed(self, view: np.ndarray, value: np.ndarray, min_bytes: int) -> None:
        """Give the kernels one run's input ``value`` (checked: ``view``'s dtype and shape):
        a C-contiguous, aligned array of at least ``min_bytes`` is read where it lies (kernels
        only read it, and the caller holds it during the run); a smaller one, or any other
        layout, is copied into the arena's copy ``view``, which the slots then point at."""
        if value.nbytes >= min_bytes and value.flags.c_contiguous and value.flags.aligned:
            self.bind(value.ctypes.data)
            return
        self.bind(self.arena)
        np.copyto(view, value)

    def bind(self, address: int) -> None:
        if address != self.current:
            for args, i in self.slots:
                args[i] = address
            self.current = address


@dataclass(frozen=True)
class PoolCode:
    """Addresses of the hand-off functions a bundle's object carries (the packager's
    ``codegen/threadpool.py`` documents them); older bundles have none. ``steps`` (0 in bundles
    made before it) runs a plan's kernel calls in one native call."""
    worker: int
    run: int
    join: int
    image: Any = None   # the code image they live in: kept mapped while the pool runs
    steps: int = 0
    ranges: bool = False   # home ranges: a job may have more tasks than threads

    SYMBOLS = ("mlcpack_pool_worker", "mlcpack_pool_run", "mlcpack_pool_join")
    STEPS = "mlcpack_pool_steps"
    RANGES = "mlcpack_pool_ranges"

    @classmethod
    def from_image(cls, image: Any) -> PoolCode | None:
        """The hand-off functions of a mapped code image; None when it has none."""
        try:
            addresses = [image.address(name) for name in cls.SYMBOLS]
        except CodeLoadError:   # a bundle made before the native hand-off
            return None
        try:
            steps = image.address(cls.STEPS)
        except CodeLoadError:   # made before the native step loop
            steps = 0
        try:
            ranges = bool(image.address(cls.RANGES))
        except CodeLoadError:   # made before home ranges: one task per thread
            ranges = False
        return cls(*addresses, image=image, steps=steps, ranges=ranges)


_POOL_WORKER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_POOL_RUN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_POOL_JOIN = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
_POOL_STEPS = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
MAX_THREADS = 63          # sleeping workers come back as bits 0..62 of a mask
# A parallel kernel of at least this many multiply-adds (~400 us on one core) is posted as
# several tasks per thread, at most MAX_TASKS in all, when the bundle's hand-off has home
# ranges (codegen/threadpool.py): each thread still runs one contiguous part of the kernel
# while they keep pace, and a thread that falls behind (descheduled, a slower core) has the
# far end of its part taken by the others instead of holding up the call. Measured on
# PP-OCRv4's recognizer (2 threads, AVX2 host, each task's thread CPU time in the pool): at
# 2^22 a conv on copied planes whose every task copies all of them (6.9 M MACs, one output row)
# took 2.7x the work at 8 tasks (the tasks write the same planes), and 8 tasks cost the large
# layers ~1-4 %; at 2^24 conv3d's last Winograd layer (17.7 M MACs in 5 bands, so 8 tasks get
# 0-2 bands each) ran 1.26x its work, its 2-thread median 1.17x. Smaller kernels keep one task
# per thread; which kernels split finely is a property of the kernel (its work items), which
# the header does not carry yet, so the size stands in for it.
FINE_TASK_MACS = 1 << 25
MAX_TASKS = 8   # the kernels' per-task workspace regions (MAX_TASK_REGIONS in the packager)


def task_count(threads: int, macs: int | None, ranges: bool) -> int:
    """How many tasks a parallel kernel of ``macs`` multiply-adds is posted as on ``threads``
    threads (``ranges``: the bundle's hand-off has home ranges). runtime/c's is the same."""
    if not ranges or threads < 2 or macs is None or macs < FINE_TASK_MACS:
        return threads
    return max(threads, MAX_TASKS // threads * threads)

# Idle spin-loop hints before a worker sleeps (~50 us on Zen 4). Spinning longer (20000, ~0.5
# ms) burned the time a descheduled caller was away on a shared host (the kernel groups a
# session's threads: the spin came out of the caller's share): 2 threads, load ~16 on 2 vCPUs,
# AVX2 host, wall median / CPU min, 20000 -> 2000: ResNet-50 528 -> 389 ms / 122 -> 90 ms,
# YOLOv8n 114-122 -> 89-90 / 37-39 -> 27-29, ResNet-18 161-164 -> 130-136 / 40-41 -> 33-34.
SPIN_ITERATIONS = 2000
JOIN_SPINS = 4000         # the caller's wait before it yields the CPU to a late worker
_LATE = 1 << 63
_LINE = 8                 # u64 words per line: 64 bytes


class _SpinPool:
    """Workers that wait for tasks spinning in native code (the bundle's hand-off functions):
    a parallel kernel is one native call that posts the job, runs tasks and waits. A worker
    idle for ``SPIN_ITERATIONS`` sleeps on its Python lock; a call that finds it asleep wakes it
    (the slow path, as costly as ``_LockPool``'s every call)."""

    def __init__(self, nworkers: int, code: PoolCode) -> None:
        # More threads than CPUs this process may use: spinning would steal the CPU from the
        # thread being waited for, so workers sleep as soon as they are idle.
        self.spins = SPIN_ITERATIONS if nworkers + 1 <= _usable_cpus() else 0
        raw = np.zeros((nworkers + 2) * _LINE, dtype=np.uint64)
        skip = (-raw.ctypes.data % 64) // 8
        self._slots = raw[skip:skip + (nworkers + 1) * _LINE]
        self._address = self._slots.ctypes.data
        self._code = code
        self._run, self._join = _POOL_RUN(code.run), _POOL_JOIN(code.join)
        self._n = nworkers
        self._locks = []
        self._threads = []
        worker = _POOL_WORKER(code.worker)
        for w in range(nworkers):
            lock = _thread.allocate_lock()
            lock.acquire()
            self._locks.append(lock)
            t = threading.Thread(target=_spin_loop, args=(worker, self._address, w, lock,
                                                          self.spins),
                                 name="mlcpack-worker", daemon=True)
            t.start()
            self._threads.append(t)

    def _wake(self, mask: int) -> None:
        for w, lock in enumerate(self._locks):
            if mask >> w & 1:
                lock.release()

    @property
    def address(self) -> int:
        return self._address

    @property
    def n(self) -> int:
        return self._n

    def step(self, fn: Any, address: int, args: int, n: int) -> Callable[[], Any]:
        # One task per thread: cutting ResNet-18's kernels into 4 or 8 tasks instead of 1 costs
        # 4% or 12% more work in all (more plane copies and partial panels), more than finer
        # load balancing wins back on a quiet machine (MobileNetV2 at 2 threads: 8 tasks on
        # the kernels over 100 us, 1-4 % slower at every percentile).
        run, pool, nw, finish = self._run, self._address, self._n, self.finish
        spins = JOIN_SPINS

        def run_tasks() -> None:
            status = run(pool, nw, address, args, n, spins)
            if status:
                finish(status)
        return run_tasks

    def finish(self, status: int) -> None:
        """Complete a job whose post returned ``status`` (not 0): wake the workers it found
        asleep (unless bit 63 says it is only still running), then wait for it."""
        if status != _LATE:
            self._wake(status)
        while self._join(self._address, JOIN_SPINS):
            os.sched_yield()

    def stop(self) -> None:
        if self._threads:
            self._wake(self._run(self._address, self._n, 0, 0, 0, 0))
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()
            self._threads = []


def _spin_loop(worker: Any, pool: int, w: int, lock: Any, spins: int) -> None:
    while worker(pool, w, spins):
        lock.acquire()


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _LockPool:
    """Workers woken by a Python lock for each task (bundles without the hand-off code)."""

    def __init__(self, nworkers: int) -> None:
        self._workers = [_Worker() for _ in range(nworkers)]

    def step(self, fn: Any, address: int, args: int, n: int) -> Callable[[], Any]:
        jobs = [(w, (fn, args, t, n)) for t, w in enumerate(self._workers, start=1)]

        def run_tasks() -> None:
            for w, job in jobs:
                w.job = job
                w.start.release()
            fn(args, 0, n)
            for w, _ in jobs:
                w.done.acquire()
        return run_tasks

    def stop(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers.clear()


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


def _stop_pool(pool: _SpinPool | _LockPool | None) -> None:
    if pool is not None:
        pool.stop()


def _library_step(fn: Callable[..., Any], inputs: list[np.ndarray], out: np.ndarray,
                  attrs: dict) -> Callable[[], Any]:
    return lambda: fn(*inputs, out=out, **attrs)


def _bind_step(count: np.ndarray, sizes: np.ndarray | None, limits: np.ndarray | None,
               var: int) -> Callable[[], Any]:
    """BIND_SIZE: the count a kernel wrote becomes size variable ``var``, within its bound."""
    if sizes is None or limits is None or count.size != 1:
        raise BundleError("bundle header: BIND_SIZE outside a plan with run-time sizes")
    flat = count.reshape(-1)

    def step() -> None:
        value = int(flat[0])
        if not 0 <= value <= limits[var]:
            raise InputError(f"a size the model computes at run time is {value}, outside "
                             f"[0, {int(limits[var])}] (its bound for these input sizes): the "
                             "input asks for more than the model's shapes allow (a TopK k "
                             "larger than its axis, or negative; a Loop's carried value "
                             "grown past its cap)")
        sizes[var] = value

    return step


def index_after(program: list[Instruction], ins: Instruction) -> int:
    """The index of the instruction after ``ins`` (by identity) in ``program``."""
    return next(i for i, x in enumerate(program) if x is ins) + 1


def _branch_step(cond: np.ndarray, target: int, after: int) -> Callable[[], int]:
    """JUMP_UNLESS: the next instruction, or ``target`` when the condition is false."""
    flat = cond.reshape(-1)
    return lambda: after if flat[0] else target


def _trap_step(reason: int) -> Callable[[], Any]:
    def step() -> None:
        raise InputError(TRAP_REASONS[reason])
    return step


def _copy_step(dst: np.ndarray, src: np.ndarray) -> Callable[[], Any]:
    """A copy: ``src`` (reshaped once, here) into ``dst``; of one dtype (every copy the
    packager emits) an item assignment, a tenth of ``np.copyto``'s cost on small tensors."""
    if not src.flags.c_contiguous:   # its reshape would be a copy: reshaped at each call
        return lambda: np.copyto(dst, src.reshape(dst.shape))
    src = src.reshape(dst.shape)
    if src.dtype == dst.dtype:
        return functools.partial(dst.__setitem__, Ellipsis, src)
    return functools.partial(np.copyto, dst, src)
