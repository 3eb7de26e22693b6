"""What a run's journal binds besides its protocol, and how a resume and a validation hold a run
to it (README, "Resume"; PROTOCOL.md §9.1).

The header binds the run's whole configuration apart from the protocol it holds already
(`settings`; `output.run_dir` aside: the run lives where it is now) and the SHA-256 of every
file the configuration names whose bytes change what the run computes (`files`): the model
(`policy.path`, a .gguf file with the digests of the config and tokenizer read from it into
the cache, or a model directory file by file), a task's tokenizer (`task.tokenizer`) and a
JSONL task's file (`task.path`). A resume may change operational settings only (`OPERATIONAL`):
each change is a line of the journal, and the settings the run holds to are the header's with
those lines applied. config.json is a copy of them for people and tools: one that is not a
configuration this journal bound (edited by hand) is refused, naming the keys.

Why a module of its own: the runtime's resume (`invar.runtime.cli`) and the checker's
re-scoring (`invar.runtime.rescore`) both read it; it imports the configuration, the tasks'
tokenizer names and the GGUF cache: no shell, no framework.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from invar.journal_format import Binding, Contents, leaves, protocol_to_dict
from invar.model.errors import ConfigError
from invar.runtime.config import TrainConfig, load_config, task_section, to_dict
from invar.runtime.gguf import entry_digests, file_digest, is_gguf, prepared
from invar.runtime.tasks import AUTO_TOKENIZER, TOKENIZERS

UNBOUND = ("output.run_dir",)
"""Settings a journal does not bind: where the run lives is where it is now."""


def bound_settings(config: TrainConfig) -> dict[str, Any]:
    """The settings a journal's header binds (`Binding.settings`): the configuration as
    `to_dict` gives it, without its protocol (the header holds it) and `UNBOUND`."""
    data = to_dict(config)
    del data["protocol"]
    for key in UNBOUND:
        section, name = key.split(".")
        del data[section][name]
    return data


def bound_files(config: TrainConfig) -> dict[str, Any]:
    """The digests of the files `config` names that change what its run computes, by key."""
    named: dict[str, str] = {}
    if config.policy.kind == "transformers" and config.policy.path:
        named["policy.path"] = config.policy.path
    tokenizer = task_section(config)["tokenizer"]
    if config.task.name in ("jsonl", "arithmetic") and \
            tokenizer not in (*TOKENIZERS, AUTO_TOKENIZER, config.policy.path):
        named["task.tokenizer"] = tokenizer
    if config.task.name == "jsonl":
        named["task.path"] = config.task.path
    return {key: _digests(key, path) for key, path in named.items()}


def _digests(key: str, path: str) -> Any:
    """A file's SHA-256; a .gguf file's with its cache entry's (`gguf.prepared`); a
    directory's files', by name. ConfigError naming `key` when it cannot be read."""
    target = Path(path).expanduser()
    try:
        if target.is_dir():
            return {str(item.relative_to(target)): file_digest(item)
                    for item in sorted(target.rglob("*")) if item.is_file()}
        if is_gguf(target):
            return {"sha256": file_digest(target), "derived": entry_digests(prepared(target))}
        return file_digest(target)
    except OSError as error:
        raise ConfigError((key,), f"{path!r} cannot be read: {error.strerror or error}"
                          ) from None


def check_files(binding: Binding, config: TrainConfig) -> None:
    """Refuse, naming the key, a file whose bytes are not those the journal bound."""
    now = bound_files(config)
    for key in sorted({*binding.files, *now}):
        bound, current = binding.files.get(key), now.get(key)
        if bound != current:
            raise ConfigError((key,), f"{_named(config, key)!r} is not the file the run was "
                                      f"started with: its bytes (SHA-256) differ from those "
                                      f"the journal binds{_derived(bound, current)}")


def _named(config: TrainConfig, key: str) -> str:
    section, name = key.split(".")
    return str(getattr(getattr(config, section), name))


def _derived(bound: Any, now: Any) -> str:
    """Which of a .gguf file's cached config and tokenizer files changed, when the file did
    not."""
    if isinstance(bound, dict) and isinstance(now, dict) and bound.get("sha256") and \
            bound.get("sha256") == now.get("sha256"):
        changed = sorted(name for name in {*bound.get("derived", {}), *now.get("derived", {})}
                         if bound.get("derived", {}).get(name) != now.get("derived", {}).get(name))
        return f" (the file is the same; the config and tokenizer read from it into the " \
               f"cache are not: {', '.join(changed)})"
    return ""


def bound_config(contents: Contents, run_dir: str | Path) -> TrainConfig:
    """The configuration the journal binds, as its last resume left it (not validated: the
    checker may read it on another machine). ConfigError when it binds none."""
    history = contents.binding.history()
    if not history:
        raise ConfigError(("journal header",), "binds no configuration (a journal not written "
                                               "by `invar train`)")
    data = nested(history[-1])
    data["protocol"] = protocol_to_dict(contents.config)
    data.setdefault("output", {})["run_dir"] = str(run_dir)
    return load_config(None, base=data, validate=False)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested tables (what `leaves` undoes)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return out


def check_saved(saved: dict[str, Any], contents: Contents, where: Path) -> None:
    """Refuse config.json (read as `saved`) when it is not a configuration the journal bound:
    the one it binds now, or one before a resume's change (a resume that died between its
    change line and config.json leaves the older one). Names the keys that differ."""
    # As config.json holds it: JSON.
    protocol = leaves(json.loads(json.dumps(protocol_to_dict(contents.config))), "protocol.")
    history = [{**protocol, **settings} for settings in contents.binding.history()]
    copy = {key: value for key, value in leaves(saved).items() if key not in UNBOUND}
    if not history or copy in history:
        return
    bound = history[-1]
    differ = [key for key in [*bound, *(k for k in copy if k not in bound)]
              if bound.get(key) != copy.get(key)]
    changes = ", ".join(f"{key} {json.dumps(bound.get(key))} -> {json.dumps(copy.get(key))}"
                        for key in differ)
    raise ConfigError(tuple(differ), f"{where} says other values than the configuration the "
                                     f"journal binds ({changes}): a resumed run changes "
                                     f"settings only through --set or a CONFIG file, and "
                                     f"operational ones only (README, \"Resume\")")


def pruning_problem(contents: Contents) -> str:
    """Why a journal read from a snapshot (`Contents.start`) should not have been ("" when it
    may): its settings never let it prune payloads (`journal_keep_updates` 0 in its header
    and after every resume's change), so the snapshot was put there, or payloads removed, by
    hand. A journal that binds no settings is not judged."""
    history = contents.binding.history()
    if contents.start is None or not history or any(
            settings.get("output.journal_keep_updates", 0) for settings in history):
        return ""
    return (f"{contents.start.path.name}: the journal is read from a snapshot, but its "
            f"settings never let it prune payloads (output.journal_keep_updates = 0 in its "
            f"header and after every resume): its payloads were removed, or the snapshot put "
            f"there, by hand")
