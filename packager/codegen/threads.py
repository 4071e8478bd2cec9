"""How much work a kernel needs before it splits over the thread pool: the two thresholds the
emitters read from the compile options (``CompileOptions.parallel_min_macs`` and
``parallel_min_outputs``, tests set them to 0 to split every kernel), their defaults, and the
defaults as an object for emitters built without options. Pure Python that imports nothing of
the compiler: ``options.py`` takes its defaults from here, and the emitters, which
``options.py`` reaches when it resolves layout choices, never import the options module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Below this many multiply-adds (~4 µs on one core) a contraction, depthwise or channel-lane
# kernel runs on one thread. The runtime's native hand-off (codegen/threadpool.py) costs about a
# microsecond: a matmul of 131 K MACs measured 0.99x on 2 threads, 524 K 1.43x, 2 M 1.88x (the
# lock hand-off it replaced cost 30-40 µs, and the threshold was 8 M).
PARALLEL_MIN_MACS = 1 << 18
# Below this many outputs the generic loop nest, softmax and normalization run on one thread (a
# hand-off costs well under a microsecond, runtime/vm.py; a kernel this small not much more).
PARALLEL_MIN_OUTPUTS = 1 << 14


class SplitThresholds(Protocol):
    """What an emitter reads of the compile options."""
    parallel_min_macs: int
    parallel_min_outputs: int


@dataclass(frozen=True)
class Thresholds:
    """The defaults, for an emitter built without compile options (tests, the int8 kernels)."""
    parallel_min_macs: int = PARALLEL_MIN_MACS
    parallel_min_outputs: int = PARALLEL_MIN_OUTPUTS


DEFAULTS = Thresholds()
