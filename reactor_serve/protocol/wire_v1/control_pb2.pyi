from reactor_serve.protocol.wire_v1 import common_pb2 as _common_pb2
from reactor_serve.protocol.wire_v1 import platform_pb2 as _platform_pb2
from reactor_serve.protocol.wire_v1 import track_pb2 as _track_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControlClientMessage(_message.Message):
    __slots__ = ("request_id", "kind", "ping", "request_schema", "file_uploaded", "request_clip", "request_recording", "publish_track", "pause_track", "resume_track", "unpublish_track", "client_stats", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FILE_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLIP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RECORDING_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TRACK_FIELD_NUMBER: _ClassVar[int]
    PAUSE_TRACK_FIELD_NUMBER: _ClassVar[int]
    RESUME_TRACK_FIELD_NUMBER: _ClassVar[int]
    UNPUBLISH_TRACK_FIELD_NUMBER: _ClassVar[int]
    CLIENT_STATS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: _common_pb2.MessageKind
    ping: _platform_pb2.Ping
    request_schema: _platform_pb2.RequestSchema
    file_uploaded: _platform_pb2.FileUploaded
    request_clip: _platform_pb2.RequestClip
    request_recording: _platform_pb2.RequestRecording
    publish_track: _track_pb2.PublishTrack
    pause_track: _track_pb2.PauseTrack
    resume_track: _track_pb2.ResumeTrack
    unpublish_track: _track_pb2.UnpublishTrack
    client_stats: _platform_pb2.ClientStats
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.MessageKind, str]] = ..., ping: _Optional[_Union[_platform_pb2.Ping, _Mapping]] = ..., request_schema: _Optional[_Union[_platform_pb2.RequestSchema, _Mapping]] = ..., file_uploaded: _Optional[_Union[_platform_pb2.FileUploaded, _Mapping]] = ..., request_clip: _Optional[_Union[_platform_pb2.RequestClip, _Mapping]] = ..., request_recording: _Optional[_Union[_platform_pb2.RequestRecording, _Mapping]] = ..., publish_track: _Optional[_Union[_track_pb2.PublishTrack, _Mapping]] = ..., pause_track: _Optional[_Union[_track_pb2.PauseTrack, _Mapping]] = ..., resume_track: _Optional[_Union[_track_pb2.ResumeTrack, _Mapping]] = ..., unpublish_track: _Optional[_Union[_track_pb2.UnpublishTrack, _Mapping]] = ..., client_stats: _Optional[_Union[_platform_pb2.ClientStats, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...

class ControlServerMessage(_message.Message):
    __slots__ = ("request_id", "kind", "model_schema", "clip_ready", "clip_failed", "moderation", "publish_track", "session_ended", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CLIP_READY_FIELD_NUMBER: _ClassVar[int]
    CLIP_FAILED_FIELD_NUMBER: _ClassVar[int]
    MODERATION_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TRACK_FIELD_NUMBER: _ClassVar[int]
    SESSION_ENDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: _common_pb2.MessageKind
    model_schema: _platform_pb2.ModelSchema
    clip_ready: _platform_pb2.ClipReady
    clip_failed: _platform_pb2.ClipFailed
    moderation: _platform_pb2.Moderation
    publish_track: _track_pb2.PublishTrackResponse
    session_ended: _platform_pb2.SessionEnded
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.MessageKind, str]] = ..., model_schema: _Optional[_Union[_platform_pb2.ModelSchema, _Mapping]] = ..., clip_ready: _Optional[_Union[_platform_pb2.ClipReady, _Mapping]] = ..., clip_failed: _Optional[_Union[_platform_pb2.ClipFailed, _Mapping]] = ..., moderation: _Optional[_Union[_platform_pb2.Moderation, _Mapping]] = ..., publish_track: _Optional[_Union[_track_pb2.PublishTrackResponse, _Mapping]] = ..., session_ended: _Optional[_Union[_platform_pb2.SessionEnded, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...
