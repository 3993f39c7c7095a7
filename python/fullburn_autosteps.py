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
"""

import atexit
import functools
import importlib
import importlib.abc
import inspect
import json
import math
import os
import sys
import threading
import time
import traceback
import weakref

import fullburn_flops
import fullburn_layers
import fullburn_markers

_state = None


class _AutoSteps:
    def __init__(self, torch):
        self.enabled = True
        self.markers = None  # opened at the first step
        self.optimizer = None  # the one whose steps are counted
        self.saw_loader = False
        # step_start: when the step began, pushed later by each stretch left
        # out of it (a save, an evaluation); step_began: when it really
        # began, which such a stretch is compared with (a save before an
        # evaluation must not hide the evaluation).
        self.step_start = None
        self.step_began = None
        self.torch = torch  # None once the first step's "torch" event is written
        self.pid = os.getpid()  # a forked DataLoader worker inherits this state
        self.loop_thread = threading.get_ident()  # the one that steps (set at the first step)
        # With the job's own markers: the DataLoader iterated last, described
        # at the next optimizer step (a validation loader iterated first feeds none).
        self.own_markers_loader = None
        # Without a DataLoader, the model's calls are timed: a global forward
        # pre-hook, armed between calls, finds each top-level module call on
        # the loop's thread; that module's own forward hook ends it.
        self.arm = None  # arms the pre-hook (set by _hook_torch)
        self.call = None  # (module, start, counts as training) of the call running
        self.timed_modules = weakref.WeakSet()  # modules given the end hook
        self.batch_dims = weakref.WeakKeyDictionary()  # module -> its batch dimension (_batch_dim)
        # A loop with no optimizer object (it updates the parameters by hand
        # after backward(), as older examples do): a backward() with none seen
        # yet ends its step at the next batch's fetch or model call.
        self.manual_pending = False
        self.optimizer_made = False  # an Optimizer was constructed: it ends the steps
        self.backward_calls = 0  # with none of its steps seen, said at exit
        self.said_second_optimizer = False
        self.profile = _Profile.from_environment(torch)  # fullburn run --profile A-B
        # One step's FLOPs after the warm-up, for MFU (fullburn_flops.py).
        self.flops = fullburn_flops.FlopCount.from_environment(torch, self.profile)
        # fullburn run --layers: each top-level layer's time and activations.
        self.layers = fullburn_layers.LayerTimes.from_environment(torch)
        self._reset_pending()

    def _reset_pending(self):
        # What fed the step so far, held weakly: an iterator the loop dropped
        # (a `break`) must be freed, and its worker processes with it.
        self.iterator_ref = None
        self.iterator_stepped = False  # an optimizer step happened while it fed
        self.first_fetch = None
        self.wait = 0.0
        self.samples = 0
        self.losses = []
        self.last_activity = None
        self.saved_s = 0.0  # torch.save time since first_fetch (not evaluation)
        self.saving = False  # inside a framework's save that is timed as one (Lightning's)
        # The step's phases on the host: the forward part runs from a batch's
        # fetch to its backward(), the optimizer part from the last backward()
        # to the step's end; saves inside either are left out of it.
        self.mark = None  # the last fetch's or backward()'s end
        self.saved_since_mark = 0.0
        self.forward = 0.0
        self.backward = 0.0
        self.backward_end = None
        # The model's calls (no DataLoader): the training ones' time and
        # samples; calls without grad (or in eval mode) are held until the
        # next training call or step tells a teacher's call from an evaluation.
        self.module_forward = None
        self.module_samples = 0
        self.micro_batch_counted = False
        self.no_grad_calls = []  # [(module id, start, end)]

    def _open(self):
        if self.markers is None:
            self.markers = fullburn_markers.Markers(_automatic=True)
        return self.markers

    # --- the DataLoader side ---------------------------------------------

    def before_fetch(self, iterator, now):
        if self.manual_pending:
            self.manual_step_ended(now)
        if (self.iterator_ref is not None and self.iterator_ref() is not iterator and
                not self.iterator_stepped):
            self._evaluation_ended(now)
        if self.step_start is None:
            self.step_start = self.step_began = now
        if self.first_fetch is None:
            self.first_fetch = now

    def after_fetch(self, iterator, started, batch):
        now = time.time()
        self.saw_loader = True
        if self.iterator_ref is None or self.iterator_ref() is not iterator:
            self.iterator_ref = weakref.ref(iterator)
            self.iterator_stepped = getattr(iterator, "_fullburn_stepped", False)
        self.wait += now - started
        self.samples += fullburn_markers._batch_size(batch)
        self.last_activity = now
        self.mark = now
        self.saved_since_mark = 0.0
        if self.flops is not None and threading.get_ident() == self.loop_thread:
            self.flops.batch_fetched()

    def _write_evaluation(self, end):
        """The fetches since the last step fed no step: an evaluation."""
        start = self.first_fetch if self.first_fetch is not None else end
        m = self._open()
        m._write({"kind": "event", "name": "evaluation", "rank": m.rank, "time": end,
                  "duration_s": max(0.0, end - start - self.saved_s),
                  "data": _evaluation_data({"detected": "automatic"}, m.step)})

    def _evaluation_ended(self, now):
        self._write_evaluation(now)
        self._reset_pending()
        self.step_start = self.step_began = now

    # --- the model's calls (loops without a DataLoader) ------------------

    def _times_modules(self):
        return (self.enabled and not self.saw_loader and os.getpid() == self.pid and
                threading.get_ident() == self.loop_thread)

    def module_call_started(self, module, args, training, now):
        """A top-level module call on the loop's thread: the pre-hook fired
        (and disarmed itself, so the model's own submodules cost nothing)."""
        if module not in self.timed_modules:
            module.register_forward_hook(_module_call_ended)
            self.timed_modules.add(module)
            self.batch_dims[module] = _batch_dim(module)
        self.call = (module, now, training)
        if not training:
            return
        if self.manual_pending:
            self.manual_step_ended(now)
            self.call = (module, now, training)
        self._no_grad_calls_ended(now)
        if self.step_start is None:
            self.step_start = self.step_began = now
        if not self.micro_batch_counted:  # the model's input, not the loss's after it
            samples = fullburn_markers._batch_size(args, dim=self.batch_dims.get(module, 0))
            self.module_samples += samples
            # Called with keywords only (model(**batch)): the hooks see no
            # input, so the output's leading dimension counts them.
            self.micro_batch_counted = samples > 0 or "output"

    def module_call_ended(self, module, output):
        call = self.call
        if call is None or call[0] is not module:
            return  # a call started elsewhere, or a module calling itself
        if call[2] and self.micro_batch_counted == "output":
            self.module_samples += fullburn_markers._batch_size(output)
            self.micro_batch_counted = True
        self.call = None
        now = time.time()
        if call[2]:
            self.module_forward = (self.module_forward or 0.0) + now - call[1]
        else:
            self.no_grad_calls.append((id(module), call[1], now))
        self.last_activity = now
        self.arm()

    def _no_grad_calls_ended(self, now):
        """Calls without grad before this training call (or step end): one
        model called again and again is an evaluation, kept out of the steps;
        else (a teacher's forward) they are the step's forward."""
        calls, self.no_grad_calls = self.no_grad_calls, []
        if not calls:
            return
        start, end = calls[0][1], calls[-1][2]
        ids = [c[0] for c in calls]
        if len(set(ids)) == len(ids):
            self.module_forward = (self.module_forward or 0.0) + sum(c[2] - c[1] for c in calls)
            return
        m = self._open()
        m._write({"kind": "event", "name": "evaluation", "rank": m.rank, "time": end,
                  "duration_s": end - start,
                  "data": _evaluation_data({"detected": "automatic", "model_calls": len(calls)},
                                           m.step)})
        if self.step_start is None:
            self.step_start = self.step_began = end
        elif self.step_began <= start:
            self.step_start += end - start  # the step goes on after it

    def rearm_after(self):
        """After a backward() or a step: a call that never ended (it raised)
        is dropped and the pre-hook armed again."""
        self.micro_batch_counted = False
        self.call = None
        if self.arm is not None and self._times_modules():
            self.arm()

    # --- torch.save --------------------------------------------------------

    def saved(self, target, started, end, nbytes):
        if os.getpid() != self.pid:
            return
        took = end - started
        m = self._open()
        data = {"path": target, "detected": "automatic", "after_step": m.step}
        if nbytes is not None:
            data["bytes"] = nbytes
        if threading.get_ident() != self.loop_thread:
            # An async checkpointer's thread: it blocks nothing, so no step
            # gives back its time.
            data["background"] = True
        else:
            if self.step_start is not None and self.step_began <= started:
                self.step_start += took  # the step it interrupts goes on after it
            if self.first_fetch is not None and self.first_fetch <= started:
                self.saved_s += took
            if self.mark is not None and self.mark <= started:
                self.saved_since_mark += took
        m._write({"kind": "event", "name": "checkpoint", "rank": m.rank, "time": end,
                  "duration_s": took, "data": data})

    # --- the optimizer side ----------------------------------------------

    def record_loss(self, tensor):
        if tensor.numel() != 1:
            return
        if tensor.device.type != "cpu" and not self._open()._sync:
            return  # reading it would wait for the device
        try:
            self.losses.append(tensor.item())
        except (RuntimeError, ValueError):
            pass

    def backward_ran(self, started, end):
        """A backward() on the loop's thread: its time, and the forward's
        before it (from the batch it follows; a second backward() on the same
        batch adds its own forward part, the time since the first)."""
        if os.getpid() != self.pid or threading.get_ident() != self.loop_thread:
            return
        if self.mark is not None:
            self.forward += max(0.0, started - self.mark - self.saved_since_mark)
        self.backward += end - started
        self.backward_calls += 1
        self.backward_end = self.mark = end
        self.saved_since_mark = 0.0
        if self.optimizer is None and not self.optimizer_made:
            self.manual_pending = True
        self.rearm_after()

    def _phases(self, now):
        """',"forward_s":..' for the step ending now: what was measured of it."""
        if self.backward_end is None:
            return ""  # no backward() seen: an optimizer stepped by other means
        phases = ',"backward_s":%r,"optimizer_s":%r' % (
            self.backward, max(0.0, now - self.backward_end - self.saved_since_mark))
        if self.saw_loader and self.first_fetch is not None:
            phases = ',"forward_s":%r' % self.forward + phases
        elif not self.saw_loader and self.module_forward is not None:
            phases = ',"forward_s":%r' % self.module_forward + phases
        return phases

    def manual_step_ended(self, now):
        """The step of a loop without an optimizer: from its batch to the next
        batch's fetch (or model call), its hand-made update included."""
        self.manual_pending = False
        if os.getpid() != self.pid or threading.get_ident() != self.loop_thread:
            return
        self._write_step(None, now, synchronize=False)

    def optimizer_stepped(self, optimizer):
        if self.optimizer is None:
            self.optimizer = optimizer
            self.loop_thread = threading.get_ident()
        self.manual_pending = False
        if optimizer is not self.optimizer:
            if not self.said_second_optimizer:
                # A GAN's generator and discriminator, or a second model:
                # one line, so the step count is not read as per update.
                self.said_second_optimizer = True
                sys.stderr.write(
                    "fullburn: a second optimizer (%s) steps too: a step is counted per %s "
                    "update, the first to step; the other's update is part of it\n" %
                    (type(optimizer).__name__, type(self.optimizer).__name__))
            return
        self._write_step(optimizer, None)

    def _write_step(self, optimizer, now, synchronize=True):
        m = self._open()
        if synchronize:
            m._synchronize()
        if now is None:
            now = time.time()
        self._no_grad_calls_ended(now)
        start = self.step_start if self.step_start is not None else now
        self.note_torch(m, now)
        m.note_mlflow(now)
        m.step += 1
        # Formatted by hand: json.dumps was a fifth of the per-step cost
        # (bench/autosteps_overhead); every value here is a number.
        line = '{"kind":"step","rank":%d,"step":%d,"time":%r,"step_s":%r,"samples":%d' % (
            m.rank, m.step, now, max(0.0, now - start),
            self.samples if self.saw_loader else self.module_samples)
        if self.saw_loader:
            line += ',"data_wait_s":%r' % self.wait
        line += self._phases(now)
        iterator = self.iterator_ref() if self.iterator_ref is not None else None
        if iterator is not None:
            iterator._fullburn_stepped = True  # a persistent-workers iterator comes back
            epoch = getattr(iterator, "_fullburn_epoch", None)
            if epoch is not None:
                line += ',"epoch":%d' % epoch
            loader = getattr(iterator, "_fullburn_loader", None)
            if loader is not None:
                m.describe_loader(loader)
        if self.losses:
            loss = sum(self.losses) / len(self.losses)
            # JSON has no NaN or inf: a diverged loss goes as a string.
            line += ',"loss":' + (repr(loss) if math.isfinite(loss) else '"%r"' % loss)
        lr = _first_lr(optimizer) if optimizer is not None else None
        if lr is not None and math.isfinite(lr):
            line += ',"lr":%r' % lr
        m._write_line(line + "}")
        if self.profile is not None:
            self.profile.step_ended(m.step, m)
        if self.layers is not None:
            self.layers.step_ended(m, m.step)
        set_up_s = 0.0  # the FLOP count's one-time set-up: outside every step
        if self.flops is not None:
            set_up_s = self.flops.step_ended(m.step, m, max(0.0, now - start), self.saw_loader,
                                             may_set_up=synchronize)
        ref = self.iterator_ref
        self._reset_pending()
        self.iterator_ref = ref  # accumulation: the same iterator goes on
        self.iterator_stepped = ref is not None
        self.step_start = self.step_began = now + set_up_s
        self.rearm_after()

    def note_torch(self, m, now):
        """Once, at the first step: what the steps ran with (the tuner checks
        its threads took)."""
        if self.torch is None:
            return
        m._write({"kind": "event", "name": "torch", "rank": m.rank, "time": now,
                  "data": {"version": self.torch.__version__,
                           "threads": self.torch.get_num_threads()}})
        self.torch = None

    def stepped(self, optimizer):
        if self.enabled:
            self.optimizer_stepped(optimizer)
            return
        # The job's own markers time the steps; what it ran with is still recorded.
        if self.torch is not None:
            self.note_torch(self._open(), time.time())
        loader = self.own_markers_loader() if self.own_markers_loader is not None else None
        if loader is not None:
            self._open().describe_loader(loader)
            self.own_markers_loader = None

    def finish(self):
        """At exit: an evaluation after the last step is still written."""
        if not self.enabled:
            return
        if self.markers is None and self.optimizer_made and self.backward_calls >= 2:
            # Gradients were computed, yet no optimizer step reached torch's
            # step hook (an optimizer outside torch.optim, a step through
            # another API): no step count beats a wrong one.
            sys.stderr.write(
                "fullburn: no optimizer step was seen after %d backward() calls (an optimizer "
                "outside torch.optim steps unseen): mark the steps with fullburn_markers, "
                "docs/frameworks.md\n" % self.backward_calls)
        if self.manual_pending:
            self.manual_step_ended(self.last_activity or time.time())
        if self.profile is not None and self.profile.profiler is not None:
            self.profile.stop(self.markers, self.markers.step if self.markers else 0)
        if self.layers is not None:
            self.layers.finish(self.markers)
        if self.no_grad_calls and self.markers is not None:
            self._no_grad_calls_ended(time.time())
        if self.iterator_ref is None or self.iterator_stepped:
            return
        self._write_evaluation(self.last_activity or time.time())

    def hand_over(self, markers):
        """The job made its own Markers: they count from here on."""
        self.enabled = False
        if self.markers is not None:
            markers.step = max(markers.step, self.markers.step)


def _batch_dim(module):
    """1 when every recurrent or attention layer of the model runs
    sequence-first (batch_first=False, torch's default for them), so its input
    is [sequence, batch, ...]; else 0."""
    try:
        import torch.nn as nn
        kinds = (nn.RNNBase, nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer,
                 nn.Transformer)
        firsts = {bool(getattr(m, "batch_first", True)) for m in module.modules() if isinstance(m, kinds)}
    except Exception:  # a module whose modules() misbehaves: count as batch-first
        return 0
    return 1 if firsts == {False} else 0


def _module_call_ended(module, args, output):
    """The forward hook on each module the loop calls at the top level."""
    if _state is not None and _state._times_modules():
        _state.module_call_ended(module, output)


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


def _first_lr(optimizer):
    try:
        lr = optimizer.param_groups[0]["lr"]
        return float(lr)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError, RuntimeError):
        return None


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


