"""Read a fullburn pack (`fullburn pack SRC DST`) from PyTorch (no dependencies
beyond Pillow for the images).

When `fullburn diagnose` says a PyTorch job's loader is CPU-bound, packing the
image folder once moves the decoding (a raw pack) or the file opening (a JPEG
pack) out of every epoch. `PackDataset` takes the place of torchvision's
ImageFolder in a DataLoader, with the same items, classes and targets:

    from fullburn_pack import PackDataset
    ds = PackDataset("data/imgs.pack", transform=train_transforms)
    # was: ds = torchvision.datasets.ImageFolder("data/imgs", transform=train_transforms)

Items are (PIL image in RGB, label), so torchvision transforms work unchanged.
`PackDataset.raw(i)` gives the record's bytes without Pillow: RGB pixels, rows
top to bottom, in a raw pack; the JPEG file in a JPEG pack.

The index is checked as fullburn's own reader checks it (magic, version,
checksum, every record inside its shard, every shard its recorded size);
`verify=False` skips the checksum, which costs about a second per 100,000
images in pure Python. Shards are memory-mapped on first use in each process,
so DataLoader workers share the page cache. The format: docs/formats.md.
"""

import io
import mmap
import os
import struct
from array import array

MAGIC = b"FBPACK01"
VERSION = 1
FORMATS = {0: "jpeg", 1: "raw"}
RECORD = struct.Struct("<IQIHHi")  # shard, offset, size, width, height, label
INDEX_NAME = "index.fbpx"


class PackError(Exception):
    """A pack that cannot be read; the message names the file and the fix."""


# FNV-1a's 64-bit offset basis; packs written before 2026-11-23 used a
# mistyped one, which fullburn's reader accepts too.
FNV_BASIS = 0xCBF29CE484222325
FNV_BASIS_V1_EARLY = 1469598103934665603


def _fnv1a64(data, basis=FNV_BASIS):
    h = basis
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def is_pack(path):
    return os.path.isfile(os.path.join(path, INDEX_NAME))


class _Cursor:
    def __init__(self, data, path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise PackError("pack index %s is corrupt (cut short): re-run fullburn pack" % self.path)
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values


class PackDataset:
    """A fullburn pack as a map-style dataset: (PIL RGB image, label) items."""

    def __init__(self, root, transform=None, target_transform=None, verify=True):
        self.root = root
        self.transform = transform
        self.target_transform = target_transform
        path = os.path.join(root, INDEX_NAME)
        try:
            with open(path, "rb") as f:
                index = f.read()
        except OSError as e:
            raise PackError("cannot read %s (%s): is %s a fullburn pack? (fullburn pack SRC DST)"
                            % (path, e.strerror, root)) from None
        self._parse(index, path, verify)
        self._check_shards()
        self._maps = {}

    def _corrupt(self, path, why):
        return PackError("pack index %s is corrupt (%s): re-run fullburn pack" % (path, why))

    def _parse(self, index, path, verify):
        if len(index) < 16 or index[:8] != MAGIC:
            raise self._corrupt(path, "not a fullburn pack index")
        body = memoryview(index)[:-8]
        (stored,) = struct.unpack_from("<Q", index, len(index) - 8)
        if verify and _fnv1a64(body) != stored and _fnv1a64(body, FNV_BASIS_V1_EARLY) != stored:
            raise self._corrupt(path, "checksum mismatch")
        c = _Cursor(body, path)
        c.pos = 8
        (version,) = c.take("<I")
        if version != VERSION:
            raise PackError("%s is pack format v%d; this reader reads v%d: re-run fullburn pack"
                            % (path, version, VERSION))
        fmt, count, classes, shards = c.take("<IQII")
        if fmt not in FORMATS:
            raise self._corrupt(path, "bad header")
        self.format = FORMATS[fmt]
        self.classes = []
        for _ in range(classes):
            (length,) = c.take("<I")
            if c.pos + length > len(body):
                raise self._corrupt(path, "bad class name")
            self.classes.append(bytes(body[c.pos:c.pos + length]).decode("utf-8"))
            c.pos += length
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self._shard_sizes = list(c.take("<%dQ" % shards)) if shards else []
        if c.pos + count * RECORD.size > len(body):
            raise self._corrupt(path, "record table cut short")
        self._records = bytes(body[c.pos:c.pos + count * RECORD.size])
        self.targets = array("i")
        for shard, offset, size, width, height, label in RECORD.iter_unpack(self._records):
            if (shard >= shards or offset + size > self._shard_sizes[shard]
                    or (self.format == "raw" and size != width * height * 3)
                    or not 0 <= label < classes):
                raise self._corrupt(path, "a record points outside its shard")
            self.targets.append(label)

    def _shard_path(self, i):
        return os.path.join(self.root, "shard-%05d.fbp" % i)

    def _check_shards(self):
        for i, expected in enumerate(self._shard_sizes):
            path = self._shard_path(i)
            try:
                size = os.path.getsize(path)
            except OSError:
                raise PackError("pack shard %s is missing: re-run fullburn pack" % path) from None
            if size != expected:
                raise PackError("pack shard %s is %d bytes, the index expects %d (truncated?): "
                                "re-run fullburn pack" % (path, size, expected))

    def _shard(self, i):
        m = self._maps.get(i)
        if m is None:
            with open(self._shard_path(i), "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[i] = m
        return m

    def __getstate__(self):
        # Maps are per process: a spawned DataLoader worker opens its own.
        state = self.__dict__.copy()
        state["_maps"] = {}
        return state

    def __len__(self):
        return len(self.targets)

    def _entry(self, i):
        """Item i's record (shard, offset, size, width, height, label)."""
        if not -len(self) <= i < len(self):
            raise IndexError("item %d of a pack of %d" % (i, len(self)))
        return RECORD.unpack_from(self._records, (i % len(self)) * RECORD.size)

    def _bytes(self, entry):
        shard, offset, size = entry[:3]
        return self._shard(shard)[offset:offset + size]

    def record(self, i):
        """(width, height, label) of item i."""
        return self._entry(i)[3:]

    def raw(self, i):
        """The bytes of item i: RGB pixels (raw pack) or the JPEG file (jpeg pack)."""
        return self._bytes(self._entry(i))

    def image(self, i):
        from PIL import Image  # only when images are asked for
        entry = self._entry(i)
        data = self._bytes(entry)
        if self.format == "raw":
            return Image.frombytes("RGB", entry[3:5], data)
        return Image.open(io.BytesIO(data)).convert("RGB")

    def __getitem__(self, i):
        img = self.image(i)
        label = self.targets[i]
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return img, label
