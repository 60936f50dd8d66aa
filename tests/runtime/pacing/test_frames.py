"""Frame/audio validation (no copies) and OutputSplitter."""

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from reactor_serve.interface import Audio, Output, TrackPayload, Video
from reactor_serve.interface.tracks import declared_tracks
from reactor_serve.runtime.pacing.frames import (
    MAX_FRAME_METADATA_BYTES,
    FrameError,
    audio_chunk,
    video_batch,
)
from reactor_serve.runtime.pacing.output_splitter import OutputSplitter

EXPECTED_VIDEO = "(H, W, 3) or (N, H, W, 3)"


def frames(n, h=6, w=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def data_ptr(array):
    return array.__array_interface__["data"][0]


# -- video_batch ---------------------------------------------------------------------


def test_single_frame_becomes_batch_of_one_without_copy():
    frame = frames(1)[0]
    batch = video_batch(frame, "main_video")
    assert batch.shape == (1, 6, 8, 3)
    assert np.shares_memory(batch, frame)
    assert np.array_equal(batch[0], frame)


def test_batch_is_passed_through_without_copy():
    batch_in = frames(4)
    batch = video_batch(batch_in, "main_video")
    assert batch.shape == (4, 6, 8, 3)
    assert np.shares_memory(batch, batch_in)


def test_strided_view_is_not_copied():
    big = frames(2, h=12, w=16)
    view = big[:, ::2, ::2]
    batch = video_batch(view, "main_video")
    assert np.shares_memory(batch, big)
    assert np.array_equal(batch, view)


@pytest.mark.parametrize("shape", [(6, 8, 3), (3, 6, 8, 3)])
def test_cpu_torch_tensor_is_not_copied(shape):
    tensor = torch.randint(0, 256, shape, dtype=torch.uint8)
    batch = video_batch(tensor, "main_video")
    assert isinstance(batch, np.ndarray)
    assert batch.ndim == 4 and batch.shape[1:] == (6, 8, 3)
    assert data_ptr(batch) == tensor.data_ptr()
    assert np.array_equal(batch.reshape(-1), tensor.numpy().reshape(-1))


@pytest.mark.parametrize(
    "value, given",
    [
        (np.zeros((6, 8, 3), np.float32), "(6, 8, 3) and dtype float32"),
        (torch.zeros((6, 8, 3)), "(6, 8, 3) and dtype torch.float32"),
        (np.zeros((6, 8, 4), np.uint8), "(6, 8, 4)"),
        (np.zeros((2, 6, 8, 4), np.uint8), "(2, 6, 8, 4)"),
        (np.zeros((6, 8), np.uint8), "(6, 8)"),
        (np.zeros((1, 2, 6, 8, 3), np.uint8), "(1, 2, 6, 8, 3)"),
        (np.zeros((0, 6, 8, 3), np.uint8), "(0, 6, 8, 3)"),
    ],
)
def test_bad_video_names_given_and_expected(value, given):
    with pytest.raises(FrameError) as info:
        video_batch(value, "main_video")
    message = str(info.value)
    assert "main_video" in message
    assert given in message
    assert EXPECTED_VIDEO in message
    assert "uint8" in message


def test_list_is_rejected():
    with pytest.raises(FrameError) as info:
        video_batch([[[0, 0, 0]]], "main_video")
    assert "list" in str(info.value)
    assert EXPECTED_VIDEO in str(info.value)


def test_frame_error_is_a_value_error():
    assert issubclass(FrameError, ValueError)


# -- audio_chunk ---------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 2])
def test_audio_int16_accepted_without_copy(channels):
    samples = np.arange(channels * 480, dtype=np.int16).reshape(channels, 480)
    chunk = audio_chunk(samples, "main_audio")
    assert chunk.shape == (channels, 480)
    assert np.shares_memory(chunk, samples)


def test_audio_torch_tensor_accepted_without_copy():
    tensor = torch.zeros((2, 480), dtype=torch.int16)
    chunk = audio_chunk(tensor, "main_audio")
    assert data_ptr(chunk) == tensor.data_ptr()


@pytest.mark.parametrize(
    "value, given",
    [
        (np.zeros((1, 480), np.float32), "float32"),
        (np.zeros((1, 480), np.int32), "int32"),
        (np.zeros((480,), np.int16), "(480,)"),
        (np.zeros((3, 480), np.int16), "(3, 480)"),
        (np.zeros((480, 2), np.int16), "(480, 2)"),
        ([[0, 0]], "list"),
    ],
)
def test_bad_audio_is_rejected(value, given):
    with pytest.raises(FrameError) as info:
        audio_chunk(value, "voice")
    message = str(info.value)
    assert "voice" in message
    assert given in message
    assert "int16" in message and "(channels, samples)" in message


# -- OutputSplitter --------------------------------------------------------------------


@dataclass
class AVOutput(Output):
    main_video: Video
    main_audio: Audio


class Voice(Audio):
    sample_rate = 16000


@dataclass
class VoiceOutput(Output):
    main_video: Video
    voice: Voice


@dataclass
class SingleOutput(Output):
    main_video: Video


@dataclass
class StereoOutput(Output):
    left: Video
    right: Video


def splitter(output_cls):
    return OutputSplitter(declared_tracks(output_cls))


def test_batch_splits_into_views():
    batch = frames(4)
    items = splitter(AVOutput).split(AVOutput(main_video=batch, main_audio=None))
    assert len(items) == 4
    for i, item in enumerate(items):
        assert set(item.video) == {"main_video"}
        assert item.video["main_video"].shape == (6, 8, 3)
        assert np.shares_memory(item.video["main_video"], batch)
        assert np.array_equal(item.video["main_video"], batch[i])
        assert item.audio == {}


@pytest.mark.parametrize("samples", [4 * 1200, 1001, 3])
def test_audio_is_split_across_the_batch_in_order(samples):
    audio = np.arange(samples, dtype=np.int16)[None]
    items = splitter(AVOutput).split(AVOutput(main_video=frames(4), main_audio=audio))
    assert len(items) == 4
    parts = [item.audio["main_audio"] for item in items]
    assert all(part.shape[0] == 1 for part in parts)
    assert sum(part.shape[1] for part in parts) == samples
    assert np.array_equal(np.concatenate(parts, axis=1), audio)
    sizes = [part.shape[1] for part in parts]
    assert max(sizes) - min(sizes) <= 1


def test_stereo_audio_keeps_channels():
    audio = np.stack([np.arange(800), -np.arange(800)]).astype(np.int16)
    items = splitter(AVOutput).split(AVOutput(main_video=frames(2), main_audio=audio))
    assert [item.audio["main_audio"].shape for item in items] == [(2, 400), (2, 400)]
    assert np.array_equal(np.concatenate([i.audio["main_audio"] for i in items], axis=1), audio)


def test_audio_at_16k_is_resampled_to_48k():
    split = splitter(VoiceOutput)
    per_emit = 1600  # 100 ms at 16 kHz
    totals = []
    for k in range(5):
        voice = np.full((1, per_emit), 1000, dtype=np.int16)
        items = split.split(VoiceOutput(main_video=frames(4, seed=k), voice=voice))
        assert len(items) == 4
        totals.append(sum(item.audio["voice"].shape[1] for item in items))
    # The resampler holds back a short look-ahead tail on the first emit only;
    # after that every emit yields exactly three times its samples.
    assert totals[1:] == [3 * per_emit] * 4
    assert 3 * per_emit - 100 <= totals[0] < 3 * per_emit
    # A constant signal stays constant once the start-up ramp is past.
    last = np.concatenate([item.audio["voice"] for item in items], axis=1)
    assert np.all(np.abs(last.astype(int) - 1000) <= 2)


def test_audio_at_48k_is_not_resampled():
    audio = np.arange(960, dtype=np.int16)[None]
    items = splitter(AVOutput).split(AVOutput(main_video=frames(1), main_audio=audio))
    assert np.array_equal(items[0].audio["main_audio"], audio)


@pytest.mark.parametrize("value", [frames(3), frames(1)[0]])
def test_raw_frame_on_single_video_track_model(value):
    items = splitter(SingleOutput).split(value)
    assert len(items) == (3 if value.ndim == 4 else 1)
    assert all(set(item.video) == {"main_video"} for item in items)
    assert all(np.shares_memory(item.video["main_video"], value) for item in items)


def test_raw_frame_on_two_video_track_model_raises():
    with pytest.raises(FrameError) as info:
        splitter(StereoOutput).split(frames(2))
    message = str(info.value)
    assert "left" in message and "right" in message
    assert "Output" in message


def test_undeclared_track_raises_naming_it():
    with pytest.raises(FrameError) as info:
        splitter(SingleOutput).split(AVOutput(main_video=frames(1), main_audio=None))
    assert "'main_audio'" in str(info.value)


def test_mismatched_batch_sizes_raise():
    with pytest.raises(FrameError) as info:
        splitter(StereoOutput).split(StereoOutput(left=frames(4), right=frames(2)))
    message = str(info.value)
    assert "left: 4" in message and "right: 2" in message


def test_two_video_tracks_split_together():
    left, right = frames(3, seed=1), frames(3, seed=2)
    items = splitter(StereoOutput).split(StereoOutput(left=left, right=right))
    assert len(items) == 3
    for i, item in enumerate(items):
        assert np.array_equal(item.video["left"], left[i])
        assert np.array_equal(item.video["right"], right[i])


def test_bad_frame_inside_output_names_the_track():
    with pytest.raises(FrameError, match="'right'"):
        splitter(StereoOutput).split(
            StereoOutput(left=frames(1), right=np.zeros((1, 6, 8, 3), np.float32))
        )


def test_dict_is_not_an_output():
    with pytest.raises(FrameError, match="dict"):
        splitter(SingleOutput).split({"main_video": frames(1)})


def test_empty_output_yields_nothing():
    assert splitter(AVOutput).split(AVOutput(main_video=None, main_audio=None)) == []


# -- per-frame metadata (TrackPayload) ---------------------------------------------------


def test_a_payloads_metadata_goes_with_every_frame_as_bytes():
    batch = frames(3)
    items = splitter(AVOutput).split(
        AVOutput(main_video=TrackPayload(batch, metadata={"seed": 7, "tag": "é"}), main_audio=None)
    )
    assert [np.array_equal(i.video["main_video"], batch[n]) for n, i in enumerate(items)] == [True] * 3
    assert [i.metadata for i in items] == [{"main_video": b'{"seed":7,"tag":"\\u00e9"}'}] * 3
    assert json.loads(items[0].metadata["main_video"]) == {"seed": 7, "tag": "é"}


def test_a_list_tags_each_frame_of_a_batch_and_none_tags_nothing():
    items = splitter(StereoOutput).split(StereoOutput(
        left=TrackPayload(frames(3), metadata=[b"\x00a", None, {"n": 2}]),
        right=frames(3),
    ))
    assert [i.metadata for i in items] == [{"left": b"\x00a"}, {}, {"left": b'{"n":2}'}]


def test_a_raw_frame_and_a_payload_without_metadata_carry_none():
    assert splitter(SingleOutput).split(frames(1)[0])[0].metadata == {}
    assert splitter(SingleOutput).split(SingleOutput(main_video=TrackPayload(frames(2))))[1].metadata == {}


@pytest.mark.parametrize("metadata, words", [
    ([b"a", b"b"], ("2 metadata values for 3 frame(s)",)),
    ({"x": float("nan")}, ("not JSON",)),
    ({"x": object()}, ("not JSON",)),
    ("text", ("dict, bytes or None", "str")),
    (b"x" * (MAX_FRAME_METADATA_BYTES + 1), ("limit",)),
])
def test_metadata_that_cannot_be_sent_is_refused_naming_the_track(metadata, words):
    with pytest.raises(FrameError) as caught:
        splitter(SingleOutput).split(SingleOutput(main_video=TrackPayload(frames(3), metadata=metadata)))
    assert "main_video" in str(caught.value)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_an_audio_track_takes_no_frame_metadata():
    with pytest.raises(FrameError, match="main_audio.*audio"):
        splitter(AVOutput).split(AVOutput(
            main_video=frames(1), main_audio=TrackPayload(np.zeros((1, 800), np.int16), metadata=b"x"),
        ))
