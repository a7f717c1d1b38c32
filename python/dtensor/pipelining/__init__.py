"""Pipeline parallelism with torch.distributed.pipelining's names: PipelineStage (a manual
split), the schedules ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleLoopedBFS,
ScheduleInterleavedZeroBubble, and the microbatch helpers. Stage boundaries move tensors,
distributed ones laid out as they left, by a cross-mesh redistribute (NOTE [pipeline
transfers]); no ``pipeline()`` tracing."""

from dtensor.pipelining._microbatch import merge_chunks, split_args_kwargs_into_chunks
from dtensor.pipelining._schedules import (PipelineScheduleMulti, PipelineScheduleSingle,
                                           Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                           ScheduleInterleavedZeroBubble, ScheduleLoopedBFS)
from dtensor.pipelining._stage import PipelineStage

__all__ = ["PipelineStage", "PipelineScheduleSingle", "PipelineScheduleMulti", "ScheduleGPipe",
           "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
           "ScheduleInterleavedZeroBubble", "split_args_kwargs_into_chunks", "merge_chunks"]
