"""The checker as an installed package: built as a wheel and installed into a fresh virtual
environment, `invar-check` run outside the source tree finds the gate shipped with it
(checker/gate/, package data found through importlib.resources), lists it, checks one of its
bounds to the pinned state counts, and proves the schedule against the pinned decisions.

About 20 s, offline: the wheel is built with this environment's setuptools (no build isolation) and
installed without dependencies into a venv that borrows this environment's site-packages
through a .pth line (which adds the folder but runs none of its .pth files, so the editable
install of the source tree stays out)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "invar", "checker")  # what the wheel is built from
GATE_FILES = sorted(path.name for path in (ROOT / "spec" / "gate").iterdir())
SMALLEST = "large_frames"  # the gate's smallest bound: 280 states


class Installed:
    """A fresh venv with the wheel installed, and a folder outside the source tree to run in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cwd = root / "elsewhere"
        self.cwd.mkdir()
        self.wheel = self._build_wheel()
        self.bin = root / "venv" / "bin"
        venv.EnvBuilder(with_pip=False).create(root / "venv")
        site = Path(self.python("-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                    .stdout.strip())
        (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(self.bin / "python"),
                        "install", "--no-deps", "--no-index", "--quiet", str(self.wheel)],
                       check=True)

    def _build_wheel(self) -> Path:
        source = self.root / "source"
        source.mkdir()
        for name in SOURCES:
            path = ROOT / name
            if path.is_dir():
                shutil.copytree(path, source / name, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.egg-info"))
            else:
                shutil.copy2(path, source / name)
        wheels = self.root / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "--quiet", "--wheel-dir", str(wheels), str(source)],
                       check=True)
        (wheel,) = wheels.glob("*.whl")
        return wheel

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        # Without PYTHONPATH, which may name the source tree.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        return subprocess.run([str(self.bin / program), *args], cwd=self.cwd, env=env,
                              capture_output=True, text=True, timeout=600)

    def python(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self.run("python", *args)
        assert done.returncode == 0, done.stderr
        return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("package"))


def test_the_wheel_ships_the_gate(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = sorted(Path(name).name for name in wheel.namelist()
                         if name.startswith("checker/gate/"))
    assert shipped == GATE_FILES


def test_the_installed_package_is_the_one_imported(installed: Installed) -> None:
    done = installed.python("-c", "import checker, invar; print(checker.__file__); "
                                  "print(invar.__file__)")
    for path in done.stdout.split():
        assert Path(path).is_relative_to(installed.root / "venv"), path


def test_invar_check_lists_the_installed_gate(installed: Installed) -> None:
    done = installed.run("invar-check", "--list")
    assert done.returncode == 0, done.stdout + done.stderr
    first, *rows = done.stdout.splitlines()
    assert str(installed.root / "venv") in first
    assert [row.split()[0] for row in rows] == [name.removesuffix(".toml")
                                                for name in GATE_FILES if name.endswith(".toml")]


def test_a_bound_of_the_installed_gate_has_its_pinned_counts(installed: Installed) -> None:
    gate = Path(installed.python("-c", "from checker.pinned import GATE; print(GATE)")
                .stdout.strip())
    out = installed.cwd / f"{SMALLEST}.json"
    done = installed.run("invar-check", str(gate / f"{SMALLEST}.toml"), "--quiet",
                         "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    pinned = json.loads((gate / "pinned.json").read_text())["bounds"][SMALLEST]
    assert (doc["distinct_states"], doc["states_generated"]) == (
        pinned["distinct_states"], pinned["states_generated"])


def test_the_installed_prover_finds_the_pinned_schedule(installed: Installed) -> None:
    done = installed.run("invar-check", "--prove")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "schedule_is_pinned" in done.stdout
