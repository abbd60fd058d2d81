"""AsyncEngine on its own (no HTTP): the engine is touched from one thread only, prompt errors
come back to the caller, aborts end streams and reach the engine, detokeniser failures stay
local to their request, and shutdown ends every stream.

Data flow (tests only): asyncio test -> AsyncEngine (inbox, engine thread) -> FakeEngine.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from fake_engine import FakeEngine, expected_text

from gearshift.engine.engine import PromptError
from gearshift.frontend.async_engine import AsyncEngine, EngineDeadError
from gearshift.frontend.engine_loop import EngineLoop
from gearshift.request import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


async def _collect(stream) -> tuple[str, str | None, int]:
    text, reason, n = "", None, 0
    async for delta in stream:
        text += delta.new_text
        n += len(delta.new_token_ids)
        reason = delta.finish_reason
    return text, reason, n


def test_generate_many_and_engine_thread_only():
    fake = FakeEngine(max_num_seqs=4)
    callers: set[int] = set()
    original_step = fake.step

    def step(emit=None):
        callers.add(threading.get_ident())
        return original_step(emit)

    fake.step = step

    async def main() -> None:
        ae = AsyncEngine(fake)
        ae.start()
        try:
            prompts = [[0, 3 + i, 50] for i in range(10)]
            streams = [await ae.add_request(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]
            results = await asyncio.gather(*(_collect(s) for s in streams))
            for p, (text, reason, n) in zip(prompts, results, strict=True):
                assert text == expected_text(p, GREEDY, 12) and reason == "length" and n == 12
            assert ae.num_live_streams == 0
        finally:
            ae.shutdown()

    run(main())
    assert len(callers) == 1 and threading.get_ident() not in callers
    assert fake._thread not in (None, threading.get_ident())  # every call came from one thread


def test_prompt_error_reaches_caller_and_nothing_leaks():
    fake = FakeEngine(max_model_len=32, step_delay=0.002)

    async def main() -> None:
        ae = AsyncEngine(fake)
        ae.start()
        try:
            with pytest.raises(PromptError, match="context"):
                await ae.add_request("big", [5] * 30, GREEDY)
            with pytest.raises(PromptError, match="out of range"):
                await ae.add_request("vocab", [5, 10_000], GREEDY)
            assert ae.num_live_streams == 0 and ae.num_waiting == 0
            text, _, _ = await _collect(await ae.add_request("ok", [5], GREEDY))
            assert text == expected_text([5], GREEDY, 12)
            # admission paused: "dup" stays live however slowly this loop runs (a loaded
            # machine once let it finish before the second add, and no error was raised)
            fake.paused.set()
            with pytest.raises(ValueError, match="already in use"):
                s = await ae.add_request("dup", [5], SamplingParams(max_tokens=20))
                await ae.add_request("dup", [5], GREEDY)
            ae.abort(s.request_id)
            fake.paused.clear()
        finally:
            ae.shutdown()

    run(main())


def test_abort_ends_stream_and_frees_engine():
    fake = FakeEngine(step_delay=0.002)

    async def main() -> None:
        ae = AsyncEngine(fake)
        ae.start()
        try:
            stream = await ae.add_request("long", [7, 8], SamplingParams(max_tokens=200))
            first = await stream.__anext__()
            assert first.new_token_ids
            ae.abort("long")
            rest = [d async for d in stream]
            assert rest[-1].finished and rest[-1].finish_reason == "abort"
            for _ in range(200):
                if not fake.live_request_ids():
                    break
                await asyncio.sleep(0.01)
            assert not fake.live_request_ids()
            assert fake.aborted == [("long", "abort")]
            ae.abort("long")  # twice, or unknown: ignored
            ae.abort("never-existed")
        finally:
            ae.shutdown()

    run(main())


def test_processor_failure_is_local_to_its_request():
    fake = FakeEngine()

    async def main() -> None:
        ae = AsyncEngine(fake)
        original = ae.processor.process

        def process(out):
            if out.request_id == "bad":
                raise RuntimeError("detokeniser bug")
            return original(out)

        ae.processor.process = process
        ae.start()
        try:
            bad = await ae.add_request("bad", [4], GREEDY)
            good = await ae.add_request("good", [4], GREEDY)
            with pytest.raises(RuntimeError, match="detokeniser bug"):
                await _collect(bad)
            text, reason, _ = await _collect(good)
            assert text == expected_text([4], GREEDY, 12) and reason == "length"
            assert ae.is_alive
        finally:
            ae.shutdown()

    run(main())


def test_shutdown_and_engine_failure_end_every_stream():
    async def main() -> None:
        ae = AsyncEngine(FakeEngine(step_delay=0.002))
        ae.start()
        stream = await ae.add_request("s", [4], SamplingParams(max_tokens=200))
        ae.shutdown()
        with pytest.raises(EngineDeadError):
            await _collect(stream)
        with pytest.raises(EngineDeadError):
            await ae.add_request("late", [4], GREEDY)

        fake = FakeEngine(step_delay=0.002)
        ae = AsyncEngine(fake)
        ae.start()
        stream = await ae.add_request("s", [4], SamplingParams(max_tokens=200))
        fake.fail_next_step = RuntimeError("boom")
        with pytest.raises(EngineDeadError, match="boom"):
            await _collect(stream)
        assert not ae.is_alive and isinstance(ae.error, RuntimeError)
        ae.shutdown()

    run(main())


def test_num_waiting_counts_each_request_once_whichever_thread_runs_first():
    """The engine thread can take an add and publish its snapshot before the event loop
    hears back: the queue length (the server's overload check) must not count it twice."""
    async def main():
        fake = FakeEngine(max_num_seqs=1)
        fake.paused.set()  # the request stays waiting
        ae = AsyncEngine(fake)
        ae._loop = asyncio.get_running_loop()  # no engine thread: the test plays its part
        ae._started, ae._thread = True, threading.current_thread()  # (a live engine thread)
        task = asyncio.create_task(ae.add_request("r", [5, 6], GREEDY))
        await asyncio.sleep(0)  # the add is posted
        assert ae.num_waiting == 1
        loop = EngineLoop(fake, ae)
        loop._apply(ae._inbox.take())  # taken and published; the loop's callback has not run
        loop.publish()
        assert ae.num_waiting == 1
        await task
        assert ae.num_waiting == 1

    run(main())
