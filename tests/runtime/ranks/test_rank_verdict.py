"""What one call on every rank comes to, from the answers alone."""

from __future__ import annotations

import re

import pytest

from reactor_serve.runtime.ranks.errors import (
    RankDesync,
    WorkerCrashed,
    WorkerTimeout,
    rank_failure_in,
)
from reactor_serve.runtime.ranks.rank_count import (
    RANKS_ENV,
    rank_count,
    ranks_from_environment,
)
from reactor_serve.runtime.ranks.rank_mode import RankMode, rank_mode
from reactor_serve.runtime.ranks.verdict import RankAnswer, verdict


def test_rank_0s_answer_stands_when_every_rank_succeeded_whatever_the_order() -> None:
    answers = [RankAnswer(2), RankAnswer(0, result="frame"), RankAnswer(1)]
    assert verdict(answers, "generate").result == "frame"


def test_a_named_result_ranks_answer_and_error_stand_instead_of_rank_0s() -> None:
    answers = [RankAnswer(0), RankAnswer(1, result="frame"), RankAnswer(2)]
    assert verdict(answers, "generate", result_rank=1).result == "frame"
    one = KeyError("one")
    with pytest.raises(KeyError) as caught:
        verdict([RankAnswer(0, error=KeyError("zero")), RankAnswer(1, error=one)], "generate",
                result_rank=1)
    assert caught.value is one


def test_calls_that_succeeded_but_came_to_different_things_are_a_desync() -> None:
    same = [RankAnswer(0, "frame", summary="made"), RankAnswer(1, summary="made")]
    assert verdict(same, "generate").result == "frame"
    with pytest.raises(RankDesync, match="generate: the ranks disagree: rank 0 made; "
                                         "rank 1 waits"):
        verdict([RankAnswer(1, summary="waits"), RankAnswer(0, "frame", summary="made")],
                "generate")


def test_the_same_error_everywhere_is_rank_0s_own_exception() -> None:
    zero = KeyError("zero")
    with pytest.raises(KeyError) as caught:
        verdict([RankAnswer(1, error=KeyError("one")), RankAnswer(0, error=zero)], "generate")
    assert caught.value is zero


def test_some_ranks_failing_is_a_desync_naming_the_first_and_the_others() -> None:
    cause = ValueError("bad shard")
    with pytest.raises(RankDesync) as caught:
        verdict([RankAnswer(0, result=1), RankAnswer(2, error=ValueError("x")),
                 RankAnswer(1, error=cause)], "generate")
    assert str(caught.value) == ("generate: rank 1 raised ValueError: bad shard; "
                                 "rank(s) 0 did not")
    assert caught.value.__cause__ is cause


def test_different_errors_on_every_rank_are_a_desync_too() -> None:
    with pytest.raises(RankDesync, match=r"the others raised TypeError \(rank 1\)"):
        verdict([RankAnswer(0, error=ValueError("a")), RankAnswer(1, error=TypeError("b"))],
                "reset")


def test_a_rank_failure_is_found_through_what_a_model_wrapped_it_in() -> None:
    crashed = WorkerCrashed("rank 1 died")
    try:
        try:
            raise crashed
        except WorkerCrashed as exc:
            raise RuntimeError("step failed") from exc
    except RuntimeError as wrapped:
        assert rank_failure_in(wrapped) is crashed
    assert isinstance(rank_failure_in(WorkerTimeout("slow")), WorkerTimeout)
    assert rank_failure_in(ValueError("mine")) is None
    assert rank_failure_in(None) is None


def test_the_ranks_setting_and_its_environment_variable(monkeypatch) -> None:
    assert rank_count({"ranks": 4}, "m") == 4 and rank_count(None, "m", 2) == 2
    with pytest.raises(ValueError, match="model m: ranks: expected a whole number from 1 to 16"):
        rank_count({"ranks": 0}, "m")
    monkeypatch.delenv(RANKS_ENV, raising=False)
    assert ranks_from_environment() == 1
    monkeypatch.setenv(RANKS_ENV, "3")
    assert ranks_from_environment() == 3
    monkeypatch.setenv(RANKS_ENV, "many")
    with pytest.raises(ValueError, match=RANKS_ENV):
        ranks_from_environment()


@pytest.mark.parametrize("config, ranks, seats, wrong", [
    ({"rank_mode": "spmd"}, 2, 1, "rank_mode: expected one of runner, model, got 'spmd'"),
    ({"output_rank": 2}, 2, 1, "output_rank: expected a rank from 0 to 1, got 2"),
    ({"output_rank": True}, 2, 1, "output_rank"),
    ({"rank_step_timeout_s": float("nan")}, 2, 1, "rank_step_timeout_s"),
    ({"rank_step_timeout_s": "5"}, 2, 1, "rank_step_timeout_s"),
    ({"rank_mode": "model"}, 2, 3, "rank_mode: model serves one session at a time"),
])
def test_wrong_rank_mode_settings_name_the_field_and_the_model(config, ranks, seats, wrong) -> None:
    with pytest.raises(ValueError, match=re.escape(f"model m: {wrong}")):
        rank_mode(config, "m", ranks, seats)


def test_rank_mode_defaults_and_values() -> None:
    assert rank_mode(None, "m", 1) == RankMode("runner", 0, 30.0)
    chosen = rank_mode({"rank_mode": "model", "output_rank": 1, "rank_step_timeout_s": 5}, "m", 2)
    assert chosen.every_rank_runs_model and chosen.output_rank == 1
    assert chosen.step_timeout_s == 5.0
    # One rank: nothing to conduct, so seats are fine.
    assert rank_mode({"rank_mode": "model"}, "m", 1, seats=4).every_rank_runs_model
