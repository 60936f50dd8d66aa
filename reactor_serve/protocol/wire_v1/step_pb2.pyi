from google.protobuf import struct_pb2 as _struct_pb2
from reactor_serve.protocol.wire_v1 import model_pb2 as _model_pb2
from reactor_serve.protocol.wire_v1 import platform_pb2 as _platform_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FrameEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FRAME_ENCODING_UNSPECIFIED: _ClassVar[FrameEncoding]
    FRAME_ENCODING_RAW: _ClassVar[FrameEncoding]
    FRAME_ENCODING_H264: _ClassVar[FrameEncoding]

class StepFailureCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_FAILURE_CODE_UNSPECIFIED: _ClassVar[StepFailureCode]
    STEP_FAILURE_CODE_REFUSED: _ClassVar[StepFailureCode]
    STEP_FAILURE_CODE_NOT_READY: _ClassVar[StepFailureCode]
    STEP_FAILURE_CODE_FAILED: _ClassVar[StepFailureCode]
    STEP_FAILURE_CODE_RESULT_TOO_LARGE: _ClassVar[StepFailureCode]
    STEP_FAILURE_CODE_COMMAND_FAILED: _ClassVar[StepFailureCode]
    STEP_FAILURE_CODE_SESSION_ENDED: _ClassVar[StepFailureCode]
FRAME_ENCODING_UNSPECIFIED: FrameEncoding
FRAME_ENCODING_RAW: FrameEncoding
FRAME_ENCODING_H264: FrameEncoding
STEP_FAILURE_CODE_UNSPECIFIED: StepFailureCode
STEP_FAILURE_CODE_REFUSED: StepFailureCode
STEP_FAILURE_CODE_NOT_READY: StepFailureCode
STEP_FAILURE_CODE_FAILED: StepFailureCode
STEP_FAILURE_CODE_RESULT_TOO_LARGE: StepFailureCode
STEP_FAILURE_CODE_COMMAND_FAILED: StepFailureCode
STEP_FAILURE_CODE_SESSION_ENDED: StepFailureCode

class Frame(_message.Message):
    __slots__ = ("encoding", "dtype", "shape", "data", "metadata", "capture_time_us")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_US_FIELD_NUMBER: _ClassVar[int]
    encoding: FrameEncoding
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    metadata: bytes
    capture_time_us: int
    def __init__(self, encoding: _Optional[_Union[FrameEncoding, str]] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., metadata: _Optional[bytes] = ..., capture_time_us: _Optional[int] = ...) -> None: ...

class TrackFrames(_message.Message):
    __slots__ = ("track", "kind", "frames", "rate")
    TRACK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    track: str
    kind: _platform_pb2.TrackKind
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    rate: float
    def __init__(self, track: _Optional[str] = ..., kind: _Optional[_Union[_platform_pb2.TrackKind, str]] = ..., frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., rate: _Optional[float] = ...) -> None: ...

class RequestStep(_message.Message):
    __slots__ = ("state", "commands", "media_input")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_INPUT_FIELD_NUMBER: _ClassVar[int]
    state: _struct_pb2.Struct
    commands: _containers.RepeatedCompositeFieldContainer[_model_pb2.Command]
    media_input: _containers.RepeatedCompositeFieldContainer[TrackFrames]
    def __init__(self, state: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., commands: _Optional[_Iterable[_Union[_model_pb2.Command, _Mapping]]] = ..., media_input: _Optional[_Iterable[_Union[TrackFrames, _Mapping]]] = ...) -> None: ...

class StepFileRef(_message.Message):
    __slots__ = ("name", "content_type", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    content_type: str
    size: int
    def __init__(self, name: _Optional[str] = ..., content_type: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step", "tracks", "elapsed_seconds", "files", "error", "failure_code", "code", "entry")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRACKS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CODE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    step: int
    tracks: _containers.RepeatedCompositeFieldContainer[TrackFrames]
    elapsed_seconds: float
    files: _containers.RepeatedCompositeFieldContainer[StepFileRef]
    error: str
    failure_code: StepFailureCode
    code: str
    entry: str
    def __init__(self, step: _Optional[int] = ..., tracks: _Optional[_Iterable[_Union[TrackFrames, _Mapping]]] = ..., elapsed_seconds: _Optional[float] = ..., files: _Optional[_Iterable[_Union[StepFileRef, _Mapping]]] = ..., error: _Optional[str] = ..., failure_code: _Optional[_Union[StepFailureCode, str]] = ..., code: _Optional[str] = ..., entry: _Optional[str] = ...) -> None: ...
