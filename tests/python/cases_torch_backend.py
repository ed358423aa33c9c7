"""Rank-side cases of test_torch_backend.py: torch.distributed on the "gfdit" backend against gloo.

Every rank's default process group is gfdit (``dist.init_process_group("gfdit")``); the reference is a gloo
group over the same ranks made with ``dist.new_group(backend="gloo")``. A case runs the same torch.distributed
call on both with the same fresh random inputs and returns what differs.
"""

from __future__ import annotations

import datetime
import itertools

import torch
import torch.distributed as dist

_STATE: dict = {}


def setup(ctx) -> str:
    """Makes gfdit the default process group (once per rank process) and the gloo reference groups."""
    import gfdit  # noqa: F401  (registers the backend)

    if not dist.is_initialized():
        dist.init_process_group(
            "gfdit",
            store=dist.PrefixStore("torch-backend", ctx.store),
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=datetime.timedelta(seconds=ctx.timeout),
        )
        _STATE["gloo"] = {}
    return dist.get_backend()


def _pair(ranks: list[int]):
    """(gfdit group, gloo group) over ranks; every rank calls this for every group, as torch requires."""
    from gfdit.comm.torch_backend import ProcessGroupGfdit

    gf = dist.new_group(ranks)
    key = tuple(ranks)
    if key not in _STATE["gloo"]:
        _STATE["gloo"][key] = dist.new_group(ranks, backend="gloo")
    gl = _STATE["gloo"][key]
    if ctx_rank() in ranks:
        # torch's fast subgroup path must not hand a gfdit group to a caller that asked for gloo.
        if not isinstance(gf, ProcessGroupGfdit) or dist.get_backend(gf) != "gfdit":
            raise AssertionError(f"new_group({ranks}) gave {gf!r} on backend {dist.get_backend(gf)}")
        if isinstance(gl, ProcessGroupGfdit) or dist.get_backend(gl) != "gloo":
            raise AssertionError(f"new_group({ranks}, backend='gloo') gave {gl!r}")
    return gf, gl


def ctx_rank() -> int:
    return dist.get_rank()


def _groups(n: int) -> list[list[int]]:
    out = [list(range(n))]
    if n >= 4:
        out += [[0, 2], [1, 3], [1, 2, 3]]
    if n >= 3:
        out.append([0, 2])
    return out


def _rand(shape, dtype, gen) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    return torch.randint(-50 if dtype != torch.uint8 else 0, 50, shape, generator=gen).to(dtype)


def _cmp(name: str, got: torch.Tensor, want: torch.Tensor, errors: list, exact: bool = True) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        errors.append(f"{name}: {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}")
        return
    if exact or not got.is_floating_point():
        ok = torch.equal(got, want)
    else:
        # gloo adds bf16 values one rounding at a time, gfdit accumulates in float32 and rounds once.
        bf16 = got.dtype == torch.bfloat16
        ok = torch.allclose(
            got.float(), want.float(), rtol=2e-2 if bf16 else 1e-5, atol=0.0625 if bf16 else 1e-5
        )
    if not ok:
        errors.append(f"{name}: differs (max |diff| {(got.double() - want.double()).abs().max().item()})")


