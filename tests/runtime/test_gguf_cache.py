"""The GGUF cache (`invar.runtime.gguf.prepared`): keyed by the file's SHA-256, never by its
path, size or time; an entry whose files changed is rebuilt, loudly; a run's journal binds the
file's digest and its entry's, so a model changed between a run and its resume is refused,
naming policy.path.

transformers' readers are replaced by a fake that writes what they would (a config, a chat
template, a tokenizer) from the file's bytes: what is tested is the cache, not the format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from invar.model.errors import ConfigError
from invar.runtime import gguf
from invar.runtime.config import load_config


class _Saved:
    """What a transformers config or tokenizer read from a file writes out."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def save_pretrained(self, directory: Path) -> None:
        for name, text in self.files.items():
            (Path(directory) / name).write_text(text)


@pytest.fixture
def reads(monkeypatch, tmp_path) -> list[str]:
    """Each GGUF file the fake transformers read, in order; the cache under tmp_path."""
    monkeypatch.setenv("INVAR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "_digests", {}, raising=False)
    read: list[str] = []

    def config(parent: Path, gguf_file: str) -> _Saved:
        read.append(gguf_file)
        content = (Path(parent) / gguf_file).read_bytes().hex()[:16]
        return _Saved({"config.json": json.dumps({"rms_norm_eps": 1e-5, "of": content})})

    def tokenizer(parent: Path, gguf_file: str) -> _Saved:
        return _Saved({"chat_template.jinja": "{{ messages }}", "tokenizer.json": "{}"})

    monkeypatch.setattr(gguf, "_transformers", lambda: SimpleNamespace(
        AutoConfig=SimpleNamespace(from_pretrained=config),
        AutoTokenizer=SimpleNamespace(from_pretrained=tokenizer)))
    return read


def _model(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _same_size_and_time(path: Path, content: bytes) -> None:
    """`path` given other bytes of the same length, its modification time put back."""
    status = path.stat()
    assert len(content) == status.st_size
    path.write_bytes(content)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    _new_process()


def _new_process() -> None:
    """Forget the digests this process computed (`gguf.file_digest`), as a new one would."""
    vars(gguf).get("_digests", {}).clear()


def test_the_cache_is_keyed_by_the_file_s_digest(tmp_path, reads):
    model = _model(tmp_path / "model.gguf", b"A" * 64)
    first = gguf.prepared(model)
    assert gguf.prepared(model) == first and len(reads) == 1  # read once
    _same_size_and_time(model, b"B" * 64)
    second = gguf.prepared(model)
    assert second != first and len(reads) == 2
    assert json.loads((second / "config.json").read_text())["of"] == (b"B" * 8).hex()


def test_a_changed_cache_entry_is_rebuilt_loudly(tmp_path, reads, capsys):
    model = _model(tmp_path / "model.gguf", b"A" * 64)
    entry = gguf.prepared(model)
    (entry / "chat_template.jinja").write_text("{{ 'forged' }}")
    (entry / "config.json").write_text(json.dumps({"rms_norm_eps": 0.5}))
    _new_process()
    assert gguf.prepared(model) == entry and len(reads) == 2
    warning = capsys.readouterr().err
    assert f"{entry}: chat_template.jinja, config.json changed since the entry was made" \
           in warning and "rebuilt" in warning, warning
    assert (entry / "chat_template.jinja").read_text() == "{{ messages }}"
    assert json.loads((entry / "config.json").read_text())["rms_norm_eps"] == 1e-5


def _gguf_run(model: Path) -> tuple[object, object, object]:
    """What the journal of a run of the GGUF file `model` binds, its configuration, and the
    check a resume makes of its files."""
    from invar.journal_format import Binding
    from invar.runtime.binding import bound_files, bound_settings, check_files
    config = load_config(None, ['policy.kind="transformers"',
                                f"policy.path={json.dumps(str(model))}"], validate=False)
    return Binding(bound_settings(config), bound_files(config)), config, check_files


def test_a_model_changed_since_the_run_is_refused_naming_policy_path(tmp_path, reads):
    model = _model(tmp_path / "model.gguf", b"A" * 64)
    binding, config, check_files = _gguf_run(model)
    check_files(binding, config)  # the same file: nothing to say
    _same_size_and_time(model, b"B" * 64)
    with pytest.raises(ConfigError) as refused:
        check_files(binding, config)
    assert refused.value.fields == ("policy.path",)
    assert "is not the file the run was started with" in refused.value.reason


def test_a_cache_entry_rewritten_with_its_digests_is_refused_naming_policy_path(tmp_path,
                                                                                reads):
    """Its files and its digests file changed together, the entry passes its own check; the
    journal's digests of it do not."""
    model = _model(tmp_path / "model.gguf", b"A" * 64)
    binding, config, check_files = _gguf_run(model)
    entry = gguf.prepared(model)
    (entry / "chat_template.jinja").write_text("{{ 'forged' }}")
    _new_process()
    recorded = json.loads((entry / gguf.DIGESTS).read_text())
    recorded["files"] = gguf.entry_digests(entry)
    (entry / gguf.DIGESTS).write_text(json.dumps(recorded))
    with pytest.raises(ConfigError) as refused:
        check_files(binding, config)
    assert refused.value.fields == ("policy.path",)
    assert "the config and tokenizer read from it into the cache are not: " \
           "chat_template.jinja" in refused.value.reason
