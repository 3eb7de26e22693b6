"""Weights as bytes: serialisation for publication and a stable digest."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from typing import Any

import torch
import xxhash
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


def content_digest(data: bytes | memoryview) -> bytes:
    """XXH3-128 of `data`: what `weights_digest` and the commit file's checksum take of
    bulk bytes. XXH3 runs at tens of GB/s where BLAKE2b manages under 1 GB/s here, and a real
    model's learner state is gigabytes, digested after every step, at every commit and every
    load: BLAKE2b made that seconds of each update. It tells apart bytes that differ by
    accident (a bug, a bit flip, a backend that diverged) except with probability about
    2^-128 per pair; XXH3 is not cryptographic, so bytes crafted to collide are not covered."""
    return content_hasher(data).digest()


def content_hasher(data: bytes | memoryview = b"") -> xxhash.xxh3_128:
    """The hash behind `content_digest`, to be fed in pieces (`update`): a commit's payload is
    digested as it streams to disk."""
    return xxhash.xxh3_128(data)


def weights_digest(state_dict: Mapping[str, Tensor]) -> str:
    """BLAKE2b hex digest of the names, dtypes and shapes and the `content_digest` of each
    tensor's bytes, independent of dict order."""
    digest = hashlib.blake2b(digest_size=32)
    for name in sorted(state_dict):
        tensor = state_dict[name]
        # Length-prefixed fields, so no two different states can hash the same byte stream.
        fields = (
            name.encode(),
            str(tensor.dtype).encode(),
            repr(tuple(tensor.shape)).encode(),
            content_digest(tensor_bytes(tensor)),
        )
        for field in fields:
            digest.update(len(field).to_bytes(8, "little"))
            digest.update(field)
    return digest.hexdigest()
