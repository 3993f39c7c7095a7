"""Per-layer time and activation memory of an unchanged PyTorch job, for
`fullburn run --layers` (FULLBURN_LAYERS=1; docs/stacks.md, "Layers"), and
the record of an out-of-memory error (always).

The automatic step hooks (fullburn_autosteps/steps.py) make one `LayerTimes` when
--layers is on and tell it of each step's end and each backward()'s return.

- The model: the first module called on the loop's thread with grad enabled,
  in training mode, that has parameters and children (a global forward
  pre-hook finds it and removes itself). Wrappers with one child (DDP,
  torch.compile's OptimizedModule) are looked through. Its top-level
  children are the layers.
- Forward: each child's call, pre-hook to forward hook (a child called twice
  in a step counts twice). Backward: a gradient hook on each child's output
  fires when autograd reaches it, where that child's backward begins; it
  ends at the next such hook, or when backward() returns. Children run in
  sequence (a Sequential, a GPT's blocks) are timed exactly; a child whose
  output branches is timed up to the next child's, a bound.
- On CUDA the same points are CUDA events, recorded on the current stream
  and read a step later once complete (Event.query()): no synchronisation
  inside the step. On the CPU they are perf_counter() readings.
- Activation memory: the bytes autograd saves for backward during each
  child's forward (torch.autograd.graph.saved_tensors_hooks), each storage
  once, the child's own weights left out.
- A "layers" event every 20 steps and at exit: each child's median forward
  and backward time per step and activation bytes over the steps after the
  first 3 (warm-up), and the hooks' own cost per step.

Everything here is a hint: a model whose hooks fail is not timed, and the
job goes on.
"""

import os
import statistics
import threading
import time

LAYERS_ENV_VAR = "FULLBURN_LAYERS"
WARMUP_STEPS = 3
WRITE_EVERY = 20

_running = None  # (layer name, "forward" | "backward") while a layer runs


def running_layer():
    """The layer and pass running now, for an out-of-memory's record."""
    return _running


def _storage_key(t):
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    try:
        return storage.data_ptr(), storage.nbytes()
    except Exception:
        return id(t), t.numel() * t.element_size()


