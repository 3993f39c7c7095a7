"""Framework detection: where each DataLoader is made (the user's own code,
and which framework, Lightning, transformers, accelerate or timm, made or
called for it) and the script's command-line options that set its workers
or its evaluations, so a fix names the place to change (docs/frameworks.md)."""

import functools
import os
import sys


# Where a framework's own code lives: its frames are not the user's.
_FRAMEWORKS = (("/transformers/", "transformers"), ("/accelerate/", "accelerate"),
               ("/lightning/", "lightning"), ("/pytorch_lightning/", "lightning"),
               ("/timm/", "timm"))
# fullburn's own helpers (python/, this package's parent) are library code too.
_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/",
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# The script's integer command-line options as argparse parsed them
# ([(dest, option strings, value)]): a DataLoader's num_workers that one of
# them carried is set on the command line, and the fix names the flag.
_cli_options = []


def _watch_command_line():
    """Wraps ArgumentParser.parse_known_args (parse_args and HF's
    HfArgumentParser go through it) to keep what each option parsed to."""
    import argparse

    original = argparse.ArgumentParser.parse_known_args

    @functools.wraps(original)
    def parse_known_args(parser, *args, **kwargs):
        result = original(parser, *args, **kwargs)
        try:
            namespace = result[0]
            for action in parser._actions:
                value = getattr(namespace, action.dest, None)
                if action.option_strings and type(value) is int:
                    _cli_options.append((action.dest, list(action.option_strings), value))
        except Exception:  # a parser of another shape: nothing kept, the script goes on
            pass
        return result

    argparse.ArgumentParser.parse_known_args = parse_known_args


def _workers_flag(num_workers):
    """The option that gave a DataLoader its num_workers ("--workers",
    "--dataloader_num_workers"), or None: an option about workers whose
    value it is. The last parse wins (a script parses once; a framework's
    second parser comes later)."""
    for dest, strings, value in reversed(_cli_options):
        about_workers = "worker" in dest.lower() or any("worker" in s for s in strings)
        if about_workers and value == num_workers:
            longs = [s for s in strings if s.startswith("--")]
            return max(longs, key=len) if longs else strings[0]
    return None


def _evaluation_options():
    """The script's own options about its evaluations ({"--eval-interval":
    20, "--eval-iters": 40}), for the fix to name: how often, on how many
    batches."""
    found = {}
    for dest, strings, value in _cli_options:
        names = [dest.lower()] + [s.lower() for s in strings]
        if any("eval" in n or n.startswith(("val_", "--val")) for n in names):
            longs = [s for s in strings if s.startswith("--")]
            found[max(longs, key=len) if longs else strings[0]] = value
    return found


def _evaluation_data(data, step):
    """An evaluation event's data: the step it came after, the options."""
    data["after_step"] = step
    options = _evaluation_options()
    if options:
        data["options"] = options
        data["script"] = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return data


def _creation_site(frame):
    """Where a DataLoader is being made: the first frame of the user's own
    code ("train.py:47", "ShapesData.train_dataloader"), and the framework
    involved, so the diagnosis can name the argument to change where the user
    sets it. The framework is the one the user's code called into to get the
    loader (transformers' Trainer builds it from TrainingArguments, through
    accelerate; accelerator.prepare() rebuilds one), else the one that called
    the user's code (Lightning calls a DataModule's train_dataloader())."""
    site, called_into, caller = {}, None, None
    while frame is not None:
        path = frame.f_code.co_filename
        library = path.startswith("<") or any(d in path for d in _LIBRARY_DIRS)
        named = next((name for key, name in _FRAMEWORKS if key in path), None)
        if not site:
            if library:
                called_into = named or called_into
            else:
                where = os.path.relpath(path)
                site = {"created_at": "%s:%d" % (path if where.startswith("..") else where,
                                                 frame.f_lineno),
                        "created_in": getattr(frame.f_code, "co_qualname", frame.f_code.co_name)}
        elif named and caller is None:
            caller = named
        frame = frame.f_back
    framework = called_into or caller
    if framework:
        site["framework"] = framework
    return site
