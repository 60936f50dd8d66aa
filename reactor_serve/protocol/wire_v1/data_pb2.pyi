from reactor_serve.protocol.wire_v1 import common_pb2 as _common_pb2
from reactor_serve.protocol.wire_v1 import model_pb2 as _model_pb2
from reactor_serve.protocol.wire_v1 import step_pb2 as _step_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataClientMessage(_message.Message):
    __slots__ = ("request_id", "kind", "command", "request_step", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_STEP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: _common_pb2.MessageKind
    command: _model_pb2.Command
    request_step: _step_pb2.RequestStep
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.MessageKind, str]] = ..., command: _Optional[_Union[_model_pb2.Command, _Mapping]] = ..., request_step: _Optional[_Union[_step_pb2.RequestStep, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...

class DataServerMessage(_message.Message):
    __slots__ = ("request_id", "kind", "message", "step_result", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: _common_pb2.MessageKind
    message: _model_pb2.ModelMessage
    step_result: _step_pb2.StepResult
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.MessageKind, str]] = ..., message: _Optional[_Union[_model_pb2.ModelMessage, _Mapping]] = ..., step_result: _Optional[_Union[_step_pb2.StepResult, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...
