from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class FrameMetadata(_message.Message):
    __slots__ = ("frame_id", "capture_time_us", "user_data")
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_US_FIELD_NUMBER: _ClassVar[int]
    USER_DATA_FIELD_NUMBER: _ClassVar[int]
    frame_id: int
    capture_time_us: int
    user_data: bytes
    def __init__(self, frame_id: _Optional[int] = ..., capture_time_us: _Optional[int] = ..., user_data: _Optional[bytes] = ...) -> None: ...
