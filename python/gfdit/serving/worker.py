"""A worker: one process per rank. It joins the group-free collectives world, loads a staged model and runs
the tasks its ``gfdit._C.runtime.WorkerLoop`` hands it, in FIFO order (docs/architecture.md, "The runtime").

The worker's half of the ring protocol is C++ (``include/gfdit/worker_loop.h``, NOTE [worker loop]): the hello,
which tasks the loop answers by itself (a probe, a task for a state this worker does not hold, collective
tasks while the world is down), the error code an exception maps to, quiet completions and the bell before
idling, the output in shared memory. This module calls the model and nothing else.

Task ranks are worker ids; the collectives world may be re-created among the survivors after a worker dies
(a REINIT task, epoch e), so each worker maps worker ids to its current world's ranks. A replacement for a dead
worker (NOTE [healing] in gfdit.serving.engine) attaches the rings through the descriptor it inherited, and joins
no world until its first REINIT.

On a GPU (``Engine(device=...)``) a worker joins the world with its device, loads the model there and holds
its states there (NOTE [state placement] in gfdit.models.staged). Work is enqueued on the device's current
stream; a task's completion is posted only after the device finished it (one stream synchronisation per task,
then ``World.check()`` for device-side errors), so completions keep meaning "done" and their timestamps stay
true.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
import traceback
from typing import Any

import torch

from gfdit import comm, settings
from gfdit._C import runtime as rt
from gfdit.attention.spec import ParallelSpec
from gfdit.comm.topology import NODE_IDS_ENV

POLL_S = 1.0  # how often an idle worker checks that the engine still exists
# NOTE [fault injection]: tests make a worker fail or hang on purpose with a prompt starting with
# FAULT_PREFIX ("gfdit-fault:raise", "gfdit-fault:sleep=30"); honoured only when GFDIT_FAULT_INJECTION is on.
FAULT_PREFIX = "gfdit-fault:"
Kind = rt.TaskKind


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What every worker of one engine is started with (pickled to each spawned process)."""

    num_workers: int
    store_host: str
    store_port: int
    queue_name: str  # the engine's rings
    model: str
    model_path: str | None
    timeout_s: float
    heap_bytes: int | None
    threads: int = 1  # torch's intra-op threads
    # every worker's node where workers span hosts (None: all on this one): each world's GFDIT_NODE_IDS
    node_ids: tuple[int, ...] | None = None


