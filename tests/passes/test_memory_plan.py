"""Static memory plan: no two live tensors overlap, and reuse makes deep models smaller."""

from __future__ import annotations

import random

import numpy as np

from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes import run_pipeline
from mlcpack.packager.passes.memory_plan import Buffer, plan_memory
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.vm_emit import ARENA, emit_program

from helpers import compile_and_run


def assert_no_live_overlap(buffers: list[Buffer], offsets: dict[int, int], arena: int) -> None:
    for i, a in enumerate(buffers):
        assert offsets[a.id] % 64 == 0
        assert offsets[a.id] + a.size <= arena
        for b in buffers[i + 1:]:
            if a.overlaps_in_time(b) and a.size and b.size:
                a0, b0 = offsets[a.id], offsets[b.id]
                assert a0 + a.size <= b0 or b0 + b.size <= a0, (a, b, a0, b0)


def random_buffers(rng: random.Random, most: int, largest: int) -> list[Buffer]:
    """1 .. ``most`` buffers of random sizes (some 0, 1, 63, 64, up to ``largest``) and
    lifetimes of 1-11 steps starting anywhere in the first 51."""
    bufs = []
    for i in range(rng.randint(1, most)):
        start = rng.randint(0, 50)
        bufs.append(Buffer(i, rng.choice([0, 1, 63, 64, 100, 4096, rng.randint(1, largest)]),
                           start, start + rng.randint(0, 10)))
    return bufs


def test_random_lifetimes_never_overlap():
    rng = random.Random(0)
    for _ in range(300):
        bufs = random_buffers(rng, 40, 10000)
        offsets, arena = plan_memory(bufs)
        assert_no_live_overlap(bufs, offsets, arena)
        assert arena <= sum(-(-max(b.size, 1) // 64) * 64 for b in bufs)


def random_graph_module(rng: random.Random, n_nodes: int):
    """A random DAG of elementwise ops over equal-shaped tensors (several users per value)."""
    bb = BlockBuilder()
    x = bb.input("x", (4, rng.choice([7, 16, 33])))
    with bb.function("main", [x]):
        with bb.dataflow():
            values = [x]
            for _ in range(n_nodes):
                if rng.random() < 0.5 and len(values) > 1:
                    a, b = rng.sample(values, 2)
                    values.append(bb.emit_op(rng.choice(["add", "multiply", "maximum"]), a, b))
                else:
                    values.append(bb.emit_op(rng.choice(["tanh", "relu", "sigmoid"]),
                                             rng.choice(values)))
            outs = [bb.emit_output(v) for v in values[-2:]]
        bb.emit_func_output(outs, names=["y0", "y1"])
    return bb.get()


def test_random_graphs_plan_and_run_correctly(tmp_path):
    rng = random.Random(1)
    target = resolve_target(None)
    for _ in range(12):
        mod = run_pipeline(random_graph_module(rng, rng.randint(3, 25)), verify=True, options=UNPACKED)
        compiled = compile_prim_funcs(list(mod.prim_funcs().values()), target)
        prog = emit_program(mod, compiled.kernels)
        # Rebuild lifetimes from the program and check every pair of live arena tensors.
        live: dict[int, list[int]] = {}
        for t in prog.inputs:
            live.setdefault(t.tensor, [0, 0])
        for step, ins in enumerate(prog.instructions, start=1):
            for t in ins[3:]:
                span = live.setdefault(t, [step, step])
                span[1] = step
        for t in prog.outputs:
            live[t.tensor][1] = len(prog.instructions) + 1
        rows = {t: prog.tensors[t] for t in live if prog.tensors[t].kind == ARENA}
        items = sorted(rows)
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                (sa, ea), (sb, eb) = live[a], live[b]
                if sa <= eb and sb <= ea:
                    ra, rb = rows[a], rows[b]
                    na = int(np.prod(ra.shape)) * np.dtype(ra.dtype).itemsize
                    nb = int(np.prod(rb.shape)) * np.dtype(rb.dtype).itemsize
                    assert ra.ref + na <= rb.ref or rb.ref + nb <= ra.ref


def test_random_graph_results_match_numpy(tmp_path):
    rng = random.Random(2)
    mod = random_graph_module(rng, 20)
    from mlcpack.packager.ops import get_op
    x = np.random.default_rng(0).standard_normal(mod.main.params[0].type.shape).astype(np.float32)
    env = {id(mod.main.params[0]): x}
    for b in mod.main.bindings():
        env[id(b.var)] = get_op(b.value.op).reference(*(env[id(a)] for a in b.value.args),
                                                      **b.value.attrs)
    got = compile_and_run(mod, {"x": x}, tmp_path)
    for name, o in zip(["y0", "y1"], mod.main.outputs):
        np.testing.assert_allclose(got[name], env[id(o)], rtol=1e-5, atol=1e-6)


def test_deep_model_arena_smaller_than_sum(tmp_path):
    bb = BlockBuilder()
    x = bb.input("x", (8, 256))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i in range(24):
                w = bb.constant(rng.standard_normal((256, 256)).astype(np.float32) * 0.05, f"w{i}")
                h = bb.emit_op("relu", bb.emit_op("matmul", h, w, transpose_b=True))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    mod = run_pipeline(bb.get(), options=UNPACKED)
    compiled = compile_prim_funcs(list(mod.prim_funcs().values()), resolve_target(None))
    prog = emit_program(mod, compiled.kernels)
    assert prog.arena_bytes * 4 <= prog.intermediate_bytes


def test_warm_plan_never_overlaps_and_stays_near_smallest_arena():
    from mlcpack.packager.passes.memory_plan import (WARM_ARENA_SLACK, plan_by_size,
                                                     plan_warm)
    rng = random.Random(2)
    for _ in range(300):
        bufs = random_buffers(rng, 60, 100000)
        offsets, arena = plan_warm(bufs)
        assert_no_live_overlap(bufs, offsets, arena)
        offsets, arena = plan_memory(bufs)
        assert_no_live_overlap(bufs, offsets, arena)
        assert arena <= WARM_ARENA_SLACK * plan_by_size(bufs)[1]


def test_warm_plan_puts_an_output_on_the_most_recently_freed_bytes():
    # Two 1 MB regions are free at step 6: one last used at step 1, one at step 5. The new
    # output goes on the one used last (still in cache); the plan by size takes the lowest
    # free offset, the colder one.
    mb = 1 << 20
    bufs = [Buffer(0, mb, 0, 1),          # cold region's occupant
            Buffer(1, mb, 0, 5),          # warm region's occupant (lives longer)
            Buffer(2, 64, 2, 6),          # keeps step 6 from being the start of the program
            Buffer(3, mb, 6, 7)]          # the new output
    from mlcpack.packager.passes.memory_plan import plan_by_size, plan_warm
    warm, _ = plan_warm(bufs)
    assert warm[3] == warm[1] != warm[0]
    by_size, _ = plan_by_size(bufs)
    assert by_size[3] == min(by_size[0], by_size[1])
