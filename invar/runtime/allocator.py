"""Keep glibc's allocator from holding freed tensor memory: called first in Invar's processes.

torch allocates CPU tensors with `malloc`. glibc serves a block from a per-thread arena unless
it is larger than the mmap threshold, and that threshold rises to the size of every block freed
(up to 32 MiB): after the first large activation is freed, a model's activations, gradients and
serialised weights all come from arenas. The driver runs the learner, publication and the
journal in separate threads, each with its own arena, and freed arena memory returns to the
system only from an arena's top, so the process keeps the high-water mark of every thread's
fragments (measured on the real model: 8 GB of 64 MiB arena heaps in the driver, its
tensors a third of that). A fixed threshold sends every block of `MMAP_THRESHOLD` or more
straight to `mmap` and back with `munmap`, and fewer arenas leave fewer fragments.

Environment settings win: glibc's own `MALLOC_MMAP_THRESHOLD_` and `MALLOC_ARENA_MAX`, or
`INVAR_KEEP_MALLOC=1` to leave the allocator as it is. Elsewhere than glibc, nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

MMAP_THRESHOLD = 1 << 20
"""Blocks of this many bytes or more are mapped and unmapped on their own (1 MiB: a row of
activations of a real model is larger; the Python objects of the event path are far smaller)."""
ARENA_MAX = 2
"""Arenas glibc may create (its default is 8 per core)."""

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def limit_fragmentation() -> dict[str, int]:
    """Set glibc's mmap threshold and arena count unless the environment says otherwise;
    returns what was set (empty: nothing)."""
    if os.environ.get("INVAR_KEEP_MALLOC") == "1" or platform.libc_ver()[0] != "glibc":
        return {}
    name = ctypes.util.find_library("c")
    if name is None:
        return {}
    mallopt = ctypes.CDLL(name).mallopt
    chosen = {}
    for variable, option, value in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                    ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENA_MAX)):
        if variable not in os.environ and mallopt(option, value) == 1:
            chosen[variable] = value
    return chosen
