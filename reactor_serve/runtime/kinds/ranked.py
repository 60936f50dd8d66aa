"""`RankedDriver`: conducts a model whose own class runs on every rank (`rank_mode: model`).

The model process holds no model of its own. At load it starts a `DistributedRunner`
of `ModelRank` (runtime/ranks/model_rank.py): R processes, one per GPU, each loading
the model's class. The host in the model process keeps doing what it does for every
kind (the client's session, command validation, the output buffer, the `@connected`
bookkeeping) over a stand-in, `RankedModel`, whose handlers and state only write down
what was applied, in order.

Each session is a run of steps, every one sent to every rank: the commands applied
since the last step and the input frames that arrived, then one emit of the model,
whose frames (the output rank's) go to the output buffer like any emit. A step whose
model waits for input it did not bring comes back "starved"; the next frames to
arrive are fed to every rank at once, and the step goes on. So every rank's model sees
the same inputs at the same points, and its collectives line up.

A rank that dies, hangs past `rank_step_timeout_s`, or disagrees with the others ends
the session with the runner's error naming it, and breaks this load: the model
process exits, and its next start loads every rank afresh.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import TYPE_CHECKING, Any, Callable

from reactor_serve.runtime.kinds.kind_driver import DriverHost, QueuedCommands
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.runtime.ranks.model_rank import (
    ModelRank,
    RankSessionFailed,
    RankStep,
)
from reactor_serve.runtime.ranks.rank_mode import RankMode
from reactor_serve.runtime.ranks.runner import DistributedRunner
from reactor_serve.runtime.session import EndReason

if TYPE_CHECKING:
    from reactor_serve.runtime.session import Session

__all__ = ["RankedDriver", "RankedModel"]

log = logging.getLogger("reactor_serve.runtime")


class RankedModel:
    """The model process's stand-in for a model that runs on the ranks: its event
    handlers and state setters write each applied command into `applied`, for the next
    step to carry to every rank; its `@connected` / `@disconnected` hooks do nothing
    here (the ranks run them)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.applied: list[tuple[str, dict[str, Any]]] = []
        self._state: Any = None
        for name in (*spec.connected_hooks, *spec.disconnected_hooks):
            setattr(self, name, _nothing)
        for command in spec.commands.values():
            if command.kind != "setter":
                setattr(self, command.target, self._recorder(command.name))

    def _recorder(self, name: str) -> Callable[..., None]:
        def applied(**args: Any) -> None:
            self.applied.append((name, args))
        return applied

    @property
    def state(self) -> Any:
        return self._state

    @state.setter
    def state(self, state: Any) -> None:
        # A new session's fresh state (the ranks make theirs the same way).
        self._state = _RecordedState(state, self.applied)

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        applied, self.applied[:] = list(self.applied), []
        return applied


class _RecordedState:
    """A model's state whose every assignment is written down as its setter command."""

    def __init__(self, state: Any, applied: list[tuple[str, dict[str, Any]]]) -> None:
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_applied", applied)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_state"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_state"), name, value)
        object.__getattribute__(self, "_applied").append((f"set_{name}", {name: value}))


def _nothing() -> None:
    return None


class RankedDriver(QueuedCommands):
    """Steps every rank through each session, in lockstep. Commands queue between
    steps, as a pipeline's between yields."""

    load_step = "load(config) on its ranks"

    def __init__(self, host: DriverHost, *, model_dir: str, ranks: int, mode: RankMode) -> None:
        super().__init__(host)
        self._model_dir = model_dir
        self._ranks = ranks
        self._mode = mode
        self._runner: DistributedRunner | None = None
        # One call on the ranks at a time, in order, off the model loop: commands and
        # the session's end are taken while a step runs.
        self._calls = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reactor-ranks")
        self._task: asyncio.Task[None] | None = None
        # The ranks hold an open session (opened and not closed yet).
        self._open = False

    # ---- the model's life --------------------------------------------------------------

    def create(self, config: Any) -> Any:
        return RankedModel(self._host.spec)

    async def load(self, model: Any, config: Any) -> None:
        runner = DistributedRunner(
            ModelRank, world_size=self._ranks, load_kwargs={"model_dir": self._model_dir},
            call_timeout=self._mode.step_timeout_s, result_rank=self._mode.output_rank,
        )
        # Blocks the model loop, as any model's load does.
        runner.start()
        self._runner = runner

    def shutdown(self) -> None:
        self._calls.shutdown(wait=False, cancel_futures=True)
        if self._runner is not None:
            self._runner.shutdown()

    # ---- sessions ----------------------------------------------------------------------

    def start_session(self, session: Session) -> None:
        self._task = self._host.spawn(self._drive(session))

    async def stop(self, session: Session) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._open and self._runner is not None and self._runner.healthy:
            self._open = False
            try:
                await self._call(("close", session.end_reason or EndReason.CLIENT_CLOSED,
                                  session.end_detail))
            except Exception as exc:
                log.warning("model %s: closing the session on the ranks: %s",
                            self._host.spec.name, exc)

    def release_inputs(self, session: Session) -> None:
        pass

    async def join(self, session: Session) -> None:
        pass

    # ---- commands ----------------------------------------------------------------------

    def drop_pending(self) -> None:
        super().drop_pending()
        model = self._host.model
        if isinstance(model, RankedModel):
            model.take()  # applied to the stand-in, not carried to the ranks yet

    # ---- the steps ---------------------------------------------------------------------

    async def _drive(self, session: Session) -> None:
        host = self._host
        model: RankedModel = host.model
        try:
            self._open = True
            answer = await self._call(("open", session.id))
            while self._took(session, answer) and not session.stopping:
                await self._apply_pending()
                answer = await self._call(("step", self._arrived(), model.take()))
                while answer.starved and not session.stopping:
                    self._took(session, answer)
                    frames = self._arrived()
                    if not frames:
                        await self._idle_wait(None)
                        continue
                    answer = await self._call(("feed", frames))
                if not self._took(session, answer) or session.stopping:
                    break
                if answer.items:
                    await host.emit_items(answer.items, answer.elapsed_s)
                elif not await host.stepped_idle():
                    await self._idle_wait()
        except asyncio.CancelledError:
            raise
        except RankSessionFailed as exc:
            # Every rank's model ended the session with this error: the ranks go on.
            self._open = False
            host.count_model_error()
            host.spawn(host.disconnect(session, EndReason.ERROR, str(exc)))
        except Exception as exc:
            host.schedule_fail(session, "the model's ranks", exc)

    def _took(self, session: Session, answer: RankStep) -> bool:
        """Pass on what the step's answer says beside its frames; False when the
        model ended the session."""
        for envelope in answer.messages:
            session.deliver(envelope)
        port = self._host.model.output_buffer
        if answer.fps is not None:
            port.set_fps(answer.fps)
        if answer.monitoring is not None:
            port.set_monitoring(answer.monitoring)
        if answer.ended is not None:
            self._open = False
            reason, message = answer.ended
            self._host.spawn(self._host.disconnect(session, reason, message))
            return False
        return True

    def _arrived(self) -> dict[str, list[Any]]:
        """The input frames that arrived since the last step, by track."""
        frames = {}
        for name, buffer in self._host.input_buffers.items():
            drained = buffer.drain()
            if drained:
                frames[name] = drained
        return frames

    async def _call(self, request: tuple[Any, ...]) -> RankStep:
        runner = self._runner
        assert runner is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._calls, runner.generate, request)
