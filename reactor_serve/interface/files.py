"""`UploadedFile`: a file the client uploaded, as a command handler receives it.

A command parameter (or an `InputState` field) annotated `UploadedFile` (also inside
`Optional[...]`, `list[...]` or `dict[str, ...]`) takes a reference to a file the
client uploaded to its session (`POST {base}/sessions/{id}/uploads`, then a `PUT` of
the bytes); the runtime swaps the reference for the file before the handler runs:

    @event(description="Use this image as the style")
    def set_style(self, image: UploadedFile) -> None:
        self.style = decode(image.data)

Only the name, the declared MIME type and the bytes cross to the model. The upload's
id stays with the session, and a client can name only its own session's uploads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["UploadedFile"]


@dataclass(frozen=True)
class UploadedFile:
    """One uploaded file: `name` as the client gave it, its declared `mime_type`, and
    `data`, every byte it announced (an upload reaches a handler only once complete)."""

    name: str
    mime_type: str
    # repr=False: a handler that logs its arguments should not print megabytes.
    data: bytes = field(repr=False)

    @property
    def size(self) -> int:
        """Its length in bytes."""
        return len(self.data)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # Only the runtime makes one, from an upload of the session: a command's
        # arguments must not build one from an object that merely looks like a file.
        from pydantic_core import PydanticCustomError, core_schema

        def check(value: Any) -> UploadedFile:
            if not isinstance(value, cls):
                raise PydanticCustomError(
                    "upload_reference",
                    "expected an upload reference ({'upload_id': ...}) to a file "
                    "uploaded to this session",
                )
            return value

        return core_schema.no_info_plain_validator_function(check)
