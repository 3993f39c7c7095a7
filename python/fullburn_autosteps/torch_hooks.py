"""The torch hooks. `_hook_torch` runs once the job imports torch (install()
watches for it): it looks up everything it wraps, then puts in each hook,
each made by its own function below:

- `_iter_hook`: iter(loader), whose start-up (the worker processes) is the
  next fetch's data wait; the swap trial's fullburn.ImageLoader (loader_swap.py);
- `_next_hook`: next() on a DataLoader iterator, the step's data wait;
- `_backward_hook` and `_scale_hook`: tensor.backward() (the loss, the
  step's phases) and GradScaler.scale (the loss before scaling);
- `_model_call_hooks`: the global forward pre-hook that finds the model's
  top-level calls in a loop with no DataLoader (steps.py);
- `_save_hook`: torch.save, a checkpoint write (checkpoints.py);
- `_loader_init_hook`: where each DataLoader is made (frameworks.py);
- `_step_code_hook` (torch 1.x; 2.x's global step post-hook needs none) and
  `_optimizer_init_hook`: the optimizer's steps, which end the steps.

The wrappers keep the names py-spy shows and src/stacks/stacks.cpp reads
(`__iter__`, `__next__`, `backward`, `save`)."""

import atexit
import functools
import importlib
import os
import sys
import threading
import time
import weakref

import fullburn_autosteps as _package  # its _state: set here, once torch is hooked

from .checkpoints import _TimingHooksHidden, _is_path, _mark_saved
from .frameworks import _creation_site, _workers_flag
from .loader_swap import _swapper
from .steps import _AutoSteps
from .tune_settings import _apply_tune_settings, _tune_settings


# The PyTorch versions these hooks are tested with (docs/testing.md, "Two
# PyTorch versions"): Debian's and PyPI's pinned one.
TESTED_TORCH = ((1, 13), (2, 11))


def untested_torch(version):
    """The one line to say for a torch outside the tested range, or None."""
    try:
        major_minor = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        major_minor = None
    if major_minor is not None and TESTED_TORCH[0] <= major_minor <= TESTED_TORCH[-1]:
        return None
    return ("fullburn: PyTorch %s is outside the versions the step hooks are tested with "
            "(%s to %s): steps are timed where its hooks allow; check the step count in the "
            "summary\n" % (version, ".".join(map(str, TESTED_TORCH[0])),
                            ".".join(map(str, TESTED_TORCH[-1]))))


def _hook_torch(torch):
    warning = untested_torch(str(getattr(torch, "__version__", "unknown")))
    if warning:
        sys.stderr.write(warning)
    state = _AutoSteps(torch)
    # Everything is looked up before anything is patched: a torch without one
    # of these hooks is left as it was.
    data = importlib.import_module("torch.utils.data.dataloader")
    optim = importlib.import_module("torch.optim.optimizer")
    register = getattr(optim, "register_optimizer_step_post_hook", None)
    original_code = optim.Optimizer._optimizer_step_code if register is None else None
    original_iter = data.DataLoader.__iter__
    swap = _tune_settings().get("loader") == "fullburn"
    original_next = data._BaseDataLoaderIter.__next__
    original_backward = torch.Tensor.backward
    # GradScaler.scale(loss).backward(): the loss before scaling is recorded.
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None) or getattr(
        torch.cuda.amp, "GradScaler", None)
    original_scale = scaler_class.scale if scaler_class is not None else None
    modules = importlib.import_module("torch.nn.modules.module")
    register_pre = getattr(modules, "register_module_forward_pre_hook", None)
    serialization = importlib.import_module("torch.serialization")
    original_save = serialization.save

    settings = _tune_settings()
    if settings:
        _apply_tune_settings(torch, data, settings)
    scaled_last = []  # [(scaled loss, loss)]: GradScaler.scale's last call
    if scaler_class is not None:
        scaler_class.scale = _scale_hook(torch, original_scale, scaled_last)
    # After the tuned settings: their __init__ is the one wrapped.
    data.DataLoader.__init__ = _loader_init_hook(data.DataLoader.__init__)
    data.DataLoader.__iter__ = _iter_hook(state, torch, original_iter, swap)
    data._BaseDataLoaderIter.__next__ = _next_hook(state, original_next)
    torch.Tensor.backward = _backward_hook(state, original_backward, scaled_last)
    torch.save = serialization.save = _save_hook(state, original_save)
    if register_pre is not None:
        state.arm = _model_call_hooks(state, torch, register_pre)
        state.arm()
    if register is not None:
        register(lambda optimizer, args, kwargs: state.stepped(optimizer))
    else:
        optim.Optimizer._optimizer_step_code = _step_code_hook(state, original_code)
    # A loop with an optimizer object steps through it, even before its
    # first step (accumulation): only one without any updates by hand.
    optim.Optimizer.__init__ = _optimizer_init_hook(state, optim.Optimizer.__init__)
    if state.profile is not None and state.profile.first <= 1:
        state.profile.start()  # from step 1: the profile begins here
    _package._state = state
    atexit.register(state.finish)


