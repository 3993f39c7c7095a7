"""ImageLoader and TokenLoader: fullburn's C++ loaders with a DataLoader's
manners (iteration, len, set_epoch, state_dict), yielding torch tensors made
over the loader's own batch memory (docs/python.md)."""
import collections
import json
import os
import sys
import time

from . import _native

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_EVENT_EVERY_S = 10.0  # how often a loader under `fullburn run` reports its view


def _torch(what):
    try:
        import torch
    except ImportError:
        raise ImportError("%s yields torch tensors and needs PyTorch: install it (pip install "
                          "torch; Debian: apt-get install python3-torch), or pass "
                          "output='numpy' for NumPy arrays" % what) from None
    return torch


def _rank_and_world(rank, world_size):
    """Given values win; otherwise torch.distributed's when it is initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if rank is None:
            rank = dist.get_rank()
        if world_size is None:
            world_size = dist.get_world_size()
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def _output_of(output, device, what):
    """"torch" (tensors) or "numpy" (arrays: no torch needed, the CPU only)."""
    if output not in ("torch", "numpy"):
        raise ValueError("%s: output must be 'torch' or 'numpy', not %r" % (what, output))
    if output == "numpy" and device is not None and str(device) != "cpu":
        raise ValueError("%s: output='numpy' yields host arrays; device=%r needs output='torch'"
                         % (what, str(device)))
    return output


def _device_of(device, what):
    """None or "cpu": None; a CUDA device: its torch.device, checked now."""
    if device is None or str(device) == "cpu":
        return None
    torch = _torch(what)
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError("%s: device=%r is neither the CPU nor a CUDA device" % (what, str(device)))
    if not torch.cuda.is_available():
        raise RuntimeError("%s: device=%r but this PyTorch sees no CUDA device "
                           "(torch.cuda.is_available() is False): use device=None for the CPU"
                           % (what, str(device)))
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class _StepHooks:
    """The automatic step markers of `fullburn run` (fullburn_autosteps), when
    loaded: a fetch from these loaders is data wait as a DataLoader's is."""

    @staticmethod
    def state():
        auto = sys.modules.get("fullburn_autosteps")
        state = getattr(auto, "_state", None)
        return state if state is not None and state.enabled else None


class _Events:
    """`loader` events for `fullburn run` ($FULLBURN_EVENTS), as fullburn train
    writes them: workers, queue depth, stage times, skipped files."""

    def __init__(self, rank, kind):
        self.path = os.environ.get("FULLBURN_EVENTS")
        self.rank = rank
        self.kind = kind
        self.last = 0.0

    def maybe_write(self, stats, force=False):
        if not self.path:
            return
        now = time.time()
        if not force and now - self.last < _EVENT_EVERY_S:
            return
        self.last = now
        data = dict(stats, python=self.kind)  # fullburn train's loader events have no "python"
        line = {"kind": "event", "name": "loader", "time": now, "data": data}
        if self.rank:
            line["rank"] = self.rank
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            self.path = None  # the run is gone: stop trying


class _Pinned:
    """The loader's memory blocks registered with CUDA (cudaHostRegister) the
    first time a batch lies in one, whole, so the copy to the GPU reads the
    slot directly; the native pool unregisters each before freeing it."""

    def __init__(self, torch, native):
        cudart = torch.cuda.cudart()
        success = getattr(getattr(cudart, "cudaError", None), "success", 0)

        def register(address, nbytes):
            err = cudart.cudaHostRegister(address, nbytes, 0)
            if err != success:
                raise RuntimeError("cudaHostRegister of %d bytes of batch memory failed (%s): "
                                   "pass device=None and copy the batches yourself"
                                   % (nbytes, getattr(err, "name", err)))

        native.set_device_hooks(register, lambda address, nbytes: cudart.cudaHostUnregister(address))
        self.native = native

    def ensure(self, address):
        if not self.native.register_block(address):
            raise RuntimeError("fullburn: a batch outside the loader's memory blocks (a bug: "
                               "please report it)")


