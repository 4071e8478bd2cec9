"""What a loaded ``Model`` delegates to: one plan object per bundle kind, chosen once at load.

A bundle runs one of three ways, and each is one implementation of ``session.ModelPlan``
(defined beside the ``Session`` it makes; this module holds the specs both read):

- ``static_plan.FixedPlan``: every shape fixed at export, one memory plan (format 1.0);
- ``static_plan.BatchPlans``: one static plan per batch size, any batch run in chunks of them
  (format 1.1);
- ``symbolic_plan.SymbolicPlan``: symbolic shapes, planned per input size at run time, or once
  for an upper bound (``--max-shape``), with or without static plans for exact batch sizes
  beside them (``--batch-sizes``) (format 1.3).

A plan holds what every session of the model shares (the mapped code, the weights, the decoded
bytecode) and makes sessions: ``session.Session`` subclasses that hold an arena and worker
threads of their own and run, profile and close the same way whatever the kind. ``Model.run``
is its own session's ``run``; ``model.session()`` is ``plan.session(threads)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a bundle. ``shape`` is a concrete shape it runs at (for a
    dynamic-batch bundle: its smallest plan's); ``dims`` is what the bundle accepts, the batch
    dim shown as "N" (any batch from 1 up, run on the plans of ``batch_sizes``), as
    ``mlcpack inspect`` shows it."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    tensor: int
    batch_sizes: tuple[int, ...] | None = None   # the plans' batch sizes, when batched

    @property
    def dims(self) -> tuple[int | str, ...]:
        return ("N", *self.shape[1:]) if self.batch_sizes else self.shape

    def __str__(self) -> str:
        plans = f" (plans for N = {', '.join(map(str, self.batch_sizes))})" \
            if self.batch_sizes else ""
        return f"{self.name} [{', '.join(map(str, self.dims))}] {self.dtype}{plans}"


@dataclass(frozen=True)
class BatchInfo:
    """A dynamic-batch bundle's plan sizes (ascending) and its batched inputs and outputs."""
    sizes: tuple[int, ...]
    inputs: frozenset[str]
    outputs: frozenset[str]


@dataclass(frozen=True)
class Inplace:
    """When a run hands the kernels the caller's arrays instead of the arena's copies, read
    where the tests may change them (``runtime/model.py``'s ``INPLACE_MIN_BYTES`` and
    ``OUTPUT_INPLACE_MIN_BYTES``): ``input_min_bytes()`` at each run, ``output_min_bytes()``
    when a session's plans are made."""
    input_min_bytes: Callable[[], int]
    output_min_bytes: Callable[[], int]
