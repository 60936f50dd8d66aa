"""`SessionDirectory` on the test session's real Ray GCS: candidates kept before a
session is placed are taken exactly once, whoever asks."""

import asyncio
import uuid

from reactor_serve.serve.session_directory import SessionDirectory


async def test_early_candidates_are_kept_apart_and_taken_once(ray_serve):
    directory = SessionDirectory(f"test-{uuid.uuid4().hex[:8]}")
    session_id = "s1"
    await directory.put(session_id, {"model": "m", "state": "waiting"})
    await directory.put("s2", {"model": "m", "state": "waiting"})
    first = await directory.keep_early_candidates(session_id, {"candidates": ["c1"], "is_final": False})
    await directory.keep_early_candidates(session_id, {"candidates": ["c2"], "is_final": True})
    await directory.keep_early_candidates("s2", {"candidates": ["other"], "is_final": True})
    assert await directory.early_candidate_batches(session_id) == 2
    assert (await directory.get(session_id)) == {"model": "m", "state": "waiting"}
    # Two takers of one batch: exactly one gets it.
    took = await asyncio.gather(directory.take_early_candidate(first),
                                directory.take_early_candidate(first))
    assert sorted(map(bool, took)) == [False, True]
    assert await directory.take_early_candidates(session_id) == [{"candidates": ["c2"], "is_final": True}]
    assert await directory.take_early_candidates(session_id) == []
    # What a session that ends still had kept goes with it.
    await directory.end("s2", "client_closed", None)
    assert await directory.early_candidate_batches("s2") == 0
