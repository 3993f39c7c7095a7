"""Step markers for an unchanged PyTorch script, under `fullburn run`.

`fullburn run` puts python/autosteps/ first on the child's PYTHONPATH; its
sitecustomize.py calls `install()`, which waits for the script to import torch
and then hooks four places:

- the end of `optimizer.step()` (torch's global step post-hook where it has
  one, 2.x; `Optimizer._optimizer_step_code`, the profiler's hook, in 1.x)
  ends a step. Only the first optimizer that steps counts, so a GAN's second
  optimizer or an optimizer wrapping another does not split steps;
- `next()` on a torch DataLoader iterator, and `iter(loader)`, which starts
  the worker processes, are timed as the step's data wait; the batches' sizes
  add up to the step's samples (micro-batches of an accumulated step too);
- `tensor.backward()` on a one-element tensor records the step's loss when
  it can be read without waiting for the device (a CPU tensor, or any tensor
  with FULLBURN_MARKERS_SYNC=1); the mean over the step's backward calls;
  and times the step's phases on the host: backward_s (the backward calls),
  forward_s (from each batch's fetch to its backward: the copy to the
  device, zero_grad, the forward and the loss) and optimizer_s (from the
  last backward to the step's end: unscaling, clipping, the update). What
  is left of the step (the loop's own work after optimizer.step() and
  before the next batch: logging, metrics, the LR scheduler) is the rest.
  On a GPU these are host times: the host runs ahead and waits where it
  synchronizes, so the GPU's utilization bounds what the diagnosis reads
  into them;
- `torch.save()`, `safetensors.torch.save_file()` (the weights Hugging
  Face's Trainer, timm and accelerate write) and Lightning's `_atomic_save`
  (its torch.save into memory and the file's write, timed whole) are each
  written as a "checkpoint" event (duration, path and bytes; the diagnosis takes the
  files written after one step as one checkpoint), and their time is left
  out of the step it falls in: the loop is
  blocked, not training, and the diagnosis counts that time as the
  checkpoints' (checkpoint_stall), not as a slow step.

Evaluation: fetches from a DataLoader iterator during which no optimizer step
happens (a validation loop) are not a step. When another iterator is fetched
from next (training goes on), that stretch is written as an "evaluation" event
and the next step starts after it, so it shows as time outside the steps.

`fullburn tune -- CMD` tries settings on the unchanged script through
FULLBURN_TUNE_SET, a JSON object applied when torch is imported: the
DataLoader arguments `num_workers`, `prefetch_factor`, `persistent_workers`
and `pin_memory` (to every DataLoader the script makes; the last three only
with workers, where torch accepts them) and `threads` (torch.set_num_threads,
the script's own calls included). What took effect is recorded: the
"dataloader" event, and a "torch" event at the first step (its threads).

A loop with no DataLoader (nanoGPT's get_batch()) has no fetch to time, so
its steps carry no data_wait_s (unmeasured, not zero). Its model is timed
instead: a global forward pre-hook, armed only between calls (so the model's
submodules, and a compiled model's traced code, never see a global hook),
finds each top-level module call on the loop's thread, and a forward hook on
that module ends it. forward_s is the time in the calls with grad (the
model's, the loss module's); the first call of each micro-batch gives its
samples (its first tensor's leading dimension, or its second where the model
runs its recurrent or attention layers sequence-first, batch_first=False,
as word_language_model's [35, 20] batches of 20 sequences; called with keywords only,
which global hooks do not see, its output's first tensor with one). Calls
without grad or in eval mode are held: if one module was called more than
once before the next training call, they were an evaluation
(estimate_loss()), written as an event and kept out of the steps; else (a
teacher's forward) they count as forward. What is left of the step,
get_batch() included, is the loop's own work. torch.save of a whole module
takes these hooks off it while it pickles.

A job with its own markers (fullburn_markers.Markers, steps()) turns this off
the moment it makes one, and its step numbers go on from these. A step
skipped by a GradScaler (inf/NaN) never reaches the hook, so its time goes to
the next step.

The package, one module per concern (_hook_torch's hooks are in torch_hooks.py):

- steps.py: `_AutoSteps`, the step timing the hooks feed (the "step" and
  "evaluation" events) and the model-call timing of a loop with no DataLoader;
- torch_hooks.py: `_hook_torch`, one function per hook on torch, and the
  PyTorch versions they are tested with (`untested_torch`);
- checkpoints.py: checkpoint timing (torch.save's, safetensors', Lightning's);
- tune_settings.py: `fullburn tune`'s FULLBURN_TUNE_SET;
- loader_swap.py: the tune trial that reads a DataLoader's epochs with
  fullburn.ImageLoader;
- profiler.py: fullburn run --profile's torch.profiler;
- frameworks.py: where each DataLoader is made and by which framework, and
  the script's command-line options;
- exceptions.py: an uncaught exception as an "exception" event;
- import_watch.py: the hook run right after a module's import.

Standard library only, and nothing here imports torch: the job does.
"""

import os
import sys

import fullburn_markers

from .checkpoints import _hook_lightning_save, _hook_safetensors
from .exceptions import _record_uncaught_exceptions
from .frameworks import _watch_command_line
from .import_watch import _ImportWatch
from .profiler import PROFILE_ENV_VAR  # noqa: F401 (the package's names, as the single file's)
from .torch_hooks import TESTED_TORCH, _hook_torch, untested_torch  # noqa: F401
from .tune_settings import TUNE_ENV_VAR  # noqa: F401

# The hooks' _AutoSteps once torch is hooked (torch_hooks.py sets it), else
# None; python/package/fullburn/_loaders.py reads it from
# sys.modules["fullburn_autosteps"].
_state = None


def install():
    """Called by python/autosteps/sitecustomize.py; a no-op outside `fullburn run`."""
    if not os.environ.get(fullburn_markers.ENV_VAR):
        return
    _record_uncaught_exceptions()
    _watch_command_line()
    fullburn_markers._on_explicit_markers = lambda m: _state is not None and _state.hand_over(m)
    for name, hook in (("torch", _hook_torch), ("safetensors.torch", _hook_safetensors),
                       ("lightning.fabric.utilities.cloud_io", _hook_lightning_save),
                       ("lightning_fabric.utilities.cloud_io", _hook_lightning_save)):
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            sys.meta_path.insert(0, _ImportWatch(name, hook))