def _iter_hook(state, torch, original_iter, swap):
    """DataLoader.__iter__: starting the workers is data wait too, charged to
    the step it delays; `swap`: fullburn tune's swap trial."""
    swapped_iter = _swapper(torch)

    def __iter__(loader):
        if swap and state.enabled:
            iterator = swapped_iter(loader)
            if iterator is not None:
                return iterator
        if not state.enabled:
            # The job's own markers time its steps; the training loader's
            # settings are still recorded (its markers do only for steps(loader)).
            state.own_markers_loader = weakref.ref(loader)
            return original_iter(loader)
        started = time.time()
        iterator = original_iter(loader)
        # Starting workers is data wait too, charged to the step it delays.
        epochs = getattr(loader, "_fullburn_epochs", -1) + 1
        try:
            loader._fullburn_epochs = epochs
            iterator._fullburn_loader = loader
            iterator._fullburn_epoch = epochs
            iterator._fullburn_iter_s = time.time() - started
        except AttributeError:
            pass
        return iterator

    return __iter__


def _next_hook(state, original_next):
    """_BaseDataLoaderIter.__next__: each fetch, the step's data wait."""

    def __next__(iterator):
        if not state.enabled:
            return original_next(iterator)
        started = time.time()
        startup = getattr(iterator, "_fullburn_iter_s", 0.0)
        if startup:  # iter(loader) just ran: its time is this fetch's
            iterator._fullburn_iter_s = 0.0
            started -= startup
        state.before_fetch(iterator, started)
        try:
            batch = original_next(iterator)
        except StopIteration:
            state.last_activity = time.time()
            if state.first_fetch == started:  # finding it empty starts no evaluation
                state.first_fetch = None
            raise
        state.after_fetch(iterator, started, batch)
        return batch

    return __next__


def _backward_hook(state, original_backward, scaled_last):
    """Tensor.backward: the loss (the one before scaling when GradScaler.scale
    made this tensor, `scaled_last`), and the backward's time."""

    def backward(tensor, *args, **kwargs):
        if not state.enabled:
            return original_backward(tensor, *args, **kwargs)
        unscaled = tensor
        if scaled_last and scaled_last[0][0] is tensor:
            unscaled = scaled_last.pop()[1]
        state.record_loss(unscaled)
        started = time.time()
        result = original_backward(tensor, *args, **kwargs)
        if state.layers is not None:
            state.layers.backward_returned()
        state.backward_ran(started, time.time())
        return result

    return backward


def _scale_hook(torch, original_scale, scaled_last):
    """GradScaler.scale: keeps its last (scaled loss, loss) in `scaled_last`."""

    def scale(scaler, outputs):
        scaled = original_scale(scaler, outputs)
        scaled_last.clear()
        if isinstance(outputs, torch.Tensor):
            scaled_last.append((scaled, outputs))
        return scaled

    return scale


def _model_call_hooks(state, torch, register_pre):
    """The global forward pre-hook, armed only between the model's calls:
    returns `arm`, which registers it (once) again."""
    armed = []  # the global pre-hook's handle while it is armed

    def module_pre_hook(module, args):
        if state.enabled and not state.saw_loader and os.getpid() == state.pid:
            if threading.get_ident() != state.loop_thread:
                return None  # another thread's call: stays armed for the loop's
            try:
                state.module_call_started(module, args, torch.is_grad_enabled() and module.training,
                                          time.time())
            except Exception:  # a module that takes no hooks goes untimed; the job goes on
                state.call = None
        # Disarmed during the call, so the model's submodules (and a compiled
        # model's traced code) see no global hook; a DataLoader's loop, or a
        # job with its own markers, never arms it again.
        while armed:
            armed.pop().remove()
        return None

    def arm():
        if not armed:
            armed.append(register_pre(module_pre_hook))

    return arm


def _save_hook(state, original_save):
    """torch.save: a "checkpoint" event, its time left out of the step."""

    @functools.wraps(original_save)
    def save(obj, f, *args, **kwargs):
        if not state.enabled:
            return original_save(obj, f, *args, **kwargs)
        if state.saving:  # part of a save timed whole (Lightning's, to memory first)
            with _TimingHooksHidden(obj):
                return original_save(obj, f, *args, **kwargs)
        started = time.time()
        try:
            position = None if _is_path(f) else f.tell()
        except (OSError, ValueError, AttributeError):
            position = None
        with _TimingHooksHidden(obj):
            result = original_save(obj, f, *args, **kwargs)
        _mark_saved(state, f, position, started)
        return result

    return save


def _loader_init_hook(original_loader_init):
    """DataLoader.__init__: where the loader was made (frameworks.py), and the
    command-line option that set its workers."""

    @functools.wraps(original_loader_init)
    def loader_init(loader, *args, **kwargs):
        original_loader_init(loader, *args, **kwargs)
        if "_fullburn_created" not in loader.__dict__:  # a subclass's __init__ calls this again
            try:
                site = _creation_site(sys._getframe(1))
                flag = _workers_flag(getattr(loader, "num_workers", None))
                if flag:
                    site["workers_flag"] = flag
                    site["script"] = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
                loader.__dict__["_fullburn_created"] = site
            except Exception:  # where it was made is a hint, never worth failing the job
                pass

    return loader_init


def _step_code_hook(state, original_code):
    """torch 1.x, with no global step post-hook: Optimizer._optimizer_step_code
    (the profiler's hook, which every step() runs) ends the step."""

    def _optimizer_step_code(optimizer):
        original_code(optimizer)
        state.stepped(optimizer)

    return _optimizer_step_code


def _optimizer_init_hook(state, original_optim_init):
    """Optimizer.__init__: a loop with an optimizer object has its steps end
    at its step(), not at the next batch (a loop updating by hand)."""

    @functools.wraps(original_optim_init)
    def optimizer_init(optimizer, *args, **kwargs):
        state.optimizer_made = True
        return original_optim_init(optimizer, *args, **kwargs)

    return optimizer_init
