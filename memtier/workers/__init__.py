"""Workers of the conversation-memory tier: ``memtier worker``, ``flush``, ``restore``, ``inspect``.

See :mod:`memtier.workers.worker` for the loop and ``docs/workers.md`` for operations.
"""

from memtier.workers.worker import GROUP, Worker, WorkerOptions, WorkerStats

__all__ = ["GROUP", "Worker", "WorkerOptions", "WorkerStats"]
