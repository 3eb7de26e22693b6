"""Tasks as a plug-in: the interface every task keeps, the built-in JSONL task, and how the
configuration's `task` section becomes a task.

A task is anything with the attributes and methods of `Task` below. The runtime asks it for
prompts by logical index (the core decides which index each request gets), and for the reward
of a response (the verifier, run by the rollout workers through `invar.runtime.verifier`).
Generation has fixed shapes (each request sampled at a fixed row of a fixed-size call, which
the identical-weights guarantee rests on): prompts are left-padded to `prompt_length` with the
padding masked (`invar.runtime.padding`), and a response has `response_length` tokens, or
fewer when the task names an end token (`eos_token`): it ends at its first one.

Four kinds, by `task.name`: "reverse" (`invar.runtime.task.DigitReversal`), "arithmetic"
(`invar.runtime.arithmetic`: sums asked in a chat model's own tokens), "jsonl" (`JsonlTask`:
a file of `{"prompt": ..., "answer": ...}` lines) and "module" (a factory named
`package.module:factory` or `path/to/file.py:factory`, called with `task.options`). Nothing
here imports torch (transformers only for a Hugging Face tokenizer): the verifier processes
build the task from the same configuration.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from invar.model.errors import ConfigError
from invar.runtime.padding import Prompts
from invar.runtime.task import SPLITS, DigitReversal

TASK_KINDS = ("reverse", "arithmetic", "jsonl", "module")
BUILT_IN_KINDS = {"arithmetic": "invar.runtime.arithmetic:from_settings"}
"""Task kinds built by a module of their own (imported only when named): the factory, called
with the `task` section's getter."""
VERIFIERS = ("exact", "numeric")
JSONL_KEYS = ("prompt", "answer", "split")
HELDOUT_BUCKETS = 8
"""A JSONL line without a "split" is held out when the hash of its prompt falls in one bucket
of this many (about 12 %)."""


@runtime_checkable
class Task(Protocol):
    """What the runtime needs of a task. Every method must be a pure function of its
    arguments (the same on every call, process and machine): a request re-issued after a
    worker's death must get the same prompt, and the same response the same reward, or an
    asynchronous run would not compute what the serial one does.

    Optional attributes: `eos_token` (int or None: the token that ends a response), and
    `question_text(split, index)` / `answer_text(split, index)` (str: how reports show a
    prompt and its expected answer beside the decoded response; `invar.runtime.responses`)."""

    # Read-only (plain attributes satisfy them too).
    @property
    def name(self) -> str:
        """Shown in reports and logs."""

    @property
    def prompt_length(self) -> int:
        """Tokens in the longest prompt: shorter ones are left-padded to it, the padding
        masked, so a prompt computes what it computes alone (refuse a longer one, never cut)."""

    @property
    def response_length(self) -> int:
        """The most tokens the policy generates for a prompt (a response ends earlier at the
        task's `eos_token`, when it has one: an optional attribute, int or None)."""

    @property
    def vocab_size(self) -> int:
        """Token ids are 0..vocab_size-1; `policy.vocab_size` must be at least this."""

    def prompt(self, index: int, split: str = "train") -> list[int]:
        """The `index`-th prompt of `split` ("train" or "heldout"): 1..`prompt_length` ids.
        Indices grow without end (the core numbers prompts across batches): a finite task
        wraps them around its split."""
        ...

    def split_size(self, split: str) -> int | None:
        """Distinct prompts in `split`; None when there is no end to them. Held-out
        evaluation uses min(task.heldout_prompts, this) prompts."""
        ...

    def score(self, split: str, index: int, response: Sequence[int]) -> float:
        """The verifier: the reward of `response` (its token ids, up to and including its
        first `eos_token`, or `response_length` of them) to prompt
        `index` of `split`. Plain Python, run in separate processes with a time limit: an
        exception or a timeout records a failure and gives `task.failure_reward`."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """What the JSONL task needs of a tokenizer. A Hugging Face tokenizer fits through a thin
    adapter (`HuggingFaceTokenizer`: encode without special tokens); one that has a
    `chat_template` gets each prompt wrapped as a user turn with
    `apply_chat_template(..., add_generation_prompt=True)`."""

    vocab_size: int
    pad_token_id: int
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255, then PAD (256) and EOS (257): needs no files, so the
    built-in small policy can learn a JSONL task with nothing downloaded. No chat template."""

    vocab_size = 258
    pad_token_id = 256
    eos_token_id = 257
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer:
    """A Hugging Face tokenizer directory (`save_pretrained` layout, read from local files
    only) behind the `Tokenizer` protocol: text is encoded without special tokens (a chat
    template writes its own), PAD is the tokenizer's pad token or else its EOS token, and a
    response is decoded without special tokens. Ids the tokenizer does not know (a model's
    embedding table may be larger than its tokenizer) decode to nothing."""

    def __init__(self, directory: str | Path) -> None:
        try:
            import transformers
        except ImportError:
            raise ConfigError(("task.tokenizer",), "a Hugging Face tokenizer needs the "
                                                   "transformers and tokenizers packages: "
                                                   "pip install -e '.[hf]' in the Invar "
                                                   "checkout") from None
        transformers.logging.set_verbosity_error()
        try:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(
                Path(directory).expanduser(), local_files_only=True)
        except (OSError, ValueError, TypeError) as error:
            first_line = str(error).strip().splitlines()[0]
            raise ConfigError(("task.tokenizer",), f"no Hugging Face tokenizer can be loaded "
                                                   f"from {str(directory)!r}: {first_line}"
                              ) from None
        if self._tokenizer.eos_token_id is None:
            raise ConfigError(("task.tokenizer",), f"the tokenizer in {str(directory)!r} has no "
                                                   "EOS token to end a response with")
        self.vocab_size = len(self._tokenizer)
        self.eos_token_id = int(self._tokenizer.eos_token_id)
        pad = self._tokenizer.pad_token_id
        self.pad_token_id = self.eos_token_id if pad is None else int(pad)
        self.chat_template = self._tokenizer.chat_template

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode([i for i in ids if 0 <= i < self.vocab_size],
                                          skip_special_tokens=True))

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool,
                            add_generation_prompt: bool) -> str:
        return str(self._tokenizer.apply_chat_template(
            messages, tokenize=tokenize, add_generation_prompt=add_generation_prompt))


