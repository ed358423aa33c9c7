"""Case functions of test_stress.py: thousands of collective instances over overlapping random groups.

One global schedule is drawn from a shared seed; each rank runs, in order, only the instances it belongs
to (this is the order guarantee the GFC protocol relies on). Inputs are deterministic per (instance,
rank), so every rank computes the expected results locally: no gloo needed.
"""

from __future__ import annotations

import torch
from cases_common import LARGE_BYTES, Checker, generator, place, rand_tensor, reduce_ref, sentinel

OPS = ["all_gather", "all_reduce", "all_to_all", "broadcast", "reduce_scatter", "send_recv", "barrier"]
# Relative frequency of each op in the schedule.
WEIGHTS = [5, 5, 4, 4, 2, 2, 1]
DTYPES_BY_OP = {
    "all_gather": ["float32", "bfloat16", "uint8", "int64"],
    "all_to_all": ["float32", "float16", "int32"],
    "broadcast": ["float32", "int64", "uint8"],
    "all_reduce": ["int64", "int32"],  # integers: exact whatever the reduction order
    "reduce_scatter": ["int64", "int32"],
    "send_recv": ["bfloat16", "int32"],
    "barrier": ["int32"],
}


def build_schedule(seed, world_size, count, large_every, min_size=2):
    """The global order of instances: (op, members, per-rank elements, dtype, root, reduce op, memory)."""
    gen = generator(seed, 4242)
    weights = torch.tensor(WEIGHTS, dtype=torch.float64)
    schedule = []
    for k in range(count):
        op = OPS[int(torch.multinomial(weights, 1, generator=gen))]
        size = 2 if op == "send_recv" else int(torch.randint(min_size, world_size + 1, (1,), generator=gen))
        members = torch.randperm(world_size, generator=gen)[:size].tolist()
        dtypes = DTYPES_BY_OP[op]
        dtype = dtypes[int(torch.randint(0, len(dtypes), (1,), generator=gen))]
        numel = int(torch.randint(1, 65, (1,), generator=gen))
        if large_every and k % large_every == large_every - 1 and op != "barrier":
            numel = LARGE_BYTES // 4 + 1  # > a staging slot per rank (4-byte elements or more: > 5 MiB)
            if dtype in ("bfloat16", "float16"):
                numel *= 2
            elif dtype == "uint8":
                numel *= 4
        root = members[int(torch.randint(0, size, (1,), generator=gen))]
        rop = ["sum", "max", "min"][int(torch.randint(0, 3, (1,), generator=gen))]
        mem = "heap" if int(torch.randint(0, 3, (1,), generator=gen)) == 0 else "plain"
        schedule.append((op, members, numel, dtype, root, rop, mem))
    return schedule


def case_stress(ctx, seed, count, large_every):
    """Runs this rank's instances of the schedule; returns how many it ran."""
    import gfdit

    chk = Checker(ctx.rank)
    schedule = build_schedule(seed, ctx.world_size, count, large_every)
    ran = 0
    for k, (op, members, numel, dtype, root, rop, mem) in enumerate(schedule):
        if ctx.rank not in members:
            continue
        ran += 1
        n = len(members)
        me = members.index(ctx.rank)
        g = gfdit.new_group(members)
        what = f"instance {k} {op} {dtype} group={members} numel={numel} mem={mem}"

        def inp(r, shape=(numel,), kind="any"):
            return rand_tensor(shape, dtype, seed, k, r, kind=kind, n=n)

        if op == "all_gather":
            x = place(inp(ctx.rank), mem)
            out = sentinel((n * numel,), dtype, mem)
            if k % 2:
                g.all_gather_into_tensor(out, x)
            else:
                gfdit.all_gather_into_tensor(out, x, group=g)
            chk.equal(out, torch.cat([inp(r) for r in members]), what)
        elif op == "all_reduce":
            t = place(inp(ctx.rank, kind="sum"), mem)
            g.all_reduce(t, op=rop)
            ref = reduce_ref([inp(r, kind="sum") for r in members], rop, dtype).to(t.dtype)
            chk.equal(t, ref, what + " " + rop)
        elif op == "reduce_scatter":
            x = place(inp(ctx.rank, (n * numel,), kind="sum"), mem)
            out = sentinel((numel,), dtype, mem)
            gfdit.reduce_scatter_tensor(out, x, op=rop, group=g)
            blocks = [inp(r, (n * numel,), kind="sum")[me * numel : (me + 1) * numel] for r in members]
            chk.equal(out, reduce_ref(blocks, rop, dtype).to(out.dtype), what + " " + rop)
        elif op == "all_to_all":
            x = place(inp(ctx.rank, (n * numel,)), mem)
            out = sentinel((n * numel,), dtype, mem)
            gfdit.all_to_all_single(out, x, group=g)
            ref = torch.cat([inp(r, (n * numel,))[me * numel : (me + 1) * numel] for r in members])
            chk.equal(out, ref, what)
        elif op == "broadcast":
            t = place(inp(ctx.rank), mem)
            if k % 2:
                g.broadcast(t, root)
            else:
                gfdit.broadcast(t, root, group=g)
            chk.equal(t, inp(root), what + f" root={root}")
        elif op == "send_recv":
            src, dst = members
            if ctx.rank == src:
                gfdit.send(place(inp(src), mem), dst)
            else:
                y = sentinel((numel,), dtype, mem)
                gfdit.recv(y, src)
                chk.equal(y, inp(src), what + f" {src}->{dst}")
        elif op == "barrier":
            g.barrier()
    chk.raise_if_any()
    return ran


def expected_counts(seed, world_size, count, large_every):
    """How many instances each rank belongs to."""
    counts = [0] * world_size
    for op, members, *_ in build_schedule(seed, world_size, count, large_every):
        for r in members:
            counts[r] += 1
    return counts
