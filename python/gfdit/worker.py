"""A worker: one process per rank. It joins the group-free collectives world, loads a staged model and runs
its dispatch queue in FIFO order (see DESIGN.md, "Runtime").

Task ranks are worker ids; the collectives world may be re-created among the survivors after a worker dies
(a REINIT task, epoch e), so each worker maps worker ids to its current world's ranks.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback
from typing import Any

import torch

from gfdit._C import runtime as rt

SHUTDOWN_POLL_S = 0.2


class Worker:
    def __init__(self, worker_id: int, num_workers: int, store_host: str, store_port: int, queue_name: str,
                 model: str, model_path: str | None, results: Any, timeout_s: float, heap_bytes: int) -> None:
        import gfdit  # noqa: F401  (imports the extension in the child)
        import torch.distributed as dist

        self.id = worker_id
        self.queues = rt.QueueSet.attach(queue_name)
        self.results = results
        self.timeout_s = timeout_s
        self.heap_bytes = heap_bytes
        self.store = dist.TCPStore(store_host, store_port, None, False,
                                   timeout=datetime.timedelta(seconds=max(30.0, timeout_s)))
        self.model_name = model
        self.model_path = model_path
        self.model: Any = None
        self.states: dict[int, Any] = {}
        self.steps: dict[int, int] = {}
        self.rank_of: dict[int, int] = {}
        self.world: Any = None
        self.parent = os.getppid()
        self._init_world(0, list(range(num_workers)))

    def _init_world(self, epoch: int, workers: list[int]) -> None:
        import gfdit

        if gfdit.is_initialized():
            gfdit.destroy()
        self.rank_of = {w: i for i, w in enumerate(workers)}
        self.world = gfdit.init(self.rank_of[self.id], len(workers), self.store, timeout=self.timeout_s,
                                heap_bytes=self.heap_bytes, key_prefix=f"gfdit/epoch{epoch}")
        # The engine bumps this word to abort blocked collectives when it recovers from a failure.
        self.world._w.watch_abort(self.queues.abort_address())
        self.broken = False

    def _group(self, ranks: list[int]) -> Any:
        return self.world.new_group([self.rank_of[w] for w in ranks])

    @staticmethod
    def _spec(task: Any) -> Any:
        from gfdit.attention import ParallelSpec

        layout = task.layout
        mode = "torus" if layout.mode == 1 else "usp"
        placement = {0: "auto", 1: "ulysses-low", 2: "ring-low"}.get(layout.placement, "auto")
        return ParallelSpec(ulysses=layout.ulysses, ring=layout.ring, mode=mode, placement=placement)

    def load_model(self) -> dict:
        from gfdit import models

        self.model = models.load(self.model_name, self.model_path)
        heads = int(self.model.transformer.config.num_attention_heads)
        d = self.model.defaults
        return {"heads": heads, "is_video": bool(self.model.is_video),
                "defaults": {"height": d.height, "width": d.width, "num_frames": d.num_frames,
                             "num_inference_steps": d.num_inference_steps, "guidance_scale": d.guidance_scale}}

    def run(self) -> None:
        hello = rt.Completion()
        hello.task_id = 0
        hello.rank = self.id
        try:
            info = self.load_model()
            hello.message = json.dumps(info)
        except Exception as e:  # the engine reports it and stops
            hello.ok = False
            hello.message = f"loading model {self.model_name!r} failed: {e}"
        self.queues.push_completion(hello, 30.0)
        if not hello.ok:
            return
        while True:
            task = self.queues.pop_task(self.id, SHUTDOWN_POLL_S)
            if task is None:
                if os.getppid() != self.parent:  # the engine is gone
                    return
                continue
            if task.kind == rt.TaskKind.SHUTDOWN:
                return
            self.execute(task)

    def execute(self, task: Any) -> None:
        import gfdit

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
                raise gfdit.RemoteError("the collectives world is down until the engine re-creates it")
            if kind == rt.TaskKind.ENCODE:
                self.encode(rid, json.loads(task.payload.decode()))
                c.step_end = 0
            elif kind == rt.TaskKind.REINIT:
                payload = json.loads(task.payload.decode())
                self._init_world(int(payload["epoch"]), [int(w) for w in payload["workers"]])
            elif kind == rt.TaskKind.DENOISE:
                state = self.states[rid]
                group = self._group(task.ranks)
                spec = self._spec(task)
                for k in range(task.step_begin, task.step_begin + task.num_steps):
                    state = self.model.denoise_step(state, k, group=group, spec=spec)
                    self.states[rid] = state  # a later failure leaves the last completed step here
                    self.steps[rid] = k + 1
                c.step_end = self.steps[rid]
            elif kind == rt.TaskKind.MIGRATE:
                group = self._group(task.ranks)
                src = self.rank_of[task.src_rank]
                state = self.model.migrate(self.states.get(rid), group, src)
                self.states[rid] = state
                self.steps[rid] = int(state.step_idx)
                c.step_end = self.steps[rid]
            elif kind == rt.TaskKind.DECODE:
                out = self.model.decode(self.states[rid])
                self.results.put((rid, out.contiguous().numpy()))
            elif kind == rt.TaskKind.FREE:
                self.states.pop(rid, None)
                self.steps.pop(rid, None)
        except (gfdit.Timeout, gfdit.RemoteError) as e:
            # The world is unusable: report, and wait for the engine to re-create it (a REINIT task).
            self.broken = True
            c.ok = False
            c.message = f"comm: {e}"
            c.step_end = self.steps.get(rid, 0)
        except Exception as e:
            c.ok = False
            c.message = f"{type(e).__name__}: {e}"
            c.step_end = self.steps.get(rid, 0)
            if os.environ.get("GFDIT_WORKER_TRACEBACK"):
                traceback.print_exc()
        c.end_ns = rt.now_ns()
        c.post_ns = rt.now_ns()
        self.queues.push_completion(c, 30.0)

    def encode(self, rid: int, req: dict) -> None:
        if req.get("fail_in_worker"):
            raise RuntimeError(str(req["fail_in_worker"]))
        m = self.model
        cond = m.encode(req["prompt"], req.get("negative_prompt"), guidance_scale=req.get("guidance_scale"))
        shape = m.latent_shape(height=req.get("height"), width=req.get("width"), num_frames=req.get("num_frames"))
        latent = m.init_latent(int(req.get("seed", 0)), shape)
        self.states[rid] = m.initial_state(cond, latent, num_inference_steps=req.get("num_inference_steps"),
                                           guidance_scale=req.get("guidance_scale"), grid=tuple(shape[2:]))
        self.steps[rid] = 0


def main(worker_id: int, num_workers: int, store_host: str, store_port: int, queue_name: str, model: str,
         model_path: str | None, results: Any, timeout_s: float, heap_bytes: int, threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        Worker(worker_id, num_workers, store_host, store_port, queue_name, model, model_path, results, timeout_s,
               heap_bytes).run()
    except KeyboardInterrupt:
        pass