class LayerTimes:
    @staticmethod
    def from_environment(torch):
        if os.environ.get(LAYERS_ENV_VAR, "") not in ("1", "true", "on"):
            return None
        try:
            return LayerTimes(torch)
        except Exception as e:  # no layers; the job goes on
            import sys

            sys.stderr.write("fullburn: --layers is off (%s: %s)\n" % (type(e).__name__, e))
            return None

    def __init__(self, torch):
        self.torch = torch
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.model = None
        self.names = []  # the children's names, in order
        self.types = []
        self.params = []
        self.cuda = False
        self.marks = []  # this step's (kind, index, time or CUDA event)
        self.saved = {}  # index -> {storage key: bytes} this step
        self.pending = []  # steps whose CUDA events are not read yet
        self.rows = []  # per step after the warm-up: (forward[], backward[], saved[])
        self.steps = 0
        self.hook_s = 0.0  # the hooks' own host time, all steps
        self.context = None  # the saved-tensors hooks of the child running
        self.weights = {}  # index -> its parameters' storages, left out of the activations
        modules = __import__("torch.nn.modules.module", fromlist=["module"])
        self.finder = modules.register_module_forward_pre_hook(self._find_model)

    # --- finding the model -------------------------------------------------

    def _find_model(self, module, args):
        if (os.getpid() != self.pid or threading.get_ident() != self.thread or
                not self.torch.is_grad_enabled() or not module.training):
            return None
        if next(module.parameters(), None) is None or next(module.children(), None) is None:
            return None
        self.finder.remove()
        try:
            self._attach(module)
        except Exception:
            self.model = None
        return None

    def _attach(self, model):
        while True:
            children = list(model.named_children())
            if len(children) != 1:
                break
            model = children[0][1]
        self.model = model
        for index, (name, child) in enumerate(model.named_children()):
            self.names.append(name)
            self.types.append(type(child).__name__)
            self.params.append(sum(p.numel() for p in child.parameters()))
            child.register_forward_pre_hook(self._pre(index))
            child.register_forward_hook(self._post(index))
        first = next(model.parameters(), None)
        self.cuda = first is not None and first.is_cuda

    def _stamp(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    # --- the hooks -----------------------------------------------------------

    def _counting(self):
        return os.getpid() == self.pid and threading.get_ident() == self.thread and \
            self.torch.is_grad_enabled()

    def _pre(self, index):
        def pre(module, args):
            global _running
            if not self._counting() or not module.training:
                return None
            started = time.perf_counter()
            if self.context is not None:  # a forward that raised: its hooks are still pushed
                self.context.__exit__(None, None, None)
            saved = self.saved.setdefault(index, {})
            # The weights autograd saves are not activations.
            weights = self.weights.get(index)
            if weights is None:
                weights = self.weights[index] = {_storage_key(p)[0] for p in module.parameters()}

            def pack(t):
                key, nbytes = _storage_key(t)
                if key not in weights:
                    saved[key] = nbytes
                return t

            self.context = self.torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            self.context.__enter__()
            _running = (self.names[index], "forward")
            self.marks.append(("fwd", index, self._stamp()))
            self.hook_s += time.perf_counter() - started
            return None

        return pre

    def _post(self, index):
        def post(module, args, output):
            global _running
            if self.context is None:
                return None
            started = time.perf_counter()
            self.marks.append(("fwd_end", index, self._stamp()))
            self.context.__exit__(None, None, None)
            self.context = None
            _running = None
            tensor = output
            if isinstance(output, (tuple, list)) and output:
                tensor = output[0]
            elif isinstance(output, dict) and output:
                tensor = next(iter(output.values()))
            if isinstance(tensor, self.torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(self._grad_hook(index))
            self.hook_s += time.perf_counter() - started
            return None

        return post

    def _grad_hook(self, index):
        def hook(grad):
            global _running
            _running = (self.names[index], "backward")
            self.marks.append(("bwd", index, self._stamp()))
            return None

        return hook

    def backward_returned(self):
        global _running
        if self.model is None or os.getpid() != self.pid or threading.get_ident() != self.thread:
            return
        _running = None
        self.marks.append(("bwd_end", -1, self._stamp()))

    # --- per step ------------------------------------------------------------

    def _seconds(self, a, b):
        if self.cuda:
            return a.elapsed_time(b) / 1000.0
        return b - a

    def _row(self, marks, saved):
        n = len(self.names)
        forward, backward = [0.0] * n, [0.0] * n
        opened = {}
        for i, (kind, index, stamp) in enumerate(marks):
            if kind == "fwd":
                opened[index] = stamp
            elif kind == "fwd_end" and index in opened:
                forward[index] += self._seconds(opened.pop(index), stamp)
            elif kind == "bwd":
                nxt = next((m for m in marks[i + 1:] if m[0] in ("bwd", "bwd_end")), None)
                if nxt is not None:
                    backward[index] += self._seconds(stamp, nxt[2])
        return forward, backward, [sum(saved.get(i, {}).values()) for i in range(n)]

    def _ready(self, marks):
        return not self.cuda or all(m[2].query() for m in marks)

    def step_ended(self, markers, step):
        if self.model is None or os.getpid() != self.pid:
            return
        self.steps += 1
        marks, saved = self.marks, self.saved
        self.marks, self.saved = [], {}
        if self.steps > WARMUP_STEPS and marks:
            self.pending.append((marks, saved))
        while self.pending and self._ready(self.pending[0][0]):
            self.rows.append(self._row(*self.pending.pop(0)))
        if self.rows and self.steps % WRITE_EVERY == 0:
            self.write(markers)

    def write(self, markers):
        if not self.rows:
            return
        layers = []
        for i, name in enumerate(self.names):
            layers.append({"name": name, "type": self.types[i], "params": self.params[i],
                           "forward_s": statistics.median(r[0][i] for r in self.rows),
                           "backward_s": statistics.median(r[1][i] for r in self.rows),
                           "activation_bytes": int(statistics.median(r[2][i] for r in self.rows))})
        markers._write({"kind": "event", "name": "layers", "rank": markers.rank, "time": time.time(),
                        "data": {"device": "cuda" if self.cuda else "cpu", "steps": len(self.rows),
                                 "model": type(self.model).__name__, "layers": layers,
                                 "hooks_s_per_step": self.hook_s / max(1, self.steps)}})

    def finish(self, markers):
        if self.model is None or markers is None:
            return
        if self.cuda and self.pending:
            try:
                self.torch.cuda.synchronize()  # the job is over: nothing left to stall
            except Exception:
                pass
            while self.pending:
                self.rows.append(self._row(*self.pending.pop(0)))
        self.write(markers)


def _module_in_traceback(tb, torch):
    """The innermost torch.nn.Module whose forward the traceback passes
    through, and the pass: "backward" when autograd's backward is on it."""
    module, backward = None, False
    while tb is not None:
        frame = tb.tb_frame
        code = frame.f_code
        if code.co_name in ("backward", "_engine_run_backward", "run_backward") and \
                os.sep + "torch" + os.sep in code.co_filename:
            backward = True
        candidate = frame.f_locals.get("self") if code.co_name in ("forward", "_call_impl") else None
        if isinstance(candidate, torch.nn.Module):
            module = candidate
        tb = tb.tb_next
    return module, backward


def out_of_memory(torch, exc, tb):
    """The record of an out-of-memory error: the layer and pass that ran,
    and the CUDA allocator's allocated, reserved and total bytes, or None
    for another exception."""
    text = type(exc).__name__ + ": " + str(exc)
    if "OutOfMemoryError" not in text and "out of memory" not in text:
        return None
    record = {}
    if _running is not None:
        record["layer"], record["pass"] = _running
    else:
        module, backward = _module_in_traceback(tb, torch)
        if module is not None:
            record["module_type"] = type(module).__name__
        if module is not None or backward:  # raised outside the model: no pass to name
            record["pass"] = "backward" if backward else "forward"
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            record.update(allocated_bytes=torch.cuda.memory_allocated(),
                          reserved_bytes=torch.cuda.memory_reserved(),
                          max_allocated_bytes=torch.cuda.max_memory_allocated(),
                          free_bytes=free, total_bytes=total,
                          alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    except Exception:  # the record goes without the allocator's numbers
        pass
    return record
