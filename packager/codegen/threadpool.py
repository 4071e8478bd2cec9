"""The hand-off between the runtime's threads, compiled into every object: a parallel kernel's
tasks reach spinning workers through shared memory, in one native call, instead of through a
Python lock per task (a futex wake and a GIL hand-off each, 30-40 us on a loaded 2-core VM).

The runtime owns the memory, 64-byte lines of eight u64. Line 0 is the job::

    0 word     gen << 32 | ntasks << 16: the job number and its task count, published last
    1 fn       kernel address          2 args      its void*[]
    3 finished tasks done so far       4 stop      1 once the pool is shutting down
    5 owed     1 while the caller still owes task 0 (only the caller reads or writes it)
    6 range    the caller's range      7 nranges   the number of ranges (threads)

and line 1 + w belongs to worker w: ``0 state`` (IDLE 0 spinning, PARKED 1 asleep on its Python
lock, PENDING 2 a job was posted), ``1 seen`` (the last job number it looked at) and ``2
range``, its range.

**Home ranges.** A job of ``ntasks`` tasks on ``T`` threads (the caller is thread 0, worker w
thread w + 1) gives thread t the tasks ``[t * ntasks / T, (t + 1) * ntasks / T)``, posted as
its range word ``gen << 32 | hi << 16 | lo``. A thread runs its own range from the bottom
(``lo`` + 1 by compare-and-swap on its own line, which no other thread touches while it has
work), then takes tasks from the top of the others' (``hi`` - 1), the next thread first, until
every range is empty; a claim succeeds only while the word still carries the job's number. So
when the threads keep pace, each runs one contiguous part of every kernel, the part its
producer wrote on that core (with ``ntasks`` = T exactly one task, as before ranges); when one
is late (descheduled on a busy machine, a slower core), the others take over the rest of its
part from the far end. Each thread counts the tasks it ran into ``finished`` once, when it finds
no task left. A runtime may post several tasks per thread (``mlcpack_pool_ranges``, present
from this protocol on, says it may); a kernel's tasks are disjoint and give the same result
however many there are.

Task 0 is the caller's: its range is posted from 1 and ``owed`` = 1, and the caller runs task 0
before it claims anything (``mlcpack_pool_join``). The kernel and its void*[] are read after a
thread's first successful claim: the caller rewrites them only once every claimed task has
finished.

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
WORD, FN, ARGS, FINISHED, STOP, OWED, CALLER_RANGE, NRANGES = range(8)  # job line
STATE, SEEN, RANGE = range(3)                  # worker lines
LINE = 8                                       # u64 per line (64 bytes)
IDLE, PARKED, PENDING = 0, 1, 2
WORKER, RUN, JOIN = "mlcpack_pool_worker", "mlcpack_pool_run", "mlcpack_pool_join"
STEPS = "mlcpack_pool_steps"
# Its presence says that the hand-off splits a job's tasks into home ranges (module doc): a
# runtime may then post more tasks than threads without losing which thread runs which part.
RANGES = "mlcpack_pool_ranges"
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
    def field(b: ir.IRBuilder, pool: ir.Value, index: int) -> ir.Value:
        return b.gep(pool, [_c(index)], inbounds=True)

    @staticmethod
    def at(b: ir.IRBuilder, pool: ir.Value, line: ir.Value, field: int) -> ir.Value:
        return b.gep(pool, [b.add(b.mul(line, _c(LINE)), _c(field))], inbounds=True)

    @staticmethod
    def range_ptr(b: ir.IRBuilder, pool: ir.Value, thread: ir.Value) -> ir.Value:
        """Thread ``thread``'s range word: the caller's (thread 0) on the job line, worker
        ``w``'s (thread ``w + 1``) on its own line."""
        index = b.select(b.icmp_unsigned("==", thread, _c(0)), _c(CALLER_RANGE),
                         b.add(b.mul(thread, _c(LINE)), _c(RANGE)))
        return b.gep(pool, [index], inbounds=True)

    @staticmethod
    def call_kernel(b: ir.IRBuilder, kernel: ir.Value, args: ir.Value, task: ir.Value,
                    ntasks: ir.Value) -> None:
        b.call(b.inttoptr(kernel, KERNEL.as_pointer()),
               [b.inttoptr(args, I8.as_pointer()), task, ntasks])

    def emit_claim(self) -> ir.Function:
        """``i64 claim(pool, gen, me, ntasks, nranges, done)``: thread ``me`` runs tasks of job
        ``gen``, first from the bottom of its own range, then from the top of the others'
        (``me + 1``, ``me + 2``, ... round), until every range is empty; it then adds the tasks
        it ran, plus ``done`` (a task it ran before), to ``finished`` in one atomic add, and
        returns that count. The kernel and its void*[] are read after the first successful
        claim: the job cannot be replaced while a task of it is unfinished."""
        fn = self.function("mlcpack_pool_claim", I64, [PTR, I64, I64, I64, I64, I64])
        fn.linkage = "internal"
        pool, gen, me, ntasks, nranges, done = fn.args
        blocks = {n: fn.append_basic_block(n) for n in
                  ("entry", "head", "body", "look", "next", "grab", "load", "work", "out",
                   "count", "ret")}
        b = ir.IRBuilder(blocks["entry"])
        count, kernel_at, args_at, victim = (b.alloca(I64) for _ in range(4))
        b.store(done, count)
        b.store(_c(0), kernel_at)
        b.store(_c(0), args_at)
        b.store(_c(0), victim)
        b.branch(blocks["head"])

        b.position_at_end(blocks["head"])   # range number ``victim`` after this thread's own
        v = b.load(victim)
        b.cbranch(b.icmp_unsigned("<", v, nranges), blocks["body"], blocks["out"])
        b.position_at_end(blocks["body"])
        who = b.add(me, v)
        who = b.select(b.icmp_unsigned(">=", who, nranges), b.sub(who, nranges), who)
        ptr = self.range_ptr(b, pool, who)
        own = b.icmp_unsigned("==", v, _c(0))
        b.branch(blocks["look"])

        b.position_at_end(blocks["look"])
        r = b.load_atomic(ptr, "acquire", 8)
        lo = b.and_(r, _c(0xFFFF))
        hi = b.and_(b.lshr(r, _c(16)), _c(0xFFFF))
        live = b.and_(b.icmp_unsigned("==", b.lshr(r, _c(32)), gen),
                      b.icmp_unsigned("<", lo, hi))
        b.cbranch(live, blocks["grab"], blocks["next"])
        b.position_at_end(blocks["next"])
        b.store(b.add(v, _c(1)), victim)
        b.branch(blocks["head"])

        b.position_at_end(blocks["grab"])   # own range: its bottom task; another's: its top
        task = b.select(own, lo, b.sub(hi, _c(1)))
        claimed = b.extract_value(b.cmpxchg(ptr, r, b.select(own, b.add(r, _c(1)),
                                                             b.sub(r, _c(1 << 16))),
                                            "acq_rel", "acquire"), 1)
        b.cbranch(claimed, blocks["load"], blocks["look"])
        b.position_at_end(blocks["load"])
        have = b.icmp_unsigned("!=", b.load(kernel_at), _c(0))
        with b.if_then(b.not_(have)):
            b.store(b.load_atomic(self.field(b, pool, FN), "monotonic", 8), kernel_at)
            b.store(b.load_atomic(self.field(b, pool, ARGS), "monotonic", 8), args_at)
        b.branch(blocks["work"])
        b.position_at_end(blocks["work"])
        self.call_kernel(b, b.load(kernel_at), b.load(args_at), task, ntasks)
        b.store(b.add(b.load(count), _c(1)), count)
        b.branch(blocks["look"])

        b.position_at_end(blocks["out"])
        n = b.load(count)
        b.cbranch(b.icmp_unsigned("!=", n, _c(0)), blocks["count"], blocks["ret"])
        b.position_at_end(blocks["count"])
        b.atomic_rmw("add", self.field(b, pool, FINISHED), n, "release")
        b.branch(blocks["ret"])
        b.position_at_end(blocks["ret"])
        b.ret(n)
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
        word = b.load_atomic(self.field(b, pool, WORD), "acquire", 8)
        gen = b.lshr(word, _c(32))
        b.cbranch(b.icmp_unsigned("!=", gen, b.load(seen)), blocks["new"], blocks["idle"])

        b.position_at_end(blocks["new"])
        b.store(gen, seen)
        stop = b.load_atomic(self.field(b, pool, STOP), "acquire", 8)
        b.cbranch(b.icmp_unsigned("!=", stop, _c(0)), blocks["stop"], blocks["job"])
        b.position_at_end(blocks["job"])
        nranges = b.load_atomic(self.field(b, pool, NRANGES), "monotonic", 8)
        b.call(claim, [pool, gen, line, b.and_(b.lshr(word, _c(16)), _c(0xFFFF)), nranges,
                       _c(0)])
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
        word = b.load_atomic(self.field(b, pool, WORD), "acquire", 8)
        ntasks = b.and_(b.lshr(word, _c(16)), _c(0xFFFF))
        # Task 0, if the caller still owes it (see run), before anything else.
        owed_ptr = self.field(b, pool, OWED)
        owed = b.load(owed_ptr)
        with b.if_then(b.icmp_unsigned("!=", owed, _c(0))):
            b.store(_c(0), owed_ptr)
            self.call_kernel(b, b.load_atomic(self.field(b, pool, FN), "monotonic", 8),
                             b.load_atomic(self.field(b, pool, ARGS), "monotonic", 8),
                             _c(0), ntasks)
        b.call(claim, [pool, b.lshr(word, _c(32)), _c(0), ntasks,
                       b.load_atomic(self.field(b, pool, NRANGES), "monotonic", 8), owed])
        claimed = b.block
        b.branch(wait)
        b.position_at_end(wait)
        i = b.phi(I64)
        i.add_incoming(_c(0), claimed)
        finished = b.load_atomic(self.field(b, pool, FINISHED), "acquire", 8)
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
        blocks = {n: fn.append_basic_block(n) for n in
                  ("entry", "split", "part", "publish", "head", "post", "after", "work", "out")}
        b = ir.IRBuilder(blocks["entry"])
        word_ptr = self.field(b, pool, WORD)
        gen = b.and_(b.add(b.lshr(b.load_atomic(word_ptr, "monotonic", 8), _c(32)), _c(1)),
                     _c(0xFFFFFFFF))
        is_stop = b.icmp_unsigned("==", kernel, _c(0))
        nranges = b.add(nworkers, _c(1))
        b.store_atomic(kernel, self.field(b, pool, FN), "monotonic", 8)
        b.store_atomic(args, self.field(b, pool, ARGS), "monotonic", 8)
        b.store_atomic(_c(0), self.field(b, pool, FINISHED), "monotonic", 8)
        b.store_atomic(b.zext(is_stop, I64), self.field(b, pool, STOP), "monotonic", 8)
        b.store_atomic(nranges, self.field(b, pool, NRANGES), "monotonic", 8)
        # Task 0 is the caller's (it is taken out of the caller's range, so no other thread
        # can claim it): with two threads the same part of every kernel runs on the same
        # thread, so a kernel reads the rows its producer wrote on that core. A worker that is
        # late still leaves the rest of its range to the others.
        ntasks = b.and_(ntasks, _c(0xFFFF))
        owed = b.zext(b.icmp_unsigned("<", _c(0), b.udiv(ntasks, nranges)), I64)
        b.store(owed, self.field(b, pool, OWED))
        b.branch(blocks["split"])

        # thread t's home range: tasks [t * ntasks / nranges, (t + 1) * ntasks / nranges)
        b.position_at_end(blocks["split"])
        t = b.phi(I64)
        t.add_incoming(_c(0), blocks["entry"])
        b.cbranch(b.icmp_unsigned("<", t, nranges), blocks["part"], blocks["publish"])
        b.position_at_end(blocks["part"])
        lo = b.udiv(b.mul(t, ntasks), nranges)
        hi = b.udiv(b.mul(b.add(t, _c(1)), ntasks), nranges)
        lo = b.select(b.icmp_unsigned("==", t, _c(0)), b.add(lo, owed), lo)
        b.store_atomic(b.or_(b.or_(b.shl(gen, _c(32)), b.shl(hi, _c(16))), lo),
                       self.range_ptr(b, pool, t), "monotonic", 8)
        t.add_incoming(b.add(t, _c(1)), blocks["part"])
        b.branch(blocks["split"])

        b.position_at_end(blocks["publish"])
        b.store_atomic(b.or_(b.shl(gen, _c(32)), b.shl(ntasks, _c(16))), word_ptr, "release", 8)
        b.branch(blocks["head"])

        b.position_at_end(blocks["head"])
        w = b.phi(I64)
        mask = b.phi(I64)
        w.add_incoming(_c(0), blocks["publish"])
        mask.add_incoming(_c(0), blocks["publish"])
        b.cbranch(b.icmp_signed("<", w, nworkers), blocks["post"], blocks["after"])
        b.position_at_end(blocks["post"])
        prev = b.atomic_rmw("xchg", self.at(b, pool, b.add(w, _c(1)), STATE), _c(PENDING),
                            "seq_cst")
        parked = b.zext(b.icmp_unsigned("==", prev, _c(PARKED)), I64)
        mask.add_incoming(b.or_(mask, b.shl(parked, w)), blocks["post"])
        w.add_incoming(b.add(w, _c(1)), blocks["post"])
        b.branch(blocks["head"])

        b.position_at_end(blocks["after"])
        b.cbranch(b.or_(b.icmp_unsigned("!=", mask, _c(0)), is_stop), blocks["out"],
                  blocks["work"])
        b.position_at_end(blocks["work"])
        # Nobody to wake: join here. Bit 63 says the job is still running after ``spins``.
        late = b.call(join, [pool, spins])
        b.ret(b.shl(late, _c(63)))
        b.position_at_end(blocks["out"])
        b.ret(mask)
        return fn

    def emit_ranges_marker(self) -> None:
        """``int64_t mlcpack_pool_ranges(void)``, 1: never called, its presence is the mark."""
        fn = self.function(RANGES, I64, [])
        ir.IRBuilder(fn.append_basic_block("entry")).ret(_c(1))

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
    e.emit_ranges_marker()
