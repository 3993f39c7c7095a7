"""fullburn from Python: the input pipeline, the asynchronous checkpoint and
the step markers of fullburn's C++ core, for PyTorch training scripts.

    import fullburn
    loader = fullburn.ImageLoader("data/train", batch_size=256, device="cuda")
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:       # torch tensors, normalized
            ...
    handle = fullburn.save_async(model.state_dict(), "ckpt.safetensors")

docs/python.md is the guide: the API, how long a batch's memory lives,
threads and the GIL, and how this differs from DataLoader, DALI and FFCV.
torch is imported only when a loader yields or is built with device="cuda",
or when a checkpoint is saved or loaded, so the module imports without it.
"""
from ._version import __version__

try:
    from . import _native
except ImportError as e:  # the .py files without the built module beside them
    raise ImportError(
        "fullburn's native module is not built here (%s): build with pybind11-dev and "
        "python3-dev installed (scripts/build.sh), then use build/python or "
        "cmake --install BUILD --component python" % e) from None

DataError = _native.DataError

from ._loaders import ImageLoader, TokenLoader  # noqa: E402
from ._checkpoint import SaveHandle, load, save_async  # noqa: E402
from . import markers  # noqa: E402

__all__ = ["DataError", "ImageLoader", "TokenLoader", "SaveHandle", "save_async", "load",
           "markers", "__version__"]