TOKENIZERS = {"bytes": ByteTokenizer}
"""Tokenizers the JSONL task can name (`task.tokenizer`); any other value but "auto" is a
Hugging Face tokenizer directory."""

AUTO_TOKENIZER = "auto"
"""`task.tokenizer`: the tokenizer of the transformers policy's directory (`policy.path`)
when there is one, else "bytes"; the configuration resolves it (`config.task_section`)."""


def make_tokenizer(name: str) -> Any:
    """The tokenizer `task.tokenizer` names: a built-in one, or a Hugging Face directory
    ("auto" unresolved, with no model directory to take it from, is the byte tokenizer)."""
    if name == AUTO_TOKENIZER:
        return ByteTokenizer()
    if name in TOKENIZERS:
        return TOKENIZERS[name]()
    from invar.runtime.gguf import is_gguf, prepared
    if is_gguf(name):  # a GGUF model's own tokenizer, read from the file once (cached)
        return HuggingFaceTokenizer(prepared(name))
    if not Path(name).expanduser().is_dir():
        raise ConfigError(("task.tokenizer",), f"{name!r} is neither a built-in tokenizer "
                                               f"({', '.join(TOKENIZERS)}, {AUTO_TOKENIZER}), "
                                               "a Hugging Face tokenizer directory nor a "
                                               ".gguf file")
    return HuggingFaceTokenizer(name)


def chat_text(tokenizer: Any, prompt: str) -> str:
    """The text the policy sees for `prompt`: a user turn in the tokenizer's chat template
    when it has one, else the prompt itself."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             tokenize=False, add_generation_prompt=True)
    return prompt


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands separators dropped), or None."""
    found = NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


