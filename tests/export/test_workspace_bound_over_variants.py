"""A symbolic kernel's workspace in the bundle bounds every code variant's, not the first's.

The bundle holds one size expression per kernel; the open integer quad convolution's
x86-64-v4+vnni variant (512-bit tiles, 48-pixel steps) needs more scratch at small images than
its x86-64-v2 variant, and a workspace sized by the first variant's expression was overrun at 2
threads (tests/kernels/test_int8_depthwise_open_size.py: three other outputs corrupted at a
1x1 image)."""

from __future__ import annotations

import itertools

from mlcpack.packager.export import workspace_bound
from mlcpack.packager.ir.sym import evaluate, size_var, to_record

H, W = size_var("H"), size_var("W")


def _at_least_each(bound, exprs) -> None:
    for h, w in itertools.product((0, 1, 2, 7, 40, 333), repeat=2):
        env = {"H": h, "W": w}
        top = evaluate(to_record(bound), env)
        assert all(top >= evaluate(to_record(e), env) for e in exprs), (h, w)


def test_bound_of_differing_polynomials_takes_each_terms_largest_coefficient() -> None:
    v2 = H * W * 480 + W * 192 + 5696      # the quad convolution's lanes = 16 form
    v4 = H * W * 480 + W * 192 + 14912     # and its 48-pixel zmm tiles
    wide = H * W * 512 + 64
    bound = workspace_bound([v2, v4, wide])
    assert to_record(bound) == to_record(H * W * 512 + W * 192 + 14912)
    _at_least_each(bound, [v2, v4, wide])


def test_bound_with_a_negative_term_is_the_sum() -> None:
    a = H * 100 - W + 5000
    b = W * 300
    bound = workspace_bound([a, b])
    assert to_record(bound) == to_record(a + b)
    _at_least_each(bound, [a, b])


def test_equal_static_and_missing_expressions() -> None:
    e = H * 8 + 64
    assert workspace_bound([e, e]) is e
    assert workspace_bound([None, None]) is None
    assert workspace_bound([128, 512]) == 512
    assert to_record(workspace_bound([e, 1024])) == to_record(H * 8 + 1024)
