"""Evaluation records and their book, by hand: the fields of known returns, the final and
the best evaluation with their versions, and the evaluator's messages checked field by
field (a bad one dropped whole)."""

import math

import numpy as np
import pytest

from tianjax.runtime.record.evaluations import EvalBook, eval_fields, eval_record, from_message


def test_fields_of_known_returns():
    f = eval_fields(np.array([1.0, 2.0, 6.0]), np.array([10, 20, 30]), np.array([1, 0, 0], bool))
    assert f == {
        "eval_return": 3.0,
        "eval_return_std": pytest.approx(math.sqrt(14 / 3)),
        "eval_return_min": 1.0,
        "eval_return_max": 6.0,
        "eval_episodes": 3,
        "eval_length_mean": 20.0,
        "eval_win_rate": pytest.approx(1 / 3),
    }


def test_the_book_keeps_the_final_and_the_best_with_their_versions():
    book = EvalBook()
    assert book.summary()["eval_return"] is None and book.summary()["evaluations"] == 0
    for version, ret in [(10, 5.0), (20, 9.0), (30, 9.0), (40, 7.0)]:
        book.add(eval_record(version, version * 100, float(version), {"eval_return": ret}))
    s = book.summary()
    assert (s["eval_return"], s["eval_version"]) == (7.0, 40)
    assert (s["eval_best_return"], s["eval_best_version"]) == (9.0, 20)  # the earlier of equals
    assert s["evaluations"] == 4
    again = EvalBook()
    again.load_state_dict(book.state_dict())
    assert again.summary() == s


GOOD = {
    "type": "evaluation",
    "version": 7,
    "env_steps": 4096,
    "age_s": 0.5,
    "eval_episodes": 2,
    "eval_return": 12.5,
    "eval_video": "videos/eval-v00000007.mp4",
}


def test_a_good_message_is_taken():
    got = from_message(dict(GOOD))
    assert (got["version"], got["env_steps"], got["age_s"]) == (7, 4096, 0.5)
    assert got["fields"] == {
        "eval_episodes": 2,
        "eval_return": 12.5,
        "eval_video": "videos/eval-v00000007.mp4",
    }


@pytest.mark.parametrize(
    "change",
    [
        {"version": -1},
        {"version": "7"},
        {"env_steps": True},
        {"eval_return": float("nan")},
        {"eval_return": None},
        {"age_s": "soon"},
        {"eval_s": float("inf")},
        {"eval_video": "/etc/passwd"},
        {"eval_video": "videos/../../x.mp4"},
        {"eval_episodes": 2.5},
    ],
)
def test_a_bad_field_drops_the_message(change):
    assert from_message({**GOOD, **change}) is None