class JsonlTask:
    """Prompts and answers from a JSONL file, one `{"prompt": str, "answer": str | number}`
    object a line, optionally with `"split": "train" | "heldout"` (else the prompt's hash
    decides: about 1 in HELDOUT_BUCKETS is held out).

    Each prompt (in the chat template when the tokenizer has one) is tokenized (the runtime
    left-pads it to `prompt_length`, masked); a prompt longer than that is refused with its
    line named, never cut. A response ends at the tokenizer's EOS (`eos_token`); its text
    is read up to the first EOS or PAD. Verifier "exact":
    reward 1 when the response text equals the answer (both stripped of surrounding
    whitespace), else 0; "numeric": 1 when the last number in the response equals the answer
    (relative tolerance 1e-6), else 0. Prompt `index` of a split is line `index mod size` of
    that split, in file order.

    Every line is checked when the task is built (before anything runs): a line that is not
    a JSON object, lacks a field, has an unknown one, a numeric answer that is not a number
    or a prompt too long is refused as `task.path: line N: ...`.
    """

    def __init__(self, path: str | Path, prompt_length: int, response_length: int,
                 verifier: str = "exact", tokenizer: Any = None) -> None:
        if verifier not in VERIFIERS:
            raise ConfigError(("task.verifier",),
                              f"unknown verifier {verifier!r}; known: {', '.join(VERIFIERS)}")
        self.name = f"jsonl:{Path(path).name}"
        self.path = Path(path)
        self.verifier = verifier
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.vocab_size = int(self.tokenizer.vocab_size)
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.eos_token: int | None = self.tokenizer.eos_token_id
        self._prompts: dict[str, list[list[int]]] = {split: [] for split in SPLITS}
        self._answers: dict[str, list[str]] = {split: [] for split in SPLITS}
        self._read()

    def _read(self) -> None:
        try:
            raw = self.path.read_bytes()
        except OSError as error:
            raise ConfigError(("task.path",), f"cannot read {str(self.path)!r}: "
                                              f"{error.strerror or error}") from None
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                if number == raw.count(b"\n") + 1:
                    break  # the file's last line, after its final newline
                raise ConfigError(("task.path",), f"line {number}: empty line")
            try:
                split, prompt, answer = self._line(line.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise ConfigError(("task.path",), f"line {number}: not UTF-8 text "
                                                  f"(byte {line[error.start]:#04x})") from None
            except ValueError as error:
                raise ConfigError(("task.path",), f"line {number}: {error}") from None
            self._prompts[split].append(prompt)
            self._answers[split].append(answer)
        for split in SPLITS:
            if not self._prompts[split]:
                raise ConfigError(("task.path",),
                                  f"{str(self.path)!r} has no {split} line: mark some lines "
                                  f'"split": "{split}"')

    def _line(self, text: str) -> tuple[str, list[int], str]:
        """(split, prompt token ids, answer) of one line; ValueError says what is wrong."""
        try:
            data = json.loads(text)
        except ValueError as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected an object {{\"prompt\": ..., \"answer\": ...}}, "
                             f"got {type(data).__name__}")
        unknown = sorted(set(data) - set(JSONL_KEYS))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown))}; known: "
                             f"{', '.join(JSONL_KEYS)}")
        prompt, answer = data.get("prompt"), data.get("answer")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError('"prompt" must be a non-empty string')
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError('"answer" must be a string or a number')
        answer = str(answer)
        if self.verifier == "numeric" and last_number(answer) is None:
            raise ValueError(f'"answer" {answer!r} holds no number, and task.verifier is '
                             '"numeric"')
        split = data.get("split")
        if split is None:
            digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
            split = SPLITS[int(int.from_bytes(digest, "little") % HELDOUT_BUCKETS == 0)]
        elif split not in SPLITS:
            raise ValueError(f'"split" must be one of {", ".join(SPLITS)}, got {split!r}')
        ids = [int(i) for i in self.tokenizer.encode(chat_text(self.tokenizer, prompt))]
        if len(ids) > self.prompt_length:
            raise ValueError(f"the prompt is {len(ids)} tokens, longer than task.prompt_length "
                             f"= {self.prompt_length} (prompts are never cut)")
        return split, ids, answer

    def split_size(self, split: str) -> int | None:
        return len(self._prompts[split])

    def prompt(self, index: int, split: str = "train") -> list[int]:
        rows = self._prompts[split]
        return list(rows[index % len(rows)])

    def answer_text(self, split: str, index: int) -> str:
        """The expected answer to prompt `index` of `split`, as reports show it."""
        answers = self._answers[split]
        return answers[index % len(answers)]

    def response_text(self, response: Sequence[int]) -> str:
        """The response up to its first EOS or PAD, as text."""
        ends = (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        kept = []
        for token in response:
            if int(token) in ends:
                break
            kept.append(int(token))
        return self.tokenizer.decode(kept)

    def score(self, split: str, index: int, response: Sequence[int]) -> float:
        answer = self.answer_text(split, index)
        text = self.response_text(response)
        if self.verifier == "exact":
            return float(text.strip() == answer.strip())
        given, expected = last_number(text), last_number(answer)
        return float(given is not None and expected is not None
                     and math.isclose(given, expected, rel_tol=1e-6))


def load_factory(spec: str) -> Any:
    """The callable named by "package.module:factory" or "path/to/file.py:factory"."""
    module_name, colon, attribute = spec.rpartition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(("task.module",),
                          f"{spec!r}: write \"package.module:factory\" or "
                          "\"path/to/file.py:factory\"")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            name = f"invar_task_{hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()}"
            module = sys.modules.get(name)
            if module is None:
                loader = importlib.util.spec_from_file_location(name, path)
                if loader is None or not path.is_file():
                    raise ImportError(f"no file {str(path)!r}")
                module = importlib.util.module_from_spec(loader)
                loader.loader.exec_module(module)  # type: ignore[union-attr]
                sys.modules[name] = module
        else:
            module = importlib.import_module(module_name)
    except Exception as error:  # a plug-in's import may fail in any way: name it
        raise ConfigError(("task.module",),
                          f"cannot import {module_name!r}: {type(error).__name__}: {error}"
                          ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(("task.module",), f"{module_name!r} has no callable {attribute!r}")
    return factory


def build_task(config: Any) -> Task:
    """The task the configuration's `task` section describes (a `TaskConfig` or its dict),
    checked against the interface; any problem is a ConfigError naming the key."""
    def get(key: str) -> Any:
        return setting(config, key)
    kind = get("name")
    if kind == "reverse":
        return DigitReversal(get("length"))
    if kind in BUILT_IN_KINDS:
        module_name, _, factory = BUILT_IN_KINDS[kind].partition(":")
        return getattr(importlib.import_module(module_name), factory)(get)
    if kind == "jsonl":
        if not get("path"):
            raise ConfigError(("task.path",), "task.name = \"jsonl\" needs the file's path")
        return JsonlTask(get("path"), get("prompt_length"), get("response_length"),
                         get("verifier"), make_tokenizer(get("tokenizer")))
    if kind == "module":
        factory = load_factory(get("module"))
        try:
            task = factory(**dict(get("options")))
        except Exception as error:  # the plug-in's own refusal: keep its words
            raise ConfigError(("task.module", "task.options"),
                              f"{get('module')} failed: {type(error).__name__}: {error}"
                              ) from None
        check_task(task, get("module"))
        return task
    raise ConfigError(("task.name",), f"unknown task {kind!r}; known: {', '.join(TASK_KINDS)}")


def check_task(task: Any, where: str) -> None:
    """Refuse an object that does not keep the `Task` interface (what is missing, named)."""
    missing = [name for name in ("name", "prompt_length", "response_length", "vocab_size",
                                 "prompt", "split_size", "score") if not hasattr(task, name)]
    if missing:
        raise ConfigError(("task.module",),
                          f"{where} returned {type(task).__name__}, which lacks "
                          f"{', '.join(missing)} of the task interface (README, \"Bring your "
                          "own model and task\")")
    for name in ("prompt_length", "response_length", "vocab_size"):
        value = getattr(task, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(("task.module",), f"{where}: {name} must be an integer >= 1, "
                                                f"got {value!r}")
    for split in SPLITS:
        size = task.split_size(split)
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ConfigError(("task.module",), f"{where}: split_size({split!r}) must be None "
                                                f"or an integer >= 1, got {size!r}")
        prompt = task.prompt(0, split)
        if not 1 <= len(prompt) <= task.prompt_length or \
                not all(0 <= int(t) < task.vocab_size for t in prompt):
            raise ConfigError(("task.module",),
                              f"{where}: prompt(0, {split!r}) must be 1..{task.prompt_length} "
                              f"token ids in 0..{task.vocab_size - 1}, got {prompt!r}")
    eos = end_token(task)
    if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)
                            or not 0 <= eos < task.vocab_size):
        raise ConfigError(("task.module",), f"{where}: eos_token must be None or a token id in "
                                            f"0..{task.vocab_size - 1}, got {eos!r}")


def end_token(task: Any) -> int | None:
    """The token that ends a response of `task` (its optional `eos_token`), or None: every
    response then has `response_length` tokens."""
    return getattr(task, "eos_token", None)


def prompt_rows(task: Task, split: str, indices: Sequence[int]) -> Prompts:
    """Prompts of `split` at `indices`, left-padded to `prompt_length`."""
    return Prompts.of([task.prompt(index, split) for index in indices], task.prompt_length)


def heldout_count(task: Task, wanted: int) -> int:
    """Held-out prompts to evaluate: `wanted`, or all the task has when it has fewer."""
    size = task.split_size("heldout")
    return wanted if size is None else min(wanted, size)


def setting(config: Any, key: str) -> Any:
    """`key` of the `task` section, given as a `TaskConfig` or as its dict."""
    return config[key] if isinstance(config, dict) else getattr(config, key)


def describe(config: Any) -> str:
    """One phrase naming the configured task (a `TaskConfig` or its dict), for reports."""
    kind = setting(config, "name")
    if kind == "reverse":
        return f"reverse {setting(config, 'length')} digits"
    if kind == "jsonl":
        return f"{Path(setting(config, 'path')).name} ({setting(config, 'verifier')} match)"
    if kind == "arithmetic":
        return (f"sums of two numbers in 0..{setting(config, 'operand_max')} "
                "(the stated answer checked)")
    return f"plug-in {setting(config, 'module')}"
