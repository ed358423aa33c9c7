"""An engine whose workers span nodes, driven from a test (test_engine_nodes.py).

Imported, this module gives the test's requests and the policy that makes their outputs comparable bit for bit
between engines: ``AllRanks`` runs one request at a time on every live worker. Run as a script on a node of an
emulated cluster (netns_cluster), it starts ``gfdit.Engine(listen=...)`` there and answers commands, one JSON object
per line on stdin, with events, one JSON object per line on stdout:

    {"cmd": "run", "name": N, "requests": [...], "mid_run": bool}  ->  {"event": "denoising"} (mid_run: once a
        request has taken a step), then {"event": "done", "states": [...], "reasons": [...]}; outputs go to
        OUT/N-<k>.pt
    {"cmd": "stats"}  ->  {"event": "stats", "stats": {...}, "nodes": [...], "refusals": [...]}
    {"cmd": "quit"}   ->  the engine shuts down, {"event": "closed"}

Before the first command it prints {"event": "listening", "port": P} as soon as agents may connect, then
{"event": "ready"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from gfdit import Decision, Engine, Policy, Request
from gfdit._C import runtime as rt

MODEL = "tiny-wan"
# a mixed trace: images and videos, two sizes, guidance on and off, 2 to 4 steps
TRACE = [
    {
        "prompt": "a lighthouse",
        "height": 32,
        "width": 32,
        "num_frames": 1,
        "num_inference_steps": 3,
        "seed": 1,
    },
    {
        "prompt": "waves on rocks",
        "height": 32,
        "width": 48,
        "num_frames": 5,
        "num_inference_steps": 2,
        "seed": 2,
    },
    {
        "prompt": "a kite over dunes",
        "height": 48,
        "width": 32,
        "num_frames": 1,
        "num_inference_steps": 4,
        "seed": 3,
        "guidance_scale": 3.0,
    },
    {
        "prompt": "a harbour at dusk",
        "height": 32,
        "width": 32,
        "num_frames": 5,
        "num_inference_steps": 3,
        "seed": 4,
    },
]
# requests in flight when a node goes away: enough steps that the loss finds them denoising
LONG = [
    {
        "prompt": f"a long walk {k}",
        "height": 32,
        "width": 32,
        "num_frames": 5,
        "num_inference_steps": 12,
        "seed": 10 + k,
    }
    for k in range(3)
]


class AllRanks(Policy):
    """One request at a time, in arrival order, on every live worker (Ulysses over them all), all its steps in one
    decision, its decode on its first rank: the decisions depend only on which workers live, not on timing."""

    def name(self) -> str:
        return "all-ranks"

    def schedule(self, view):
        if view.running or not view.ready or not view.free_ranks:
            return []
        r = view.ready[0]
        ranks = sorted(view.free_ranks)
        layout = rt.plain_layout(len(ranks), r.num_heads)
        return [Decision(r.id, ranks, layout, r.steps_left, decode_degree=1)]


def _say(**event) -> None:
    print(json.dumps(event), flush=True)


def _run(eng: Engine, out_dir: str, name: str, requests: list[dict], mid_run: bool) -> None:
    handles = [eng.submit(Request(**q)) for q in requests]
    if mid_run:
        deadline = time.monotonic() + 120
        while not any(h.status().get("step", 0) >= 1 for h in handles) and time.monotonic() < deadline:
            time.sleep(0.01)
        _say(event="denoising")
    results = [h.result(timeout=300) for h in handles]
    for k, r in enumerate(results):
        if r.output is not None:
            torch.save(r.output.clone(), os.path.join(out_dir, f"{name}-{k}.pt"))
    _say(event="done", states=[r.state for r in results], reasons=[r.reason for r in results])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--local-workers", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    eng = Engine(
        model=MODEL,
        world_size=args.world_size,
        local_workers=args.local_workers,
        listen=args.listen,
        policy=AllRanks(),
        cost_model=False,
        timeout_s=30.0,
        start_timeout_s=180.0,
        on_listen=lambda host, port: _say(event="listening", port=port),
    )
    with eng:
        _say(event="ready")
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "run":
                _run(eng, args.out, cmd["name"], cmd["requests"], cmd.get("mid_run", False))
            elif cmd["cmd"] == "stats":
                _say(event="stats", stats=eng.stats(), nodes=eng.nodes(), refusals=eng.node_refusals())
            elif cmd["cmd"] == "quit":
                break
    _say(event="closed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
