"""One training step's FLOPs, counted once, for MFU (docs/diagnosis.md, "Used well").

The automatic step hooks (fullburn_autosteps/steps.py) call `FlopCount.step_ended`
after each step they write. After the warm-up, step FULLBURN_FLOPS_STEP (default
3) runs under torch.utils.flop_counter's FlopCounterMode (its dispatch mode
alone, without its per-module tracking), from its first batch's arrival
(the end of the step before, in a loop without a DataLoader) to the end of
its own optimizer.step(): the forward and backward of every micro-batch, in
plain loops, Lightning (whose optimizer.step runs the closure), the HF
Trainer and accelerate alike. One "flops" event says what it found:

- flops: the step's FLOPs (FlopCounterMode's formulas: matmuls,
  convolutions, attention); by_dtype: the same split by the dtype the ops
  computed in (autocast has cast their inputs by the time they are counted),
  conv_by_dtype the convolutions' part of it; device: where they ran;
- uncounted: the ops that likely compute but have no formula (a custom
  op's namespace, an aten matmul or attention variant FlopCounterMode does
  not know): where any ran, MFU is a lower bound, and the event says so;
- counted_s and median_step_s: the counted step's time and the median of the
  steps before it, so the count's cost is said. The count stops once it has
  run FULLBURN_FLOPS_BUDGET (default 2) times that median, so the counted
  step takes its batch's wait and at most about twice a step's work; a count
  cut short gives no FLOPs, only its reason;
- tf32_matmul, tf32_cudnn: whether fp32 matmuls and convolutions may use
  TF32 tensor cores.

A model compiled by torch.compile is counted too: under the counting mode
its step runs op by op (the same count as eager), slower, within the budget.
PyTorch without a per-op FlopCounterMode (before 2.4; Debian's 1.13) or a
count that raises gets one event with the reason instead, and one line on
stderr; the job goes on.
"""

import os
import sys
import time

FLOPS_STEP_ENV_VAR = "FULLBURN_FLOPS_STEP"
BUDGET_ENV_VAR = "FULLBURN_FLOPS_BUDGET"

# Namespaces of ops that compute nothing a FLOP count is after:
# collectives, the profiler's marks, shape and memory bookkeeping.
_QUIET_NAMESPACES = {"aten", "prim", "prims", "c10d", "_c10d_functional", "c10d_functional",
                     "profiler", "_dtensor", "_quantized", "inductor", "debugprims"}
# aten ops whose names say they multiply matrices or attend: if
# FlopCounterMode has no formula for one, the count misses its FLOPs.
_HEAVY_WORDS = ("mm", "conv", "attention", "gemm", "linear", "matmul", "einsum")


def _int_env(name, default):
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _float_env(name, default):
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _first_tensor(torch, values):
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, (list, tuple)):
            t = _first_tensor(torch, v)
            if t is not None:
                return t
    return None


def _median(values):
    s = sorted(values)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _tf32_flags(torch):
    matmul = None
    try:
        matmul = torch.get_float32_matmul_precision() != "highest"
    except Exception:  # noqa: BLE001 - an older or unusual build: unknown
        pass
    cudnn = getattr(getattr(torch.backends, "cudnn", None), "allow_tf32", None)
    return matmul, cudnn


