"""fullburn tune's swap trial (FULLBURN_TUNE_SET's "loader": "fullburn"): a
DataLoader's epochs read by fullburn.ImageLoader where it can stand in for
it (torch_hooks.py's `__iter__` hook asks `_swapper`)."""

import sys
import weakref


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


def _swapper(torch):
    """The swap trial's `swapped_iter(loader)`: an iterator over the
    DataLoader's next epoch read by fullburn.ImageLoader, or None (said once
    per loader) when it cannot be."""
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

    return swapped_iter