def collectives(ctx, seed: int) -> list:
    """Every collective of torch.distributed that the backend implements, on the world and subgroups."""
    n = ctx.world_size
    errors: list = []
    gen = torch.Generator().manual_seed(seed * 1000 + ctx.rank)
    for ranks in _groups(n):
        gf, gl = _pair(ranks)
        if ctx.rank not in ranks:
            if gf != dist.GroupMember.NON_GROUP_MEMBER:
                errors.append(f"{ranks}: a non-member got {gf!r}")
            continue
        m = len(ranks)
        me = ranks.index(ctx.rank)
        tag = f"{ranks}"
        for dtype, op in itertools.product(
            (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32),
            (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT),
        ):
            x = _rand((5, 7), dtype, gen)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op, group=gf)
            dist.all_reduce(b, op=op, group=gl)
            _cmp(f"{tag} all_reduce {dtype} {op}", a, b, errors, exact=False)
        x = _rand((6, 3), torch.float32, gen)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=dist.ReduceOp.AVG, group=gf)
        dist.all_reduce(b, op=dist.ReduceOp.SUM, group=gl)
        _cmp(f"{tag} all_reduce AVG", a, b / m, errors, exact=False)
        # A non-contiguous tensor (a transposed view) is reduced in place.
        x = _rand((4, 6), torch.float32, gen)
        a, b = x.clone().t(), x.clone().t()
        dist.all_reduce(a, group=gf)
        dist.all_reduce(b, group=gl)
        _cmp(f"{tag} all_reduce non-contiguous", a, b, errors, exact=False)

        for dtype in (torch.float32, torch.float64, torch.bool, torch.int8, torch.complex64):
            x = (
                _rand((3, 4), dtype, gen)
                if dtype != torch.complex64
                else torch.randn(3, 4, generator=gen, dtype=dtype)
            )
            a = torch.empty((m * 3, 4), dtype=dtype)
            b = torch.empty((m * 3, 4), dtype=dtype)
            dist.all_gather_into_tensor(a, x, group=gf)
            dist.all_gather_into_tensor(b, x, group=gl)
            _cmp(f"{tag} all_gather_into_tensor {dtype}", a, b, errors)
            la = [torch.empty_like(x) for _ in range(m)]
            lb = [torch.empty_like(x) for _ in range(m)]
            dist.all_gather(la, x, group=gf)
            dist.all_gather(lb, x, group=gl)
            for k in range(m):
                _cmp(f"{tag} all_gather[{k}] {dtype}", la[k], lb[k], errors)

        for dtype in (torch.float32, torch.int64):
            x = _rand((m * 4, 5), dtype, gen)
            a = torch.empty((4, 5), dtype=dtype)
            b = torch.empty((4, 5), dtype=dtype)
            dist.reduce_scatter_tensor(a, x, group=gf)
            dist.reduce_scatter_tensor(b, x, group=gl)
            _cmp(f"{tag} reduce_scatter_tensor {dtype}", a, b, errors, exact=False)
            parts = [_rand((2, 3), dtype, gen) for _ in range(m)]
            a = torch.empty((2, 3), dtype=dtype)
            dist.reduce_scatter(a, [p.clone() for p in parts], group=gf)
            # gloo has no list reduce_scatter: the reference is an all_reduce of the parts.
            ref = torch.cat([p.reshape(1, -1) for p in parts]).clone()
            dist.all_reduce(ref, group=gl)
            _cmp(f"{tag} reduce_scatter {dtype}", a, ref[me].view(2, 3), errors, exact=False)

        for dtype in (torch.float32, torch.bfloat16, torch.bool):
            x = _rand((m * 3, 2), dtype, gen)
            a, b = torch.empty_like(x), torch.empty_like(x)
            dist.all_to_all_single(a, x, group=gf)
            dist.all_to_all_single(b, x, group=gl)
            _cmp(f"{tag} all_to_all_single {dtype}", a, b, errors)
        # Uneven splits: rank r sends j + r + 1 rows to member j.
        ins = [j + me + 1 for j in range(m)]
        outs = [me + j + 1 for j in range(m)]
        x = _rand((sum(ins), 3), torch.float32, gen)
        a = torch.empty((sum(outs), 3))
        b = torch.empty((sum(outs), 3))
        dist.all_to_all_single(a, x, outs, ins, group=gf)
        dist.all_to_all_single(b, x, outs, ins, group=gl)
        _cmp(f"{tag} all_to_all_single splits", a, b, errors)
        xs = [_rand((2, 2), torch.float32, gen) for j in range(m)]  # gloo needs equal sizes
        la = [torch.empty((2, 2)) for _ in range(m)]
        lb = [torch.empty((2, 2)) for _ in range(m)]
        dist.all_to_all(la, xs, group=gf)
        dist.all_to_all(lb, xs, group=gl)
        for k in range(m):
            _cmp(f"{tag} all_to_all[{k}]", la[k], lb[k], errors)

        for src_idx in range(m):
            src = ranks[src_idx]
            x = _rand((7,), torch.float32, gen)
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=src, group=gf)
            dist.broadcast(b, src=src, group=gl)
            _cmp(f"{tag} broadcast from {src}", a, b, errors)
        root = ranks[-1]
        x = _rand((4,), torch.float32, gen)
        a, b = x.clone(), x.clone()
        dist.reduce(a, dst=root, group=gf)
        dist.reduce(b, dst=root, group=gl)
        if ctx.rank == root:  # elsewhere torch leaves the tensor unspecified (gloo writes partial sums)
            _cmp(f"{tag} reduce to {root}", a, b, errors, exact=False)
        x = _rand((3,), torch.float32, gen)
        la = [torch.empty(3) for _ in range(m)] if ctx.rank == root else None
        lb = [torch.empty(3) for _ in range(m)] if ctx.rank == root else None
        dist.gather(x, la, dst=root, group=gf)
        dist.gather(x, lb, dst=root, group=gl)
        if ctx.rank == root:
            for k in range(m):
                _cmp(f"{tag} gather[{k}]", la[k], lb[k], errors)
        parts = [_rand((2, 2), torch.float32, gen) for _ in range(m)]
        a, b = torch.empty(2, 2), torch.empty(2, 2)
        dist.scatter(a, parts if ctx.rank == root else None, src=root, group=gf)
        dist.scatter(b, parts if ctx.rank == root else None, src=root, group=gl)
        _cmp(f"{tag} scatter", a, b, errors)
        dist.barrier(group=gf)
    return errors


