"""`get_rank()` outside a multi-rank model: rank 0 of 1, on the CPU here; a session's
context says the same."""

from __future__ import annotations

from reactor_serve.interface import RankContext, SessionContext, get_rank


class _Context(SessionContext):
    session_id = "s"

    def emit_block(self, frames):
        pass

    def should_stop(self):
        return False

    def send(self, message):
        pass

    def disable_monitoring(self):
        pass

    def enable_monitoring(self):
        pass


def test_a_model_run_in_one_process_is_rank_0_of_1_and_its_own_output_rank() -> None:
    me = get_rank()
    assert me == RankContext(0, 1, "cpu", 0)
    assert me.is_output_rank
    assert not RankContext(1, 2, "cuda:0", 0).is_output_rank


def test_a_sessions_context_reads_the_processs_rank() -> None:
    ctx = _Context()
    assert (ctx.rank, ctx.world_size, ctx.device) == (0, 1, "cpu")
