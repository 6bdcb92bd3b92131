"""The loop service every background loop runs on: a failing round is logged and the loop
goes on; period 0 never starts; stop ends the task; a wake runs a round now, an urgent wake an
urgent read of its keys only; a period read from a function is read after each round; a
following loop ends its followers with it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from service.core.loops import FollowingLoop, LoopService

log = logging.getLogger("nvcf.test.loops")


async def _until(predicate: object, rounds: int = 500) -> None:
    for _ in range(rounds):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_failing_round_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    async def round_() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("boom")

    job: LoopService[str] = LoopService(
        "t", round_, 0.001, log=log, failure="the test round failed"
    )
    with caplog.at_level(logging.ERROR, logger="nvcf.test.loops"):
        job.start()
        job.start()  # a second start does not add a second loop
        await _until(lambda: len(calls) >= 3)
        await job.stop()
    assert not job.running
    failures = [r for r in caplog.records if r.message == "the test round failed"]
    assert len(failures) == 1 and failures[0].exc_info is not None
    seen = len(calls)
    await asyncio.sleep(0.02)
    assert len(calls) == seen  # stopped: no more rounds


async def test_period_zero_never_starts() -> None:
    async def round_() -> None:
        raise AssertionError("must not run")

    job: LoopService[str] = LoopService("t", round_, 0, log=log, failure="x")
    job.start()
    assert not job.running
    await job.stop()  # stopping a job that never started is fine


async def test_a_wake_runs_the_next_round_before_the_period() -> None:
    calls: list[int] = []
    wake = asyncio.Event()

    async def round_() -> None:
        calls.append(len(calls))

    job: LoopService[str] = LoopService("t", round_, 3600, log=log, failure="x", wake=wake)
    job.start()
    await _until(lambda: len(calls) == 1)  # the first round runs at start
    wake.set()
    await _until(lambda: len(calls) == 2)  # and the next one when woken, not in an hour
    assert not wake.is_set()  # cleared for the round after
    await job.stop()


async def test_wake_without_an_event_of_its_own_runs_the_next_round() -> None:
    calls: list[int] = []

    async def round_() -> None:
        calls.append(len(calls))

    job: LoopService[str] = LoopService("t", round_, 3600, log=log, failure="x")
    job.start()
    await _until(lambda: len(calls) == 1)
    job.wake()
    await _until(lambda: len(calls) == 2)
    await job.stop()


async def test_an_urgent_wake_reads_its_keys_only_and_the_full_round_keeps_its_period() -> None:
    rounds: list[str] = []
    urgent: list[set[str]] = []

    async def round_() -> None:
        rounds.append("full")

    async def urgent_(keys: set[str]) -> None:
        urgent.append(keys)

    job: LoopService[str] = LoopService("t", round_, 3600, log=log, failure="x", urgent=urgent_)
    job.start()
    await _until(lambda: rounds == ["full"])
    job.wake("a", "b")
    await _until(lambda: urgent == [{"a", "b"}])
    job.wake("c")
    await _until(lambda: len(urgent) == 2)
    assert urgent[1] == {"c"} and rounds == ["full"]  # no full round before its period
    await job.stop()


async def test_a_period_function_is_read_after_each_round() -> None:
    calls: list[int] = []
    periods = iter([0.001, 0.001, 3600.0])

    async def round_() -> None:
        calls.append(len(calls))

    job: LoopService[str] = LoopService("t", round_, lambda: next(periods), log=log, failure="x")
    job.start()
    await _until(lambda: len(calls) == 3)  # two short periods, then an hour
    await asyncio.sleep(0.02)
    assert len(calls) == 3
    await job.stop()


async def test_a_following_loop_ends_the_followers_its_rounds_started_when_it_stops() -> None:
    async def follow() -> None:
        await asyncio.Event().wait()  # a follower that never ends by itself

    async def round_() -> None:
        if "a" not in loop.following:
            loop.following["a"] = asyncio.create_task(follow())

    loop: FollowingLoop[str] = FollowingLoop("following", round_, 60.0, log=log, failure="f")
    loop.start()
    await _until(lambda: "a" in loop.following)
    follower = loop.following["a"]
    await loop.stop()
    assert follower.cancelled()
    assert loop.following == {}
    assert not loop.running