def functional(ctx, seed: int) -> list:
    """The functional collectives (what diffusers' context parallelism calls) and async_op=True works."""
    import torch.distributed._functional_collectives as funcol

    n = ctx.world_size
    errors: list = []
    gen = torch.Generator().manual_seed(seed * 1000 + ctx.rank)
    for ranks in _groups(n):
        gf, gl = _pair(ranks)
        if ctx.rank not in ranks:
            continue
        m = len(ranks)
        tag = f"{ranks}"
        x = _rand((2 * m, 3), torch.float32, gen)
        for name, fn in (
            ("all_gather_tensor", lambda t, g: funcol.all_gather_tensor(t, 0, g)),
            ("all_gather_tensor dim 1", lambda t, g: funcol.all_gather_tensor(t, 1, g)),
            ("all_reduce", lambda t, g: funcol.all_reduce(t, "sum", g)),
            ("reduce_scatter_tensor", lambda t, g: funcol.reduce_scatter_tensor(t, "sum", 0, g)),
            ("all_to_all_single", lambda t, g: funcol.all_to_all_single(t, None, None, g)),
            (
                "all_to_all_single splits",
                lambda t, g: funcol.all_to_all_single(t, [2] * m, [2] * m, g),
            ),
        ):
            a = funcol.wait_tensor(fn(x.clone(), gf))
            b = funcol.wait_tensor(fn(x.clone(), gl))
            _cmp(
                f"{tag} funcol {name}",
                a,
                b,
                errors,
                exact=name not in ("all_reduce", "reduce_scatter_tensor"),
            )
        a, b = x.clone(), x.clone()
        wa = dist.all_reduce(a, group=gf, async_op=True)
        wb = dist.all_reduce(b, group=gl, async_op=True)
        wa.wait()
        wb.wait()
        _cmp(f"{tag} all_reduce async_op", a, b, errors, exact=False)
    return errors


def every_rank_makes_every_group(ctx) -> dict:
    """The torch idiom (``for ranks in groups: g = new_group(ranks); if rank in ranks: mine = g``) and the
    time of one new_group on each backend."""
    import time

    n = ctx.world_size
    pairs = [[a, b] for a in range(n) for b in range(a + 1, n)]
    t0 = time.perf_counter()
    mine = [g for ranks in pairs for g in [dist.new_group(ranks)] if ctx.rank in ranks]
    per_group = (time.perf_counter() - t0) / len(pairs)
    sums = []
    for g in mine:
        t = torch.full((2,), float(ctx.rank + 1))
        dist.all_reduce(t, group=g)
        sums.append(t[0].item())
    return {"per_group_s": per_group, "sums": sums, "num_mine": len(mine)}


