"""fullburn run --profile A-B: torch.profiler over the automatic markers'
steps A to B (started and stepped by `_AutoSteps`, steps.py)."""

import os
import time


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
