"""Loaded by Python at start-up because `fullburn run` puts this folder first
on the child's PYTHONPATH: marks a PyTorch job's steps with no change to it
(python/fullburn_autosteps/), then runs the sitecustomize it shadows."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _admit_stack_sampler():
    """Under Yama's ptrace_scope=1 only a process's ancestors may read it:
    this one, and each worker it forks or spawns, names fullburn (whose child
    py-spy is) as allowed to (PR_SET_PTRACER). Without Yama the call fails,
    harmlessly."""
    tracer = os.environ.get("FULLBURN_PTRACER", "")
    if not tracer.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
        pr_set_ptracer = 0x59616D61

        def admit():
            prctl(pr_set_ptracer, int(tracer), 0, 0, 0)

        admit()
        os.register_at_fork(after_in_child=admit)
    except Exception:  # no stacks from this process; the job runs as it is
        pass


_admit_stack_sampler()
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
