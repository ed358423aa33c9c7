"""``gfdit run-trace``: a trace replayed on a real ``gfdit.Engine`` through its public API, each request
submitted at its arrival time (relative to the replay's start) by a thread that sleeps until then. Its
records, summary and plots are the simulator's (gfdit.planning.simulate), so the two compare line by line.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

from gfdit._C import Error, InvalidUsage
from gfdit.planning.simulate import Replay, add_common_arguments, check_policy, report
from gfdit.planning.trace import Interval, Outcome, TraceRequest, load_trace
from gfdit.serving.engine import Engine, Request, RequestFailed


def engine_cost_model(model: str, world_size: int, profile: str | os.PathLike | Any) -> tuple[Any, Any]:
    """(cost model, profile): the profiled cost model an engine of ``world_size`` ranks serving ``model``
    hands its policies, and the profile it was built from.

    ``profile``: a file written by ``gfdit profile`` or a ``gfdit.planning.cost.Profile``. It must have been measured
    for ``model`` at a world size of at least ``world_size`` (degrees above its world were never measured);
    otherwise InvalidUsage says what to measure."""
    from gfdit.planning import cost

    prof = profile if isinstance(profile, cost.Profile) else cost.load_profile(Path(profile))
    where = f"the profile {profile}" if not isinstance(profile, cost.Profile) else "the profile"
    if prof.model != model:
        raise InvalidUsage(
            f"{where} was measured for {prof.model!r}, not {model!r}: "
            f"run `gfdit profile --model {model} --world-size {world_size}`"
        )
    if int(prof.world_size) < world_size:
        raise InvalidUsage(
            f"{where} was measured at world size {prof.world_size}, below the replay's {world_size}: "
            f"run `gfdit profile --model {model} --world-size {world_size}`"
        )
    return cost.cost_model(model, "cpu", profile=prof), prof


def _check_priceable(requests: Sequence[TraceRequest], model: str, prof: Any) -> None:
    """Refuses a trace with a shape the profile cannot price at any degree: its policies would schedule it
    without predictions (the shape-only rules) and say nothing about it."""
    from gfdit.planning import workload

    pricer = workload.Pricer("cpu", prof)
    for r in requests:
        if pricer.best(model, r.height, r.width, r.num_frames, r.num_inference_steps) is None:
            raise InvalidUsage(
                f"request {r.id} ({r.height}x{r.width}x{r.num_frames}) is outside what the profile measured: "
                f"profile its size with `gfdit profile --shapes {r.height}x{r.width}x{r.num_frames} ...`"
            )


def _engine_request(
    r: TraceRequest, prompt: str | None = None, num_steps: int | None = None, deadline: bool = True
) -> Any:
    rel_deadline = r.deadline_s - r.arrival_s if deadline and r.deadline_s is not None else None
    return Request(
        prompt=prompt or f"trace request {r.id}",
        height=r.height,
        width=r.width,
        num_frames=r.num_frames,
        num_inference_steps=num_steps or r.num_inference_steps,
        seed=r.id,
        deadline_s=rel_deadline,
        priority=r.priority,
        cache=r.cache,
    )


def replay_trace(
    requests: Sequence[TraceRequest],
    *,
    model: str,
    world_size: int,
    policy: str | Any,
    profile: str | os.PathLike | Any = None,
    timeout_s: float = 600.0,
    threads_per_worker: int = 1,
) -> Replay:
    """Replays the trace on a real ``gfdit.Engine`` in real time (see ``replay_on_engine``), started for
    this replay and shut down after it.

    ``policy``: a built-in's name or a ``gfdit.Policy`` object. ``profile`` (a file from ``gfdit profile`` or
    a ``gfdit.planning.cost.Profile``, measured for ``model`` at a world size >= ``world_size``): the engine's policies
    get the profiled cost model's predictions (see ``engine_cost_model``); every request of the trace must be
    a size the profile can price. Without it the dynamic policies fall back to shape-only rules (perfect
    scaling assumed).
    """
    check_policy(policy, world_size)
    cost_model = None
    if profile is not None:
        cost_model, prof = engine_cost_model(model, world_size, profile)
        _check_priceable(requests, model, prof)
    with Engine(
        model=model,
        world_size=world_size,
        policy=policy,
        threads_per_worker=threads_per_worker,
        cost_model=cost_model,
    ) as eng:
        return replay_on_engine(eng, requests, timeout_s=timeout_s)


def replay_on_engine(engine: Any, requests: Sequence[TraceRequest], *, timeout_s: float = 600.0) -> Replay:
    """Replays the trace on a running ``gfdit.Engine`` in real time; the engine keeps running after it, so
    one engine (one policy) can replay several traces in turn, each after the previous one has ended.

    One small warm-up request runs before the replay clock starts; then a thread submits each request at
    its arrival time. Latency is the request's DONE time minus its QUEUED time, a deadline is met when DONE
    comes by the replay's start + deadline_s. Requests that fail, are cancelled or are not done ``timeout_s``
    after the replay's start count as not completed (those still running are cancelled).
    """
    from gfdit._C import runtime as rt

    eng = engine
    smallest = min(requests, key=lambda r: (r.height * r.width * r.num_frames, r.num_inference_steps))
    eng.submit(_engine_request(smallest, prompt="warm-up", num_steps=1, deadline=False)).result(timeout=120)

    start_ns = rt.now_ns()
    t0 = time.perf_counter()
    handles: list[tuple[TraceRequest, Any, BaseException | None]] = []
    stop = threading.Event()

    def submit_all() -> None:
        for r in requests:
            delay = (start_ns + int(r.arrival_s * 1e9) - rt.now_ns()) / 1e9
            if delay > 0 and stop.wait(delay):
                return
            try:
                handles.append((r, eng.submit(_engine_request(r)), None))
            except (Error, ValueError, RuntimeError) as e:  # refused at submit: not completed
                handles.append((r, None, e))

    submitter = threading.Thread(target=submit_all, name="gfdit-trace-submit", daemon=True)
    submitter.start()
    end = time.monotonic() + timeout_s
    submitter.join(max(0.0, end - time.monotonic()))
    stop.set()
    submitter.join()

    outcomes: list[Outcome] = []
    intervals: list[Interval] = []
    busy_ns = 0
    submitted = {r.id for r, _, _ in handles}
    for r, handle, error in handles:
        state, arrival, finish = "REFUSED" if error is not None else "FAILED", r.arrival_s, None
        try:
            res = handle.result(timeout=max(0.0, end - time.monotonic())) if handle is not None else None
        except RequestFailed:
            state = "FAILED"
        except CancelledError:
            state = "CANCELLED"
        except TimeoutError:
            state = "TIMEOUT"
            handle.cancel()
        else:
            if res is not None:
                state = res.state
                arrival = (res.transitions[0][2] - start_ns) / 1e9  # QUEUED, at submit
                finish = ({name: t_ns for name, _, t_ns in res.transitions}["DONE"] - start_ns) / 1e9
                for s in res.timeline:
                    busy_ns += (s.end_ns - s.start_ns) * len(s.ranks)
                    start_s, end_s = (s.start_ns - start_ns) / 1e9, (s.end_ns - start_ns) / 1e9
                    intervals += [Interval(rank, r.id, s.kind, start_s, end_s) for rank in s.ranks]
        outcomes.append(Outcome(r.id, arrival, finish, r.deadline_s, state, r.priority))
    outcomes += [
        Outcome(r.id, r.arrival_s, None, r.deadline_s, "NOT_SUBMITTED", r.priority)
        for r in requests
        if r.id not in submitted
    ]
    wall = time.perf_counter() - t0
    where = f"engine {eng.model_name} x{eng.world_size}"
    if eng.cost_model is not None:
        where += f", {eng.cost_model.describe()}"
    return Replay(
        policy=eng.policy_name,
        outcomes=outcomes,
        busy_rank_s=busy_ns / 1e9,
        num_ranks=eng.world_size,
        intervals=intervals,
        wall_s=wall,
        where=where,
    )


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Arguments of ``gfdit run-trace``."""
    add_common_arguments(parser)
    parser.add_argument("--model", required=True, help="model the engine serves (tiny-wan, tiny-qwen-image)")
    parser.add_argument("--world-size", type=int, required=True, help="ranks (worker processes)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds after the replay's start past which unfinished requests count as not completed "
        "(default 600)",
    )
    parser.add_argument(
        "--profile",
        help="profile file from `gfdit profile` (the same model, world size >= --world-size): the policies' "
        "predictions",
    )


def run(args: argparse.Namespace, command: str) -> int:
    """Runs ``gfdit run-trace``; 2 for bad input (message on stderr)."""
    try:
        requests = load_trace(args.trace, model=args.model)
        if args.world_size < 1:
            raise InvalidUsage(f"--world-size must be positive, got {args.world_size}")
        replay = replay_trace(
            requests,
            model=args.model,
            world_size=args.world_size,
            policy=args.policy,
            profile=args.profile,
            timeout_s=args.timeout,
        )
    except InvalidUsage as e:
        print(f"gfdit {command}: {e.message}", file=sys.stderr)
        return 2
    return report(replay, args, command)
