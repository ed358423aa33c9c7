"""Four ranks on one machine: groups formed on the fly, collectives on them, checked against torch.

Run: python examples/collectives_demo.py
"""

import datetime
import multiprocessing as mp

import gfdit
import torch
import torch.distributed as dist

WORLD = 4
PORT = 29613


def rank_main(rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", PORT, WORLD, rank == 0, timeout=datetime.timedelta(seconds=30))
    gfdit.init(rank, WORLD, store, timeout=30.0)

    # A group is only a list of ranks: forming one costs about a microsecond and talks to no one.
    pair = gfdit.new_group([0, 1] if rank < 2 else [2, 3])
    x = torch.full((4,), float(rank))
    gfdit.all_reduce(x, group=pair)  # 0+1 on ranks 0,1; 2+3 on ranks 2,3
    assert torch.equal(x, torch.full((4,), 1.0 if rank < 2 else 5.0))

    # Overlapping groups in any order are fine as long as every pair of ranks meets them in the same order.
    ring = gfdit.new_group([3, 1, 2, 0])  # group order is kept, not sorted
    out = torch.empty(4, 2)
    gfdit.all_gather_into_tensor(out, torch.tensor([rank, rank * 10.0]), group=ring)
    assert out[:, 0].tolist() == [3.0, 1.0, 2.0, 0.0]

    # Heap tensors are sent without a staging copy.
    buf = gfdit.empty((1 << 20,), dtype=torch.bfloat16)
    buf.fill_(rank)
    gfdit.broadcast(buf, src=2)
    assert bool((buf == 2).all())

    # Ulysses: [B, S_local, H, D] -> [B, S, H/n, D] and back.
    q = torch.randn(1, 16, 8, 32)
    full = torch.empty(1, 64, 2, 32)
    gfdit.all_to_all_4d(full, q, scatter_dim=2, gather_dim=1)
    back = torch.empty_like(q)
    gfdit.all_to_all_4d(back, full, scatter_dim=1, gather_dim=2)
    assert torch.equal(back, q)

    gfdit.barrier()
    if rank == 0:
        print("collectives_demo: all checks passed on", WORLD, "ranks")
    gfdit.destroy()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r,)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    raise SystemExit(max(p.exitcode for p in procs))
