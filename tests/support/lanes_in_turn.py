"""Serving lanes one after another through the real scheduler and stepper, without a block pool
(as a hybrid model's lanes run): each lane finishes, and stores its prefix, before the next starts."""

from __future__ import annotations

from shared.sampling import SamplingParams
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind


def serve_in_turn(
    stepper: ModelStepper, lanes: list[tuple[str, list[int], SamplingParams]], max_batch_tokens: int = 48
) -> dict[str, list[int]]:
    """Each lane's output tokens, its prefill in chunks of at most `max_batch_tokens`."""
    scheduler = Scheduler(stepper, SchedulerConfig(4, 1 << 40, max_batch_tokens))
    outputs: dict[str, list[int]] = {}
    for name, prompt, params in lanes:
        kv_bytes = stepper.kv_bytes(len(prompt), params.max_tokens)
        scheduler.submit(LaneRequest((name, 0), kv_bytes, None, LaneStart(name, prompt, params)))
        while not scheduler.idle:
            for result in scheduler.step():
                assert result.kind is not StepKind.FAILED, result.error
                if result.kind is StepKind.DECODE and result.state.finished:
                    outputs[name] = list(result.state.output_ids)
                    scheduler.retire(result.key)
    return outputs