def device_mesh(ctx) -> list:
    """init_device_mesh on the default (gfdit) backend: dimension groups, a flattened mesh, their ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    n = ctx.world_size
    errors: list = []
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("ring", "ulysses"))
    for dim in ("ring", "ulysses"):
        pg = mesh[dim].get_group()
        if dist.get_backend(pg) != "gfdit":
            errors.append(f"{dim}: backend {dist.get_backend(pg)}")
        ranks = dist.get_process_group_ranks(pg)
        t = torch.tensor([float(ctx.rank)])
        dist.all_reduce(t, group=pg)
        if t.item() != float(sum(ranks)):
            errors.append(f"{dim} {ranks}: sum {t.item()}")
    flat = mesh["ring", "ulysses"]._flatten()
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=flat.get_group())
    if t.item() != n:
        errors.append(f"flattened mesh: sum {t.item()}")
    return errors


def point_to_point(ctx, seed: int) -> list:
    """send/recv, isend/irecv and batch_isend_irecv rings (the pattern of yunchang's ring attention)."""
    n = ctx.world_size
    errors: list = []
    r = ctx.rank

    def value(src: int, dst: int, k: int, shape=(5, 3)) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 100003 + src * 1009 + dst * 17 + k)
        return torch.randn(shape, generator=g)

    # Blocking pairs: even ranks send first, odd ranks receive first, and back.
    peer = r ^ 1
    if peer < n:
        got = torch.empty(5, 3)
        if r % 2 == 0:
            dist.send(value(r, peer, 0), dst=peer)
            dist.recv(got, src=peer)
        else:
            dist.recv(got, src=peer)
            dist.send(value(r, peer, 0), dst=peer)
        _cmp(f"send/recv from {peer}", got, value(peer, r, 0), errors)
    # A ring of batched isend/irecv, twice, with two messages each way, in both orders of the ops.
    for it in range(2):
        nxt, prv = (r + 1) % n, (r - 1) % n
        bufs = [torch.empty(5, 3), torch.empty(4)]
        ops = [
            dist.P2POp(dist.isend, value(r, nxt, it), nxt),
            dist.P2POp(dist.irecv, bufs[0], prv),
            dist.P2POp(dist.isend, value(r, nxt, it + 10, (4,)), nxt),
            dist.P2POp(dist.irecv, bufs[1], prv),
        ]
        if it:
            ops = ops[1::2] + ops[0::2]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        _cmp(f"ring {it} msg 0", bufs[0], value(prv, r, it), errors)
        _cmp(f"ring {it} msg 1", bufs[1], value(prv, r, it + 10, (4,)), errors)
    # isend to every other rank, irecv from every other rank, then a collective (which runs the queue).
    works, got = [], {}
    for p in range(n):
        if p != r:
            works.append(dist.isend(value(r, p, 7), dst=p))
            got[p] = torch.empty(5, 3)
            works.append(dist.irecv(got[p], src=p))
    t = torch.ones(1)
    dist.all_reduce(t)
    for w in works:
        w.wait()
    for p, t in got.items():
        _cmp(f"all-pairs from {p}", t, value(p, r, 7), errors)
    return errors


