"""Step markers for jobs recorded by `fullburn run` (no dependencies).

A PyTorch loop under `fullburn run` needs none of this: its optimizer steps
and DataLoader waits are timed by themselves (fullburn_autosteps/). For a
loop those hooks cannot see, or to mark steps your own way, two lines give it
the same data-wait diagnosis as `fullburn train` (the automatic markers step
aside when the job makes its own):

    from fullburn_markers import steps
    for images, labels in steps(loader):      # was: for ... in loader:
        ...

`steps` times how long each `next(loader)` blocks (data wait) and how long the
whole step takes (from asking for the batch to asking for the next one), and
appends one line per step to the file that `fullburn run` names in
$FULLBURN_EVENTS; for a torch DataLoader it also records num_workers and
pin_memory once, which the diagnosis's advice starts from. Outside
`fullburn run` it does nothing but iterate.

On CUDA, kernels run asynchronously: pass `sync=True` (or set
FULLBURN_MARKERS_SYNC=1) to call torch.cuda.synchronize() at each step's end so
that step time is device time; it costs a little throughput.

For a loop that is not a `for` over a loader, use `Markers` directly:

    m = Markers()
    with m.data_wait(): batch = get_batch()
    ...
    m.step_end(samples=len(batch), loss=loss.item())
    with m.phase("evaluation"): evaluate()

The line format is the one in docs/formats.md ("Step events"); fullburn's C++
trainer writes the same lines.
"""

import json
import math
import os
import sys
import time
from contextlib import contextmanager

ENV_VAR = "FULLBURN_EVENTS"

# Set by fullburn_autosteps when it marks steps by itself: called with each
# Markers the job makes, which then takes over.
_on_explicit_markers = None


