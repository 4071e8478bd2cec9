"""mlcpack's runtime: loads ``.mlc`` bundles and runs them with numpy, msgpack and the standard
library only. It never imports the compiler (packager/, frontends/, llvmlite, onnx).

    from mlcpack.runtime import load
    model = load("model.mlc")
    y = model(x)
"""

from .errors import (BundleError, CodeLoadError, CpuFeatureError, FormatVersionError, InputError,
                     LibraryFunctionError, MlcpackError, SignatureError)
from .library import register_library_function
from .model import Model, TensorSpec, load

__all__ = ["BundleError", "CodeLoadError", "CpuFeatureError", "FormatVersionError", "InputError",
           "LibraryFunctionError", "MlcpackError", "Model", "SignatureError", "TensorSpec", "load",
           "register_library_function"]
