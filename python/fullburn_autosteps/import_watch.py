"""Hooks a module right after its import has run (install() watches torch,
safetensors.torch and Lightning's cloud_io this way)."""

import importlib.abc
import sys


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Hooks a module right after its import has run (torch, safetensors.torch),
    so a script that never imports it pays nothing and one that does needs no
    change."""

    def __init__(self, name, hook):
        self.name = name
        self.hook = hook

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once: a module imports only once
        spec = None
        for finder in sys.meta_path:  # PathFinder, or an editable install's finder
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(name, path, target) if find_spec else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        hook = self.hook

        def exec_and_hook(module):
            exec_module(module)
            try:
                hook(module)
            except Exception as e:  # never break the job over its markers
                sys.stderr.write("fullburn: automatic step markers are off (%s: %s)\n" %
                                 (type(e).__name__, e))

        spec.loader.exec_module = exec_and_hook
        return spec
