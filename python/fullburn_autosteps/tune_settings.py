"""`fullburn tune`'s settings for a trial: FULLBURN_TUNE_SET, a JSON object
(DataLoader arguments, threads; "loader": "fullburn" is loader_swap.py's
trial), applied when torch is imported (torch_hooks.py)."""

import functools
import inspect
import json
import os
import sys


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
