"""Weights serialisation, digest stability, and atomic writes."""

import os

import pytest
import torch

from invar.runtime import weights
from invar.runtime.files import atomic_write, atomic_write_leftovers
from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.weights import (
    state_dict_from_bytes,
    state_dict_to_bytes,
    weights_digest,
)


def mixed_state():
    return {
        "linear.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
        "half": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "count": torch.tensor(3, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
    }


def assert_same_state(left, right):
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert torch.equal(left[name], right[name]), name


@pytest.mark.parametrize("format", ["safetensors", "torch.save"])
def test_round_trip_is_bitwise(monkeypatch, format):
    if format == "torch.save":
        monkeypatch.setattr(weights, "safetensors_torch", None)
    state = mixed_state()
    data = state_dict_to_bytes(state)
    assert data.startswith(b"PK") == (format == "torch.save")
    assert_same_state(state_dict_from_bytes(data), state)


def test_tied_weights_serialise_and_load_back():
    policy = Policy(PolicyConfig(tie_head=True), seed=1)
    data = state_dict_to_bytes(policy.state_dict())
    loaded = Policy(PolicyConfig(tie_head=True), seed=2)
    loaded.load_state_dict(state_dict_from_bytes(data))
    assert_same_state(loaded.state_dict(), policy.state_dict())
    assert loaded.head.weight is loaded.token_embedding.weight


def test_digest_is_stable_and_order_independent():
    state = mixed_state()
    # Pinned: the digest must not drift between runs, processes or releases of this code.
    assert weights_digest(state) == (
        "fd7c710564725d22ebc858263b91a9715ba81183bdd1fecc368ac436e9b7a676"
    )
    assert weights_digest(dict(reversed(state.items()))) == weights_digest(state)
    loaded_back = state_dict_from_bytes(state_dict_to_bytes(state))
    assert weights_digest(loaded_back) == weights_digest(state)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update({"renamed": s.pop("count")}),
        lambda s: s.update({"count": s["count"].to(torch.int32)}),
        lambda s: s.update({"linear.weight": s["linear.weight"].reshape(4, 3)}),
        lambda s: s["linear.weight"].view(-1)[5].add_(1e-6),
        lambda s: s.update({"extra": torch.zeros(0)}),
    ],
    ids=["name", "dtype", "shape", "value", "extra tensor"],
)
def test_digest_sees_every_change(change):
    state = mixed_state()
    before = weights_digest(state)
    change(state)
    assert weights_digest(state) != before


def test_atomic_write_creates_and_replaces(tmp_path):
    target = tmp_path / "file.bin"
    atomic_write(target, b"old")
    atomic_write(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert os.listdir(tmp_path) == ["file.bin"]


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_interrupted_atomic_write_leaves_the_old_file(tmp_path, monkeypatch, failing):
    target = tmp_path / "file.bin"
    atomic_write(target, b"old")

    def crash(*args):
        raise OSError(f"simulated crash in os.{failing}")

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(OSError, match="simulated crash"):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert atomic_write_leftovers(tmp_path, "file") == []


def test_leftovers_of_a_hard_crash_are_found(tmp_path):
    # What a killed process leaves: the temporary file, never a half-written target.
    (tmp_path / ".commit-000002.pt.a1b2c3.tmp").write_bytes(b"partial")
    (tmp_path / "commit-000001.pt").write_bytes(b"whole")
    found = atomic_write_leftovers(tmp_path, "commit-")
    assert [p.name for p in found] == [".commit-000002.pt.a1b2c3.tmp"]
