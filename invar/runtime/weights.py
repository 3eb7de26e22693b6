"""Weights as bytes: serialisation for publication, a stable digest, and atomic file writes."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

safetensors_torch: Any
try:
    import safetensors.torch as safetensors_torch
except ImportError:  # torch.save is the fallback format
    safetensors_torch = None

# Every torch.save file is a zip archive; safetensors starts with its header length instead.
_ZIP_MAGIC = b"PK\x03\x04"


def _cpu_copies(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # Separate contiguous CPU copies: safetensors refuses tensors sharing storage (tied heads).
    return {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state_dict.items()}


def state_dict_to_bytes(state_dict: Mapping[str, Tensor]) -> bytes:
    """Serialise tensors by name (safetensors when installed, else torch.save)."""
    tensors = _cpu_copies(state_dict)
    if safetensors_torch is not None:
        encoded: bytes = safetensors_torch.save(tensors)
        return encoded
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def state_dict_from_bytes(data: bytes) -> dict[str, Tensor]:
    """Inverse of `state_dict_to_bytes`, accepting either format; tensors land on the CPU."""
    if data.startswith(_ZIP_MAGIC):
        loaded: dict[str, Tensor] = torch.load(io.BytesIO(data), map_location="cpu",
                                               weights_only=True)
        return loaded
    if safetensors_torch is None:
        raise ValueError("weights are in safetensors format but safetensors is not installed")
    tensors: dict[str, Tensor] = safetensors_torch.load(data)
    return tensors


def tensor_bytes(tensor: Tensor) -> memoryview:
    """The raw bytes of a tensor's values in row-major order, for any dtype (a view of the
    tensor's own memory when it is a contiguous CPU tensor: digesting the learner's whole
    state each step would otherwise copy it)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    view: memoryview = flat.view(torch.uint8).numpy().data
    return view


def weights_digest(state_dict: Mapping[str, Tensor]) -> str:
    """Blake2b hex digest of names, dtypes, shapes and bytes, independent of dict order."""
    digest = hashlib.blake2b(digest_size=32)
    for name in sorted(state_dict):
        tensor = state_dict[name]
        # Length-prefixed fields, so no two different states can hash the same byte stream.
        fields = (
            name.encode(),
            str(tensor.dtype).encode(),
            repr(tuple(tensor.shape)).encode(),
            tensor_bytes(tensor),
        )
        for field in fields:
            digest.update(len(field).to_bytes(8, "little"))
            digest.update(field)
    return digest.hexdigest()


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` with `data` so that a crash at any point leaves the old file or the new
    (see `atomic_write_with`)."""
    atomic_write_with(path, lambda file: file.write(data))


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], Any]) -> None:
    """Replace `path` with what `write(file)` writes into an open binary file (streamed: a
    large file is never a whole `bytes` in memory), so that a crash at any point leaves the
    old file or the new.

    Writes a temporary file in the same directory (rename is only atomic within a file
    system), fsyncs it, renames it over `path`, then fsyncs the directory so the rename
    itself survives a power loss. On failure the temporary file is removed.
    """
    target = Path(path)
    # Named ".<name>.<random>.tmp" (see atomic_write_leftovers).
    descriptor, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def atomic_write_leftovers(directory: str | os.PathLike[str], name_prefix: str) -> list[Path]:
    """Temporary files that interrupted `atomic_write`s of `name_prefix*` files left behind."""
    return sorted(Path(directory).glob(f".{name_prefix}*.tmp"))
