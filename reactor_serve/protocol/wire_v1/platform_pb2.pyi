from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VideoCodec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VIDEO_CODEC_UNSPECIFIED: _ClassVar[VideoCodec]
    VIDEO_CODEC_VP8: _ClassVar[VideoCodec]
    VIDEO_CODEC_VP9: _ClassVar[VideoCodec]
    VIDEO_CODEC_AV1: _ClassVar[VideoCodec]
    VIDEO_CODEC_H264: _ClassVar[VideoCodec]
    VIDEO_CODEC_H265: _ClassVar[VideoCodec]

class AudioCodec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIO_CODEC_UNSPECIFIED: _ClassVar[AudioCodec]
    AUDIO_CODEC_OPUS: _ClassVar[AudioCodec]

class TrackKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACK_KIND_UNSPECIFIED: _ClassVar[TrackKind]
    TRACK_KIND_VIDEO: _ClassVar[TrackKind]
    TRACK_KIND_AUDIO: _ClassVar[TrackKind]

class TrackDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACK_DIRECTION_UNSPECIFIED: _ClassVar[TrackDirection]
    TRACK_DIRECTION_RECVONLY: _ClassVar[TrackDirection]
    TRACK_DIRECTION_SENDONLY: _ClassVar[TrackDirection]
VIDEO_CODEC_UNSPECIFIED: VideoCodec
VIDEO_CODEC_VP8: VideoCodec
VIDEO_CODEC_VP9: VideoCodec
VIDEO_CODEC_AV1: VideoCodec
VIDEO_CODEC_H264: VideoCodec
VIDEO_CODEC_H265: VideoCodec
AUDIO_CODEC_UNSPECIFIED: AudioCodec
AUDIO_CODEC_OPUS: AudioCodec
TRACK_KIND_UNSPECIFIED: TrackKind
TRACK_KIND_VIDEO: TrackKind
TRACK_KIND_AUDIO: TrackKind
TRACK_DIRECTION_UNSPECIFIED: TrackDirection
TRACK_DIRECTION_RECVONLY: TrackDirection
TRACK_DIRECTION_SENDONLY: TrackDirection

