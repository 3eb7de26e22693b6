"""The stated answer: what a response says its answer is, never the question restated.

Each adversarial case is one a verifier that looks for "an expression equal to the answer"
(math-verify on the whole response) gets wrong, or a plain last-number rule gets wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from invar.runtime.answers import is_right, stated_answer

RESTATED = [
    # The question restated, with and without "=": the reward hack of issue 40.
    ("To add 11 + 3, we need to find a way to", 14),
    ("To find 3 + 7, we", 10),
    ("11 + 3 =", 14),
    ("11+3=", 14),
    ("What is 11 + 3?", 14),
    ("The sum of 11 and 3 is", 14),
    ("The sum of 0 and 3", 3),  # the last operand equals the sum: still a restatement
    ("11 plus 3", 14),
    ("\\boxed{11 + 3}", 14),
    ("The answer is 11 + 3.", 14),
]
WRONG = [
    ("8 + 10 = 11", 18),  # a false statement
    ("14 + 1 = 15", 14),  # the sum inside a false statement
    ("I think it is 14. No wait, it is 15.", 14),  # the wrong number last
    ("Counting 14 apples, then 2 more", 14),  # the right number buried in prose
    ("", 14),
    ("The answer is fifteen", 14),
    ("\\boxed{15} although 14 also", 14),
    ("The answer is 15, but some say 14", 14),
]
RIGHT = [
    ("14", 14),
    ("14.", 14),
    (" 14 ", 14),
    ("11 + 3 = 14", 14),
    ("11+3=14", 14),
    ("14 = 11 + 3", 14),
    ("The sum of 11 and 3 is 14.", 14),
    ("Adding them gives 14 in total.", 14),
    ("The answer is 14.", 14),
    ("Answer: 14", 14),
    ("the answer is: 14", 14),
    ("\\boxed{14}", 14),
    ("$\\boxed{14}$", 14),
    ("First 11 + 3 = 15. Wrong: \\boxed{14}", 14),
    ("14.0", 14),
    ("1,234", 1234),
]
BASE_MODEL = [
    # SmolLM2-135M-Instruct's own answers to the task's questions (greedy and sampled at
    # temperature 1, decoded), each with the verdict a reader gives it. math-verify scored
    # every one marked "restated" as right.
    ("11 + 3 = 4\n\nThis is a classic example of a mathematical identity that is often "
     "misunderstood.", 14, False),
    ("7 + 5 = 12.", 12, True),
    ("The answer is 9.", 9, True),
    ("To solve this problem, we need to find the sum of 5 and 9.\n\nThe answer is ", 14, False),
    ("12 + 12 = x", 24, False),  # restated
    ("Although it answers the question with just 15 + 17, the original answer is incorrect. "
     "It's a", 32, False),  # restated
    ("Imagine you have a grand opportunity that requires a number. For 10 + 3. to complete "
     "your grand accomplishment", 13, False),  # restated
    ("Here's a simplified answer: 7 + 2 reduces to 11. The problem seems to involve more than",
     9, False),  # restated, then a wrong number
    ("By examining the equation 4 + 4, we find that it equals the multiplication of 2 * 4.",
     8, False),  # restated
    ("12 + 12 = *13\n\nNo further elaboration is needed.", 24, False),  # restated
    ("12 plus 11 is 23", 23, True),
    ("Eight + Five is 13.", 13, True),
    ("1 + 0 = (1)\n\n PLAIN TEXT TO ENTER\n", 1, True),
    ("10 + 0 = 10\n\nLet's apply the rule: 10 + 0 =", 10, True),
    ("19 + 10 is 29, just like adding zero to the original number adds no value and is", 29,
     True),
]


@pytest.mark.parametrize(("text", "expected", "right"), BASE_MODEL)
def test_the_base_model_s_own_answers_get_a_reader_s_verdict(text, expected, right):
    assert is_right(text, expected) == right, stated_answer(text)


@pytest.mark.parametrize(("text", "expected"), RESTATED)
def test_a_restated_question_states_no_right_answer(text, expected):
    assert not is_right(text, expected), stated_answer(text)


@pytest.mark.parametrize(("text", "expected"), WRONG)
def test_a_wrong_or_missing_answer_is_not_right(text, expected):
    assert not is_right(text, expected), stated_answer(text)


@pytest.mark.parametrize(("text", "expected"), RIGHT)
def test_a_stated_answer_is_read(text, expected):
    assert stated_answer(text) == expected


@given(st.integers(0, 99), st.integers(0, 99))
def test_no_restatement_of_a_sum_is_its_answer(a, b):
    for text in (f"{a} + {b}", f"{a} + {b} =", f"To add {a} + {b}, we need",
                 f"What is {a} + {b}?", f"the sum of {a} and {b}", f"{a} plus {b} is"):
        assert stated_answer(text) is None, text


@given(st.integers(0, 99), st.integers(0, 99), st.integers(0, 198))
def test_an_equation_states_its_right_hand_side(a, b, c):
    assert stated_answer(f"{a} + {b} = {c}") == c
    assert is_right(f"{a} + {b} = {c}", a + b) == (c == a + b)


@given(st.text(max_size=60))
def test_any_text_gives_a_number_or_none(text):
    answer = stated_answer(text)
    assert answer is None or isinstance(answer, float)


# -- the arithmetic task that uses it -------------------------------------------------------


def _task(order_seed=0):
    from invar.runtime.arithmetic import ArithmeticTask
    from invar.runtime.tasks import ByteTokenizer
    return ArithmeticTask(ByteTokenizer(), prompt_length=64, response_length=16,
                          order_seed=order_seed)


def test_the_task_scores_the_response_up_to_its_first_eos():
    task = _task()
    a, b = task.question(0)
    eos = task.eos_token
    right = list(f"{a} + {b} = {a + b}".encode())
    assert task.score("train", 0, right) == 1.0
    assert task.score("train", 0, [*right[:-len(str(a + b))], eos, *str(a + b).encode()]) == 0.0
    assert task.score("train", 0, list(f"To add {a} + {b}, we".encode())) == 0.0
    assert task.score("train", 0, []) == 0.0


def test_each_pass_walks_every_training_question_once_in_an_order_drawn_from_the_seed():
    first, second = _task(order_seed=0), _task(order_seed=1)
    size = first.split_size("train")
    walk = [first.question(i) for i in range(2 * size)]
    assert sorted(walk[:size]) == sorted(walk[size:]) == sorted(set(walk))
    assert walk[:size] != walk[size:]  # a new permutation each pass
    assert walk != [second.question(i) for i in range(2 * size)]
    assert walk == [_task(order_seed=0).question(i) for i in range(2 * size)]
    heldout = first.split_size("heldout")
    assert [first.question(i, "heldout") for i in range(heldout)] == \
        [second.question(i, "heldout") for i in range(heldout)]
    assert first.prompt(size + 3) == list(first.tokenizer.encode(
        "What is {} + {}? Answer with the number only.".format(*first.question(size + 3))))
