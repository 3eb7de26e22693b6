"""Every learner backend Invar has, checked by the public conformance suite
(`invar.testing.backend_conformance`): torch always, MLX where it is installed."""

from __future__ import annotations

import importlib.util

import pytest

from invar.testing.backend_conformance import CHECKS, MLXAdapter, TorchAdapter

pytestmark = pytest.mark.usefixtures("few_threads")

HAVE_MLX = importlib.util.find_spec("mlx") is not None
BACKENDS = [pytest.param(TorchAdapter, id="torch"),
            pytest.param(MLXAdapter, id="mlx", marks=pytest.mark.skipif(
                not HAVE_MLX, reason="mlx is not installed (pip install 'mlx[cpu]')"))]


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.parametrize("adapter", BACKENDS)
def test_the_backend_conforms(adapter, check, tmp_path, monkeypatch):
    check(adapter(), tmp_path, monkeypatch)