TUNE_ENV_VAR = "FULLBURN_TUNE_SET"
_LOADER_SETTINGS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


def _tune_settings():
    """The settings `fullburn tune` asks this trial to run with ({} outside one)."""
    text = os.environ.get(TUNE_ENV_VAR)
    if not text:
        return {}
    try:
        settings = json.loads(text)
        if isinstance(settings, dict):
            return settings
    except ValueError:
        pass
    sys.stderr.write("fullburn: %s is not a JSON object; running the script's own settings\n" %
                     TUNE_ENV_VAR)
    return {}


def _apply_tune_settings(torch, data, settings):
    """Overrides the script's DataLoader arguments and thread count."""
    if "threads" in settings:
        threads = int(settings["threads"])
        set_num_threads = torch.set_num_threads
        set_num_threads(threads)

        @functools.wraps(set_num_threads)
        def tuned_set_num_threads(_ignored):
            set_num_threads(threads)

        torch.set_num_threads = tuned_set_num_threads
    loader = {k: settings[k] for k in _LOADER_SETTINGS if k in settings}
    if not loader:
        return
    original_init = data.DataLoader.__init__
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        if "num_workers" in loader:
            bound.arguments["num_workers"] = int(loader["num_workers"])
        workers = bound.arguments.get("num_workers", 0)
        for key in ("prefetch_factor", "persistent_workers"):
            if key in loader and workers > 0:  # torch refuses them without workers
                bound.arguments[key] = loader[key]
        if "pin_memory" in loader:
            bound.arguments["pin_memory"] = bool(loader["pin_memory"])
        original_init(*bound.args, **bound.kwargs)

    data.DataLoader.__init__ = __init__


