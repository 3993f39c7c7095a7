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


def _native_missing(error):
    """One line for an ImportError of _native: a module built for another
    Python beside these files, or none at all (a source tree's package)."""
    import glob
    import os
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(here, "_native*.so")))
    wanted = "_native" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    if built and wanted not in built:
        return ("fullburn in %s was built for another Python (%s), not this one (needs %s): "
                "pip install . with this interpreter, or use the Python it was built for"
                % (here, ", ".join(built), wanted))
    if built:
        return "fullburn's native module in %s does not load (%s): reinstall (pip install --force-reinstall fullburn)" % (here, error)
    return ("fullburn's native module is not in %s (a source tree's package?): pip install . "
            "(docs/install.md), or build it (scripts/build.sh) and use build/python" % here)


try:
    from ._version import __version__  # written by the build, as _native is
    from . import _native
except ImportError as e:
    raise ImportError(_native_missing(e)) from None
if getattr(_native, "__version__", None) != __version__:
    raise ImportError(
        "fullburn's native module (%s, version %s) is from another build than its Python files "
        "(version %s): rebuild (pip install . or scripts/build.sh), not a mix of the two"
        % (_native.__file__, getattr(_native, "__version__", "unknown"), __version__))

DataError = _native.DataError

from ._loaders import ImageLoader, TokenLoader  # noqa: E402
from ._checkpoint import SaveHandle, load, save_async  # noqa: E402
from . import markers  # noqa: E402

__all__ = ["DataError", "ImageLoader", "TokenLoader", "SaveHandle", "save_async", "load",
           "markers", "__version__"]
