"""A worker: one process per rank. It joins the group-free collectives world, loads a staged model and runs
its dispatch ring in FIFO order (see DESIGN.md, "Runtime").

Task ranks are worker ids; the collectives world may be re-created among the survivors after a worker dies
(a REINIT task, epoch e), so each worker maps worker ids to its current world's ranks. Every completion
carries an error code (gfdit._C.runtime.TaskError) that decides what the control plane does, and the step its
copy of the request's state is at (-1: none). Decoded outputs go into shared memory (NOTE [outputs] in
include/gfdit/runtime.h), never through the ring.

On a GPU (``Engine(device=...)``) a worker joins the world with its device, loads the model there and holds
its states there (NOTE [state placement] in gfdit.models.staged). Work is enqueued on the device's current
stream; a task's completion is posted only after the device finished it (one stream synchronisation per task,
then ``World.check()`` for device-side errors), so completions keep meaning "done" and their timestamps stay
true.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import traceback
from typing import Any

import torch

from gfdit import comm
from gfdit._C import InvalidUsage, RemoteError, Timeout
from gfdit._C import runtime as rt
from gfdit.attention.spec import ParallelSpec

POLL_S = 1.0  # how often an idle worker checks that the engine still exists
TaskError = rt.TaskError
# NOTE [fault injection]: tests make a worker fail or hang on purpose with a prompt starting with
# FAULT_PREFIX ("gfdit-fault:raise", "gfdit-fault:sleep=30"); honoured only when GFDIT_FAULT_INJECTION=1.
FAULT_PREFIX = "gfdit-fault:"
_QUIET_WITH_WORK = (rt.TaskKind.ENCODE, rt.TaskKind.DENOISE, rt.TaskKind.MIGRATE)


class Worker:
    def __init__(
        self,
        worker_id: int,
        num_workers: int,
        store_host: str,
        store_port: int,
        queue_name: str,
        output_prefix: str,
        world_shm_prefix: str,
        model: str,
        model_path: str | None,
        timeout_s: float,
        heap_bytes: int,
        device: Any = None,
    ) -> None:
        import torch.distributed as dist

        self.id = worker_id
        # this worker's GPU (None: CPU); "cuda" picks comm.default_device(worker_id)
        self.device = comm.resolve_device(device, worker_id, "gfdit.Engine device")
        self.queues = rt.QueueSet.attach(queue_name)
        self.output_prefix = output_prefix
        self.world_shm_prefix = world_shm_prefix  # what the engine removes if this process dies mid-setup
        self.timeout_s = timeout_s
        self.heap_bytes = heap_bytes
        self.store = dist.TCPStore(
            store_host, store_port, None, False, timeout=datetime.timedelta(seconds=max(30.0, timeout_s))
        )
        self.model_name = model
        self.model_path = model_path
        self.model: Any = None
        self.states: dict[int, Any] = {}
        self.steps: dict[int, int] = {}
        self.rank_of: dict[int, int] = {}
        self.world: Any = None
        self.parent = os.getppid()
        self.faults = os.environ.get("GFDIT_FAULT_INJECTION") == "1"
        self.unannounced = False  # a quiet completion was posted and no bell rung since
        self._init_world(0, list(range(num_workers)))

    def _init_world(self, epoch: int, workers: list[int]) -> None:
        if comm.is_initialized():
            comm.destroy()
        self.rank_of = {w: i for i, w in enumerate(workers)}
        self.world = comm.init(
            self.rank_of[self.id],
            len(workers),
            self.store,
            timeout=self.timeout_s,
            heap_bytes=self.heap_bytes,
            key_prefix=f"gfdit/epoch{epoch}",
            device=self.device,
            shm_prefix=self.world_shm_prefix,
        )
        # The engine bumps this word to abort blocked collectives when it recovers from a failure.
        self.world._w.watch_abort(self.queues.abort_address())
        self.broken = False

    def _group(self, ranks: list[int]) -> Any:
        return self.world.new_group([self.rank_of[w] for w in ranks])

    @staticmethod
    def _spec(task: Any) -> ParallelSpec:
        return ParallelSpec.of(task.layout)  # Layout.cfg -> ParallelSpec.cfg: denoise_step splits the passes

    def load_model(self) -> dict:
        """Loads the model; returns what the engine needs to check requests (hello message)."""
        from gfdit import models

        dev = "cpu" if self.device is None else torch.device("cuda", self.device)
        self.model = models.load(self.model_name, self.model_path, device=dev)
        m = self.model
        heads = int(m.transformer.config.num_attention_heads)
        d = m.defaults
        pt, ps, _ = m.patch_size
        stride_s = int(getattr(m, "scale_spatial", 0) or getattr(m, "vae_scale", 8))
        stride_t = int(getattr(m, "scale_temporal", 1) or 1) if m.is_video else 1
        return {
            "heads": heads,
            "is_video": bool(m.is_video),
            "patch_t": int(pt),
            "patch_s": int(ps),
            "vae_stride_s": stride_s,
            "vae_stride_t": stride_t,
            "defaults": {
                "height": d.height,
                "width": d.width,
                "num_frames": d.num_frames,
                "num_inference_steps": d.num_inference_steps,
                "guidance_scale": d.guidance_scale,
            },
        }

    def run(self) -> None:
        hello = rt.Completion()
        hello.task_id = 0
        hello.rank = self.id
        try:
            hello.message = json.dumps(self.load_model())
        except Exception as e:  # the engine reports it and stops
            hello.error = TaskError.MODEL_ERROR
            hello.message = f"loading model {self.model_name!r} failed: {type(e).__name__}: {e}"
        self.queues.push_completion(self.id, hello, 30.0)
        if not hello.ok:
            return
        while True:
            if self.unannounced and self.queues.pending_tasks(self.id) == 0:
                # about to wait for work: the control plane must have heard of every quiet completion
                self.queues.wake_control()
                self.unannounced = False
            got = self.queues.pop_task(self.id, POLL_S)
            if got is None:
                if os.getppid() != self.parent:  # the engine is gone
                    return
                continue
            task, payload = got
            if task.kind == rt.TaskKind.SHUTDOWN:
                return
            self.execute(task, payload)

    def execute(self, task: Any, payload: bytes) -> None:
        c = rt.Completion()
        c.task_id = task.task_id
        c.request_id = task.request_id
        c.kind = task.kind
        c.rank = self.id
        c.dispatch_ns = task.dispatch_ns
        c.start_ns = rt.now_ns()
        rid = task.request_id
        try:
            kind = task.kind
            if self.broken and kind in (rt.TaskKind.DENOISE, rt.TaskKind.MIGRATE):
                raise RemoteError("the collectives world is down until the engine re-creates it")
            if kind == rt.TaskKind.ENCODE:
                self.encode(rid, json.loads(payload.decode()))
            elif kind == rt.TaskKind.REINIT:
                p = json.loads(payload.decode())
                self._init_world(int(p["epoch"]), [int(w) for w in p["workers"]])
            elif kind == rt.TaskKind.DENOISE:
                state = self._state(rid, task.step_begin)
                group = self._group(task.ranks)
                spec = self._spec(task)
                for k in range(task.step_begin, task.step_begin + task.num_steps):
                    state = self.model.denoise_step(state, k, group=group, spec=spec)
                    self.states[rid] = state  # a later failure leaves the last completed step here
                    self.steps[rid] = k + 1
            elif kind == rt.TaskKind.MIGRATE:
                group = self._group(task.ranks)
                src = self.rank_of[task.src_rank]
                state = self.model.migrate(self.states.get(rid), group, src)
                self.states[rid] = state
                self.steps[rid] = int(state.step_idx)
            elif kind == rt.TaskKind.DECODE:
                out = self.model.decode(self._state(rid, None)).contiguous()
                c.set_output(f"{self.output_prefix}{task.task_id}-{self.id}", out.numpy())
            elif kind == rt.TaskKind.FREE:
                self.states.pop(rid, None)
                self.steps.pop(rid, None)
            self._device_done()
        except (Timeout, RemoteError) as e:
            # The world is unusable: report, and wait for the engine to re-create it (a REINIT task).
            self.broken = True
            c.error = TaskError.COMM_ERROR
            c.message = f"{type(e).__name__}: {e}"
        except _StateLost as e:
            c.error = TaskError.STATE_LOST
            c.message = str(e)
        except InvalidUsage as e:
            c.error = TaskError.INVALID_REQUEST
            c.message = f"InvalidUsage: {e}"
        except Exception as e:
            c.error = TaskError.MODEL_ERROR
            c.message = f"{type(e).__name__}: {e}"
            if os.environ.get("GFDIT_WORKER_TRACEBACK"):
                traceback.print_exc()
        c.step_end = self.steps.get(rid, -1)
        c.end_ns = rt.now_ns()
        c.post_ns = rt.now_ns()
        # NOTE [quiet completions] in src/runtime/queue.cpp: a stage done with more work queued, or a state
        # dropped, need not wake the control plane.
        quiet = c.ok and (
            (task.kind == rt.TaskKind.FREE and task.request_id != 0)  # request 0: a probe, someone waits
            or (task.kind in _QUIET_WITH_WORK and self.queues.pending_tasks(self.id) >= 2)
        )
        self.queues.push_completion(self.id, c, 30.0, not quiet)
        self.unannounced = quiet

    def _device_done(self) -> None:
        """On a GPU: waits until the device finished the task, then reports a device-side error."""
        if self.device is not None:
            torch.cuda.current_stream(self.device).synchronize()
            self.world.check()

    def _state(self, rid: int, step: int | None) -> Any:
        state = self.states.get(rid)
        if state is None:
            raise _StateLost(f"worker {self.id} holds no state of request {rid}")
        if step is not None and int(state.step_idx) != step:
            raise _StateLost(f"worker {self.id} holds request {rid} at step {state.step_idx}, not {step}")
        return state

    def encode(self, rid: int, req: dict) -> None:
        prompt = req["prompt"]
        if self.faults and prompt.startswith(FAULT_PREFIX):
            what = prompt[len(FAULT_PREFIX) :].split()[0]
            if what == "raise":
                raise RuntimeError("injected failure")
            if what.startswith("sleep="):
                time.sleep(float(what.split("=", 1)[1]))
        m = self.model
        cond = m.encode(prompt, req.get("negative_prompt"), guidance_scale=req.get("guidance_scale"))
        shape = m.latent_shape(
            height=req.get("height"), width=req.get("width"), num_frames=req.get("num_frames")
        )
        latent = m.init_latent(int(req.get("seed", 0)), shape)
        self.states[rid] = m.initial_state(
            cond,
            latent,
            num_inference_steps=req.get("num_inference_steps"),
            guidance_scale=req.get("guidance_scale"),
            grid=tuple(shape[2:]),
            # only when asked: a StagedModel of one's own need not know the keyword
            **(
                {"guidance_scale_2": req["guidance_scale_2"]}
                if req.get("guidance_scale_2") is not None
                else {}
            ),
        )
        self.steps[rid] = 0


class _StateLost(Exception):
    """The worker does not hold the request's state at the step asked for."""


def main(
    worker_id: int,
    num_workers: int,
    store_host: str,
    store_port: int,
    queue_name: str,
    output_prefix: str,
    world_shm_prefix: str,
    model: str,
    model_path: str | None,
    timeout_s: float,
    heap_bytes: int,
    threads: int,
    device: Any = None,
) -> None:
    torch.set_num_threads(threads)
    try:
        Worker(
            worker_id,
            num_workers,
            store_host,
            store_port,
            queue_name,
            output_prefix,
            world_shm_prefix,
            model,
            model_path,
            timeout_s,
            heap_bytes,
            device,
        ).run()
    except KeyboardInterrupt:
        pass
