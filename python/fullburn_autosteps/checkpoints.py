"""Checkpoint timing: what torch.save (torch_hooks.py's `save` hook) and the
frameworks' save functions wrote, and how long it took, for the "checkpoint"
event (`_AutoSteps.saved`): safetensors.torch.save_file and Lightning's
_atomic_save are hooked here, as their modules are imported (install())."""

import functools
import os
import time

import fullburn_autosteps as _package  # its _state: the hooks' _AutoSteps, once torch is hooked

from .steps import _module_call_ended


class _TimingHooksHidden:
    """While torch.save pickles whole modules, our forward hooks are taken off
    them (and put back after): a file that names fullburn's code would not
    load where fullburn is not."""

    def __init__(self, obj):
        self.removed = []
        if isinstance(obj, dict):
            values = obj.values()
        else:
            values = obj if isinstance(obj, (list, tuple)) else (obj,)
        try:
            for value in values:
                if not hasattr(value, "_forward_hooks"):
                    continue  # not a module
                for module in value.modules():
                    hooks = getattr(module, "_forward_hooks", None)
                    for key, hook in list(hooks.items()) if hooks else ():
                        if hook is _module_call_ended:
                            del hooks[key]
                            self.removed.append((hooks, key))
        except Exception:  # never fail a save over its markers
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for hooks, key in self.removed:
            hooks[key] = _module_call_ended


def _is_path(f):
    return isinstance(f, (str, bytes, os.PathLike))


def _save_target(f):
    """What torch.save wrote to, for people: a path, a file's name, or "<memory>"."""
    if _is_path(f):
        return os.fsdecode(os.fspath(f))
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else "<memory>"


def _saved_bytes(f, position):
    """The size of what torch.save wrote: the file's, or how far the stream moved."""
    try:
        if _is_path(f):
            return os.path.getsize(f)
        if position is not None:
            return f.tell() - position
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return None


def _mark_saved(state, f, position, started):
    """The "checkpoint" event of a save that ended now: `f` the file (or
    buffer) it wrote, `position` where a buffer stood before it."""
    end = time.time()
    try:
        state.saved(_save_target(f), started, end, _saved_bytes(f, position))
    except Exception:  # the save itself succeeded; the marker is not worth failing it
        pass


def _timed_save(original, path_index, path_name, whole):
    """A framework's save function as a checkpoint write: its time, and the
    file its `path_index`-th argument (or `path_name`) names, with its size.
    `whole`: the torch.save calls inside it are part of it, not written again."""

    @functools.wraps(original)
    def timed(*args, **kwargs):
        state = _package._state
        if state is None or not state.enabled or state.saving:
            return original(*args, **kwargs)
        path = args[path_index] if len(args) > path_index else kwargs.get(path_name)
        started = time.time()
        state.saving = whole
        try:
            result = original(*args, **kwargs)
        finally:
            state.saving = False
        _mark_saved(state, path, None, started)
        return result

    return timed


def _hook_lightning_save(module):
    """Lightning writes a checkpoint in two parts: torch.save into memory, then
    the bytes to the file through fsspec (cloud_io._atomic_save, which its
    TorchCheckpointIO calls). The whole call is the checkpoint write, with the
    file's path."""
    module._atomic_save = _timed_save(module._atomic_save, 1, "filepath", whole=True)


def _hook_safetensors(module):
    """safetensors.torch.save_file (its save_model calls it) is a checkpoint
    write like torch.save: Hugging Face's Trainer, timm and accelerate write
    a model's weights with it. Hooked as the module is first imported, before
    a framework binds the name (`from safetensors.torch import save_file`)."""
    module.save_file = _timed_save(module.save_file, 1, "filename", whole=False)
