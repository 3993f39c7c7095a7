"""Step timing: `_AutoSteps`, the state the torch hooks (torch_hooks.py) feed
and that writes the "step" and "evaluation" events (and, through
checkpoints.py's hooks, the "checkpoint" ones); and the model-call timing of
a loop with no DataLoader (the forward hook `_module_call_ended`)."""

import math
import os
import sys
import threading
import time
import weakref

import fullburn_flops
import fullburn_layers
import fullburn_markers

import fullburn_autosteps as _package  # its _state: the hooks' _AutoSteps, once torch is hooked

from .frameworks import _evaluation_data
from .profiler import _Profile


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
    state = _package._state
    if state is not None and state._times_modules():
        state.module_call_ended(module, output)


def _first_lr(optimizer):
    try:
        lr = optimizer.param_groups[0]["lr"]
        return float(lr)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError, RuntimeError):
        return None
