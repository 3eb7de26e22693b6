"""The core is pure: every module under invar/model imports only the standard library, numpy
and invar.model itself, and none of the stdlib modules that bring I/O, clocks, threads or
randomness. The test walks the AST (imports inside functions included), so it holds whatever
happens to be installed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import invar.model

MODEL_DIR = Path(invar.model.__file__).resolve().parent

FORBIDDEN = frozenset({
    "asyncio", "threading", "multiprocessing", "time", "random", "os", "socket", "subprocess",
    "torch", "mlx",
    # Dynamic imports would let anything in past this test.
    "importlib",
})
ALLOWED_THIRD_PARTY = frozenset({"numpy"})
STDLIB = frozenset(sys.stdlib_module_names)


def model_modules() -> list[Path]:
    return sorted(MODEL_DIR.rglob("*.py"))


def imported_names(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in `tree`; relative ones are resolved."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.append((node.lineno, name))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "__import__"):
            found.append((node.lineno, "__import__"))
    return found


def problems_of(source: str, package: str = "invar.model") -> list[str]:
    out = []
    for line, name in imported_names(ast.parse(source), package):
        top = name.split(".")[0]
        if name == "__import__":
            out.append(f"line {line}: dynamic __import__")
        elif top in FORBIDDEN:
            out.append(f"line {line}: forbidden import {name}")
        elif name == "invar.model" or name.startswith("invar.model."):
            continue
        elif top == "invar":
            out.append(f"line {line}: {name} is outside the pure core")
        elif top not in STDLIB and top not in ALLOWED_THIRD_PARTY:
            out.append(f"line {line}: third-party import {name}")
    return out


def test_model_modules_are_found():
    names = {p.name for p in model_modules()}
    assert {"config.py", "schedule.py", "messages.py", "state.py", "core.py", "transitions.py",
            "invariants.py", "errors.py", "objective.py", "__init__.py"} <= names


@pytest.mark.parametrize("path", model_modules(), ids=lambda p: str(p.relative_to(MODEL_DIR)))
def test_module_imports_only_stdlib_numpy_and_itself(path: Path):
    problems = problems_of(path.read_text(encoding="utf-8"))
    assert problems == [], f"{path.name} is not pure:\n" + "\n".join(problems)


@pytest.mark.parametrize("source, expected", [
    ("import asyncio", "forbidden"),
    ("def f():\n    import time\n", "forbidden"),
    ("from os import path", "forbidden"),
    ("import os.path", "forbidden"),
    ("from random import Random", "forbidden"),
    ("import threading", "forbidden"),
    ("from multiprocessing import Pool", "forbidden"),
    ("import socket", "forbidden"),
    ("import subprocess", "forbidden"),
    ("import torch", "forbidden"),
    ("import mlx.core as mx", "forbidden"),
    ("from importlib import import_module", "forbidden"),
    ("x = __import__('os')", "dynamic"),
    ("import requests", "third-party"),
    ("from invar.runtime import driver", "outside the pure core"),
    ("from invar import testing", "outside the pure core"),
    ("from .. import testing", "outside the pure core"),
])
def test_the_check_catches_impurity(source, expected):
    problems = problems_of(source)
    assert problems and expected in problems[0], problems


@pytest.mark.parametrize("source", [
    "import numpy as np", "from numpy.typing import NDArray", "import hashlib, json, math",
    "from __future__ import annotations", "from invar.model.schedule import gen_version",
    "from . import schedule", "from .state import State",
])
def test_the_check_accepts_pure_imports(source):
    assert problems_of(source) == []