class ImageLoader:
    """Batches of (images, labels) from an image folder (root/<class>/*.jpg,
    torchvision's ImageFolder layout) or a pack (`fullburn pack`), decoded,
    cropped and flipped on C++ threads (RandomResizedCrop + horizontal flip
    for training, Resize + CenterCrop for evaluation, as torchvision defines
    them), normalized as ToTensor + Normalize.

    Iterating yields one epoch; the next iteration starts the next epoch
    unless set_epoch() says which. images is float32 [B, 3, crop, crop]
    (channels_last strides with channels_last=True), labels int64 [B]. On the
    CPU the tensors are views of the loader's batch memory, normalized by its
    threads; with device="cuda" the uint8 batch is copied from pinned memory
    on a side stream and normalized on the GPU. output="numpy" yields NumPy
    arrays of the same shapes instead (views too; no torch needed).
    """

    def __init__(self, root_or_pack, batch_size, *, train=True, crop=224, threads=None,
                 prefetch=None, seed=0, shuffle=True, drop_last=None, rank=None, world_size=None,
                 on_bad_sample="skip", device=None, dtype=None, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD, channels_last=False, cache_mb=0, resize=None, output="torch"):
        root = os.fspath(root_or_pack)
        self._output = _output_of(output, device, "fullburn.ImageLoader")
        if not os.path.exists(root):
            raise FileNotFoundError(
                "%s: no such folder or pack: give an image folder (root/<class>/*.jpg) or a "
                "pack written by `fullburn pack SRC DST`" % root)
        if on_bad_sample not in ("skip", "fail"):
            raise ValueError("on_bad_sample must be 'skip' or 'fail', not %r" % (on_bad_sample,))
        if threads is not None and threads < 0:
            raise ValueError("threads must be None (tuned while running) or at least 1")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch must be None (tuned while running) or at least 1")
        self._device = _device_of(device, "fullburn.ImageLoader")
        self._dtype = dtype
        if output == "numpy" and dtype is not None and _dtype_name(dtype) not in ("uint8", "float32"):
            raise ValueError("fullburn.ImageLoader: output='numpy' makes float32 or uint8 batches, "
                             "not %s: convert the arrays yourself" % _dtype_name(dtype))
        # uint8 slots (not normalized by the threads) for uint8 batches and for
        # the GPU, which normalizes after the copy unless uint8 was asked for.
        raw = _is_uint8(dtype)
        uint8_slots = raw or self._device is not None
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.drop_last = self.train if drop_last is None else bool(drop_last)
        self.channels_last = bool(channels_last)
        self._mean, self._std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._native = _native.ImageLoader(
            root, self.batch_size, self.train, int(crop), int(threads or 0), int(prefetch or 0),
            self.seed, self.shuffle, not self.drop_last, self.rank, self.world_size,
            on_bad_sample == "fail", not uint8_slots, list(self._mean), list(self._std),
            self.channels_last, int(cache_mb) << 20, int(resize or 0),
            # threads=None may take every CPU this process may use: the tuner
            # adds a thread only while the loop waits for batches, so a loop
            # that computes keeps its cores (fullburn train keeps one back).
            _native.cpus())
        if self._native.dataset_size == 0:
            raise DataError("%s holds no images" % root)
        if self._native.batches_per_epoch == 0:
            raise ValueError(
                "batch_size %d is larger than this rank's %d images and drop_last is set: no "
                "batch would be made; lower batch_size or pass drop_last=False"
                % (self.batch_size, self._native.epoch_size))
        self.root = root
        self._raw = raw
        self._epoch = 0
        self._next_batch = 0
        self._consumed = 0  # samples every rank read before a resume that changed shapes
        self._generation = 0
        self._wait_s = 0.0
        self._events = _Events(self.rank, "fullburn.ImageLoader")
        self._gpu = None  # (stream, scale, bias, pinned, in flight) once a batch went to the GPU

    # --- what a DataLoader has ------------------------------------------------

    def __len__(self):
        """Batches per epoch for this rank."""
        return self._native.batches_per_epoch

    @property
    def dataset_size(self):
        return self._native.dataset_size

    @property
    def classes(self):
        return list(self._native.classes)

    def set_epoch(self, epoch):
        """The epoch the next iteration reads (its order and crops follow from
        seed and epoch). The position of a loaded state_dict is kept if it is
        in this epoch."""
        epoch = int(epoch)
        if epoch != self._epoch:
            self._next_batch = 0
            self._consumed = 0
        self._epoch = epoch

    def __iter__(self):
        return _ImageIterator(self)

    def state_dict(self):
        """Where the loader is: the epoch and the next batch it yields. A loader
        made the same way and given it yields the rest of that epoch exactly
        (the same images, crops and flips), as torchdata's StatefulDataLoader
        resumes."""
        return {"kind": "fullburn.ImageLoader", "version": 1, "epoch": self._epoch,
                "next_batch": self._next_batch, "consumed_samples": self._consumed,
                "seed": self.seed, "shuffle": self.shuffle, "train": self.train,
                "dataset_size": self.dataset_size, "batch_size": self.batch_size,
                "world_size": self.world_size, "drop_last": self.drop_last}

    def load_state_dict(self, state):
        _check_state(state, "fullburn.ImageLoader", {
            "dataset_size": (self.dataset_size, "a dataset of %s images; this loader reads %s"),
            "seed": (self.seed, "seed %s; this loader's is %s"),
            "shuffle": (self.shuffle, "shuffle=%s; this loader's is %s"),
            "train": (self.train, "train=%s; this loader's is %s"),
        })
        self._epoch = int(state["epoch"])
        if (state["batch_size"], state["world_size"]) == (self.batch_size, self.world_size):
            self._next_batch = int(state["next_batch"])
            self._consumed = int(state.get("consumed_samples", 0))
        else:  # other shapes: skip the samples every rank already read
            self._consumed = (int(state.get("consumed_samples", 0)) +
                              int(state["next_batch"]) * state["batch_size"] * state["world_size"])
            self._next_batch = 0

    def stats(self):
        """The loader's view: worker threads, batches ready (queue depth),
        stage times summed over threads (read, decode, augment), the time the
        training loop waited for batches, skipped files."""
        s = dict(self._native.stats())
        s["data_wait_s"] = self._wait_s
        return s

    # --- internals ----------------------------------------------------------------

    def _start(self, generation):
        self._generation = generation
        self._native.start_epoch(self._epoch, self._next_batch, self._consumed)

    def _ended(self):
        self._events.maybe_write(self.stats(), force=True)
        self._epoch += 1
        self._next_batch = 0
        self._consumed = 0

    def _tensors(self, images, labels):
        if self._output == "numpy":
            if self.channels_last:
                return images.transpose(0, 3, 1, 2), labels
            return images, labels
        torch = _torch("fullburn.ImageLoader")
        x = torch.from_numpy(images)
        y = torch.from_numpy(labels)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # NCHW indexing over the NHWC slot: channels_last strides
        if self._device is not None:
            return self._to_device(torch, images, x, y)
        if self._dtype is not None and not self._raw and self._dtype != torch.float32:
            x = x.to(self._dtype)
        return x, y

    def _to_device(self, torch, images, x, y):
        if self._gpu is None:
            shape = (1, 3, 1, 1)
            scale = torch.tensor([1.0 / (255.0 * s) for s in self._std]).view(shape)
            bias = torch.tensor([-m / s for m, s in zip(self._mean, self._std)]).view(shape)
            self._gpu = (torch.cuda.Stream(self._device), scale.to(self._device),
                         bias.to(self._device), _Pinned(torch, self._native), collections.deque())
        stream, scale, bias, pinned, in_flight = self._gpu
        pinned.ensure(images.ctypes.data)
        with torch.cuda.stream(stream):
            gpu = x.to(self._device, non_blocking=True)
            labels = y.to(self._device, non_blocking=True)
            if not self._raw:
                # In float32, then the dtype asked for: the CPU path's values.
                gpu = gpu.float().mul_(scale).add_(bias)
                if self._dtype is not None and self._dtype != torch.float32:
                    gpu = gpu.to(self._dtype)
            done = torch.cuda.Event()
            done.record(stream)
        current = torch.cuda.current_stream(self._device)
        current.wait_event(done)
        gpu.record_stream(current)
        labels.record_stream(current)
        # The host batch lives until the copy from it is done; its memory goes
        # back to the loader only then.
        in_flight.append((done, x))
        while in_flight and in_flight[0][0].query():
            in_flight.popleft()
        return gpu, labels


