"""A completions request with several prompts: one `Generation` (one job) per prompt, read as one.

OpenAI numbers a batch's choices prompt by prompt: with prompts P0, P1 and n=2, choices 0 and 1
belong to P0 and choices 2 and 3 to P1. Each prompt's job is an ordinary single-prompt job (its
choices 0..n-1), so workers know nothing of batches; this renumbers its events. The jobs run
side by side, on one worker or several, and their events go out as they arrive.

It answers to what the routes use of a `Generation` (open, close, batches, finished, outcome),
so a request with one prompt goes the plain way, at no cost for the merging.
Any prompt's failure fails the whole request, and `close()` cancels whatever is unfinished.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from gateway.accumulate import ChoiceState
from gateway.completion_bodies import PromptTokensDetails, UsageInfo
from gateway.generation import Generation
from shared.protocol import DeltaEvent, FinalEvent


class BatchOutcome:
    """The prompts' outcomes as one: choices prompt by prompt, usage summed (prompts differ)."""

    def __init__(self, generations: list[Generation]) -> None:
        self._generations = generations

    @property
    def choices(self) -> list[ChoiceState]:
        return [state for gen in self._generations for state in gen.outcome.choices]

    def usage(self) -> UsageInfo:
        usages = [gen.outcome.usage() for gen in self._generations]
        prompt = sum(usage.prompt_tokens for usage in usages)
        completion = sum(usage.completion_tokens for usage in usages)
        cached = sum(usage.prompt_tokens_details.cached_tokens for usage in usages if usage.prompt_tokens_details)
        return UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


class GenerationBatch:
    def __init__(self, generations: list[Generation], num_choices: int) -> None:
        self._generations = generations
        self._num_choices = num_choices  # per prompt: n
        self.outcome = BatchOutcome(generations)
        self.finished = False

    async def open(self) -> None:
        """Every prompt's job subscribed and enqueued, all at once (a batch of 64 would otherwise
        wait for 64 round trips in a row), or none: any failure (say, a full queue for some of them)
        closes, and so cancels, the ones that did open, then the first failure in prompt order is
        raised, as `Generation.open` raises it."""
        results = await asyncio.gather(*(gen.open() for gen in self._generations), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            await self.close()  # a generation whose open failed has closed itself: closing again does nothing
            raise failures[0]

    async def close(self) -> None:
        for gen in self._generations:
            await gen.close()

    async def batches(self) -> AsyncGenerator[list[DeltaEvent | FinalEvent], None]:
        """Whatever any prompt's job has sent, renumbered, as soon as it is here; `finished` is True
        when the last batch is handed out. Raises the first failure of any prompt."""
        streams = [gen.batches() for gen in self._generations]
        waiting = {asyncio.ensure_future(anext(stream)): index for index, stream in enumerate(streams)}
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                merged: list[DeltaEvent | FinalEvent] = []
                for task in sorted(done, key=waiting.__getitem__):  # prompt order among simultaneous ones
                    index = waiting.pop(task)
                    try:
                        batch = task.result()
                    except StopAsyncIteration:
                        continue  # that prompt is done
                    merged += [self._renumbered(index, event) for event in batch]
                    waiting[asyncio.ensure_future(anext(streams[index]))] = index
                self.finished = all(gen.finished for gen in self._generations)
                if merged:
                    yield merged
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            for stream in streams:
                await stream.aclose()

    def _renumbered(self, index: int, event: DeltaEvent | FinalEvent) -> DeltaEvent | FinalEvent:
        return event.model_copy(update={"choice": index * self._num_choices + event.choice})