class Worker:
    def __init__(
        self, worker_id: int, config: WorkerConfig, device: Any = None, queue_fd: int | None = None
    ) -> None:
        import torch.distributed as dist

        self.id = worker_id
        # this worker's GPU (None: CPU); "cuda" picks comm.default_device(worker_id)
        self.device = comm.resolve_device(device, worker_id, "gfdit.Engine device")
        self.config = c = config
        self.loop = rt.WorkerLoop(c.queue_name, worker_id, -1 if queue_fd is None else queue_fd)
        self.store = dist.TCPStore(
            c.store_host,
            c.store_port,
            None,
            False,
            timeout=datetime.timedelta(seconds=max(30.0, c.timeout_s)),
        )
        self.model: Any = None
        self.states: dict[int, Any] = {}
        self.rank_of: dict[int, int] = {}
        self.world: Any = None
        self.faults = settings.get_bool("GFDIT_FAULT_INJECTION")
        self.tracebacks = settings.get_bool("GFDIT_WORKER_TRACEBACK")
        if queue_fd is None:  # a replacement waits for the REINIT that takes it in
            self._init_world(0, list(range(c.num_workers)))

    def _init_world(self, epoch: int, workers: list[int]) -> None:
        if comm.is_initialized():
            comm.destroy()
        if self.config.node_ids is not None:
            # the node of each of this world's ranks is where its worker runs (NOTE [node agents] in
            # src/runtime/relay.cpp); a world re-created among the survivors has fewer ranks than the first
            os.environ[NODE_IDS_ENV] = ",".join(str(self.config.node_ids[w]) for w in workers)
        old_rank_of = self.rank_of
        self.rank_of = {w: i for i, w in enumerate(workers)}
        if old_rank_of and self.states:
            # step caches name the ranks that hold their shards (NOTE [step caches]): renumber them for the new
            # world; a rank whose worker is gone maps to nothing, and its shards count as lost
            from gfdit.models.cache import remap_cache_ranks

            mapping = {r: self.rank_of[w] for w, r in old_rank_of.items() if w in self.rank_of}
            self.states = {rid: remap_cache_ranks(st, mapping) for rid, st in self.states.items()}
        self.world = comm.init(
            self.rank_of[self.id],
            len(workers),
            self.store,
            timeout=self.config.timeout_s,
            heap_bytes=self.config.heap_bytes,
            key_prefix=f"gfdit/epoch{epoch}",
            device=self.device,
            shm_prefix=self.loop.world_shm_prefix,  # what the engine removes if this process dies mid-setup
        )
        # The engine bumps this word to abort blocked collectives when it recovers from a failure.
        self.world._w.watch_abort(self.loop.abort_address)

    def _group(self, ranks: list[int]) -> Any:
        return self.world.new_group([self.rank_of[w] for w in ranks])

    def load_model(self) -> Any:
        """Loads the model; returns what the engine checks requests against (the hello, a ModelInfo)."""
        from gfdit import models

        dev = "cpu" if self.device is None else torch.device("cuda", self.device)
        self.model = m = models.load(self.config.model, self.config.model_path, device=dev)
        pt, ps, _ = m.patch_size
        d = m.defaults
        info = rt.ModelInfo()
        info.name = self.config.model
        info.heads = int(m.transformer.config.num_attention_heads)
        info.is_video = bool(m.is_video)
        info.patch_t, info.patch_s = int(pt), int(ps)
        info.vae_stride_s = int(getattr(m, "scale_spatial", 0) or getattr(m, "vae_scale", 8))
        info.vae_stride_t = int(getattr(m, "scale_temporal", 1) or 1) if m.is_video else 1
        info.two_experts = bool(getattr(m, "two_experts", False))
        info.cache_kinds = list(getattr(m, "cache_kinds", ()))  # a StagedModel of one's own may have none
        info.defaults = rt.ModelDefaults(
            height=d.height,
            width=d.width,
            num_frames=d.num_frames,
            num_steps=d.num_inference_steps,
            guidance_scale=d.guidance_scale,
        )
        return info

    def run(self) -> None:
        try:
            info = self.load_model()
        except Exception as e:  # the engine reports it and stops
            self.loop.hello_failed(f"loading model {self.config.model!r} failed: {type(e).__name__}: {e}")
            return
        self.loop.hello(info)
        while (task := self.loop.next(POLL_S)) is not None:
            try:
                output = self.execute(task)
                self._device_done()
            except Exception as e:
                if self.tracebacks:
                    traceback.print_exc()
                self.loop.fail(task, e)  # the exception's class decides the error code (NOTE [worker loop])
            else:
                self.loop.complete(task, output)

    def execute(self, task: Any) -> Any:
        """Runs one task; returns the decoded output of a DECODE task (else None)."""
        kind, rid = task.kind, task.request_id
        if kind == Kind.ENCODE:
            self.encode(rid, task.request)
        elif kind == Kind.REINIT:
            self._init_world(task.epoch, list(task.workers))
        elif kind == Kind.DENOISE and task.batch:
            # a batch (NOTE [batches] in src/runtime/control.cpp): one batched forward per step for every member
            ids = [rid] + [other for other, _ in task.batch]
            group, spec = self._group(task.ranks), ParallelSpec.of(task.layout)
            for _ in range(task.num_steps):
                before = [self.states[i] for i in ids]
                states = self.model.denoise_batch(before, group=group, spec=spec)
                for i, old, state in zip(ids, before, states, strict=True):
                    self.loop.progress(i, int(state.step_idx), *_cache_delta(old, state))
                    # a later failure leaves every member's last completed step here
                    self.states[i] = _without_spent_cache(state)
        elif kind == Kind.DENOISE:
            state = self.states[rid]  # the loop checked that this worker holds it at step_begin
            group, spec = self._group(task.ranks), ParallelSpec.of(task.layout)  # cfg 2: two passes split
            for k in range(task.step_begin, task.step_begin + task.num_steps):
                old, state = state, self.model.denoise_step(state, k, group=group, spec=spec)
                self.loop.progress(rid, k + 1, *_cache_delta(old, state))
                state = _without_spent_cache(state)
                self.states[rid] = state  # a later failure leaves the last completed step here
        elif kind == Kind.MIGRATE:
            group, src = self._group(task.ranks), self.rank_of[task.src_rank]
            state = self.model.migrate(self.states.get(rid), group, src)
            self.states[rid] = state
            self.loop.progress(rid, int(state.step_idx))
        elif kind == Kind.GATHER:  # NOTE [cache gathers] in src/runtime/control.cpp
            self.states[rid] = self.model.gather_cache(self.states[rid], self._group(task.ranks))
        elif kind == Kind.DECODE:  # on a group: NOTE [parallel decode] in src/runtime/control.cpp
            ranks = list(task.ranks)
            group = self._group(ranks) if len(ranks) > 1 else None
            out = self.model.decode(self.states[rid], group)
            return out.contiguous().numpy() if ranks[0] == self.id else None  # the first member reports it
        elif kind == Kind.FREE:
            self.states.pop(rid, None)
        return None

    def _device_done(self) -> None:
        """On a GPU: waits until the device finished the task, then reports a device-side error."""
        if self.device is not None:
            torch.cuda.current_stream(self.device).synchronize()
            self.world.check()

    def encode(self, rid: int, req: Any) -> None:
        if self.faults and req.prompt.startswith(FAULT_PREFIX):
            what = req.prompt[len(FAULT_PREFIX) :].split()[0]
            if what == "raise":
                raise RuntimeError("injected failure")
            if what.startswith("sleep="):
                time.sleep(float(what.split("=", 1)[1]))
        m = self.model
        cond = m.encode(req.prompt, req.negative_prompt, guidance_scale=req.guidance_scale)
        shape = m.latent_shape(height=req.height, width=req.width, num_frames=req.num_frames)
        latent = m.init_latent(req.seed, shape)
        self.states[rid] = m.initial_state(
            cond,
            latent,
            num_inference_steps=req.num_inference_steps,
            guidance_scale=req.guidance_scale,
            grid=tuple(shape[2:]),
            # only when asked: a StagedModel of one's own need not know the keywords
            **({"guidance_scale_2": req.guidance_scale_2} if req.guidance_scale_2 is not None else {}),
            **({"cache": req.cache} if req.cache.on() else {}),
        )