def _fake_cuda(*shape) -> torch.Tensor:
    """A CUDA tensor without memory (torch's FakeTensorMode works on CPU-only builds)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(shape, device="cuda")


def refused(ctx) -> list:
    """What the backend does not support is refused on every rank with a message that names it."""
    msgs = []
    attempts = [
        ("int16 all_reduce", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16))),
        ("BAND", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND)),
        ("meta tensor", lambda: dist.all_reduce(torch.empty(3, device="meta"))),
        ("recv from any source", lambda: dist.recv(torch.empty(3))),
        ("tag", lambda: dist.send(torch.ones(3), dst=(ctx.rank + 1) % ctx.world_size, tag=5)),
        ("monitored_barrier", lambda: dist.monitored_barrier()),
        ("AVG int", lambda: dist.all_reduce(avg_int, op=dist.ReduceOp.AVG)),
        ("CUDA all_reduce", lambda: dist.all_reduce(_fake_cuda(3))),
        (
            "CUDA all_gather",
            lambda: dist.all_gather_into_tensor(_fake_cuda(2 * ctx.world_size), _fake_cuda(2)),
        ),
        ("CUDA send", lambda: dist.send(_fake_cuda(3), dst=(ctx.rank + 1) % ctx.world_size)),
    ]
    avg_int = torch.arange(3, dtype=torch.int32)
    for name, fn in attempts:
        try:
            fn()
            msgs.append((name, None))
        except Exception as exc:  # noqa: BLE001 - the message is the result
            msgs.append((name, str(exc)))
    # Still usable afterwards, and the refused AVG left its tensor as it was.
    t = torch.ones(1)
    dist.all_reduce(t)
    msgs.append(("after", t.item()))
    msgs.append(("avg int untouched", avg_int.tolist()))
    return msgs


def gfdit_groups(ctx) -> dict:
    """gfdit's own groups over the backend's world: a non-member's handle describes the group and refuses
    its collectives; a member's handle runs gfdit operations on ranks that torch code grouped."""
    import gfdit
    from gfdit.comm.torch_backend import group_of

    whole = group_of()
    world = whole._world
    other = (ctx.rank + 1) % ctx.world_size
    outsider = world.new_group([other])
    try:
        outsider.all_reduce(torch.ones(2))
        refused = ""
    except gfdit.InvalidUsage as exc:
        refused = str(exc)
    torch_pair = dist.new_group([0, 1])
    t = torch.full((3,), float(ctx.rank + 1))
    if ctx.rank < 2:
        group_of(torch_pair).all_reduce(t)
    return {
        "ranks": outsider.ranks,
        "rank": outsider.rank(),
        "is_member": outsider.is_member,
        "refused": refused,
        "whole": whole.ranks,
        "pair_sum": t[0].item(),
    }


def _message(seed: int, src: int, dst: int, k: int, shape, dtype) -> torch.Tensor:
    """The k-th message from src to dst: every rank can rebuild what any rank sends."""
    return _rand(shape, dtype, torch.Generator().manual_seed(seed * 100003 + src * 1009 + dst * 17 + k))


# (shape, dtype) of the messages each way of one pair: a and b differ in count, size and dtype.
_FROM_LOW = [((3,), torch.float64), ((7, 5), torch.int32), ((2, 2, 2), torch.bfloat16)]
_FROM_HIGH = [((4, 6), torch.float32), ((5,), torch.int64)]


def _directions(r: int, peer: int, seed: int, g, program: str) -> dict[int, torch.Tensor]:
    """One two-rank point-to-point program between r and peer on group g; the received tensors by index.

    Every program is valid on gloo except "both send first", which gloo runs only for messages small enough to
    be sent eagerly (none here), and which gfdit runs since its sends complete at the peer's process."""
    low = r < peer
    out_specs, in_specs = (_FROM_LOW, _FROM_HIGH) if low else (_FROM_HIGH, _FROM_LOW)
    outs = [_message(seed, r, peer, k, s, d) for k, (s, d) in enumerate(out_specs)]
    ins = [torch.full(s, 3, dtype=d) for s, d in in_specs]
    if program == "send waits first":
        # The lower rank waits on each send before it posts the receive its peer sent first (isend).
        if low:
            for t in outs:
                dist.send(t, peer, group=g)
            for t in ins:
                dist.recv(t, peer, group=g)
        else:
            works = [dist.isend(t, peer, group=g) for t in outs]
            for t in ins:
                dist.recv(t, peer, group=g)
            for w in works:
                w.wait()
    elif program == "isend wait":
        if low:
            for t in outs:
                dist.isend(t, peer, group=g).wait()
            for t in ins:
                dist.irecv(t, peer, group=g).wait()
        else:
            works = [dist.isend(t, peer, group=g) for t in outs]
            for t in ins:
                dist.irecv(t, peer, group=g).wait()
            for w in works:
                w.wait()
    elif program == "batch, receives first on one side":
        ops = [dist.P2POp(dist.isend, t, peer, group=g) for t in outs]
        recvs = [dist.P2POp(dist.irecv, t, peer, group=g) for t in ins]
        for w in dist.batch_isend_irecv(ops + recvs if low else recvs + ops):
            w.wait()
    elif program == "many each way":
        # More messages than one header describes, each way, all queued before any wait.
        n_out, n_in = (11, 9) if low else (9, 11)
        outs = [_message(seed, r, peer, 50 + k, (k + 1,), torch.float32) for k in range(n_out)]
        ins = [torch.empty(k + 1) for k in range(n_in)]
        works = [dist.isend(t, peer, group=g) for t in outs] + [dist.irecv(t, peer, group=g) for t in ins]
        for w in reversed(works):
            w.wait()
    elif program == "both send first":
        # gloo: each send waits for the peer's receive, which comes after the peer's send: a hang.
        for t in outs:
            dist.send(t, peer, group=g)
        ins[0] = ins[0].t() if ins[0].dim() == 2 else ins[0]  # a non-contiguous receive of a waiting message
        for t in ins:
            dist.recv(t, peer, group=g)
    else:
        raise ValueError(program)
    return dict(enumerate(ins))


