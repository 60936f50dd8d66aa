from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class MessageKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_KIND_UNSPECIFIED: _ClassVar[MessageKind]
    MESSAGE_KIND_REQUEST: _ClassVar[MessageKind]
    MESSAGE_KIND_RESPONSE: _ClassVar[MessageKind]
    MESSAGE_KIND_NOTIFICATION: _ClassVar[MessageKind]
MESSAGE_KIND_UNSPECIFIED: MessageKind
MESSAGE_KIND_REQUEST: MessageKind
MESSAGE_KIND_RESPONSE: MessageKind
MESSAGE_KIND_NOTIFICATION: MessageKind

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
