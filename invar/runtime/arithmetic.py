"""`task.name = "arithmetic"`: sums of two numbers asked as a chat question, checked by
math-verify.

Prompt: "What is A + B? Answer with the number only.", in the tokenizer's chat template, for
A and B in 0..`operand_max`. Each pair (A, B) belongs to one split for good: it is held out
when its hash falls in one bucket of `HELDOUT_BUCKETS`, so no held-out question is ever
trained on; each split lists its pairs in the order of their hashes, and prompt `index` of a
split is pair `index mod size` of that list.

Verifier: math-verify (Hugging Face's answer checker, as used by TRL's and open-r1's
accuracy rewards) parses the response, taking a `\\boxed{}` answer first, then an "answer
is" statement, then the last number, and compares it with the sum: reward 1 or 0.
`format_reward` (default 0: off) is added when the response is the number alone and ended
(its EOS reached within `response_length`): a shaping term for short, final answers.

Difficulty: `operand_max = 19` was picked by measuring SmolLM2-135M-Instruct, whose sampled
accuracy then lies well inside (0, 1), so most groups of samples hold both a right and a wrong
answer, the signal GRPO learns from (reports/real_model.md: the base model's figures).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from invar.model.errors import ConfigError
from invar.runtime.task import SPLITS
from invar.runtime.tasks import chat_text, make_tokenizer

HELDOUT_BUCKETS = 8
"""A pair is held out when its hash falls in one bucket of this many (about 12 %)."""

QUESTION = "What is {a} + {b}? Answer with the number only."

BARE_NUMBER = re.compile(r"\s*-?\d+\s*\.?\s*")


def _key(a: int, b: int) -> int:
    digest = hashlib.blake2b(f"arithmetic|{a}|{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class ArithmeticTask:
    """Two-number sums as chat questions, the model's own tokens, math-verify as verifier."""

    def __init__(self, tokenizer: Any, prompt_length: int, response_length: int,
                 operand_max: int = 19, format_reward: float = 0.0) -> None:
        self.name = f"arithmetic:0..{operand_max}"
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.eos_token: int | None = tokenizer.eos_token_id
        self.format_reward = float(format_reward)
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

    def question(self, index: int, split: str = "train") -> tuple[int, int]:
        """The pair (A, B) prompt `index` of `split` asks for."""
        pairs = self._pairs[split]
        return pairs[index % len(pairs)]

    def prompt(self, index: int, split: str = "train") -> list[int]:
        rows = self._prompts[split]
        return list(rows[index % len(rows)])

    def score(self, split: str, index: int, response: Sequence[int]) -> float:
        from math_verify import parse, verify
        a, b = self.question(index, split)
        ended = bool(response) and int(response[-1]) == self.eos_token
        text = self.tokenizer.decode([int(t) for t in response])
        # Invar's verifier processes put their own time limit on a call: math-verify's
        # signal-based one would fail outside a main thread (and says so once per process).
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        answer = parse(text, parsing_timeout=None)
        right = float(verify(parse(str(a + b), parsing_timeout=None), answer,
                             timeout_seconds=None))
        formatted = ended and BARE_NUMBER.fullmatch(text) is not None
        return right + (self.format_reward if formatted else 0.0)


def from_settings(get: Callable[[str], Any]) -> ArithmeticTask:
    """The task of the configuration's `task` section (`get(key)` reads a key of it)."""
    if get("operand_max") < 0:
        raise ConfigError(("task.operand_max",), f"must be >= 0, got {get('operand_max')}")
    return ArithmeticTask(make_tokenizer(get("tokenizer")), get("prompt_length"),
                          get("response_length"), get("operand_max"), get("format_reward"))
