"""save_async and load: checkpoints as safetensors files written on a C++
thread, checksummed, and put in place atomically (docs/python.md)."""
import atexit
import json

from . import _native
from ._loaders import _torch

_FORMAT = "fullburn-tensors-1"
_DTYPES = [("float32", "F32"), ("float64", "F64"), ("float16", "F16"), ("bfloat16", "BF16"),
           ("int64", "I64"), ("int32", "I32"), ("int16", "I16"), ("int8", "I8"),
           ("uint8", "U8"), ("bool", "BOOL")]


class SaveHandle:
    """A checkpoint being written: done() says whether it is, wait() blocks
    until it is and raises OSError if it could not be (the file there before
    is then untouched)."""

    def __init__(self, job):
        self._job = job
        self.path = job.path

    def done(self):
        return self._job.done()

    def wait(self):
        self._job.wait()
        return self.path

    def __repr__(self):
        return "<fullburn.SaveHandle %s%s>" % (self.path, " written" if self.done() else "")


def save_async(state_dict, path):
    """Saves `state_dict` (a model's, an optimizer's, or a dict of such with
    numbers and strings beside them) to `path` as a safetensors file.

    The caller waits only while the tensors are copied off the device or out
    of the live parameters into the save's own memory; a C++ thread then
    checksums and writes the file (PATH.tmp.PID, fsync, rename), so a crash
    leaves the previous file or the new one, never half of one. Returns a
    SaveHandle. Saves to one path are written in the order they were made;
    the interpreter waits for them at exit.
    """
    torch = _torch("fullburn.save_async")
    path = str(path)
    # A model's state dict (str -> tensor) is stored as it is; its one pass
    # below is most of what the caller waits for besides the copy.
    flat = _flat_tensors(state_dict, torch)
    tensors = list(state_dict.items()) if flat else []
    tree = None if flat else _flatten(torch, state_dict, "", tensors, set())
    codes = _dtype_codes(torch)
    records, direct, through_torch = [], [], []
    # Contiguous host tensors are copied by C++ threads in one call; others
    # (a GPU's, views with strides) through torch, which takes them off the
    # device or gathers them.
    for i, (name, t) in enumerate(tensors):
        code = codes.get(t.dtype)
        if code is None:
            raise TypeError("save_async: tensor %s has dtype %s, which safetensors cannot hold"
                            % (name, t.dtype))
        size = t.numel() * t.element_size()
        records.append((name, code, list(t.shape), size))
        if size == 0:
            continue
        if t.is_cpu and t.is_contiguous():
            direct.append((i, t.data_ptr(), size))  # `tensors` keeps t alive through the copy
        else:
            through_torch.append((i, t))
    meta = {"format": _FORMAT}
    if tree is not None:
        meta["fullburn.tree"] = json.dumps(tree)
    job = _native.Save(path, records, meta)
    for i, t in through_torch:
        t = t.detach()
        staged = torch.frombuffer(job.stage(i), dtype=t.dtype, count=t.numel()).view(t.shape)
        staged.copy_(t)
        del staged  # the stage memory belongs to the job from here on
    job.copy_from(direct)
    job.start()
    return SaveHandle(job)


def load(path, device=None):
    """The tensors of a safetensors file (save_async's, fullburn's checkpoints
    and export-weights', or the safetensors package's), checked against their
    checksum when the file has one; a damaged file raises fullburn.DataError.
    A dict saved by save_async comes back with its structure; any other file
    as a dict of name -> tensor in the file's order."""
    torch = _torch("fullburn.load")
    buffer, entries, meta = _native.read_tensor_file(str(path))
    by_code = {code: getattr(torch, name) for name, code in _DTYPES}
    tensors = {}
    for name, code, shape, offset, size in entries:
        dtype = by_code.get(code)
        if dtype is None:
            raise _native.DataError("%s: tensor %s has dtype %s, which torch cannot load here"
                                    % (path, name, code))
        itemsize = torch.empty((), dtype=dtype).element_size()
        if size == 0:
            t = torch.empty(shape, dtype=dtype)
        elif offset % itemsize == 0:
            t = torch.frombuffer(buffer, dtype=dtype, count=size // itemsize,
                                 offset=offset).view(shape)
        else:  # a misaligned tensor is copied into aligned memory
            raw = torch.frombuffer(buffer, dtype=torch.uint8, count=size, offset=offset).clone()
            t = raw.view(dtype).view(shape)
        tensors[name] = t if device is None else t.to(device)
    if "fullburn.tree" in meta:
        return _unflatten(json.loads(meta["fullburn.tree"]), tensors)
    return tensors


_codes = {}


def _dtype_codes(torch):
    """torch dtype -> safetensors dtype code, built once."""
    if not _codes:
        _codes.update({getattr(torch, name): code for name, code in _DTYPES})
    return _codes


def _flat_tensors(obj, torch):
    """A dict of str -> tensor (a model's state_dict): stored as it is."""
    return isinstance(obj, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _flatten(torch, obj, prefix, tensors, names):
    """A JSON tree of `obj` with each tensor replaced by its name in the file
    (the dotted path of keys, as a model's state_dict names them)."""
    if isinstance(obj, torch.Tensor):
        name = prefix or "tensor"
        if name in names:
            raise ValueError("save_async: two tensors would both be named %r: rename a key" % name)
        names.add(name)
        tensors.append((name, obj))
        return {"__tensor__": name}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError("save_async: key %r at %r is neither a string nor an integer"
                                % (k, prefix or "the top"))
            sub = "%s.%s" % (prefix, k) if prefix else str(k)
            items.append([k, _flatten(torch, v, sub, tensors, names)])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        items = [_flatten(torch, v, "%s.%d" % (prefix, i) if prefix else str(i), tensors, names)
                 for i, v in enumerate(obj)]
        return {"__list__" if isinstance(obj, list) else "__tuple__": items}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError("save_async stores tensors and JSON-like values (dicts, lists, numbers, "
                    "strings): %r at %r is neither" % (type(obj).__name__, prefix or "the top"))


def _unflatten(tree, tensors):
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            return tensors[tree["__tensor__"]]
        if "__dict__" in tree:
            return {k: _unflatten(v, tensors) for k, v in tree["__dict__"]}
        if "__list__" in tree:
            return [_unflatten(v, tensors) for v in tree["__list__"]]
        if "__tuple__" in tree:
            return tuple(_unflatten(v, tensors) for v in tree["__tuple__"])
    return tree


# A save still being written when the program ends is finished, not lost.
atexit.register(_native.drain)
