"""Task plug-ins for the tests, loaded by file path (`task.module = ".../plugin_tasks.py:..."`):
the example parity task with a verifier that misbehaves on chosen prompts."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "parity_task", Path(__file__).parents[2] / "examples" / "parity_task.py")
parity_task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity_task)


class Misbehaving(parity_task.Parity):
    """Parity whose verifier raises on prompts `index % every == raise_at`, hangs on those
    `index % every == hang_at` and returns a string on `index % every == nonsense_at` (-1:
    never)."""

    def __init__(self, bits: int, every: int, raise_at: int, hang_at: int,
                 nonsense_at: int) -> None:
        super().__init__(bits)
        self.every, self.raise_at, self.hang_at, self.nonsense_at = \
            every, raise_at, hang_at, nonsense_at

    def score(self, split, index, response):
        if split == "train" and index % self.every == self.raise_at:
            raise ZeroDivisionError("a verifier bug")
        if split == "train" and index % self.every == self.hang_at:
            time.sleep(3600)
        if split == "train" and index % self.every == self.nonsense_at:
            return "yes"
        return super().score(split, index, response)


def misbehaving(bits=4, every=5, raise_at=-1, hang_at=-1, nonsense_at=-1):
    return Misbehaving(bits, every, raise_at, hang_at, nonsense_at)


def not_a_task():
    return object()
