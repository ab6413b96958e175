"""Durable SQLite job queue: leases, heartbeats, attempts, stale-result rejection."""

from ait.queue.sqlite_queue import JobQueue
from ait.queue.types import JobState, Lease, QueueEntry, QueueError, StaleLeaseError

__all__ = ["JobQueue", "JobState", "Lease", "QueueEntry", "QueueError", "StaleLeaseError"]