def _cache_counts(state: Any) -> tuple[int, int]:
    """(cached steps, cached passes) a state's step cache has counted since step 0; (0, 0) without a cache."""
    cache = getattr(state, "cache", None)
    if cache is None:
        return 0, 0
    return int(cache.cached_steps), int(cache.cached_passes)


def _cache_delta(before: Any, after: Any) -> tuple[int, int]:
    """What one step added to the step cache's counts (the worker loop sums a task's; NOTE [step caches])."""
    (s0, p0), (s1, p1) = _cache_counts(before), _cache_counts(after)
    return max(0, s1 - s0), max(0, p1 - p0)


def _without_spent_cache(state: Any) -> Any:
    """The state without its step cache once its steps are done: the decode never reads it, and a migration to
    the decode's ranks need not carry it."""
    if getattr(state, "cache", None) is not None and state.done:
        return dataclasses.replace(state, cache=None)
    return state


class InheritedFd:
    """A file descriptor that a spawned process inherits: pickled for the child by multiprocessing, which passes
    the descriptor itself to it (the rings' region, whose name is gone once the engine started)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        from multiprocessing import reduction

        return (_inherited, (reduction.DupFd(self.fd),))


def _inherited(dup: Any) -> InheritedFd:
    return InheritedFd(dup.detach())


def main(
    worker_id: int, config: WorkerConfig, device: Any = None, queue_fd: InheritedFd | None = None
) -> None:
    torch.set_num_threads(config.threads)
    try:
        Worker(worker_id, config, device, None if queue_fd is None else queue_fd.fd).run()
    except KeyboardInterrupt:
        pass
    # The engine said SHUTDOWN (or is gone): leave the world in order (its goodbye to peers on other hosts), then
    # end without the interpreter's finalization, which tears down every module of torch and diffusers one by one
    # and took 2 s of a 4-worker engine's shutdown on 2 cores. Nothing else of a worker needs a destructor: its
    # rings and outputs belong to the engine, and the kernel closes its sockets.
    if comm.is_initialized():
        comm.destroy()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