def make_counter_class(torch):
    """A FlopCounterMode that also splits the FLOPs by dtype and device and
    lists the ops it has no formula for; raises RuntimeError naming why
    where this torch cannot."""
    try:
        from torch.utils import flop_counter
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        raise RuntimeError("PyTorch %s has no torch.utils.flop_counter.FlopCounterMode "
                           "(2.1 and newer have it)" % torch.__version__)
    if not hasattr(FlopCounterMode, "_count_flops"):
        raise RuntimeError("PyTorch %s's FlopCounterMode does not count op by op, as "
                           "newer ones do" % torch.__version__)
    # The dispatch mode alone, without FlopCounterMode's ModuleTracker: its
    # per-module hooks (forward and backward) cost more than the count, and
    # only the whole step's total is wanted.
    bare_mode = getattr(flop_counter, "_FlopCounterMode", None)

    # The CPU's SDPA kernels have no formula of their own; their arguments
    # start as the flash kernels' do (query, key, value; grad_out first
    # backward), so the flash formulas count them.
    aten = torch.ops.aten
    cpu_sdpa = {}
    for cpu_name, gpu_name in (("_scaled_dot_product_flash_attention_for_cpu",
                                "_scaled_dot_product_flash_attention"),
                               ("_scaled_dot_product_flash_attention_for_cpu_backward",
                                "_scaled_dot_product_flash_attention_backward")):
        cpu_op, gpu_op = getattr(aten, cpu_name, None), getattr(aten, gpu_name, None)
        formula = flop_counter.flop_registry.get(gpu_op) if gpu_op is not None else None
        if cpu_op is not None and formula is not None:
            cpu_sdpa[cpu_op] = formula

    class Counter(FlopCounterMode):
        def __init__(self, deadline=None):
            super().__init__(display=False)
            self.flop_registry.update(cpu_sdpa)  # already shape-wrapped, as the registry's
            self.by_dtype = {}
            self.conv_by_dtype = {}  # of by_dtype, convolutions (cuDNN's TF32 flag, not matmul's)
            self.devices = set()
            self.uncounted = {}
            self.deadline = deadline  # time.time() past which counting stops
            self.cut_short = False

        def __enter__(self):
            if bare_mode is None:
                return super().__enter__()
            self.flop_counts.clear()
            self.mode = bare_mode(self)
            self.mode.__enter__()
            return self

        def __exit__(self, *args):
            if bare_mode is None:
                return super().__exit__(*args)
            mode, self.mode = self.mode, None
            return mode.__exit__(*args)

        def _count_flops(self, func_packet, out, args, kwargs):
            if self.cut_short:
                return out
            if self.deadline is not None and time.time() > self.deadline:
                self.cut_short = True
                return out
            if func_packet in self.flop_registry:
                before = self.get_total_flops()
                out = super()._count_flops(func_packet, out, args, kwargs)
                added = self.get_total_flops() - before
                t = _first_tensor(torch, args)
                if t is not None and added > 0:
                    key = str(t.dtype).replace("torch.", "")
                    self.by_dtype[key] = self.by_dtype.get(key, 0) + added
                    if "conv" in str(func_packet):
                        self.conv_by_dtype[key] = self.conv_by_dtype.get(key, 0) + added
                    self.devices.add(t.device.type)
                return out
            name = str(func_packet)
            namespace = name.split(".", 1)[0]
            op = name.split(".", 1)[-1]
            if namespace not in _QUIET_NAMESPACES or any(w in op for w in _HEAVY_WORDS):
                self.uncounted[name] = self.uncounted.get(name, 0) + 1
            return out

    return Counter


def count_once(torch, fn, *args, **kwargs):
    """FLOPs of one call of fn(*args) (its forward and backward if it runs
    them), with the event's fields; for tests and tools."""
    counter = make_counter_class(torch)()
    with counter:
        fn(*args, **kwargs)
    return _describe(torch, counter)


def _describe(torch, counter):
    matmul, cudnn = _tf32_flags(torch)
    devices = sorted(counter.devices)
    data = {"flops": int(counter.get_total_flops()),
            "by_dtype": {k: int(v) for k, v in sorted(counter.by_dtype.items())},
            "conv_by_dtype": {k: int(v) for k, v in sorted(counter.conv_by_dtype.items())},
            "device": devices[0] if len(devices) == 1 else ",".join(devices) or "none",
            "uncounted": sorted(counter.uncounted)[:20],
            "tf32_matmul": matmul, "tf32_cudnn": cudnn}
    if counter.uncounted:
        data["lower_bound"] = True
    return data