def _dtype_name(dtype):
    """"uint8" for torch.uint8, numpy.uint8, np.dtype("uint8") and "uint8"."""
    return getattr(dtype, "__name__", None) or str(dtype).replace("torch.", "")


def _is_uint8(dtype):
    return dtype is not None and _dtype_name(dtype) == "uint8"


def _check_state(state, kind, same):
    if not isinstance(state, dict) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError("this state_dict is %s's, not a %s's" % (got, kind))
    for key, (mine, says) in same.items():
        if state.get(key) != mine:
            raise ValueError("this state_dict is from " + says % (state.get(key), mine) +
                             ": it cannot resume this loader exactly")


class _ImageIterator:
    """One epoch of an ImageLoader. A newer iter() of the same loader replaces it."""

    def __init__(self, loader):
        self.loader = loader
        self.generation = loader._generation + 1
        loader._start(self.generation)
        self.finished = False
        self.last_samples = None  # the dataset indices of the last batch (NumPy int64)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self.loader)

    def __next__(self):
        loader = self.loader
        if self.finished:
            raise StopIteration
        if loader._generation != self.generation:
            raise RuntimeError("this iterator of a fullburn.ImageLoader was replaced by a newer "
                               "iter(loader): use one iterator at a time")
        hooks = _StepHooks.state()
        started = time.time()
        if hooks is not None:
            hooks.before_fetch(self, started)
        t0 = time.perf_counter()
        got = loader._native.next()
        loader._wait_s += time.perf_counter() - t0
        if got is None:
            self.finished = True
            loader._ended()
            raise StopIteration
        images, labels, index, self.last_samples = got
        loader._next_batch = index + 1
        batch = loader._tensors(images, labels)
        if hooks is not None:
            hooks.after_fetch(self, started, batch)
        loader._events.maybe_write(loader.stats())
        return batch


