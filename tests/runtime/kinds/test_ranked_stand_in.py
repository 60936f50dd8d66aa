"""The model process's stand-in for a model that runs on its ranks: what the host
applies to it is written down in order, as the commands the next step carries."""

from __future__ import annotations

from paths import TEST_MODELS

from reactor_serve.runtime.kinds.ranked import RankedModel
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.loading.model_spec import inspect_model


def stand_in() -> tuple[RankedModel, object]:
    spec = inspect_model(load_manifest(TEST_MODELS / "ranked").load_class())
    model = RankedModel(spec)
    model.state = spec.state_cls()
    return model, spec


def test_events_and_setters_are_written_down_in_the_order_they_applied() -> None:
    model, _ = stand_in()
    model.bump(by=2)
    model.state.level = 5
    model.boom()
    model.state.level = 6
    assert model.state.level == 6  # the stand-in's state follows, for the host's checks
    assert model.take() == [("bump", {"by": 2}), ("set_level", {"level": 5}),
                            ("boom", {}), ("set_level", {"level": 6})]
    assert model.take() == []


def test_hooks_do_nothing_here_and_a_new_sessions_state_starts_unwritten() -> None:
    model, spec = stand_in()
    assert model.hello() is None  # the @connected hook runs on the ranks
    model.state = spec.state_cls()
    assert model.state.level == 0 and model.take() == []
