"""The hand-off between the runtime's threads, compiled into every object: a parallel kernel's
tasks reach spinning workers through shared memory, in one native call, instead of through a
Python lock per task (a futex wake and a GIL hand-off each, 30-40 us on a loaded 2-core VM).

The runtime owns the memory, 64-byte lines of eight u64. Line 0 is the job::

    0 word     gen << 32 | ntasks << 16 | next: the job number, its task count and the next
               unclaimed task, in one word so a claim is one compare-and-swap on all three
    1 fn       kernel address          2 args      its void*[]
    3 finished tasks done so far       4 stop      1 once the pool is shutting down
    5 owed     1 while the caller still owes task 0 (only the caller reads or writes it)

and line 1 + w belongs to worker w: ``0 state`` (IDLE 0 spinning, PARKED 1 asleep on its Python
lock, PENDING 2 a job was posted) and ``1 seen`` (the last job number it looked at).

Task 0 of every job is the caller's: the job is posted with ``next`` = 1 and ``owed`` = 1, and
the caller runs task 0 before it claims anything (``mlcpack_pool_join``). With two threads the
same half of every kernel then runs on the same thread, so a kernel reads the rows its
producer wrote on that core; when the worker claimed first at times, MobileNetV2's kernels took
4 % longer in those calls, up to 1.4x on some. Every thread, the caller included, then claims
tasks of the current job until none is left, so a worker that is slow to notice a job
(descheduled on a busy machine) leaves its share to the others instead of stalling the call.
A claim succeeds only while the word still carries the job's number, and ``fn``/``args`` are
read after it: the caller rewrites them only once every claimed task has finished.

``mlcpack_pool_worker(pool, w, spins)`` runs jobs; after ``spins`` idle spin-loop iterations it
swaps its state IDLE -> PARKED and returns 1 (its thread then sleeps on its lock), or returns 0
when the pool stops. ``mlcpack_pool_run(pool, nworkers, fn, args, ntasks, spins)`` posts a job
(``fn``/``args``, ``finished`` = 0, then the word, with release), exchanges each worker's state
to PENDING, and returns the mask of workers it found PARKED, which the caller must wake before
calling ``mlcpack_pool_join``. With none parked it joins itself. ``mlcpack_pool_join(pool,
spins)`` claims and runs tasks, then spins until ``finished`` reaches ``ntasks``; it returns 0
when the job is done, 1 if still waiting after ``spins`` iterations (the caller yields the CPU
and joins again). ``fn`` = 0 posts the stop job.

``mlcpack_pool_steps(pool, nworkers, table, start, end, spins, status)`` runs a plan's kernel
calls ``start`` .. ``end`` - 1 in one native call, so that no Python (a loop turn, a ctypes
call: 1-3 us each) sits between them. ``table`` holds three u64 per call: the kernel, its
``void*[]`` and its task count (0: called once as task 0 of 1, on this thread; else posted as
``mlcpack_pool_run`` does, with ``spins``). It returns ``end`` when all ran; otherwise the
index of a parallel call whose ``mlcpack_pool_run`` status was not 0 (workers to wake, or the
job still running: bit 63), with that status in ``status[0]``: the caller wakes them, joins,
and calls again from the next index. ``pool`` may be null when no count is non-zero.

Why no wake-up is lost: a worker parks only through a successful IDLE -> PARKED swap; the
caller's exchange comes either after it (sees PARKED: wakes the worker) or before it (the swap
fails on PENDING: the worker sets IDLE and reads the word again, written before the exchange).
"""

from __future__ import annotations

from llvmlite import ir

from .target import Target

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = I64.as_pointer()
KERNEL = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I64, I64])
WORD, FN, ARGS, FINISHED, STOP, OWED = range(6)  # job line
STATE, SEEN = range(2)                         # worker lines
LINE = 8                                       # u64 per line (64 bytes)
IDLE, PARKED, PENDING = 0, 1, 2
WORKER, RUN, JOIN = "mlcpack_pool_worker", "mlcpack_pool_run", "mlcpack_pool_join"
STEPS = "mlcpack_pool_steps"
STEP_WORDS = 3                                 # u64 per call in mlcpack_pool_steps' table


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