class TokenLoader:
    """Batches (x, y) of seq_len tokens from nanoGPT's uint16 token files (the
    bare array) or llm.c's (a 256 x int32 header, then the array), several
    files read as one stream: windows of seq_len + 1 tokens at offsets drawn
    from (seed, batch), x the first seq_len tokens and y the next ones, int64
    [batch_size, seq_len]. An epoch is as many batches as the files hold
    tokens (over every rank); every rank reads windows of its own.
    """

    def __init__(self, path, batch_size, seq_len, *, seed=0, rank=None, world_size=None,
                 device=None, output="torch"):
        self._output = _output_of(output, device, "fullburn.TokenLoader")
        paths = _token_paths(path)
        self._device = _device_of(device, "fullburn.TokenLoader")
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError("rank %d is not one of world_size %d's ranks"
                             % (self.rank, self.world_size))
        self.batch_size, self.seq_len, self.seed = int(batch_size), int(seq_len), int(seed)
        self._native = _native.TokenLoader(paths, self.batch_size, self.seq_len, self.seed)
        per_batch = self.batch_size * self.seq_len * self.world_size
        self._len = self._native.tokens // per_batch
        if self._len == 0:
            raise ValueError("%d tokens hold no batch of %d x %d tokens for %d rank(s): lower "
                             "batch_size or seq_len" % (self._native.tokens, self.batch_size,
                                                        self.seq_len, self.world_size))
        self.paths = paths
        self._epoch = 0
        self._next_batch = 0
        self._wait_s = 0.0

    def __len__(self):
        return self._len

    @property
    def tokens(self):
        return self._native.tokens

    def set_epoch(self, epoch):
        epoch = int(epoch)
        if epoch != self._epoch:
            self._next_batch = 0
        self._epoch = epoch

    def __iter__(self):
        torch = _torch("fullburn.TokenLoader") if self._output == "torch" else None
        while self._next_batch < self._len:
            hooks = _StepHooks.state()
            started = time.time()
            if hooks is not None:
                hooks.before_fetch(self, started)
            t0 = time.perf_counter()
            step = (self._epoch * self._len + self._next_batch) * self.world_size + self.rank
            x, y = self._native.batch(step)
            if torch is not None:
                x, y = torch.from_numpy(x), torch.from_numpy(y)
            if self._device is not None:
                x = x.to(self._device, non_blocking=True)
                y = y.to(self._device, non_blocking=True)
            self._wait_s += time.perf_counter() - t0
            self._next_batch += 1
            if hooks is not None:
                hooks.after_fetch(self, started, (x, y))
            yield x, y
        self._epoch += 1
        self._next_batch = 0

    def state_dict(self):
        return {"kind": "fullburn.TokenLoader", "version": 1, "epoch": self._epoch,
                "next_batch": self._next_batch, "seed": self.seed, "tokens": self.tokens,
                "batch_size": self.batch_size, "seq_len": self.seq_len,
                "world_size": self.world_size}

    def load_state_dict(self, state):
        _check_state(state, "fullburn.TokenLoader", {
            "tokens": (self.tokens, "files of %s tokens; this loader reads %s"),
            "seed": (self.seed, "seed %s; this loader's is %s"),
            "batch_size": (self.batch_size, "batch_size %s; this loader's is %s"),
            "seq_len": (self.seq_len, "seq_len %s; this loader's is %s"),
            "world_size": (self.world_size, "world_size %s; this loader's is %s"),
        })
        self._epoch = int(state["epoch"])
        self._next_batch = int(state["next_batch"])

    def stats(self):
        return {"batches": self._epoch * self._len + self._next_batch, "data_wait_s": self._wait_s}


def _token_paths(path):
    if isinstance(path, (list, tuple)):
        paths = [os.fspath(p) for p in path]
    else:
        path = os.fspath(path)
        if os.path.isdir(path):
            paths = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".bin"))
            if not paths:
                raise FileNotFoundError("%s holds no .bin token files" % path)
        else:
            paths = [path]
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError("%s: no such token file" % p)
    return paths


DataError = _native.DataError
