"""fullburn.markers: the step markers (python/fullburn_markers.py), so one
import serves both. Under `fullburn run` the markers module on the job's path
is this one too: the two names share one module and one step counter."""
import sys

try:
    import fullburn_markers as _impl
except ImportError:  # installed without fullburn's helper folder on the path
    from . import _markers_impl as _impl

    sys.modules.setdefault("fullburn_markers", _impl)

sys.modules[__name__] = _impl