_PROGRAMS = ("send waits first", "isend wait", "batch, receives first on one side", "many each way")


def p2p_directions(ctx, seed: int) -> list:
    """Messages match per direction: each program on pairs (0, 1) and (2, 3) against gloo running the same
    program, and the one program gloo cannot run against the values sent."""
    n, r = ctx.world_size, ctx.rank
    errors: list = []
    gf, gl = _pair(list(range(n)))
    peer = r ^ 1
    if peer >= n:
        return errors
    for i, program in enumerate(_PROGRAMS):
        got = _directions(r, peer, seed + i, gf, program)
        want = _directions(r, peer, seed + i, gl, program)
        for k in got:
            _cmp(f"{program}: message {k} from {peer}", got[k], want[k], errors)
    got = _directions(r, peer, seed, gf, "both send first")
    specs = _FROM_HIGH if r < peer else _FROM_LOW
    for k, (s, d) in enumerate(specs):
        want_t = _message(seed, peer, r, k, s, d)
        _cmp(f"both send first: message {k} from {peer}", got[k].reshape(want_t.shape), want_t, errors)
    return errors


def p2p_pipeline(ctx, seed: int) -> list:
    """A pipeline (each rank receives from the one before, then sends on) forward and back, and every rank
    sending to every other before it receives: valid on gloo, on every world size."""
    n, r = ctx.world_size, ctx.rank
    errors: list = []
    gf, gl = _pair(list(range(n)))
    for name, g in (("gfdit", gf), ("gloo", gl)):
        for direction, prv, nxt in (("forward", r - 1, r + 1), ("back", r + 1, r - 1)):
            x = torch.zeros(6) if 0 <= prv < n else _message(seed, r, nxt, 0, (6,), torch.float32)
            if 0 <= prv < n:
                dist.recv(x, prv, group=g)
                x += 1
            if 0 <= nxt < n:
                dist.send(x, nxt, group=g)
            first = 0 if direction == "forward" else n - 1
            want = _message(
                seed, first, first + (1 if direction == "forward" else -1), 0, (6,), torch.float32
            )
            _cmp(f"{name} pipeline {direction}", x, want + abs(r - first), errors, exact=False)
        works = [
            dist.isend(_message(seed, r, p, 3, (2, p + 1), torch.float32), p, group=g)
            for p in range(n)
            if p != r
        ]
        got = {p: torch.empty(2, r + 1) for p in range(n) if p != r}
        for p, t in got.items():
            dist.recv(t, p, group=g)
        for w in works:
            w.wait()
        for p, t in got.items():
            _cmp(
                f"{name} all send, then receive, from {p}",
                t,
                _message(seed, p, r, 3, (2, r + 1), torch.float32),
                errors,
            )
    return errors


def p2p_errors(ctx) -> dict:
    """Sizes that do not match and two ranks waiting on each other fail on both ranks of the pair with a clear
    InvalidUsage, and the world stays usable."""
    import gfdit

    r, n = ctx.rank, ctx.world_size
    peer = r ^ 1
    out: dict = {}

    def attempt(name: str, fn) -> None:
        try:
            fn()
            out[name] = None
        except gfdit.InvalidUsage as exc:
            out[name] = str(exc)

    if peer < n:
        # The message and the posted receive differ: both ranks learn it from the header.
        if r < peer:
            attempt("posted mismatch", lambda: dist.send(torch.ones(4), peer))
        else:
            attempt("posted mismatch", lambda: dist.recv(torch.empty(5), peer))
        attempt("deadlock", lambda: dist.recv(torch.empty(2), peer))
        # Both send first, so each message waits at the peer (no receive posted): a receive of another size is
        # refused there, and the right one is filled.
        dist.send(torch.arange(3.0) + r, peer)
        attempt("waiting mismatch", lambda: dist.recv(torch.empty(4), peer))
        t = torch.empty(3)
        dist.recv(t, peer)
        out["then"] = t.tolist()
    t = torch.ones(1)
    dist.all_reduce(t)
    out["after"] = t.item()
    return out


