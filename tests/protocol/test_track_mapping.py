"""The one track_mapping rule: shape, binding to the model's tracks, the offer's kinds."""

import pytest

from reactor_serve.protocol.track_mapping import (
    MAX_TRACK_MAPPING,
    TrackMapping,
    TrackMappingError,
    bind_track_mapping,
    check_offer_kinds,
    parse_track_mapping,
)

GOOD = {"mid": "0", "name": "main_video", "kind": "video", "direction": "recvonly"}
OUTPUTS = {"main_video": "video", "main_audio": "audio"}
INPUTS = {"webcam": "video"}


def test_absent_mapping_is_empty_and_good_entries_keep_their_place():
    assert parse_track_mapping(None) == []
    entries = parse_track_mapping([GOOD, {**GOOD, "mid": "1", "name": "webcam", "direction": "sendonly"}])
    assert [e.index for e in entries] == [0, 1]
    assert entries[1].as_dict() == {"mid": "1", "name": "webcam", "kind": "video", "direction": "sendonly"}


def test_a_numeric_mid_is_the_mline_index_as_a_string():
    assert parse_track_mapping([{**GOOD, "mid": 3}])[0].mid == "3"


@pytest.mark.parametrize("raw, message", [
    ({"mid": "0"}, "track_mapping: must be an array"),
    ([GOOD] * (MAX_TRACK_MAPPING + 1), f"the limit is {MAX_TRACK_MAPPING}"),
    ([5], "track_mapping[0]: must be an object"),
    ([GOOD, {"mid": "1"}], "track_mapping[1].name: required"),
    ([{**GOOD, "name": 7}], "track_mapping[0].name: must be a string"),
    ([{**GOOD, "mid": True}], "track_mapping[0].mid: must be a string"),
    ([{**GOOD, "mid": 10**6}], "track_mapping[0].mid: must be a string"),
    ([{**GOOD, "kind": "k" * 300}], "track_mapping[0].kind: longer than 256"),
    ([GOOD, {**GOOD, "kind": "text"}], "track_mapping[1].kind: must be audio or video"),
    ([{**GOOD, "direction": "both"}], "track_mapping[0].direction: must be recvonly or sendonly"),
])
def test_malformed_mappings_name_the_field(raw, message):
    with pytest.raises(TrackMappingError) as caught:
        parse_track_mapping(raw)
    assert str(caught.value).startswith(message) or message in str(caught.value)


def test_binding_checks_the_side_and_kind_of_each_named_track():
    entries = parse_track_mapping([GOOD, {**GOOD, "mid": "1", "name": "webcam", "direction": "sendonly"}])
    mapping = bind_track_mapping(entries, OUTPUTS, INPUTS)
    assert sorted(mapping) == ["0", "1"] and mapping["1"].name == "webcam"
    # An input named as an output, and an unknown track, are errors naming the name.
    with pytest.raises(TrackMappingError, match=r"track_mapping\[0\]\.name: the model has no output track 'webcam' \(output tracks: main_video, main_audio\)"):
        bind_track_mapping(parse_track_mapping([{**GOOD, "name": "webcam"}]), OUTPUTS, INPUTS)
    with pytest.raises(TrackMappingError, match=r"no input track 'x' \(input tracks: none\)"):
        bind_track_mapping(parse_track_mapping([{**GOOD, "name": "x", "direction": "sendonly"}]), OUTPUTS, {})
    with pytest.raises(TrackMappingError, match=r"track_mapping\[0\]\.kind: track 'main_audio' is audio, not video"):
        bind_track_mapping(parse_track_mapping([{**GOOD, "name": "main_audio"}]), OUTPUTS, INPUTS)


def test_a_later_entry_for_the_same_mid_wins():
    entries = parse_track_mapping([GOOD, {**GOOD, "name": "main_audio", "kind": "audio"}])
    assert bind_track_mapping(entries, OUTPUTS, INPUTS)["0"].name == "main_audio"


def test_offer_kinds_must_match_the_mapped_entries():
    mapping = {"0": TrackMapping("0", "main_video", "video", "recvonly", index=2)}
    check_offer_kinds(mapping, [("0", "video"), ("1", "audio"), ("2", "application")])
    with pytest.raises(TrackMappingError, match=r"track_mapping\[2\]\.kind: mid '0' is a audio m-line"):
        check_offer_kinds(mapping, [("0", "audio")])
