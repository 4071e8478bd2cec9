"""How much work a kernel needs before it splits over the thread pool: the thresholds the
emitters read from the compile options (``CompileOptions.parallel_min_macs``,
``parallel_min_weight_bytes`` and ``parallel_min_outputs``; tests set the first and last to 0
to split every kernel), their defaults, and the defaults as an object for emitters built
without options. Pure Python that imports nothing of
the compiler: ``options.py`` takes its defaults from here, and the emitters, which
``options.py`` reaches when it resolves layout choices, never import the options module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

# Below this many multiply-adds (~4 µs on one core) a contraction, depthwise or channel-lane
# kernel runs on one thread. The runtime's native hand-off (codegen/threadpool.py) costs about a
# microsecond: a matmul of 131 K MACs measured 0.99x on 2 threads, 524 K 1.43x, 2 M 1.88x (the
# lock hand-off it replaced cost 30-40 µs, and the threshold was 8 M).
PARALLEL_MIN_MACS = 1 << 18
# A matmul of one to three rows (batch 1 or a small batch) does a multiply-add per weight it
# reads, so its time follows the bytes of its second operand, streamed from L2 (or farther) on
# every call, not its multiply-adds: the demo MLP's 784 x 128 layer (100 K MACs, under the
# threshold above) reads its 392 KiB of packed weights in 4.1 us on one core of Zen 4 (AVX2),
# the time of a plain read of them (~100 GB/s), and each half in 2.0 us. Split by output
# columns, each thread reads only its share of the weights into its own core's cache. From
# this many bytes (~2.7 us of reading on one core, ~10x the native hand-off's cost) such a
# matmul splits whatever its multiply-adds, if it has at least two work items (the
# register-blocked kernel's column panels, or the dot-product kernel's rows of a narrow W). The
# dot-product kernel's 1x1 convolutions on a 1x1 image (squeeze-and-excitation blocks) split
# by their multiply-adds only: inside a whole model, splitting them was not measured on a
# quiet host (a loaded one showed nothing either way).
PARALLEL_MIN_WEIGHT_BYTES = 256 << 10
# Below this many outputs the generic loop nest, softmax and normalization run on one thread (a
# hand-off costs well under a microsecond, runtime/vm.py; a kernel this small not much more).
PARALLEL_MIN_OUTPUTS = 1 << 14


class SplitThresholds(Protocol):
    """What an emitter reads of the compile options."""
    parallel_min_macs: int
    parallel_min_weight_bytes: int
    parallel_min_outputs: int


@dataclass(frozen=True)
class Thresholds:
    """The defaults, for an emitter built without compile options (tests, the int8 kernels)."""
    parallel_min_macs: int = PARALLEL_MIN_MACS
    parallel_min_weight_bytes: int = PARALLEL_MIN_WEIGHT_BYTES
    parallel_min_outputs: int = PARALLEL_MIN_OUTPUTS


DEFAULTS = Thresholds()


def two_thread_share(weights: list[int]) -> float:
    """The larger of two threads' shares of a kernel's work when its ``weights`` (per work item,
    in item order) are split as the kernels split them on two threads (items ``[0, n // 2)``
    on the first, with one task per thread or with home ranges of 8 tasks alike), as a
    fraction of half the work: 1.0 is an even split."""
    total = sum(weights)
    if total <= 0 or len(weights) < 2:
        return 2.0
    first = sum(weights[:len(weights) // 2])
    return max(first, total - first) * 2 / total


def balanced(candidates: list, weights: Callable[[Any], list[int]], gain: float = 0.02) -> Any:
    """Of ``candidates`` (the kernel's own plan first, then others it may take instead), the
    one whose work items split most evenly on two threads (``two_thread_share`` of
    ``weights(candidate)``; the earliest of equals), if that beats the first by more than
    ``gain``; else the first."""
    shares = [two_thread_share(weights(c)) for c in candidates]
    best = min(range(len(candidates)), key=lambda i: (shares[i], i))
    return candidates[best] if shares[best] < shares[0] - gain else candidates[0]