PROFILE_ENV_VAR = "FULLBURN_PROFILE"  # "A-B": the steps fullburn run --profile traces


class _Profile:
    """fullburn run --profile A-B: torch.profiler over steps A to B (the
    automatic markers' step numbers), CPU activities and CUDA ones when
    there is a GPU, one ProfilerStep#N per step; the Chrome trace goes to
    $FULLBURN_PROFILE_DIR/rank<R>.pt.trace.json and a `profile` event names
    it, for fullburn run to analyse at the end (docs/analyze.md)."""

    def __init__(self, torch, first, last, folder, stacks):
        self.torch, self.first, self.last = torch, first, last
        self.folder, self.stacks = folder, stacks
        self.profiler = None
        self.done = False
        self.written = None

    @staticmethod
    def from_environment(torch):
        spec = os.environ.get(PROFILE_ENV_VAR)
        folder = os.environ.get("FULLBURN_PROFILE_DIR")
        if not spec or not folder or torch is None:
            return None
        try:
            first, last = (int(x) for x in spec.split("-"))
        except ValueError:
            return None  # fullburn run checked it; a hand-set bad value turns profiling off
        return _Profile(torch, first, last, folder, os.environ.get("FULLBURN_PROFILE_STACKS") == "1")

    def start(self):
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # The schedule is what makes the profiler mark each step
        # (ProfilerStep#N). One step more than asked: stop() after the last
        # closes it, leaving a sliver #N that the analysis leaves out as it
        # leaves out a trace's last step (HTA's rule), so every step asked is
        # whole in the trace.
        steps = self.last - self.first + 2
        self.profiler = torch.profiler.profile(
            activities=activities, with_stack=self.stacks,
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            on_trace_ready=self.export)
        self.profiler.start()

    def export(self, profiler):
        rank = int(os.environ.get("RANK", "0") or 0)
        path = os.path.join(self.folder, "rank%d.pt.trace.json" % rank)
        profiler.export_chrome_trace(path)
        self.written = path

    def step_ended(self, step, markers):
        """After the automatic markers wrote step `step`."""
        if self.done:
            return
        if self.profiler is None:
            if step == self.first - 1:
                self.start()
            return
        self.profiler.step()
        if step >= self.last:
            self.stop(markers, step)

    def stop(self, markers, step):
        """The trace written (a job that ends early: the steps it ran)."""
        self.profiler.stop()  # writes what it has when the schedule has not yet
        self.profiler, self.done = None, True
        if self.written and markers is not None:
            markers._write({"kind": "event", "name": "profile", "rank": markers.rank,
                            "time": time.time(),
                            "data": {"path": self.written, "first_step": self.first,
                                     "last_step": min(step, self.last)}})


