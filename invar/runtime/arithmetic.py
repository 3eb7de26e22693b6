"""`task.name = "arithmetic"`: sums of two numbers asked as a chat question, checked by the
number the response states as its answer (`invar.runtime.answers`).

Prompt: "What is A + B? Answer with the number only.", in the tokenizer's chat template, for
A and B in 0..`operand_max`. Each pair (A, B) belongs to one split for good: it is held out
when its hash falls in one bucket of `HELDOUT_BUCKETS`, so no held-out question is ever
trained on; each split lists its pairs in the order of their hashes. Held-out prompt `index`
is pair `index mod size` of its list; the training prompts are walked in a permutation of
theirs drawn from (`order_seed`, pass), a new one each pass through the split.

Verifier: the response (up to its first EOS) is right when the number it states as its answer
(`invar.runtime.answers.stated_answer`: a `\\boxed{}` answer, else an "answer is N", else its
last number that is not an operand) equals A + B: reward 1 or 0. A restated question ("To add
11 + 3, we") states no answer; math-verify, which read it as the expression 11 + 3 equal to 14,
is no longer used (the reward hack of issue 40).
`format_reward` (default 0: off) is added when the response is the number alone and ended
(its EOS reached within `response_length`): a shaping term for short, final answers.

Difficulty: `operand_max = 19` was picked by measuring SmolLM2-135M-Instruct, whose sampled
accuracy then lies well inside (0, 1), so most groups of samples hold both a right and a wrong
answer, the signal GRPO learns from (reports/real_model.md: the base model's figures).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from invar.model.errors import ConfigError
from invar.runtime.answers import is_right
from invar.runtime.task import SPLITS
from invar.runtime.tasks import chat_text, make_tokenizer

HELDOUT_BUCKETS = 8
"""A pair is held out when its hash falls in one bucket of this many (about 12 %)."""

QUESTION = "What is {a} + {b}? Answer with the number only."

BARE_NUMBER = re.compile(r"\s*-?\d+\s*\.?\s*")


def _key(a: int, b: int) -> int:
    digest = hashlib.blake2b(f"arithmetic|{a}|{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, passes: int, size: int) -> np.ndarray:
    """The training order of one pass: numpy's PCG64 from (seed, pass), the same on every
    process and machine."""
    return np.random.Generator(np.random.PCG64([seed, passes])).permutation(size)


class ArithmeticTask:
    """Two-number sums as chat questions, the model's own tokens, the stated answer checked."""

    def __init__(self, tokenizer: Any, prompt_length: int, response_length: int,
                 operand_max: int = 19, format_reward: float = 0.0,
                 order_seed: int = 0) -> None:
        self.name = f"arithmetic:0..{operand_max}"
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.eos_token: int | None = tokenizer.eos_token_id
        self.format_reward = float(format_reward)
        self.order_seed = int(order_seed)
        pairs = sorted(((a, b) for a in range(operand_max + 1) for b in range(operand_max + 1)),
                       key=lambda pair: _key(*pair))
        heldout = [_key(a, b) % HELDOUT_BUCKETS == 0 for a, b in pairs]
        self._pairs = {SPLITS[0]: [p for p, h in zip(pairs, heldout) if not h],
                       SPLITS[1]: [p for p, h in zip(pairs, heldout) if h]}
        self._prompts = {split: [[int(t) for t in tokenizer.encode(
            chat_text(tokenizer, QUESTION.format(a=a, b=b)))] for a, b in rows]
            for split, rows in self._pairs.items()}
        longest = max(len(row) for rows in self._prompts.values() for row in rows)
        if longest > prompt_length:
            raise ConfigError(("task.prompt_length",), f"the arithmetic questions take up to "
                                                       f"{longest} tokens, more than "
                                                       f"{prompt_length}")

    def split_size(self, split: str) -> int:
        return len(self._pairs[split])

    def _position(self, index: int, split: str) -> int:
        """Which pair of `split`'s list prompt `index` asks: held-out prompts in list order;
        training prompts through a permutation per pass, drawn from (order_seed, pass)."""
        size = len(self._pairs[split])
        if split != SPLITS[0]:
            return index % size
        passes, within = divmod(index, size)
        return int(_permutation(self.order_seed, passes, size)[within])

    def question(self, index: int, split: str = "train") -> tuple[int, int]:
        """The pair (A, B) prompt `index` of `split` asks for."""
        return self._pairs[split][self._position(index, split)]

    def prompt(self, index: int, split: str = "train") -> list[int]:
        return list(self._prompts[split][self._position(index, split)])

    def score(self, split: str, index: int, response: Sequence[int]) -> float:
        a, b = self.question(index, split)
        tokens = [int(t) for t in response]
        eos = self.eos_token
        ended = eos is not None and eos in tokens
        if eos is not None and ended:  # the response ends at its first EOS: nothing after it
            tokens = tokens[:tokens.index(eos) + 1]
        text = self.tokenizer.decode(tokens)
        right = float(is_right(text, a + b))
        formatted = ended and BARE_NUMBER.fullmatch(text) is not None
        return right + (self.format_reward if formatted else 0.0)

    def answer_text(self, split: str, index: int) -> str:
        """The expected answer to prompt `index` of `split`, as reports show it."""
        a, b = self.question(index, split)
        return str(a + b)

    def question_text(self, split: str, index: int) -> str:
        """The question prompt `index` of `split` asks, as reports show it."""
        a, b = self.question(index, split)
        return f"{a} + {b}"


def from_settings(get: Callable[[str], Any]) -> ArithmeticTask:
    """The task of the configuration's `task` section (`get(key)` reads a key of it)."""
    for key in ("operand_max", "order_seed"):
        if get(key) < 0:
            raise ConfigError((f"task.{key}",), f"must be >= 0, got {get(key)}")
    return ArithmeticTask(make_tokenizer(get("tokenizer")), get("prompt_length"),
                          get("response_length"), get("operand_max"), get("format_reward"),
                          get("order_seed"))
