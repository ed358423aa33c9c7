"""Case functions of test_collectives.py; they run on every rank of an mp_harness.World.

Each case runs all ranks through the same sequence of gfdit calls (ranks outside a subgroup skip that
group's calls), checks each result against a reference computed locally from the deterministic inputs and,
for whole-world groups, against torch.distributed (gloo) on the same inputs.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from cases_common import (
    FLOAT_DTYPES,
    LARGE_BYTES,
    Checker,
    dtype_of,
    generator,
    place,
    rand_tensor,
    reduce_ref,
    reduce_scale,
    sentinel,
)

TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

# Tags that keep the input streams of different collectives apart.
T_AG, T_A2A, T_RS, T_AR, T_BC, T_P2P, T_4D, T_PUT = range(1, 9)


def _group(ranks):
    import gfdit

    return None if ranks is None else gfdit.new_group(list(ranks))


def _members(ctx, ranks):
    return list(range(ctx.world_size)) if ranks is None else list(ranks)


def _call(name, group, use_method, *args, **kwargs):
    """gfdit.<name>(*args, group=group, ...) or group.<name>(*args, ...)."""
    import gfdit

    if use_method:
        if group is None:
            group = gfdit.new_group(list(range(gfdit.get_world_size())))
        return getattr(group, name)(*args, **kwargs)
    return getattr(gfdit, name)(*args, group=group, **kwargs)


def _random_shape(gen, max_rows=40):
    rows = int(torch.randint(1, max_rows + 1, (1,), generator=gen))
    ndim_tail = int(torch.randint(0, 3, (1,), generator=gen))
    tail = tuple(int(v) for v in torch.randint(1, 8, (ndim_tail,), generator=gen))
    return rows, tail


def _large_rows(dtype, tail):
    per_row = torch.empty(0, dtype=dtype_of(dtype)).element_size()
    for t in tail:
        per_row *= t
    return LARGE_BYTES // per_row + 3


def _shapes(seed, dtype, size):
    """(rows, tail) list for a size class: "random" (several), "large" (> LARGE_BYTES per rank), "empty"."""
    gen = generator(seed, 99)
    if size == "random":
        return [_random_shape(gen) for _ in range(3)]
    if size == "large":
        tail = (256,)
        return [(_large_rows(dtype, tail), tail)]
    if size == "empty":
        return [(0, ()), (0, (5,))]
    raise ValueError(size)


MEM_COMBOS = [("plain", "plain"), ("heap", "heap"), ("plain", "heap"), ("heap", "plain")]


# ------------------------------------------------------------------------------------------------------
def case_all_gather(ctx, seed, dtype, ranks=None, size="random", use_method=False, mems=None):

    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    n = len(members)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    mems = mems or MEM_COMBOS
    for k, (rows, tail) in enumerate(_shapes(seed, dtype, size)):
        for m, (mem_in, mem_out) in enumerate(mems):
            key = (seed, T_AG, k, m)
            if ctx.rank in members:
                inp = place(rand_tensor((rows, *tail), dtype, *key, ctx.rank), mem_in)
                out = sentinel((n * rows, *tail), dtype, mem_out)
                _call("all_gather_into_tensor", group, use_method, out, inp)
                ref = torch.cat([rand_tensor((rows, *tail), dtype, *key, r) for r in members])
                what = f"all_gather {dtype} group={members} shape={(rows, *tail)} in={mem_in} out={mem_out}"
                chk.equal(out, ref, what)
                chk.equal(inp, rand_tensor((rows, *tail), dtype, *key, ctx.rank), what + " (input modified)")
            if ranks is None and rows > 0 and m == 0:
                gref = torch.empty((n * rows, *tail), dtype=dtype_of(dtype))
                dist.all_gather_into_tensor(gref, rand_tensor((rows, *tail), dtype, *key, ctx.rank))
                chk.equal(out, gref, f"all_gather {dtype} vs gloo shape={(rows, *tail)}")
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def _split_matrix(seed, n, even, k):
    gen = generator(seed, T_A2A, 7, k)
    if even:
        rows = int(torch.randint(1, 6, (1,), generator=gen))
        return [[rows] * n for _ in range(n)]
    m = torch.randint(0, 6, (n, n), generator=gen)
    m[0, n - 1] = 0  # at least one empty pair
    m[n - 1, 0] = 7
    return m.tolist()


def case_all_to_all_single(
    ctx, seed, dtype, ranks=None, split="uneven", use_method=False, mems=None, tail=(3,)
):
    """split: "even" (no split sizes), "even_explicit", "uneven", "large" (even, > LARGE_BYTES), "empty"."""
    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    n = len(members)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    mems = mems or MEM_COMBOS
    tail = tuple(tail)
    for m, (mem_in, mem_out) in enumerate(mems):
        key = (seed, T_A2A, m)
        if split == "large":
            rows = _large_rows(dtype, tail) // n + 1
            mat = [[rows] * n for _ in range(n)]
        elif split == "empty":
            mat = [[0] * n for _ in range(n)]
        else:
            mat = _split_matrix(seed, n, split.startswith("even"), m)
        pass_splits = split in ("uneven", "empty", "even_explicit")

        def rank_in(r):
            i = members.index(r)
            return rand_tensor((sum(mat[i]), *tail), dtype, *key, r)

        if ctx.rank in members:
            me = members.index(ctx.rank)
            in_splits = list(mat[me])
            out_splits = [mat[j][me] for j in range(n)]
            inp = place(rank_in(ctx.rank), mem_in)
            out = sentinel((sum(out_splits), *tail), dtype, mem_out)
            if pass_splits:
                _call(
                    "all_to_all_single",
                    group,
                    use_method,
                    out,
                    inp,
                    output_split_sizes=out_splits,
                    input_split_sizes=in_splits,
                )
            else:
                _call("all_to_all_single", group, use_method, out, inp)
            blocks = []
            for j, r in enumerate(members):
                start = sum(mat[j][:me])
                blocks.append(rank_in(r)[start : start + mat[j][me]])
            ref = torch.cat(blocks)
            chk.equal(
                out,
                ref,
                f"all_to_all_single {dtype} group={members} split={split} mat={mat} "
                f"in={mem_in} out={mem_out}",
            )
            if ranks is None and m == 0 and sum(map(sum, mat)) > 0:
                gref = torch.empty_like(ref)
                dist.all_to_all_single(gref, rank_in(ctx.rank), out_splits, in_splits)
                chk.equal(out, gref, f"all_to_all_single {dtype} vs gloo mat={mat}")
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def case_reduce_scatter(
    ctx, seed, dtype, op="sum", ranks=None, size="random", use_method=False, op_form="str", mems=None
):
    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    n = len(members)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    mems = mems or MEM_COMBOS[:2]
    op_arg = op if op_form == "str" else TORCH_OPS[op]
    for k, (rows, tail) in enumerate(_shapes(seed, dtype, size)):
        if size == "large":
            rows = rows // n + 1
        for m, (mem_in, mem_out) in enumerate(mems):
            key = (seed, T_RS, k, m)
            full = (n * rows, *tail)
            if ctx.rank in members:
                me = members.index(ctx.rank)
                inp = place(rand_tensor(full, dtype, *key, ctx.rank, kind="sum", n=n), mem_in)
                out = sentinel((rows, *tail), dtype, mem_out)
                _call("reduce_scatter_tensor", group, use_method, out, inp, op=op_arg)
                blocks = [
                    rand_tensor(full, dtype, *key, r, kind="sum", n=n)[me * rows : (me + 1) * rows]
                    for r in members
                ]
                what = f"reduce_scatter {op} {dtype} group={members} shape={full} in={mem_in} out={mem_out}"
                chk.reduced(out, reduce_ref(blocks, op, dtype), reduce_scale(blocks), dtype, what)
            if ranks is None and rows > 0 and m == 0:
                gref = torch.empty((rows, *tail), dtype=dtype_of(dtype))
                dist.reduce_scatter_tensor(
                    gref, rand_tensor(full, dtype, *key, ctx.rank, kind="sum", n=n), op=TORCH_OPS[op]
                )
                lo, hi = ctx.rank * rows, (ctx.rank + 1) * rows
                blocks = [rand_tensor(full, dtype, *key, r, kind="sum", n=n)[lo:hi] for r in members]
                chk.reduced(
                    out,
                    gref.to(torch.float64) if dtype in FLOAT_DTYPES else gref,
                    reduce_scale(blocks),
                    dtype,
                    f"reduce_scatter {op} {dtype} vs gloo",
                    slack=2.0,
                )
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def case_all_reduce(
    ctx,
    seed,
    dtype,
    op="sum",
    ranks=None,
    size="random",
    use_method=False,
    op_form="str",
    mems=("plain", "heap"),
):
    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    n = len(members)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    op_arg = op if op_form == "str" else TORCH_OPS[op]
    for k, (rows, tail) in enumerate(_shapes(seed, dtype, size)):
        for m, mem in enumerate(mems):
            key = (seed, T_AR, k, m)
            shape = (rows, *tail)
            result = torch.zeros(shape, dtype=dtype_of(dtype))
            if ctx.rank in members:
                t = place(rand_tensor(shape, dtype, *key, ctx.rank, kind="sum", n=n), mem)
                _call("all_reduce", group, use_method, t, op=op_arg)
                ins = [rand_tensor(shape, dtype, *key, r, kind="sum", n=n) for r in members]
                what = f"all_reduce {op} {dtype} group={members} shape={shape} mem={mem}"
                chk.reduced(t, reduce_ref(ins, op, dtype), reduce_scale(ins), dtype, what)
                result = t.clone()
            if rows == 0:
                continue
            # Every member must hold bit-identical results (non-members contribute a dummy).
            everyone = [torch.empty_like(result) for _ in range(ctx.world_size)]
            dist.all_gather(everyone, result)
            if ctx.rank in members:
                for r in members:
                    chk.bitwise_equal(
                        everyone[r], result, f"all_reduce {op} {dtype} bits of rank {r} vs mine"
                    )
            if ranks is None and m == 0:
                gref = rand_tensor(shape, dtype, *key, ctx.rank, kind="sum", n=n)
                dist.all_reduce(gref, op=TORCH_OPS[op])
                ins = [rand_tensor(shape, dtype, *key, r, kind="sum", n=n) for r in members]
                chk.reduced(
                    result,
                    gref.to(torch.float64) if dtype in FLOAT_DTYPES else gref,
                    reduce_scale(ins),
                    dtype,
                    f"all_reduce {op} {dtype} vs gloo",
                    slack=2.0,
                )
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def case_broadcast(
    ctx, seed, dtype, src, ranks=None, size="random", use_method=False, mems=("plain", "heap")
):
    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    for k, (rows, tail) in enumerate(_shapes(seed, dtype, size)):
        for m, mem in enumerate(mems):
            key = (seed, T_BC, k, m)
            shape = (rows, *tail)
            if ctx.rank in members:
                t = place(rand_tensor(shape, dtype, *key, ctx.rank), mem)
                if use_method:
                    _call("broadcast", group, True, t, src)
                else:
                    import gfdit

                    gfdit.broadcast(t, src, group=group)
                chk.equal(
                    t,
                    rand_tensor(shape, dtype, *key, src),
                    f"broadcast {dtype} src={src} group={members} shape={shape} mem={mem}",
                )
            if ranks is None and rows > 0 and m == 0:
                gref = rand_tensor(shape, dtype, *key, ctx.rank)
                dist.broadcast(gref, src)
                chk.equal(t, gref, f"broadcast {dtype} src={src} vs gloo")
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def case_send_recv(ctx, seed, dtype, transfers, size="random", mems=("plain", "heap")):
    """transfers: list of (src, dst) in one global order; each rank runs the ones it takes part in."""
    import gfdit

    chk = Checker(ctx.rank)
    shapes = _shapes(seed, dtype, size)
    for t_idx, (src, dst) in enumerate(transfers):
        rows, tail = shapes[t_idx % len(shapes)]
        shape = (rows, *tail)
        mem = mems[t_idx % len(mems)]
        key = (seed, T_P2P, t_idx)
        if ctx.rank == src:
            x = place(rand_tensor(shape, dtype, *key, src), mem)
            gfdit.send(x, dst)
            chk.equal(x, rand_tensor(shape, dtype, *key, src), f"send {src}->{dst} modified its input")
        elif ctx.rank == dst:
            y = sentinel(shape, dtype, mem)
            gfdit.recv(y, src)
            chk.equal(
                y, rand_tensor(shape, dtype, *key, src), f"recv {src}->{dst} #{t_idx} {dtype} {shape} {mem}"
            )
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def case_barrier(ctx, ranks=None, use_method=False, delay=0.15):
    """Members enter at staggered times; returns (enter, leave) wall times for the parent to compare."""
    members = _members(ctx, ranks)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    if ctx.rank not in members:
        return None
    time.sleep(delay * members.index(ctx.rank))
    enter = time.time()
    if use_method:
        _call("barrier", group, True)
    else:
        import gfdit

        gfdit.barrier(group=group)
    return (enter, time.time())


# ------------------------------------------------------------------------------------------------------
def case_all_to_all_4d(ctx, seed, dtype, ranks=None, use_method=False, mems=("plain", "heap"), large=False):
    """Sequence <-> head shuffle both ways, against a local reference, gloo (whole world) and a round trip."""
    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    n = len(members)
    group = _group(ranks) if ctx.rank in members else None  # only members may form it
    gen = generator(seed, T_4D)
    for m, mem in enumerate(mems):
        b = int(torch.randint(1, 3, (1,), generator=gen))
        s_local = int(torch.randint(1, 6, (1,), generator=gen))
        hn = int(torch.randint(1, 4, (1,), generator=gen))
        d = int(torch.randint(1, 9, (1,), generator=gen))
        if large:
            d = LARGE_BYTES // (b * s_local * hn * n * 4) + 1
        h = hn * n
        key = (seed, T_4D, m)
        fwd_shape = (b, s_local, h, d)

        def fwd_in(r):
            return rand_tensor(fwd_shape, dtype, *key, r)

        if ctx.rank in members:
            me = members.index(ctx.rank)
            inp = place(fwd_in(ctx.rank), mem)
            out = sentinel((b, s_local * n, hn, d), dtype, mem)
            if use_method:
                _call("all_to_all_4d", group, True, out, inp, scatter_dim=2, gather_dim=1)
            else:
                import gfdit

                gfdit.all_to_all_4d(out, inp, scatter_dim=2, gather_dim=1, group=group)
            ref = torch.cat([fwd_in(r)[:, :, me * hn : (me + 1) * hn] for r in members], dim=1)
            what = f"all_to_all_4d seq<-heads {dtype} group={members} in={fwd_shape} mem={mem}"
            chk.equal(out, ref, what)
            if ranks is None and m == 0:
                perm = fwd_in(ctx.rank).reshape(b, s_local, n, hn, d).permute(2, 0, 1, 3, 4).contiguous()
                got = torch.empty_like(perm)
                dist.all_to_all_single(got, perm)
                gref = got.permute(1, 0, 2, 3, 4).reshape(b, n * s_local, hn, d)
                chk.equal(out, gref, what + " vs gloo")

            # Reverse: [B, S, H/n, D] -> [B, S/n, H, D]; first on fresh inputs, then the round trip.
            rev_shape = (b, s_local * n, hn, d)

            def rev_in(r):
                return rand_tensor(rev_shape, dtype, *key, r, 1)

            rin = place(rev_in(ctx.rank), mem)
            rout = sentinel((b, s_local, h, d), dtype, mem)
            import gfdit

            if use_method:
                _call("all_to_all_4d", group, True, rout, rin, scatter_dim=1, gather_dim=2)
            else:
                gfdit.all_to_all_4d(rout, rin, scatter_dim=1, gather_dim=2, group=group)
            rref = torch.cat([rev_in(r)[:, me * s_local : (me + 1) * s_local] for r in members], dim=2)
            chk.equal(
                rout, rref, f"all_to_all_4d heads<-seq {dtype} group={members} in={rev_shape} mem={mem}"
            )

            back = sentinel(fwd_shape, dtype, mem)
            gfdit.all_to_all_4d(back, out, scatter_dim=1, gather_dim=2, group=group)
            chk.equal(back, fwd_in(ctx.rank), f"all_to_all_4d round trip {dtype} group={members} mem={mem}")
    return chk.raise_if_any()


def case_all_to_all_4d_head_splits(ctx, seed, dtype, ranks=None, use_method=False, mems=("plain", "heap")):
    """The 4-D shuffle with uneven head splits (some member may hold no head) and uneven sequence splits,
    both directions and the round trip, against a local reference."""
    import gfdit

    chk = Checker(ctx.rank)
    members = _members(ctx, ranks)
    n = len(members)
    group = _group(ranks) if ctx.rank in members else None
    gen = generator(seed, T_4D, 7)
    for m, mem in enumerate(mems):
        b = int(torch.randint(1, 3, (1,), generator=gen))
        d = int(torch.randint(1, 9, (1,), generator=gen))
        seq = [int(x) for x in torch.randint(0, 6, (n,), generator=gen)]
        seq[m % n] += 1
        if m == 0:  # the convention gfdit.attention uses: the first H % n members hold one more head
            heads = gfdit.comm.even_head_splits(n + 1 + int(torch.randint(0, n, (1,), generator=gen)), n)
        else:  # any split, a member may hold none
            heads = [int(x) for x in torch.randint(0, 4, (n,), generator=gen)]
            heads[(m + 1) % n] += 1
        h = sum(heads)
        hoff = [sum(heads[:j]) for j in range(n)]
        key = (seed, T_4D, 7, m)
        if ctx.rank not in members:
            continue
        me = members.index(ctx.rank)

        def fwd_in(r):
            return rand_tensor((b, seq[members.index(r)], h, d), dtype, *key, r)

        what = f"{dtype} group={members} seq={seq} heads={heads} mem={mem}"
        inp = place(fwd_in(ctx.rank), mem)
        out = sentinel((b, sum(seq), heads[me], d), dtype, mem)
        kw = {"scatter_dim": 2, "gather_dim": 1, "seq_splits": seq, "head_splits": heads}
        if use_method:
            _call("all_to_all_4d", group, True, out, inp, **kw)
        else:
            gfdit.all_to_all_4d(out, inp, group=group, **kw)
        ref = torch.cat([fwd_in(r)[:, :, hoff[me] : hoff[me] + heads[me]] for r in members], dim=1)
        chk.equal(out, ref, "all_to_all_4d seq<-heads " + what)

        def rev_in(r):
            return rand_tensor((b, sum(seq), heads[members.index(r)], d), dtype, *key, r, 1)

        rin = place(rev_in(ctx.rank), mem)
        rout = sentinel((b, seq[me], h, d), dtype, mem)
        kw = {"scatter_dim": 1, "gather_dim": 2, "seq_splits": seq, "head_splits": heads}
        if use_method:
            _call("all_to_all_4d", group, True, rout, rin, **kw)
        else:
            gfdit.all_to_all_4d(rout, rin, group=group, **kw)
        lo = sum(seq[:me])
        rref = torch.cat([rev_in(r)[:, lo : lo + seq[me]] for r in members], dim=2)
        chk.equal(rout, rref, "all_to_all_4d heads<-seq " + what)

        back = sentinel((b, seq[me], h, d), dtype, mem)
        gfdit.all_to_all_4d(back, out, group=group, **kw)
        chk.equal(back, fwd_in(ctx.rank), "all_to_all_4d round trip " + what)
    return chk.raise_if_any()


# ------------------------------------------------------------------------------------------------------
def case_group_descriptor(ctx, ranks):
    """Group attributes on every member; returns (ranks, size, rank) as seen by this rank."""
    import gfdit

    if ctx.rank not in ranks:
        return None
    g = gfdit.new_group(list(ranks))
    return (list(g.ranks), g.size(), g.rank())


# ------------------------------------------------------------------------------------------------------
def case_put_with_signal(ctx, seed, dtype):
    """One-sided puts around a ring, into a whole heap tensor, into views of one, several, and a large one.

    Every rank allocates the same sequence of heap tensors, so offsets match (symmetric heap).
    """
    import gfdit

    chk = Checker(ctx.rank)
    n = ctx.world_size
    nxt, prv = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    gen = generator(seed, T_PUT)
    rows = int(torch.randint(1, 40, (1,), generator=gen))
    cols = int(torch.randint(1, 50, (1,), generator=gen))
    big_rows = LARGE_BYTES // (cols * torch.empty(0, dtype=dtype_of(dtype)).element_size()) + 1

    whole = gfdit.empty((rows, cols), dtype=dtype_of(dtype))
    slots = gfdit.empty((4, rows, cols), dtype=dtype_of(dtype))
    big = gfdit.empty((big_rows, cols), dtype=dtype_of(dtype))
    for t in (whole, slots, big):
        chk.true(gfdit.is_heap_tensor(t), "gfdit.empty is a heap tensor")
        t.copy_(torch.full(t.shape, 77, dtype=torch.int64).to(t.dtype))
    chk.true(not gfdit.is_heap_tensor(torch.empty(3)), "an ordinary tensor is not a heap tensor")
    gfdit.barrier()  # every destination is allocated and prefilled before any put lands

    # 1. Whole tensor, from an ordinary source tensor.
    src = rand_tensor((rows, cols), dtype, seed, T_PUT, 1, ctx.rank)
    gfdit.put_with_signal(src, whole, nxt)
    gfdit.wait_signal(prv, 1)
    chk.equal(whole, rand_tensor((rows, cols), dtype, seed, T_PUT, 1, prv), f"put whole from {prv}")
    chk.equal(src, rand_tensor((rows, cols), dtype, seed, T_PUT, 1, ctx.rank), "put modified its source")

    # 2. Three puts into views (slots 3, 0, 2) from a heap source, then one wait for all three.
    order = [3, 0, 2]
    for i, s in enumerate(order):
        hsrc = place(rand_tensor((rows, cols), dtype, seed, T_PUT, 2, i, ctx.rank), "heap")
        gfdit.put_with_signal(hsrc, slots[s], nxt)
        del hsrc
    gfdit.wait_signal(prv, count=3)
    for i, s in enumerate(order):
        chk.equal(slots[s], rand_tensor((rows, cols), dtype, seed, T_PUT, 2, i, prv), f"put into slot {s}")
    fill = torch.full((rows, cols), 77, dtype=torch.int64).to(dtype_of(dtype))
    chk.equal(slots[1], fill, "slot 1 (never put) stays untouched")

    # 3. Large put (> a staging slot), to the previous rank this time (the other direction).
    bsrc = rand_tensor((big_rows, cols), dtype, seed, T_PUT, 3, ctx.rank)
    gfdit.put_with_signal(bsrc, big, prv)
    gfdit.wait_signal(nxt, 1)
    chk.equal(big, rand_tensor((big_rows, cols), dtype, seed, T_PUT, 3, nxt), f"large put from {nxt}")

    # 4. A partial put into rows 5:7 of the large buffer (after every rank has checked step 3).
    gfdit.barrier()
    part = rand_tensor((2, cols), dtype, seed, T_PUT, 4, ctx.rank)
    gfdit.put_with_signal(part, big[5:7], nxt)
    gfdit.wait_signal(prv, 1)
    chk.equal(big[5:7], rand_tensor((2, cols), dtype, seed, T_PUT, 4, prv), f"partial put from {prv}")
    chk.equal(
        big[7:9], rand_tensor((big_rows, cols), dtype, seed, T_PUT, 3, nxt)[7:9], "rows after partial put"
    )

    gfdit.barrier()  # nobody frees its heap while a peer may still write into it
    return chk.raise_if_any()
