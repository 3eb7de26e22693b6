"""`limit_fragmentation`: glibc's mmap threshold is fixed, so a freed large block goes back to
the system at once (with the dynamic threshold, it stays in the freeing thread's arena)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

# A thread frees a 16 MiB block (raising glibc's dynamic threshold past it), then allocates
# 64 blocks of 4 MiB, each followed by a small one that lives on (as a tensor's Python
# objects do), and frees the large ones: kept in its arena unless the threshold is fixed.
PROBE = r"""
import ctypes, json, sys, threading
sys.path.insert(0, sys.argv[1])
from invar.runtime.allocator import limit_fragmentation
chosen = limit_fragmentation() if sys.argv[2] == "limit" else {}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def work():
    libc.free(libc.malloc(16 << 20))
    blocks, pins = [], []
    for _ in range(64):
        blocks.append(libc.malloc(4 << 20))
        pins.append(libc.malloc(64))
        ctypes.memset(blocks[-1], 1, 4 << 20)
    for block in blocks:
        libc.free(block)
before = resident()
thread = threading.Thread(target=work)
thread.start(); thread.join()
print(json.dumps({"kept": resident() - before, "chosen": chosen}))
"""


def probe(mode: str, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "INVAR_"))}
    done = subprocess.run([sys.executable, "-c", PROBE, os.getcwd(), mode], capture_output=True,
                          text=True, timeout=60, env={**environment, **env}, check=True)
    return json.loads(done.stdout)


def test_freed_large_blocks_go_back_to_the_system():
    kept = probe("keep")
    limited = probe("limit")
    assert kept["kept"] > 128 << 20  # most of the 256 MiB held by the thread's arena
    assert limited["kept"] < 32 << 20
    assert limited["chosen"] == {"MALLOC_MMAP_THRESHOLD_": 1 << 20, "MALLOC_ARENA_MAX": 2}


def test_the_environment_wins():
    assert probe("limit", INVAR_KEEP_MALLOC="1")["chosen"] == {}
    assert probe("limit", MALLOC_ARENA_MAX="4")["chosen"] == {"MALLOC_MMAP_THRESHOLD_": 1 << 20}
