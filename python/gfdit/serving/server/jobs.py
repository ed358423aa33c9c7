"""Video jobs: ``POST /v1/videos`` makes one, ``GET /v1/videos/{id}`` reads it (its progress comes from the
engine's request handle), its MP4 is kept in memory until the job expires."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gfdit.serving.server.errors import APIError


class VideoJob:
    """One asynchronous video generation: its engine request, then its MP4."""

    def __init__(
        self, job_id: str, model: str, handle: Any, width: int, height: int, num_frames: int
    ) -> None:
        self.id = job_id
        self.model = model
        self.handle = handle
        self.size = f"{width}x{height}"
        self.num_frames = num_frames
        self.created_at = int(time.time())
        self.status = "queued"  # queued, in_progress, completed, failed, cancelled
        self.completed_at: int | None = None
        self.finished_monotonic: float | None = None
        self.ended = asyncio.Event()  # set when the job has ended (long polls wait on it)
        self.content: bytes | None = None
        self.error: str | None = None

    def to_json(self, ttl_s: float) -> dict:
        """The OpenAI-style video object, with the progress the engine last pushed to the request's handle."""
        progress = 100 if self.status == "completed" else 0
        status = self.status
        if self.finished_monotonic is None and not self.handle.done():
            st = self.handle.status()  # pushed by the engine: never waits
            if st["state"] != "QUEUED":
                status = "in_progress"
                progress = min(99, int(100 * st["step"] / max(1, st["num_steps"])))
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": status,
            "progress": progress,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "expires_at": None if self.completed_at is None else int(self.completed_at + ttl_s),
            "size": self.size,
            "num_frames": self.num_frames,
            "error": None if self.error is None else {"message": self.error},
        }

    def end(self, status: str, error: str | None = None) -> None:
        """The job is over: completed, failed or cancelled (long polls wake)."""
        self.status = status
        if error is not None:
            self.error = error
        self.completed_at = int(time.time())
        self.finished_monotonic = time.monotonic()
        self.ended.set()


class VideoJobStore:
    """The jobs of one server: finished ones are forgotten past their TTL, and the oldest finished ones early
    while the MP4s kept exceed max_bytes (the newest is kept whatever its size). Used on the event loop."""

    def __init__(self, ttl_s: float, max_bytes: int) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._jobs: dict[str, VideoJob] = {}
        self._tasks: set[asyncio.Task] = set()  # the tasks that finish jobs (kept referenced)

    def add(self, job: VideoJob, finisher: Any) -> None:
        """Keeps ``job`` and runs the coroutine ``finisher`` that ends it."""
        self.sweep()
        self._jobs[job.id] = job
        task = asyncio.ensure_future(finisher)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def get(self, video_id: str) -> VideoJob:
        """The job, or a 404 APIError naming ``video_id``."""
        self.sweep()
        job = self._jobs.get(video_id)
        if job is None:
            raise APIError(
                404,
                f"no video job {video_id!r} (unknown, deleted or expired)",
                param="video_id",
                code="not_found",
            )
        return job

    def forget(self, video_id: str) -> None:
        self._jobs.pop(video_id, None)

    def sweep(self) -> None:
        """Forgets finished jobs past their TTL, then the oldest finished ones while their MP4s exceed
        max_bytes."""
        now = time.monotonic()
        finished = sorted(
            (j for j in list(self._jobs.values()) if j.finished_monotonic is not None),
            key=lambda j: j.finished_monotonic or 0.0,
        )
        kept = 0
        for i, j in enumerate(reversed(finished)):  # the newest first; the newest is kept whatever its size
            kept += len(j.content or b"")
            if now - (j.finished_monotonic or now) > self.ttl_s or (i > 0 and kept > self.max_bytes):
                self._jobs.pop(j.id, None)