# ------------------------------------------------------------------- the CUDA path with stand-in streams
def _host_meets_device(ctx, seed: int) -> list:
    """With float64 on the (stand-in) device: a device message lands in a host receive and a host message in a
    device receive, each direction of one pair at once."""
    r, n = ctx.rank, ctx.world_size
    errors: list = []
    peer = r ^ 1
    if peer >= n:
        return errors
    if r < peer:
        sent, got = _message(seed, r, peer, 9, (4,), torch.float64), torch.empty(3, dtype=torch.float64)
    else:
        sent, got = _message(seed, r, peer, 9, (6,), torch.float32), torch.empty(4, dtype=torch.int64)
    work = dist.isend(sent, peer)
    dist.recv(got, peer)
    work.wait()
    want = _message(seed, peer, r, 9, *(((6,), torch.float32) if r < peer else ((4,), torch.float64)))
    _cmp(f"host meets device from {peer}", got.view(want.dtype), want, errors)
    return errors


class _StandInEvent:
    recorded: list = []

    def __init__(self, *args, **kwargs) -> None:
        _StandInEvent.recorded.append(self)
        self.stream = None

    def record(self, stream=None) -> None:
        self.stream = stream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _StandInStream:
    cuda_stream = 0

    def __init__(self) -> None:
        self.waited: list = []

    def wait_event(self, event) -> None:
        self.waited.append(event)


def cuda_paths_on_cpu(ctx, seed: int, device_dtypes: list | None = None) -> dict:
    """The backend's CUDA path on CPU tensors: the tensors' placement reports a stand-in CUDA stream (for every
    tensor, or for those of device_dtypes only, so that host and device messages meet), torch.cuda's events
    and current stream are stand-ins, and the core gets the host path. The collectives and the messages are
    real and compared against gloo as on the host path; the events say whether every call's Work made the
    current stream wait."""
    from gfdit.comm import torch_backend as tb

    stream = _StandInStream()
    kinds = None if device_dtypes is None else {getattr(torch, d) for d in device_dtypes}
    real_placement = tb._placement

    def placement(world, op, named):
        real_placement(world, op, named)  # the checks of the host path still run
        if kinds is None or any(t.dtype in kinds for _, t in named):
            return stream
        return None

    saved = (tb._placement, tb._stream_handle, torch.cuda.Event, torch.cuda.current_stream)
    tb._placement, tb._stream_handle = placement, lambda s: 0
    torch.cuda.Event = _StandInEvent
    torch.cuda.current_stream = lambda device=None: stream
    _StandInEvent.recorded = []
    try:
        errors: list = []
        if kinds is None:
            errors += collectives(ctx, seed)
            errors += functional(ctx, seed)
            x = torch.ones(3)
            work = dist.all_reduce(x, async_op=True)
            if not isinstance(work, tb._StreamWork):
                errors.append(f"all_reduce(async_op=True) gave {type(work).__name__}")
            work.wait()
            if not stream.waited or stream.waited[-1] is not work._event or work._event.stream is not stream:
                errors.append("wait() did not make the current stream wait for the all_reduce's event")
        else:
            errors += _host_meets_device(ctx, seed)
        errors += point_to_point(ctx, seed)
        errors += p2p_directions(ctx, seed)
        return {
            "errors": errors,
            "recorded": len(_StandInEvent.recorded),
            "waited": len(stream.waited),
            "unrecorded waits": sum(e.stream is not stream for e in stream.waited),
        }
    finally:
        tb._placement, tb._stream_handle, torch.cuda.Event, torch.cuda.current_stream = saved
