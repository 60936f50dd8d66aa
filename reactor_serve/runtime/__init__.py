"""The session engine: runs one model instance and its sessions, with paced output.

A model is served from a `ModelProcess` (its code in a process of its own) or, for
debugging, a `ModelHost` (on a thread of this process); `hosted_model` picks one.
Transports (WebRTC, the in-process `LocalClient`) plug in through `open_session` and
the returned `Session`: its `clock` for output, `push_input` and `command` for input.
"""

from reactor_serve.runtime.host import ModelHost, ModelLoadError, SessionBusy
from reactor_serve.runtime.input_buffer import InputBuffer
from reactor_serve.runtime.isolation.model_process import ModelProcess, hosted_model
from reactor_serve.runtime.loading.manifest import (
    Manifest,
    ManifestError,
    load_manifest,
)
from reactor_serve.runtime.loading.model_spec import (
    CommandSpec,
    ModelSpec,
    ModelSpecError,
    inspect_model,
)
from reactor_serve.runtime.local_client import LocalClient, ReceivedFrame
from reactor_serve.runtime.pacing.emission_clock import EmissionClock, PresentedFrame
from reactor_serve.runtime.pacing.frames import FrameError
from reactor_serve.runtime.pacing.output_buffer import FrameItem, OutputBuffer
from reactor_serve.runtime.session import (
    EndReason,
    SeatedHost,
    Session,
    SessionHost,
    SessionSink,
)

__all__ = [
    "CommandSpec",
    "EmissionClock",
    "EndReason",
    "FrameError",
    "FrameItem",
    "InputBuffer",
    "LocalClient",
    "Manifest",
    "ManifestError",
    "ModelHost",
    "ModelLoadError",
    "ModelProcess",
    "ModelSpec",
    "ModelSpecError",
    "OutputBuffer",
    "PresentedFrame",
    "ReceivedFrame",
    "Session",
    "SessionBusy",
    "SeatedHost",
    "SessionHost",
    "SessionSink",
    "hosted_model",
    "inspect_model",
    "load_manifest",
]