class FlopCount:
    """Counts the FLOPs of one step after the warm-up (see the module's doc)."""

    def __init__(self, torch, step, budget, avoid=None):
        self.torch = torch
        self.step = step  # the step counted
        self.budget = budget  # multiples of the median step; 0: no limit
        self.avoid = avoid  # (first, last) steps another tool times (--profile)
        self.counter_class = None
        self.counter = None
        self.done = False
        self.durations = []
        self.median = None
        self.armed = None  # the markers, while waiting for the counted step's first batch

    @staticmethod
    def from_environment(torch, profile=None):
        if torch is None or os.environ.get("FULLBURN_NO_FLOPS") == "1":
            return None
        step = max(2, _int_env(FLOPS_STEP_ENV_VAR, 3))
        avoid = (profile.first, profile.last) if profile is not None else None
        if avoid is not None and avoid[0] <= step <= avoid[1]:
            step = avoid[1] + 1  # the profile's steps stay as they run
        return FlopCount(torch, step, max(0.0, _float_env(BUDGET_ENV_VAR, 2.0)), avoid)

    def step_ended(self, step, markers, step_s, fed_by_loader=False, may_set_up=True):
        """After the hooks wrote step `step`, which took step_s; returns the
        seconds spent here, which the next step does not count. A loop fed
        by a DataLoader is counted from its next batch's arrival, so the
        fetch (its collate, in-process transforms) is not slowed by the count.
        `may_set_up` false: the step ended inside the next one's fetch or
        model call (a loop that updates by hand), whose timing would take the
        set-up in; it then happens inside the counted step."""
        if self.done:
            return 0.0
        try:
            if self.counter is not None or self.armed is not None:
                self._stop(step, markers, step_s)
                return 0.0
            self.durations.append(step_s)
            if step != self.step - 1:
                return 0.0
            set_up_s = self._set_up(markers) if may_set_up else 0.0
            if self.done:
                return set_up_s
            if fed_by_loader:
                self.armed = markers
            else:
                self._start(markers)
            return set_up_s
        except Exception as e:  # noqa: BLE001 - a count never disturbs the job
            self._fail(markers, e)
            return 0.0

    def _set_up(self, markers):
        """The first dispatch mode of a process imports torch._dynamo (over
        a second here): done once before the counted step, outside it, and
        written as a "flops_setup" event so the gap it leaves is named."""
        started = time.time()
        try:
            self.counter_class = make_counter_class(self.torch)
        except RuntimeError as e:
            self.done = True
            self._abandon(markers, str(e))
            return 0.0
        probe = self.torch.ones(2, 2)
        with self.counter_class():
            probe @ probe
        took = time.time() - started
        markers._write({"kind": "event", "name": "flops_setup", "rank": markers.rank,
                        "time": time.time(), "duration_s": took, "data": {}})
        return took

    def batch_fetched(self):
        """A DataLoader batch arrived on the loop's thread."""
        markers, self.armed = self.armed, None
        if markers is None or self.done or self.counter is not None:
            return
        try:
            self._start(markers)
        except Exception as e:  # noqa: BLE001
            self._fail(markers, e)

    def _fail(self, markers, e):
        counter, self.counter, self.armed = self.counter, None, None
        self.done = True
        if counter is not None:
            try:
                counter.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - leave the job's dispatch as it was
                pass
        self._abandon(markers, "the FLOP count raised %s: %s" % (type(e).__name__, e))

    def _start(self, markers):
        if self.counter_class is None:
            try:
                self.counter_class = make_counter_class(self.torch)
            except RuntimeError as e:
                self.done = True
                self._abandon(markers, str(e))
                return
        median = _median(self.durations[1:] or self.durations)  # the first step warms up
        deadline = None
        if self.budget > 0 and median:
            # From the count's start: a batch the loader is slow to hand over
            # (its workers behind) is the input's time, not the count's.
            deadline = time.time() + self.budget * median
        self.median = median
        self.counter = self.counter_class(deadline)
        self.counter.__enter__()

    def _stop(self, step, markers, step_s):
        counter, self.counter, self.armed = self.counter, None, None
        self.done = True
        if counter is None:  # armed, yet no batch came: the step was not fed by the loader
            self._abandon(markers, "step %d took no DataLoader batch to start the count at" % step)
            return
        counter.__exit__(None, None, None)
        if counter.cut_short:
            self._abandon(markers, "counting slowed step %d past %gx the median step (%.1f ms): "
                          "stopped, no MFU; FULLBURN_FLOPS_BUDGET=0 lifts the limit" %
                          (step, self.budget, (self.median or 0) * 1e3),
                          step=step, counted_s=step_s)
            return
        data = _describe(self.torch, counter)
        data.update({"step": step, "rank": markers.rank, "counted_s": step_s,
                     "median_step_s": self.median if self.median is not None else step_s})
        markers._write({"kind": "event", "name": "flops", "rank": markers.rank,
                        "time": time.time(), "data": data})

    def _abandon(self, markers, reason, **fields):
        data = {"error": reason}
        data.update(fields)
        if markers is not None:
            markers._write({"kind": "event", "name": "flops", "rank": markers.rank,
                            "time": time.time(), "data": data})
        sys.stderr.write("fullburn: no FLOP count, so no MFU: %s\n" % reason)
