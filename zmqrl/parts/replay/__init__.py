"""Replay storage: tables, samplers, rate limiter. No sockets.

:class:`ReplayTable` stores items and samples them (uniform, prioritized, fifo),
:class:`SumTree` backs the prioritized sampler, and :class:`RateLimiter` decides
when inserts and samples may proceed, and :class:`WaitingSamples` holds the sample
requests it refuses (bounded). The replay node wraps these behind sockets.
"""

from zmqrl.parts.replay.rate_limiter import RateLimiter
from zmqrl.parts.replay.sum_tree import SumTree
from zmqrl.parts.replay.table import ReplayTable, Sample, SamplerKind
from zmqrl.parts.replay.waiting import Request, WaitingSamples

__all__ = ["RateLimiter", "ReplayTable", "Request", "Sample", "SamplerKind", "SumTree",
           "WaitingSamples"]
