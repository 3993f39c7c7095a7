"""Loaded by Python at start-up because `fullburn run` puts this folder first
on the child's PYTHONPATH: marks a PyTorch job's steps with no change to it
(python/fullburn_autosteps.py), then runs the sitecustomize it shadows."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    import fullburn_autosteps

    fullburn_autosteps.install()
except Exception as e:  # the job runs whatever happens to its markers
    sys.stderr.write("fullburn: automatic step markers are off (%s: %s)\n" % (type(e).__name__, e))

# Debian's, a virtualenv's or the user's own sitecustomize still runs.
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
