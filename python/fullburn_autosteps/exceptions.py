"""An uncaught exception as an "exception" event (type, message, where, and
what ran out of memory), for the diagnosis to name first."""

import os
import sys
import time
import traceback

import fullburn_layers
import fullburn_markers


def _where(tb):
    """"train.py:42": the innermost frame of the job's own code (not torch's
    or the standard library's), else the innermost one."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    library = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep,
               os.path.dirname(os.__file__) + os.sep)
    own = [f for f in frames if not any(part in f.filename for part in library)]
    frame = (own or frames)[-1]
    return "%s:%d" % (os.path.basename(frame.filename), frame.lineno)


def _record_uncaught_exceptions():
    """An uncaught exception becomes an "exception" event (type, message, where)
    that the diagnosis names first, with the usual fix for its kind."""
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        if not issubclass(exc_type, KeyboardInterrupt):  # Ctrl-C is not a failure
            try:
                m = fullburn_markers.Markers(_automatic=True)
                data = {"type": exc_type.__name__, "message": str(exc)[:2000], "where": _where(tb)}
                torch = sys.modules.get("torch")
                oom = fullburn_layers.out_of_memory(torch, exc, tb) if torch is not None else None
                if oom is not None:
                    data["oom"] = oom
                m._write({"kind": "event", "name": "exception", "rank": m.rank, "time": time.time(),
                          "data": data})
                m.close()
            except Exception:  # the traceback is printed whatever happens here
                pass
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
