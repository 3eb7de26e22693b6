"""An example task plug-in: say whether a string of bits has an odd number of ones.

    invar train --set task.name=module \
        --set task.module=examples/parity_task.py:make_task --set task.options.bits=6

`make_task(**task.options)` returns an object with the attributes and methods of
`invar.runtime.tasks.Task`; nothing else is required (no base class, no registration).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

SEP = 2  # tokens: 0 and 1 are bits, 2 ends the prompt


class Parity:
    name = "parity"
    vocab_size = 3
    response_length = 1

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.prompt_length = bits + 1

    def _bits(self, index: int, split: str) -> list[int]:
        # A pure function of (split, index): the same prompt on every call and machine.
        digest = hashlib.blake2b(f"{split}:{index}".encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return [(value >> i) & 1 for i in range(self.bits)]

    def prompt(self, index: int, split: str = "train") -> list[int]:
        return [*self._bits(index, split), SEP]

    def split_size(self, split: str) -> int | None:
        return None  # indices never run out (train and held-out may share strings here)

    def score(self, split: str, index: int, response: Sequence[int]) -> float:
        return float(response[0] == sum(self._bits(index, split)) % 2)


def make_task(bits: int = 6) -> Parity:
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits}")
    return Parity(bits)