class _NoSwap(Exception):
    """Why fullburn.ImageLoader cannot stand in for a DataLoader."""


def _swap_for_fullburn(loader, torch):
    """fullburn.ImageLoader doing what `loader` does (`fullburn tune`'s swap
    trial): an ImageFolder whose transform is RandomResizedCrop + flip (or
    Resize + CenterCrop) + ToTensor + Normalize, read by a random, sequential
    or distributed sampler. Raises _NoSwap naming what differs."""
    dataset = loader.dataset
    if type(dataset).__name__ != "ImageFolder":
        raise _NoSwap("its dataset is a %s, not an ImageFolder" % type(dataset).__name__)
    steps = list(getattr(dataset.transform, "transforms", [dataset.transform]))
    names = [type(t).__name__ for t in steps]
    if names == ["RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]:
        crop_t, flip = steps[0], steps[1]
        if (tuple(crop_t.scale) != (0.08, 1.0) or
                any(abs(a - b) > 1e-6 for a, b in zip(crop_t.ratio, (3 / 4, 4 / 3))) or
                getattr(flip, "p", 0.5) != 0.5):
            raise _NoSwap("its RandomResizedCrop or flip is not torchvision's default")
        train, crop, resize = True, crop_t.size, None
    elif names == ["Resize", "CenterCrop", "ToTensor", "Normalize"]:
        train, crop, resize = False, steps[1].size, steps[0].size
        if isinstance(resize, (list, tuple)):
            if len(resize) != 1:
                raise _NoSwap("its Resize is to a fixed shape, not the shorter side")
            resize = resize[0]
    else:
        raise _NoSwap("its transform is %s, not RandomResizedCrop (or Resize + CenterCrop), "
                      "flip, ToTensor and Normalize" % " + ".join(names))
    if isinstance(crop, (list, tuple)):
        if len(set(crop)) != 1:
            raise _NoSwap("its crop %r is not square" % (crop,))
        crop = crop[0]
    norm = steps[3]
    sampler = type(loader.sampler).__name__
    rank, world, shuffle = 0, 1, sampler == "RandomSampler"
    if sampler == "DistributedSampler":
        rank, world, shuffle = loader.sampler.rank, loader.sampler.num_replicas, loader.sampler.shuffle
    elif sampler not in ("RandomSampler", "SequentialSampler"):
        raise _NoSwap("its sampler is a %s" % sampler)
    import fullburn  # the package beside these helpers (fullburn run puts it on the path)
    swapped = fullburn.ImageLoader(
        dataset.root, loader.batch_size, train=train, crop=int(crop), resize=resize and int(resize),
        shuffle=shuffle, drop_last=loader.drop_last, rank=rank, world_size=world,
        mean=[float(m) for m in norm.mean], std=[float(v) for v in norm.std],
        seed=torch.initial_seed() % (1 << 32))
    if swapped.dataset_size != len(dataset):
        raise _NoSwap("it holds %d images fullburn.ImageLoader can read of %d (JPEG and PNG only)"
                      % (swapped.dataset_size, len(dataset)))
    return swapped


# Where a framework's own code lives: its frames are not the user's.
_FRAMEWORKS = (("/transformers/", "transformers"), ("/accelerate/", "accelerate"),
               ("/lightning/", "lightning"), ("/pytorch_lightning/", "lightning"),
               ("/timm/", "timm"))
_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/", os.path.dirname(os.path.abspath(__file__)))


# The script's integer command-line options as argparse parsed them
# ([(dest, option strings, value)]): a DataLoader's num_workers that one of
# them carried is set on the command line, and the fix names the flag.
_cli_options = []


def _watch_command_line():
    """Wraps ArgumentParser.parse_known_args (parse_args and HF's
    HfArgumentParser go through it) to keep what each option parsed to."""
    import argparse

    original = argparse.ArgumentParser.parse_known_args

    @functools.wraps(original)
    def parse_known_args(parser, *args, **kwargs):
        result = original(parser, *args, **kwargs)
        try:
            namespace = result[0]
            for action in parser._actions:
                value = getattr(namespace, action.dest, None)
                if action.option_strings and type(value) is int:
                    _cli_options.append((action.dest, list(action.option_strings), value))
        except Exception:  # a parser of another shape: nothing kept, the script goes on
            pass
        return result

    argparse.ArgumentParser.parse_known_args = parse_known_args


def _workers_flag(num_workers):
    """The option that gave a DataLoader its num_workers ("--workers",
    "--dataloader_num_workers"), or None: an option about workers whose
    value it is. The last parse wins (a script parses once; a framework's
    second parser comes later)."""
    for dest, strings, value in reversed(_cli_options):
        about_workers = "worker" in dest.lower() or any("worker" in s for s in strings)
        if about_workers and value == num_workers:
            longs = [s for s in strings if s.startswith("--")]
            return max(longs, key=len) if longs else strings[0]
    return None


def _evaluation_options():
    """The script's own options about its evaluations ({"--eval-interval":
    20, "--eval-iters": 40}), for the fix to name: how often, on how many
    batches."""
    found = {}
    for dest, strings, value in _cli_options:
        names = [dest.lower()] + [s.lower() for s in strings]
        if any("eval" in n or n.startswith(("val_", "--val")) for n in names):
            longs = [s for s in strings if s.startswith("--")]
            found[max(longs, key=len) if longs else strings[0]] = value
    return found


def _evaluation_data(data, step):
    """An evaluation event's data: the step it came after, the options."""
    data["after_step"] = step
    options = _evaluation_options()
    if options:
        data["options"] = options
        data["script"] = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return data


def _creation_site(frame):
    """Where a DataLoader is being made: the first frame of the user's own
    code ("train.py:47", "ShapesData.train_dataloader"), and the framework
    involved, so the diagnosis can name the argument to change where the user
    sets it. The framework is the one the user's code called into to get the
    loader (transformers' Trainer builds it from TrainingArguments, through
    accelerate; accelerator.prepare() rebuilds one), else the one that called
    the user's code (Lightning calls a DataModule's train_dataloader())."""
    site, called_into, caller = {}, None, None
    while frame is not None:
        path = frame.f_code.co_filename
        library = path.startswith("<") or any(d in path for d in _LIBRARY_DIRS)
        named = next((name for key, name in _FRAMEWORKS if key in path), None)
        if not site:
            if library:
                called_into = named or called_into
            else:
                where = os.path.relpath(path)
                site = {"created_at": "%s:%d" % (path if where.startswith("..") else where,
                                                 frame.f_lineno),
                        "created_in": getattr(frame.f_code, "co_qualname", frame.f_code.co_name)}
        elif named and caller is None:
            caller = named
        frame = frame.f_back
    framework = called_into or caller
    if framework:
        site["framework"] = framework
    return site


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
    global _state
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
    swaps = weakref.WeakKeyDictionary()  # DataLoader -> its fullburn.ImageLoader, or None

    def swapped_iter(loader):
        """fullburn tune's swap trial: the DataLoader's epoch read by
        fullburn.ImageLoader, or None (said once) when it cannot be."""
        if loader not in swaps:
            try:
                swaps[loader] = _swap_for_fullburn(loader, torch)
                loader._fullburn_swapped = "fullburn.ImageLoader"
            except Exception as e:  # _NoSwap, or the package not importable
                sys.stderr.write("fullburn: fullburn.ImageLoader cannot stand in for this "
                                 "DataLoader (%s): it runs as written\n" % e)
                swaps[loader] = None
        swapped = swaps[loader]
        if swapped is None:
            return None
        epochs = getattr(loader, "_fullburn_epochs", -1) + 1  # each iter() a new epoch, as a DataLoader's
        loader._fullburn_epochs = epochs
        sampler_epoch = getattr(loader.sampler, "epoch", None)
        swapped.set_epoch(sampler_epoch if isinstance(sampler_epoch, int) else epochs)
        iterator = iter(swapped)
        iterator._fullburn_loader = loader
        iterator._fullburn_epoch = epochs
        return iterator

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

    original_next = data._BaseDataLoaderIter.__next__

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

    original_backward = torch.Tensor.backward
    scaled_last = []  # [(scaled loss, loss)]: GradScaler.scale's last call

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

    # GradScaler.scale(loss).backward(): the loss before scaling is recorded.
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None) or getattr(
        torch.cuda.amp, "GradScaler", None)
    original_scale = scaler_class.scale if scaler_class is not None else None

    def scale(scaler, outputs):
        scaled = original_scale(scaler, outputs)
        scaled_last.clear()
        if isinstance(outputs, torch.Tensor):
            scaled_last.append((scaled, outputs))
        return scaled

    modules = importlib.import_module("torch.nn.modules.module")
    register_pre = getattr(modules, "register_module_forward_pre_hook", None)
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

    serialization = importlib.import_module("torch.serialization")
    original_save = serialization.save

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
        end = time.time()
        try:
            state.saved(_save_target(f), started, end, _saved_bytes(f, position))
        except Exception:  # the save itself succeeded; the marker is not worth failing it
            pass
        return result

    settings = _tune_settings()
    if settings:
        _apply_tune_settings(torch, data, settings)
    if scaler_class is not None:
        scaler_class.scale = scale
    original_loader_init = data.DataLoader.__init__

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

    data.DataLoader.__init__ = loader_init
    data.DataLoader.__iter__ = __iter__
    data._BaseDataLoaderIter.__next__ = __next__
    torch.Tensor.backward = backward
    torch.save = serialization.save = save
    if register_pre is not None:
        state.arm = arm
        arm()
    if register is not None:
        register(lambda optimizer, args, kwargs: state.stepped(optimizer))
    else:

        def _optimizer_step_code(optimizer):
            original_code(optimizer)
            state.stepped(optimizer)

        optim.Optimizer._optimizer_step_code = _optimizer_step_code
    # A loop with an optimizer object steps through it, even before its
    # first step (accumulation): only one without any updates by hand.
    original_optim_init = optim.Optimizer.__init__

    @functools.wraps(original_optim_init)
    def optimizer_init(optimizer, *args, **kwargs):
        state.optimizer_made = True
        return original_optim_init(optimizer, *args, **kwargs)

    optim.Optimizer.__init__ = optimizer_init
    if state.profile is not None and state.profile.first <= 1:
        state.profile.start()  # from step 1: the profile begins here
    _state = state
    atexit.register(state.finish)


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Hooks a module right after its import has run (torch, safetensors.torch),
    so a script that never imports it pays nothing and one that does needs no
    change."""

    def __init__(self, name, hook):
        self.name = name
        self.hook = hook

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once: a module imports only once
        spec = None
        for finder in sys.meta_path:  # PathFinder, or an editable install's finder
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(name, path, target) if find_spec else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        hook = self.hook

        def exec_and_hook(module):
            exec_module(module)
            try:
                hook(module)
            except Exception as e:  # never break the job over its markers
                sys.stderr.write("fullburn: automatic step markers are off (%s: %s)\n" %
                                 (type(e).__name__, e))

        spec.loader.exec_module = exec_and_hook
        return spec


def _timed_save(original, path_index, path_name, whole):
    """A framework's save function as a checkpoint write: its time, and the
    file its `path_index`-th argument (or `path_name`) names, with its size.
    `whole`: the torch.save calls inside it are part of it, not written again."""

    @functools.wraps(original)
    def timed(*args, **kwargs):
        state = _state
        if state is None or not state.enabled or state.saving:
            return original(*args, **kwargs)
        path = args[path_index] if len(args) > path_index else kwargs.get(path_name)
        started = time.time()
        state.saving = whole
        try:
            result = original(*args, **kwargs)
        finally:
            state.saving = False
        end = time.time()
        try:
            state.saved(_save_target(path), started, end, _saved_bytes(path, None))
        except Exception:  # the save itself succeeded; the marker is not worth failing it
            pass
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
