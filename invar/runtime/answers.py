"""The number a response states as its answer — never one it only restates from the question.

A verifier that looks for "an expression equal to the answer" anywhere in a response is fooled
by a response that restates the question: math-verify reads "To add 11 + 3, we need" as the
expression 11 + 3 and scores it equal to 14 (the reward hack found in issue 40, which every
curve of the first real-model report measured). The rule here reads what a grader would:

1. the content of the last `\\boxed{...}`, when there is one;
2. else the number right after the last "answer is" / "answer:" / "answer =";
3. else the last *stated* number of the response: a number that is not an operand, i.e. not
   next to an arithmetic operator (`+ - * / × ÷ ^`) or the words "plus", "minus", "times",
   "divided by", nor joined to another number by "and" (as in "the sum of 11 and 3"). "11 + 3 = 14"
   states 14; "11 + 3 =" and "To add 11 + 3, we" state nothing.

Rules 1 and 2 accept only a number: "\\boxed{11 + 3}" and "the answer is 11 + 3" state nothing.
The text is read up to its end token (the caller decodes the response up to its first EOS; any
text past it is no part of the response). The answer is compared as a number (14, 14.0 and
"14." are the same answer). Plain Python and `re`: no parser that can be slow or fooled by a
formula, and the same verdict in every process.
"""

from __future__ import annotations

import re

NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?"

_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(?:\$\s*)?(" + NUMBER + r")(?!\s*[-+*/×÷^\d])",
                        re.IGNORECASE)
_ONLY_NUMBER = re.compile(r"\s*\$?\s*(" + NUMBER + r")\s*\.?\s*\$?\s*")
_NUMBER = re.compile(r"(?<![\w.])" + NUMBER + r"(?![\w])")

_OPERATOR_BEFORE = re.compile(r"(?:[-+*/×÷^]|\bplus|\bminus|\btimes|\bdivided\s+by|\d\s+and)\s*$",
                              re.IGNORECASE)
_OPERATOR_AFTER = re.compile(r"^\s*(?:[-+*/×÷^]|plus\b|minus\b|times\b|divided\b|and\s+-?\d)",
                             re.IGNORECASE)


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def _is_operand(text: str, start: int, end: int) -> bool:
    """Whether the number at text[start:end] is an operand of an expression, not a statement."""
    return (_OPERATOR_BEFORE.search(text[:start]) is not None
            or _OPERATOR_AFTER.match(text[end:]) is not None)


def stated_answer(text: str) -> float | None:
    """The number `text` states as its answer (rules in the module's docstring), or None."""
    boxed = _BOXED.findall(text)
    if boxed:
        only = _ONLY_NUMBER.fullmatch(boxed[-1])
        return _value(only.group(1)) if only else None
    announced = _ANSWER_IS.findall(text)
    if announced:
        return _value(announced[-1])
    stated = [match.group() for match in _NUMBER.finditer(text)
              if not _is_operand(text, match.start(), match.end())]
    return _value(stated[-1]) if stated else None


def is_right(text: str, expected: float) -> bool:
    """Whether `text` states `expected` as its answer."""
    answer = stated_answer(text)
    return answer is not None and answer == expected