class Ping(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RequestSchema(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelSchema(_message.Message):
    __slots__ = ("openapi",)
    OPENAPI_FIELD_NUMBER: _ClassVar[int]
    openapi: _struct_pb2.Struct
    def __init__(self, openapi: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class FileUploaded(_message.Message):
    __slots__ = ("upload_id", "name", "mime_type", "size")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    name: str
    mime_type: str
    size: int
    def __init__(self, upload_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class RequestClip(_message.Message):
    __slots__ = ("duration_seconds",)
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    duration_seconds: float
    def __init__(self, duration_seconds: _Optional[float] = ...) -> None: ...

class RequestRecording(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClipReady(_message.Message):
    __slots__ = ("session_id", "kind", "start_marker", "end_marker", "now_marker", "predicted_ready_at_ms", "playlist_url")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_MARKER_FIELD_NUMBER: _ClassVar[int]
    END_MARKER_FIELD_NUMBER: _ClassVar[int]
    NOW_MARKER_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_READY_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PLAYLIST_URL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    kind: str
    start_marker: float
    end_marker: float
    now_marker: float
    predicted_ready_at_ms: int
    playlist_url: str
    def __init__(self, session_id: _Optional[str] = ..., kind: _Optional[str] = ..., start_marker: _Optional[float] = ..., end_marker: _Optional[float] = ..., now_marker: _Optional[float] = ..., predicted_ready_at_ms: _Optional[int] = ..., playlist_url: _Optional[str] = ...) -> None: ...

class ClipFailed(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Moderation(_message.Message):
    __slots__ = ("action", "input_kind", "command", "categories", "message")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_KIND_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    action: str
    input_kind: str
    command: str
    categories: _containers.RepeatedScalarFieldContainer[str]
    message: str
    def __init__(self, action: _Optional[str] = ..., input_kind: _Optional[str] = ..., command: _Optional[str] = ..., categories: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ...) -> None: ...

class SessionEnded(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class FrameStage(_message.Message):
    __slots__ = ("name", "total_ms", "frames", "part_of")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    PART_OF_FIELD_NUMBER: _ClassVar[int]
    name: str
    total_ms: float
    frames: int
    part_of: str
    def __init__(self, name: _Optional[str] = ..., total_ms: _Optional[float] = ..., frames: _Optional[int] = ..., part_of: _Optional[str] = ...) -> None: ...

class ClientTrackStat(_message.Message):
    __slots__ = ("timestamp", "track_name", "kind", "direction", "video_codec", "audio_codec", "paused", "metrics", "frame_stages", "codec_implementation", "hardware_codec")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TRACK_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    VIDEO_CODEC_FIELD_NUMBER: _ClassVar[int]
    AUDIO_CODEC_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    FRAME_STAGES_FIELD_NUMBER: _ClassVar[int]
    CODEC_IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_CODEC_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    track_name: str
    kind: TrackKind
    direction: TrackDirection
    video_codec: VideoCodec
    audio_codec: AudioCodec
    paused: bool
    metrics: _containers.ScalarMap[str, float]
    frame_stages: _containers.RepeatedCompositeFieldContainer[FrameStage]
    codec_implementation: str
    hardware_codec: bool
    def __init__(self, timestamp: _Optional[int] = ..., track_name: _Optional[str] = ..., kind: _Optional[_Union[TrackKind, str]] = ..., direction: _Optional[_Union[TrackDirection, str]] = ..., video_codec: _Optional[_Union[VideoCodec, str]] = ..., audio_codec: _Optional[_Union[AudioCodec, str]] = ..., paused: _Optional[bool] = ..., metrics: _Optional[_Mapping[str, float]] = ..., frame_stages: _Optional[_Iterable[_Union[FrameStage, _Mapping]]] = ..., codec_implementation: _Optional[str] = ..., hardware_codec: _Optional[bool] = ...) -> None: ...

class MessageStage(_message.Message):
    __slots__ = ("name", "total_ms", "messages", "part_of")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PART_OF_FIELD_NUMBER: _ClassVar[int]
    name: str
    total_ms: float
    messages: int
    part_of: str
    def __init__(self, name: _Optional[str] = ..., total_ms: _Optional[float] = ..., messages: _Optional[int] = ..., part_of: _Optional[str] = ...) -> None: ...

class ClientEnvironment(_message.Message):
    __slots__ = ("sdk_type", "sdk_version", "os", "os_version", "arch", "device_model")
    SDK_TYPE_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    OS_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MODEL_FIELD_NUMBER: _ClassVar[int]
    sdk_type: str
    sdk_version: str
    os: str
    os_version: str
    arch: str
    device_model: str
    def __init__(self, sdk_type: _Optional[str] = ..., sdk_version: _Optional[str] = ..., os: _Optional[str] = ..., os_version: _Optional[str] = ..., arch: _Optional[str] = ..., device_model: _Optional[str] = ...) -> None: ...

class ClientConnectionStat(_message.Message):
    __slots__ = ("timestamp", "metrics", "environment", "message_stages")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_STAGES_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    metrics: _containers.ScalarMap[str, float]
    environment: ClientEnvironment
    message_stages: _containers.RepeatedCompositeFieldContainer[MessageStage]
    def __init__(self, timestamp: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., environment: _Optional[_Union[ClientEnvironment, _Mapping]] = ..., message_stages: _Optional[_Iterable[_Union[MessageStage, _Mapping]]] = ...) -> None: ...

class ClientStats(_message.Message):
    __slots__ = ("track_stats", "connection_stat")
    TRACK_STATS_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_STAT_FIELD_NUMBER: _ClassVar[int]
    track_stats: _containers.RepeatedCompositeFieldContainer[ClientTrackStat]
    connection_stat: ClientConnectionStat
    def __init__(self, track_stats: _Optional[_Iterable[_Union[ClientTrackStat, _Mapping]]] = ..., connection_stat: _Optional[_Union[ClientConnectionStat, _Mapping]] = ...) -> None: ...
