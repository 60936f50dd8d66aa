"""The command log: verdicts, commandError matching, the presentation clock, history, commands.jsonl."""

import json

from reactor_serve.sessions.recording.command_log import (
    ACCEPT_AFTER_S,
    CommandFile,
    CommandHistory,
    CommandLog,
)


class FakeClock:
    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


def make_log():
    clock = FakeClock()
    settled = []
    log = CommandLog(settled.append, clock=clock, wall_clock=lambda: 1_700_000_000.25)
    return log, clock, settled


def test_a_command_no_error_named_is_accepted_after_the_wait():
    log, clock, settled = make_log()
    log.add("set_tint", {"tint": 1}, command_id="c1")
    clock.now += ACCEPT_AFTER_S - 0.01
    log.settle()
    assert settled == [] and log.waiting == 1
    clock.now += 0.01
    log.presented(0, clock.now)  # a presented slot settles what timed out
    assert [(r["id"], r["accepted"]) for r in settled] == [("c1", True)]
    assert settled[0]["seq"] == 1 and settled[0]["wall"] == 1_700_000_000.25
    assert "error" not in settled[0] and log.waiting == 0


def test_a_command_error_names_its_command_by_id_and_accepts_those_before_it():
    log, _, settled = make_log()
    log.add("set_tint", {"tint": 1}, command_id="a")
    log.add("set_tint", {"tint": 999}, command_id="b")
    log.add("poke", {}, command_id="c")
    error = {"command": "set_tint", "id": "b", "errors": [{"field": "tint", "value": 999}]}
    log.command_error(error)
    # a is accepted (an error for a later command came back), b rejected; c still waits.
    assert [(r["id"], r["accepted"]) for r in settled] == [("a", True), ("b", False)]
    assert settled[1]["error"] is error and settled[1]["args"] == {"tint": 999}
    assert log.waiting == 1


def test_an_error_without_an_id_names_the_command_whose_arguments_hold_its_values():
    log, _, settled = make_log()
    log.add("set_tint", {"tint": 5})
    log.add("set_tint", {"tint": -1})
    log.command_error({"command": "set_tint", "errors": [{"field": "tint", "value": -1}]})
    assert [(r["args"], r["accepted"]) for r in settled] == [({"tint": 5}, True), ({"tint": -1}, False)]


def test_an_error_that_matches_nothing_names_the_oldest_waiting_command_of_its_name():
    log, _, settled = make_log()
    log.add("poke", {})
    log.add("set_tint", {"tint": 5})
    log.add("set_tint", {"tint": 6})
    log.command_error({"command": "set_tint", "id": "unknown", "errors": [{"field": "tint", "value": 7}]})
    assert [(r["name"], r["accepted"]) for r in settled] == [("poke", True), ("set_tint", False)]
    assert log.waiting == 1


def test_an_error_that_is_not_an_object_is_ignored():
    log, _, settled = make_log()
    log.add("poke", {})
    log.command_error(["not", "a", "dict"])
    assert settled == [] and log.waiting == 1


def test_a_command_refused_before_the_model_waits_its_turn_and_keeps_no_args():
    log, clock, settled = make_log()
    log.add("poke", {})
    refusal = {"command": "set_tint", "errors": [{"rule": "finite"}]}
    log.add("set_tint", {"tint": "NaN"}, error=refusal)
    assert settled == []  # in arrival order: poke's verdict first
    clock.now += ACCEPT_AFTER_S
    log.settle()
    assert [(r["name"], r["accepted"], r["args"]) for r in settled] == [
        ("poke", True, {}), ("set_tint", False, None)]
    assert settled[1]["error"] is refusal


def test_forcing_takes_every_waiting_command_as_accepted():
    log, _, settled = make_log()
    log.add("a", {})
    log.add("b", {})
    log.settle(force=True)
    assert [(r["name"], r["accepted"]) for r in settled] == [("a", True), ("b", True)]


def test_commands_are_placed_on_the_presentation_clock():
    log, clock, settled = make_log()
    log.add("before", {})  # no slot presented yet
    log.presented(9000, clock.now)
    clock.now += 0.5
    log.add("after", {})
    log.settle(force=True)
    assert [r["pts"] for r in settled] == [0, 9000 + 45000]


def test_the_history_answers_by_wall_clock_and_by_pts_and_keeps_the_latest():
    history = CommandHistory(size=3)
    for n in range(5):
        history.add({"n": n, "wall": 10.0 + n, "pts": 1000 * n})
    assert [r["n"] for r in history.since_wall(0)] == [2, 3, 4]
    assert [r["n"] for r in history.since_wall(13.0)] == [3, 4]
    assert [r["n"] for r in history.since_pts(4000)] == [4]


def test_a_command_file_times_each_line_from_its_first_frame(tmp_path):
    path = tmp_path / "commands.jsonl"
    commands = CommandFile(path, base_pts=90_000)
    commands.write({"seq": 1, "name": "poke", "pts": 135_000})
    # Flushed per line: a recording cut short keeps its log.
    assert json.loads(path.read_text()) == {"seq": 1, "name": "poke", "pts": 135_000, "t": 0.5}
    commands.write({"seq": 2, "name": "poke", "pts": 90_000})
    commands.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["t"] for line in lines] == [0.5, 0.0] and commands.count == 2
    assert " " not in path.read_text()  # compact lines