def _rank():
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _batch_size(batch, depth=3, dim=0):
    """The leading dimension (or dimension `dim`, where it has one: 1 for
    sequence-first inputs) of the first tensor-like thing in a batch (or a
    model's output: a 0-d loss before the logits is passed over); a list of
    plain values (texts) counts its items; 0 if none."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[dim if len(shape) > dim else 0]) if len(shape) > 0 else 0
    if isinstance(batch, dict):
        items = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return 0
    if items and not hasattr(items[0], "shape") and not isinstance(items[0], (list, tuple, dict)):
        return len(items)
    for item in items if depth > 1 else ():
        n = _batch_size(item, depth - 1, dim)
        if n:
            return n
    return 0


class Markers:
    """Writes step and phase events; a no-op when no events file is named."""

    def __init__(self, path=None, rank=None, sync=None, _automatic=False):
        path = path if path is not None else os.environ.get(ENV_VAR)
        self.enabled = bool(path)
        self.rank = _rank() if rank is None else int(rank)
        if sync is None:
            sync = os.environ.get("FULLBURN_MARKERS_SYNC", "") == "1"
        self._sync = sync
        self._file = open(path, "a", buffering=1) if self.enabled else None
        self.step = 0
        self._step_start = time.time()
        self._wait = 0.0
        self._described = set()
        self._mlflow_run_id = None  # the job's own MLflow run, once written
        if not _automatic and _on_explicit_markers is not None:
            _on_explicit_markers(self)  # automatic markers stop (fullburn_autosteps)

    def _write(self, obj):
        if self._file is None:
            return
        self._write_line(json.dumps(obj, separators=(",", ":")))

    def _write_line(self, text):
        if self._file is None:
            return
        # One write per line: appends of whole short lines do not interleave.
        try:
            self._file.write(text + "\n")
        except OSError as e:
            # A full or vanished file system: the job goes on, unmarked from here.
            failed, self._file = self._file, None
            name = getattr(failed, "name", "the events file")
            try:
                failed.close()  # its unwritten buffer with it, said once here
            except OSError:
                pass
            self.enabled = False
            sys.stderr.write("fullburn: step events can no longer be written to %s (%s): steps "
                             "from step %d on are not recorded; the job goes on (give fullburn run "
                             "a TMPDIR with room)\n" % (name, e.strerror or e, self.step + 1))

    def _synchronize(self):
        if not self._sync:
            return
        try:
            import torch  # only when asked for, and only if present
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except ImportError:
            pass

    def step_start(self):
        """Marks where a step begins (`step_end` begins the next one by itself)."""
        self._step_start = time.time()
        self._wait = 0.0

    @contextmanager
    def data_wait(self):
        """Time spent inside this block counts as the step's data wait."""
        start = time.time()
        try:
            yield
        finally:
            self._wait += time.time() - start

    def step_end(self, samples=0, loss=None, lr=None, epoch=None, **phases):
        """Ends a step; `phases` are extra seconds such as h2d_s=0.01."""
        self._synchronize()
        now = time.time()
        self.step += 1
        event = {"kind": "step", "rank": self.rank, "step": self.step, "time": now,
                 "step_s": max(0.0, now - self._step_start), "data_wait_s": self._wait,
                 "samples": int(samples)}
        if loss is not None:
            loss = float(loss)
            # JSON has no NaN/inf: a diverged loss is written as a string.
            event["loss"] = loss if math.isfinite(loss) else str(loss)
        if lr is not None:
            event["lr"] = float(lr)
        if epoch is not None:
            event["epoch"] = int(epoch)
        for key, value in phases.items():
            event[key] = float(value)
        self._write(event)
        self.note_mlflow(now)
        self._step_start = now
        self._wait = 0.0

    def note_mlflow(self, now):
        """The job's own MLflow run, once it has one (mlflow.start_run: a plain
        script, HF Trainer's MLflowCallback), as a "mlflow_run" event:
        `fullburn run --mlflow` then logs into it rather than into a run of
        its own (docs/trackers.md). A dict lookup per step without mlflow."""
        mlflow = sys.modules.get("mlflow")
        if mlflow is None or self._file is None:
            return
        try:
            run = mlflow.active_run()
            if run is None or run.info.run_id == self._mlflow_run_id:
                return
            uri = mlflow.get_tracking_uri()
        except Exception:  # an mlflow too old or half imported: no join, the job goes on
            return
        self._mlflow_run_id = run.info.run_id
        self._write({"kind": "event", "name": "mlflow_run", "rank": self.rank, "time": now,
                     "data": {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                              "tracking_uri": str(uri), "by": "job"}})

    def describe_loader(self, loader):
        """Records a torch DataLoader's settings once (a "dataloader" event), so
        the diagnosis can name its num_workers and pin_memory; other iterables
        are left alone."""
        workers = getattr(loader, "num_workers", None)
        if self._file is None or not isinstance(workers, int) or id(loader) in self._described:
            return
        self._described.add(id(loader))
        data = {"num_workers": workers}
        for key in ("batch_size", "pin_memory", "persistent_workers", "prefetch_factor"):
            value = getattr(loader, key, None)
            if isinstance(value, (bool, int)):
                data[key] = value
        dataset = getattr(loader, "dataset", None)
        if dataset is not None:  # "ImageFolder": the diagnosis can name fullburn.ImageLoader
            data["dataset"] = type(dataset).__name__
        # Where it was made and by which framework (fullburn_autosteps/frameworks.py),
        # so the fix names the place to change: a DataModule's
        # train_dataloader(), TrainingArguments.
        created = getattr(loader, "_fullburn_created", None)
        if isinstance(created, dict):
            data.update(created)
        swapped = getattr(loader, "_fullburn_swapped", None)
        if swapped:  # fullburn tune's swap trial read it with fullburn.ImageLoader
            data["swapped"] = swapped
        self._write({"kind": "event", "name": "dataloader", "rank": self.rank,
                     "time": time.time(), "data": data})

    @contextmanager
    def phase(self, name, **data):
        """A named stretch outside the steps (evaluation, checkpoint).

        Yields its data dict, so results known only at the end go into the
        event: `with m.phase("evaluation") as out: out["val_loss"] = loss`
        (val_loss and val_accuracy are drawn by `fullburn report`)."""
        self._synchronize()
        start = time.time()
        try:
            yield data
        finally:
            self._synchronize()
            now = time.time()
            self._write({"kind": "event", "name": name, "rank": self.rank, "time": now,
                         "duration_s": now - start, "data": data})
            self.step_start()

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


_shared = None


def _shared_markers(sync):
    """One Markers for every `steps` call without its own, so step numbers go
    on from epoch to epoch and the events file is opened once."""
    global _shared
    if _shared is None:
        _shared = Markers(sync=sync)
    elif sync is not None:
        _shared._sync = sync
    return _shared


def steps(iterable, markers=None, sync=None, epoch=None):
    """Yields from `iterable`, marking each item as one training step.

    Call it once per epoch (`for batch in steps(loader)` inside the epoch
    loop): without `markers`, every call shares one Markers, so step numbers
    continue across epochs."""
    m = markers or _shared_markers(sync)
    m.describe_loader(iterable)
    it = iter(iterable)
    m.step_start()
    samples = None
    while True:
        if samples is not None:
            m.step_end(samples=samples, epoch=epoch)
        with m.data_wait():
            try:
                batch = next(it)
            except StopIteration:
                break
        samples = _batch_size(batch)
        yield batch
    # The time spent finding the loader empty is not a step.
    m.step_start()
