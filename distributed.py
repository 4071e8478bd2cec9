"""``mlcpack.distributed``: run a bundle over a Ray Dataset (``pip install 'mlcpack[ray]'``).

The implementation is ``mlcpack.runtime.distributed`` (shipped with the runtime, no compiler)."""

from .runtime.distributed import BundlePredictor, predict, run_paths

__all__ = ["BundlePredictor", "predict", "run_paths"]
