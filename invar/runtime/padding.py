"""Rows of different lengths in fixed-shape calls: prompts left-padded, responses right-padded.

Generation and scoring run fixed-shape calls (the identical-weights guarantee rests on a
request's row computing the same whatever shares the call), but prompts differ in length and
responses end at their first EOS. A padded row must compute what the row computes alone: the
model never attends to a prompt's left padding, and positions count from the row's first real
token (`attention_mask`, `positions`). Padding after a response needs no mask: attention is
causal, so no real position sees it, and whatever is computed there is cut off by the row's
length. Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from invar.model.ragged import Ragged

PAD = 0
"""The id a padding position holds: any id the model embeds will do, since nothing attends to
it; 0 exists in every vocabulary."""


def left_mask(lengths: np.ndarray, width: int, total: int | None = None) -> np.ndarray:
    """(n, total) bool: True from column `width - lengths[i]` on (a row left-padded to
    `width`, followed by `total - width` more columns, all real)."""
    columns = np.arange(width if total is None else total)
    return columns >= (width - np.asarray(lengths))[:, None]


def positions_of(mask: np.ndarray) -> np.ndarray:
    """(n, T) int64 positions under an attention mask: counted from each row's first real
    token, 0 at the padding (nothing attends to it)."""
    return np.where(mask, mask.cumsum(axis=1) - 1, 0).astype(np.int64)


@dataclass(frozen=True)
class Prompts:
    """Prompts left-padded to one width: what generation starts from."""

    tokens: np.ndarray
    """(n, P) int64; the padding holds `PAD`."""
    lengths: np.ndarray
    """(n,) each prompt's real tokens, at the end of its row."""

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]], width: int) -> Prompts:
        """`rows` left-padded to `width` tokens; ValueError when one is empty or longer."""
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        if len(lengths) and (lengths.min() < 1 or lengths.max() > width):
            raise ValueError(f"prompts must have 1..{width} tokens, got lengths "
                             f"{sorted(set(lengths.tolist()))}")
        tokens = np.full((len(rows), width), PAD, dtype=np.int64)
        if len(lengths) and (lengths == width).all():
            tokens[:] = np.asarray(rows, dtype=np.int64).reshape(len(rows), width)
        else:
            for row, prompt in zip(tokens, rows):
                if len(prompt):
                    row[width - len(prompt):] = prompt
        return cls(tokens, lengths)

    @property
    def padded(self) -> bool:
        """True when some prompt is shorter than the width (a mask and positions are needed)."""
        return bool((self.lengths < self.tokens.shape[1]).any())


def response_lengths(tokens: np.ndarray, eos: int | None) -> np.ndarray:
    """(n,) each response's length: up to and including its first `eos`, else every token of
    its row of `tokens` (n, T). A length depends on the row's own tokens alone."""
    tokens = np.asarray(tokens)
    rows, width = tokens.shape
    if eos is None:
        return np.full(rows, width, dtype=np.int64)
    ended = tokens == eos
    first = ended.argmax(axis=1)
    return np.where(ended.any(axis=1), first + 1, width).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Sequences:
    """Prompt + response token rows a learner scores or steps on, as one padded matrix.

    Each prompt is left-padded to `response_start` tokens and each response right-padded to
    the longest response of the rows (responses end at their first EOS, so their lengths
    differ); see the module's docstring for what the learner masks."""

    tokens: np.ndarray
    """(n, P + R) int64; what the padding holds does not matter."""
    response_start: int
    """P: the column where every response starts."""
    prompt_lengths: np.ndarray | None = None
    """(n,) each prompt's real tokens (at the end of its P columns); None: every one fills P."""
    response_lengths: np.ndarray | None = None
    """(n,) each response's tokens; None: every one fills R."""

    def __eq__(self, other: object) -> bool:
        """Equal rows: the same tokens, start and lengths (None only equals None)."""
        if not isinstance(other, Sequences):
            return NotImplemented
        return (self.response_start == other.response_start
                and np.array_equal(self.tokens, other.tokens)
                and all((a is None and b is None) or (a is not None and b is not None
                                                      and np.array_equal(a, b))
                        for a, b in ((self.prompt_lengths, other.prompt_lengths),
                                     (self.response_lengths, other.response_lengths))))

    __hash__ = None  # type: ignore[assignment]  # holds arrays: compared, never hashed

    @property
    def padded_prompts(self) -> bool:
        """True when some prompt is shorter than P (a mask and positions are needed)."""
        return self.prompt_lengths is not None and bool(
            (self.prompt_lengths < self.response_start).any())

    def attention_mask(self) -> np.ndarray:
        """(n, P + R) bool: False at each prompt's left padding."""
        lengths = (np.full(len(self.tokens), self.response_start) if self.prompt_lengths is None
                   else self.prompt_lengths)
        return left_mask(lengths, self.response_start, self.tokens.shape[1])

    @classmethod
    def of(cls, prompts: Prompts, responses: Ragged) -> Sequences:
        """Prompts and responses side by side."""
        response_tokens, _ = responses.padded()
        return cls._whole_as_none(
            np.concatenate((prompts.tokens, response_tokens.astype(np.int64)), axis=1),
            prompts.tokens.shape[1], prompts.lengths,
            np.array(responses.lengths, dtype=np.int64))

    def take(self, positions: np.ndarray) -> Sequences:
        """The rows at `positions`, responses padded to the longest of them."""
        return self._whole_as_none(
            self.tokens[positions], self.response_start,
            None if self.prompt_lengths is None else self.prompt_lengths[positions],
            None if self.response_lengths is None else self.response_lengths[positions])

    @classmethod
    def _whole_as_none(cls, tokens: np.ndarray, start: int, prompt_lengths: np.ndarray | None,
                       response_lengths: np.ndarray | None) -> Sequences:
        """One spelling per set of rows: a length column is None when every row is whole
        (so rows built one by one and rows taken from a batch compare equal), and the token
        columns end with the longest response."""
        if prompt_lengths is not None and (prompt_lengths == start).all():
            prompt_lengths = None
        if response_lengths is not None and len(response_lengths):
            longest = int(response_lengths.max())
            tokens = tokens[:, :start + longest]
            if (response_lengths == longest).all():
                response_lengths = None
        return cls(tokens, start, prompt_lengths, response_lengths)
