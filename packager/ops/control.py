"""Control flow: an ONNX ``If`` whose condition is known only at run time, run as the VM's
branch (format 1.7: JUMP_UNLESS, JUMP, TRAP) so that only the taken branch runs.

``if`` takes the condition (one bool) and the values its branches read from outside
(``captures``); ``branches`` names the two graph functions of the module that compute its
outputs from the captures ("" for a branch that refuses the run: TRAP). Its value is output 0;
``if_output`` gives output ``index`` > 0 of the ``if`` it takes; ``check`` refuses the run
(JUMP_UNLESS over a TRAP) where a size relation that a branch needs fails. Neither is a kernel: the VM
emitter (``vm_emit.py``) lays out both branches, each copying its results into the outputs'
memory. An output's extents that differ between the branches are size variables that each
branch binds (BIND_SIZE) before it copies. The references evaluate nothing: the numpy
reference of a module with branches is ``golden.evaluate_ir``'s, which runs the taken one.

A Loop whose trip count or condition has no bound at export is the VM's counted loop (format
1.8: LOOP ... NEXT): ``loop`` takes the trip count (int64 (1,)), the condition (bool (1,)), the
carried values' first values and the captures; ``body`` names the graph function of one
iteration (iteration number, carried values, captures -> condition, new carried values). Its
value is carried value 0 at the end, ``loop_output`` the others. ``golden.evaluate_ir`` runs
the body as the VM does. Scan outputs with no bound at export (format 1.9): ``rows`` lists their
rows' (shape, dtype), which the body gives after its carried values and the VM appends to a
row store each iteration; ``count`` names the size variable the loop's row count is bound to
after it (``bind_size``), and ``loop_rows`` is one such output, of that many rows. Carried
values that grow (format 1.10): ``grown`` lists, per carried value the body only grows by a
Concat (``acc = Concat(acc, r)``), ``(axis, the rows' shape past the axis, dtype, count)``; its
initial value is one of the ``loop``'s last arguments (after the captures, one per entry), the
body gives its ``r`` after the scan rows, the VM appends the initial value then each ``r`` to a
row store, and ``loop_rows`` with ``lead = axis`` (that many 1s before the count) returns it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.graph import TensorType
from ..ir.sym import Dim
from .registry import BRANCH, VIEW, register_op


def _output_type(outputs: Sequence[tuple], index: int) -> TensorType:
    shape, dtype = outputs[index]
    return TensorType(tuple(shape), dtype)


def _infer_if(cond: TensorType, *captures: TensorType, branches: tuple[str, str] = ("", ""),
              outputs: Sequence[tuple] = ()) -> TensorType:
    if cond.dtype != "bool" or cond.shape != (1,):
        raise ValueError(f"if: the condition must be one bool of shape (1,), not {cond}")
    if len(branches) != 2 or not outputs or not any(branches):
        raise ValueError("if: two branches (at most one refusing) and an output are needed")
    return _output_type(outputs, 0)


@register_op("if", BRANCH, _infer_if)
def if_(cond: np.ndarray, *captures: np.ndarray, branches: tuple[str, str] = ("", ""),
        outputs: Sequence[tuple] = ()) -> np.ndarray:
    raise NotImplementedError("if: evaluated by golden.evaluate_ir, which runs one branch")


def _infer_if_output(first: TensorType, index: int = 1, outputs: Sequence[tuple] = ()
                     ) -> TensorType:
    if not 0 < index < len(outputs):
        raise ValueError(f"if_output: output {index} of an if with {len(outputs)} outputs")
    return _output_type(outputs, index)


@register_op("if_output", BRANCH, _infer_if_output)
def if_output(first: np.ndarray, index: int = 1, outputs: Sequence[tuple] = ()) -> np.ndarray:
    raise NotImplementedError("if_output: evaluated by golden.evaluate_ir with its if")


def _infer_check(bad: TensorType, where: str = "", trap: int = 1) -> TensorType:
    if bad.dtype != "bool" or bad.shape != (1,) or trap not in (1, 2):
        raise ValueError(f"check: the flag must be one bool of shape (1,), not {bad}")
    return bad


@register_op("check", BRANCH, _infer_check)
def check(bad: np.ndarray, where: str = "", trap: int = 1) -> np.ndarray:
    """A size relation a branch needs (``where`` names it): the VM refuses the run (TRAP
    ``trap``: 1, a relation of an If's branch; 2, format 1.9, a Loop's carried value whose
    shape changed) where ``bad`` holds. Never dropped as dead code."""
    return bad


def _infer_carried_view(x: TensorType, shape: tuple = ()) -> TensorType:
    if len(shape) != len(x.shape):
        raise ValueError(f"carried_view: {x} as rank {len(shape)}")
    return TensorType(tuple(shape), x.dtype)


@register_op("carried_view", VIEW, _infer_carried_view)
def carried_view(x: np.ndarray, shape: tuple = ()) -> np.ndarray:
    """A Loop's new carried value as the shape it had, its extents counted in the body and
    checked equal to those at run time (a ``check`` with ``trap`` 2 before it): a view, no
    kernel, no size relation assumed."""
    return x.reshape(shape)


def _infer_loop(trip: TensorType, cond: TensorType, *values: TensorType, body: str = "",
                carried: int = 0, outputs: Sequence[tuple] = (), rows: Sequence[tuple] = (),
                count: str = "", grown: Sequence[tuple] = (),
                resized: Sequence[int] = ()) -> TensorType:
    if trip.dtype != "int64" or trip.shape != (1,):
        raise ValueError(f"loop: the trip count must be one int64 of shape (1,), not {trip}")
    if cond.dtype != "bool" or cond.shape != (1,):
        raise ValueError(f"loop: the condition must be one bool of shape (1,), not {cond}")
    if not body or carried < 1 or len(outputs) != carried or len(values) < carried:
        raise ValueError("loop: a body and at least one carried value are needed")
    for k, (t, out) in enumerate(zip(values, outputs)):
        if k in resized:   # its extents the body's (size variables bound at run time)
            if t.dtype != out[1] or len(t.shape) != len(out[0]):
                raise ValueError(f"loop: resized carried value {k} is {t}, its output {out}")
        elif t != _output_type(outputs, k):
            raise ValueError(f"loop: carried value {k} is {t}, its output {out}")
    return _output_type(outputs, 0)


@register_op("loop", BRANCH, _infer_loop)
def loop(trip: np.ndarray, cond: np.ndarray, *values: np.ndarray, body: str = "",
         carried: int = 0, outputs: Sequence[tuple] = (), rows: Sequence[tuple] = (),
         count: str = "", grown: Sequence[tuple] = (), resized: Sequence[int] = ()
         ) -> np.ndarray:
    """A Loop run by the VM (format 1.8: LOOP ... NEXT): the graph function ``body`` takes the
    iteration number (int64 of shape ()), the ``carried`` values and the captures (``values``
    past the carried ones) and gives the condition (one bool) and the new carried values; it
    runs while the iteration number is below ``trip`` and the condition holds. Its value is
    the last carried value 0 (``loop_output`` the others)."""
    raise NotImplementedError("loop: evaluated by golden.evaluate_ir, which runs its body")


def _infer_loop_output(first: TensorType, index: int = 1, outputs: Sequence[tuple] = ()
                       ) -> TensorType:
    if not 0 < index < len(outputs):
        raise ValueError(f"loop_output: output {index} of a loop with {len(outputs)} outputs")
    return _output_type(outputs, index)


@register_op("loop_output", BRANCH, _infer_loop_output)
def loop_output(first: np.ndarray, index: int = 1, outputs: Sequence[tuple] = ()) -> np.ndarray:
    raise NotImplementedError("loop_output: evaluated by golden.evaluate_ir with its loop")


def _infer_loop_rows(first: TensorType, after: TensorType, index: int = 0,
                     count: Dim = 0, row: tuple = ((), "float32"), lead: int = 0) -> TensorType:
    shape, dtype = row
    return TensorType((1,) * lead + (count,) + tuple(shape), dtype)


@register_op("loop_rows", BRANCH, _infer_loop_rows)
def loop_rows(first: np.ndarray, after: np.ndarray, index: int = 0, count: Dim = 0,
              row: tuple = ((), "float32"), lead: int = 0) -> np.ndarray:
    """The loop's output ``index`` (its carried values first, then its row outputs), a scan
    output of a loop whose rows
    have no bound at export (format 1.9): the ``count`` rows the VM appended, ``after`` the
    binding of that count. Evaluated by golden.evaluate_ir with its loop."""
    raise NotImplementedError("loop_rows: evaluated by golden.evaluate_ir with its loop")