class _Emitter:
    def __init__(self, module: ir.Module, target: Target) -> None:
        self.module = module
        # The spin-loop hint: PAUSE on x86; ISB SY on AArch64 (YIELD is a no-op on most cores).
        if target.arch == "x86_64":
            self.hint = ir.Function(module, ir.FunctionType(ir.VoidType(), []),
                                    "llvm.x86.sse2.pause")
            self.hint_args: list[ir.Value] = []
        else:
            self.hint = ir.Function(module, ir.FunctionType(ir.VoidType(), [I32]),
                                    "llvm.aarch64.isb")
            self.hint_args = [ir.Constant(I32, 15)]

    def function(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
        fn.attributes.add("nounwind")
        return fn

    def pause(self, b: ir.IRBuilder) -> None:
        b.call(self.hint, self.hint_args)

    @staticmethod
    def pay_owed(b: ir.IRBuilder, pool: ir.Value) -> None:
        """If the caller still owes task 0 of the posted job: run it and count it done."""
        owed_ptr = b.gep(pool, [_c(OWED)], inbounds=True)
        with b.if_then(b.icmp_unsigned("!=", b.load(owed_ptr), _c(0))):
            b.store(_c(0), owed_ptr)
            word = b.load_atomic(b.gep(pool, [_c(WORD)], inbounds=True), "monotonic", 8)
            _Emitter.run_task(b, pool, _c(0), b.and_(b.lshr(word, _c(16)), _c(0xFFFF)))

    @staticmethod
    def run_task(b: ir.IRBuilder, pool: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        """Run task ``task`` of the posted job (its kernel and void*[] read from the job line)
        and count it finished."""
        kernel = b.load_atomic(b.gep(pool, [_c(FN)], inbounds=True), "monotonic", 8)
        args = b.load_atomic(b.gep(pool, [_c(ARGS)], inbounds=True), "monotonic", 8)
        b.call(b.inttoptr(kernel, KERNEL.as_pointer()),
               [b.inttoptr(args, I8.as_pointer()), task, ntasks])
        b.atomic_rmw("add", b.gep(pool, [_c(FINISHED)], inbounds=True), _c(1), "release")

    @staticmethod
    def at(b: ir.IRBuilder, pool: ir.Value, line: ir.Value, field: int) -> ir.Value:
        return b.gep(pool, [b.add(b.mul(line, _c(LINE)), _c(field))], inbounds=True)

    def emit_claim(self) -> ir.Function:
        """``void claim(pool, gen)``: run tasks of job ``gen`` until none is left."""
        fn = self.function("mlcpack_pool_claim", ir.VoidType(), [PTR, I64])
        fn.linkage = "internal"
        pool, gen = fn.args
        entry, loop, check, grab, work, done = (fn.append_basic_block(n) for n in
                                                ("entry", "loop", "check", "grab", "work",
                                                 "done"))
        b = ir.IRBuilder(entry)
        word_ptr = b.gep(pool, [_c(WORD)], inbounds=True)
        b.branch(loop)
        b.position_at_end(loop)
        word = b.load_atomic(word_ptr, "acquire", 8)
        b.cbranch(b.icmp_unsigned("==", b.lshr(word, _c(32)), gen), check, done)
        b.position_at_end(check)
        nxt = b.and_(word, _c(0xFFFF))
        ntasks = b.and_(b.lshr(word, _c(16)), _c(0xFFFF))
        b.cbranch(b.icmp_unsigned("<", nxt, ntasks), grab, done)
        b.position_at_end(grab)
        claimed = b.extract_value(b.cmpxchg(word_ptr, word, b.add(word, _c(1)), "acq_rel",
                                            "acquire"), 1)
        b.cbranch(claimed, work, loop)
        b.position_at_end(work)
        self.run_task(b, pool, nxt, ntasks)
        b.branch(loop)
        b.position_at_end(done)
        b.ret_void()
        return fn

    def emit_worker(self, claim: ir.Function) -> None:
        fn = self.function(WORKER, I64, [PTR, I64, I64])
        pool, w, spins = fn.args
        blocks = {n: fn.append_basic_block(n) for n in
                  ("entry", "loop", "new", "job", "stop", "idle", "park", "asleep", "retry")}
        b = ir.IRBuilder(blocks["entry"])
        line = b.add(w, _c(1))
        state, seen = self.at(b, pool, line, STATE), self.at(b, pool, line, SEEN)
        count = b.alloca(I64)
        b.store(_c(0), count)
        b.branch(blocks["loop"])

        b.position_at_end(blocks["loop"])
        gen = b.lshr(b.load_atomic(b.gep(pool, [_c(WORD)], inbounds=True), "acquire", 8),
                     _c(32))
        b.cbranch(b.icmp_unsigned("!=", gen, b.load(seen)), blocks["new"], blocks["idle"])

        b.position_at_end(blocks["new"])
        b.store(gen, seen)
        stop = b.load_atomic(b.gep(pool, [_c(STOP)], inbounds=True), "acquire", 8)
        b.cbranch(b.icmp_unsigned("!=", stop, _c(0)), blocks["stop"], blocks["job"])
        b.position_at_end(blocks["job"])
        b.call(claim, [pool, gen])
        b.store(_c(0), count)
        b.branch(blocks["loop"])
        b.position_at_end(blocks["stop"])
        b.ret(_c(0))

        b.position_at_end(blocks["idle"])
        self.pause(b)
        n = b.add(b.load(count), _c(1))
        b.store(n, count)
        b.cbranch(b.icmp_signed(">", n, spins), blocks["park"], blocks["loop"])

        b.position_at_end(blocks["park"])
        swapped = b.extract_value(b.cmpxchg(state, _c(IDLE), _c(PARKED), "seq_cst", "seq_cst"),
                                  1)
        b.cbranch(swapped, blocks["asleep"], blocks["retry"])
        b.position_at_end(blocks["asleep"])
        b.ret(_c(1))
        # A failed swap means a job was posted (state PENDING): back to IDLE, look again.
        b.position_at_end(blocks["retry"])
        b.store_atomic(_c(IDLE), state, "seq_cst", 8)
        b.store(_c(0), count)
        b.branch(blocks["loop"])

    def emit_join(self, claim: ir.Function) -> ir.Function:
        fn = self.function(JOIN, I64, [PTR, I64])
        pool, spins = fn.args
        entry, wait, spin, done, late = (fn.append_basic_block(n) for n in
                                         ("entry", "wait", "spin", "done", "late"))
        b = ir.IRBuilder(entry)
        self.pay_owed(b, pool)
        word = b.load_atomic(b.gep(pool, [_c(WORD)], inbounds=True), "acquire", 8)
        b.call(claim, [pool, b.lshr(word, _c(32))])
        ntasks = b.and_(b.lshr(word, _c(16)), _c(0xFFFF))
        claimed = b.block
        b.branch(wait)
        b.position_at_end(wait)
        i = b.phi(I64)
        i.add_incoming(_c(0), claimed)
        finished = b.load_atomic(b.gep(pool, [_c(FINISHED)], inbounds=True), "acquire", 8)
        b.cbranch(b.icmp_unsigned(">=", finished, ntasks), done, spin)
        b.position_at_end(spin)
        self.pause(b)
        i1 = b.add(i, _c(1))
        i.add_incoming(i1, spin)
        b.cbranch(b.icmp_signed(">", i1, spins), late, wait)
        b.position_at_end(done)
        b.ret(_c(0))
        b.position_at_end(late)
        b.ret(_c(1))
        return fn

    def emit_run(self, join: ir.Function) -> ir.Function:
        fn = self.function(RUN, I64, [PTR, I64, I64, I64, I64, I64])
        pool, nworkers, kernel, args, ntasks, spins = fn.args
        entry, head, post, after, work, out = (fn.append_basic_block(n) for n in
                                               ("entry", "head", "post", "after", "work", "out"))
        b = ir.IRBuilder(entry)
        word_ptr = b.gep(pool, [_c(WORD)], inbounds=True)
        gen = b.add(b.lshr(b.load_atomic(word_ptr, "monotonic", 8), _c(32)), _c(1))
        is_stop = b.icmp_unsigned("==", kernel, _c(0))
        b.store_atomic(kernel, b.gep(pool, [_c(FN)], inbounds=True), "monotonic", 8)
        b.store_atomic(args, b.gep(pool, [_c(ARGS)], inbounds=True), "monotonic", 8)
        b.store_atomic(_c(0), b.gep(pool, [_c(FINISHED)], inbounds=True), "monotonic", 8)
        b.store_atomic(b.zext(is_stop, I64), b.gep(pool, [_c(STOP)], inbounds=True),
                       "monotonic", 8)
        # Task 0 is the caller's (not claimed): with two threads the same half of every
        # kernel runs on the same thread, so a kernel reads the rows its producer wrote on
        # that core. A worker that is late still leaves its task to the caller (join).
        owed = b.zext(b.icmp_unsigned("!=", ntasks, _c(0)), I64)
        b.store(owed, b.gep(pool, [_c(OWED)], inbounds=True))
        word = b.or_(b.or_(b.shl(b.and_(gen, _c(0xFFFFFFFF)), _c(32)),
                           b.shl(b.and_(ntasks, _c(0xFFFF)), _c(16))), owed)
        b.store_atomic(word, word_ptr, "release", 8)
        b.branch(head)

        b.position_at_end(head)
        w = b.phi(I64)
        mask = b.phi(I64)
        w.add_incoming(_c(0), entry)
        mask.add_incoming(_c(0), entry)
        b.cbranch(b.icmp_signed("<", w, nworkers), post, after)
        b.position_at_end(post)
        prev = b.atomic_rmw("xchg", self.at(b, pool, b.add(w, _c(1)), STATE), _c(PENDING),
                            "seq_cst")
        parked = b.zext(b.icmp_unsigned("==", prev, _c(PARKED)), I64)
        mask.add_incoming(b.or_(mask, b.shl(parked, w)), post)
        w.add_incoming(b.add(w, _c(1)), post)
        b.branch(head)

        b.position_at_end(after)
        b.cbranch(b.or_(b.icmp_unsigned("!=", mask, _c(0)), is_stop), out, work)
        b.position_at_end(work)
        # Nobody to wake: join here. Bit 63 says the job is still running after ``spins``.
        late = b.call(join, [pool, spins])
        b.ret(b.shl(late, _c(63)))
        b.position_at_end(out)
        b.ret(mask)
        return fn

    def emit_steps(self, run: ir.Function) -> None:
        fn = self.function(STEPS, I64, [PTR, I64, PTR, I64, I64, I64, PTR])
        pool, nworkers, table, start, end, spins, status_out = fn.args
        entry, head, body, serial, parallel, stop, done = (
            fn.append_basic_block(n) for n in
            ("entry", "head", "body", "serial", "parallel", "stop", "done"))
        b = ir.IRBuilder(entry)
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(start, entry)
        b.cbranch(b.icmp_signed("<", i, end), body, done)
        b.position_at_end(body)
        row = b.mul(i, _c(STEP_WORDS))
        kernel, args, ntasks = (b.load(b.gep(table, [b.add(row, _c(k))], inbounds=True))
                                for k in range(STEP_WORDS))
        nxt = b.add(i, _c(1))
        b.cbranch(b.icmp_unsigned("==", ntasks, _c(0)), serial, parallel)
        b.position_at_end(serial)
        b.call(b.inttoptr(kernel, KERNEL.as_pointer()),
               [b.inttoptr(args, I8.as_pointer()), _c(0), _c(1)])
        i.add_incoming(nxt, serial)
        b.branch(head)
        b.position_at_end(parallel)
        status = b.call(run, [pool, nworkers, kernel, args, ntasks, spins])
        i.add_incoming(nxt, parallel)
        b.cbranch(b.icmp_unsigned("==", status, _c(0)), head, stop)
        b.position_at_end(stop)
        b.store(status, status_out)
        b.ret(i)
        b.position_at_end(done)
        b.ret(end)


def emit_thread_pool(module: ir.Module, target: Target) -> None:
    """Add the hand-off functions (see the module doc) to ``module``."""
    e = _Emitter(module, target)
    claim = e.emit_claim()
    e.emit_worker(claim)
    e.emit_steps(e.emit_run(e.emit_join(claim)))
