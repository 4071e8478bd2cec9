"""Graph passes and the pipeline that runs them."""

from .fuse import fuse_ops
from .legalize import legalize
from .pipeline import DEFAULT_PIPELINE, Pass, run_pipeline
from .simplify import bind_params, eliminate_dead_code, fold_constants

__all__ = ["DEFAULT_PIPELINE", "Pass", "bind_params", "eliminate_dead_code", "fold_constants",
           "fuse_ops", "legalize", "run_pipeline"]
