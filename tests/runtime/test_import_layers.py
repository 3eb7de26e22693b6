"""Every layer imports only the ones below it: the command line and the configuration (loaded,
validated, or refused) never pay for a learning framework; torch is imported when training
starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FRAMEWORKS = ("torch", "transformers", "mlx")


def frameworks_imported_by(code: str) -> list[str]:
    """The frameworks `code`, run in a fresh interpreter, leaves in sys.modules."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_configuration_and_the_cli_import_no_framework():
    assert frameworks_imported_by("import invar.runtime.config, invar.runtime.cli") == []


def test_loading_and_validating_the_default_configuration_imports_no_framework():
    assert frameworks_imported_by(
        "from invar.runtime.config import load_config\nload_config(None, [])") == []


def test_rescoring_a_trace_imports_no_framework():
    """`invar-check --trace` builds the task's verifier (`invar.runtime.rescore`) by default."""
    assert frameworks_imported_by("import checker.cli, invar.runtime.rescore") == []


def test_invar_train_help_imports_no_framework():
    code = ("import contextlib, io\nfrom invar.runtime.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main(['train', '--help'])")
    assert frameworks_imported_by(code) == []
