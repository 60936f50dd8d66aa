"""Track declarations' values: what an input track hands the model."""

import numpy as np
import torch

from reactor_serve.interface import InputFrame


def test_an_input_frame_is_the_array_with_what_the_client_attached():
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert InputFrame.tag(frame, None, None) is frame  # nothing attached: the plain array
    tagged = InputFrame.tag(frame, b"seed=4", 1_700_000_000_000_000)
    assert isinstance(tagged, np.ndarray) and np.shares_memory(tagged, frame)
    assert (tagged.metadata, tagged.capture_time_us) == (b"seed=4", 1_700_000_000_000_000)
    assert tagged[None][0].metadata == b"seed=4"  # views keep it
    assert type(np.asarray(tagged)) is np.ndarray
    assert torch.equal(torch.from_numpy(tagged), torch.from_numpy(frame))
