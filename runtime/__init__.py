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

# The release of this runtime (runtime/pyproject.toml's version; mlcpack.__version__ and
# mlcpack.packager.__version__ are the same release: tests/runtime/test_session_api.py checks them).
__version__ = "0.1.0"
