"""What model authors import. Also importable as `reactor_runtime.interface`."""

from reactor_serve.interface.batching import SessionStep, batched
from reactor_serve.interface.context import SessionContext, get_ctx
from reactor_serve.interface.events import command, connected, disconnected, event
from reactor_serve.interface.files import UploadedFile
from reactor_serve.interface.legacy import ModelConfig, VideoModel, model
from reactor_serve.interface.messages import ModelMessage
from reactor_serve.interface.models import (
    BufferClosed,
    Idle,
    ReactorModel,
    ReactorPipeline,
)
from reactor_serve.interface.rank_context import RankContext, get_rank
from reactor_serve.interface.state import InputField, InputRejected, InputState
from reactor_serve.interface.tracks import (
    Audio,
    FrameMetadata,
    Input,
    InputFrame,
    Output,
    TrackPayload,
    Video,
)

__all__ = [
    "Audio",
    "BufferClosed",
    "FrameMetadata",
    "Idle",
    "Input",
    "InputField",
    "InputFrame",
    "InputRejected",
    "InputState",
    "ModelConfig",
    "ModelMessage",
    "Output",
    "RankContext",
    "ReactorModel",
    "ReactorPipeline",
    "SessionContext",
    "SessionStep",
    "TrackPayload",
    "UploadedFile",
    "Video",
    "VideoModel",
    "batched",
    "command",
    "connected",
    "disconnected",
    "event",
    "get_ctx",
    "get_rank",
    "model",
]
