"""Where a session's recordings and clips go, and their upload when the destination is a URL.

A destination is a local directory (or a `file://` URL) or any other fsspec URL. Files
are always written to a local directory: the destination's own for a directory, and a
staging directory for a URL, uploaded on a thread of its own once the files are
complete, so a slow store never stalls encoding. An upload that fails leaves the files
where they were written and says where; it never ends the session.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["Destination", "Output", "Uploads", "safe_segment", "upload_files"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Output:
    """Where one recording (or clip) goes: a local directory, uploaded after to `remote`."""

    id: str
    kind: str  # "recording" | "clip"
    local: Path  # where the files are written
    remote: str | None  # fsspec URL they are uploaded to, or None (local destination)

    @property
    def location(self) -> str:
        """Where the files end up: what the client is told."""
        return self.remote if self.remote is not None else str(self.local)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write `meta.json` whole or not at all (a reader never sees half of it)."""
        path = self.local / "meta.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(meta, out, indent=2)
        os.replace(tmp, path)


class Destination:
    """A model's recording destination, for one session: recordings go to
    `<destination>/<model>/<session id>/<n>/`, clips to `.../clips/<n>/`."""

    def __init__(self, destination: str, model: str, session_id: str) -> None:
        self.destination = destination
        self.model = model
        self.session_id = session_id

    @property
    def is_url(self) -> bool:
        """Whether files are staged locally and uploaded."""
        return "://" in self.destination and not self.destination.startswith("file://")

    def output(self, kind: str, oid: str) -> Output:
        """Where recording (`kind` "recording") or clip ("clip") `oid` goes; a URL
        destination gets a fresh staging directory."""
        parts = [safe_segment(self.model), safe_segment(self.session_id)]
        parts += (["clips"] if kind == "clip" else []) + [oid]
        destination = self.destination
        if self.is_url:
            staging = Path(tempfile.mkdtemp(prefix="reactor-recording-"))
            return Output(oid, kind, staging, destination.rstrip("/") + "/" + "/".join(parts))
        if destination.startswith("file://"):
            destination = destination[len("file://"):]
        return Output(oid, kind, Path(destination).joinpath(*parts).absolute(), None)


def safe_segment(part: str) -> str:
    """A path segment made of a model name or session id (URL-safe already; this
    makes sure of it)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in part)[:128]
    return cleaned.strip(".") or "_"


def upload_files(output: Output) -> None:
    """Copy every file of `output.local` to `output.remote` (fsspec)."""
    import fsspec  # only URL destinations need it

    assert output.remote is not None
    fs, path = fsspec.core.url_to_fs(output.remote)
    fs.makedirs(path, exist_ok=True)
    for local in sorted(output.local.iterdir()):
        fs.put_file(str(local), f"{path.rstrip('/')}/{local.name}")


class Uploads:
    """The upload thread of one session's recordings."""

    def __init__(
        self, session_id: str, upload: Callable[[Output], None] = upload_files,
    ) -> None:
        self.session_id = session_id
        self._upload = upload
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reactor-recording-upload"
        )

    def deliver(
        self, output: Output, done: Callable[[], None], failed: Callable[[str], None],
        *, keep_local: bool = False,
    ) -> None:
        """The files of `output` are complete: `done()` once they are at their
        destination (at once for a local one), or `failed(message)` when the upload
        failed, the files left in the staging directory the message names.
        `keep_local`: leave the staging copy after the upload (its owner removes it)."""
        if output.remote is None:
            done()
            return

        def upload() -> None:
            try:
                self._upload(output)
            except Exception as exc:
                log.warning("session %s: uploading %s failed: %r", self.session_id, output.remote, exc)
                failed(f"uploading to {output.remote} failed: {type(exc).__name__}: {exc}"
                       f"; the files stay in {output.local}")
                return
            if not keep_local:
                shutil.rmtree(output.local, ignore_errors=True)
            done()

        try:
            self._executor.submit(upload)
        except RuntimeError:
            upload()  # shutting down: upload on this thread

    def shutdown_now(self) -> None:
        """No more uploads; those under way go on without being waited for."""
        self._executor.shutdown(wait=False)

    def shutdown_within(self, timeout: float) -> None:
        """No more uploads; wait up to `timeout` seconds for those under way."""
        done = threading.Event()

        def wait() -> None:
            self._executor.shutdown(wait=True)
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        done.wait(timeout)
