"""The depthwise convolution kernels (one input channel per group): ``static.py`` for shapes
known at export, ``symbolic.py`` for run-time image sizes (it reuses the static kernel's plane
setup and fused epilogue). Both are rows of the kernel rule table (``codegen/rules.py``), tried
before the register-blocked contraction, which would also take them."""
