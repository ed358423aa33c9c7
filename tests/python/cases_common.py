"""Helpers shared by the case functions that run inside the rank processes.

Inputs are fresh random data, drawn from a generator seeded by (seed, rank, tag), so every rank can rebuild
any other rank's input locally for a reference. Comparisons collect mismatches in a `Checker` instead of
raising at once, so that one wrong result does not desynchronise the ranks of a persistent world.
"""

from __future__ import annotations

import torch

DTYPES = ["float32", "float16", "bfloat16", "int32", "int64", "uint8"]
FLOAT_DTYPES = ("float32", "float16", "bfloat16")

# Relative tolerance of reductions, applied to the scale sum(|x_i|) of the reduced values (gloo and gfdit
# reduce in different orders and precisions). Worst-case rounding of 8 terms stays below these.
REDUCE_RTOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}

# Staging slots are at most a few MiB; sizes above this per rank take the chunked path.
LARGE_BYTES = 5 << 20


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def generator(*key: int) -> torch.Generator:
    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + int(k) + 17) % (2**62)
    return torch.Generator().manual_seed(seed)


def rand_tensor(shape, dtype: str, *key: int, kind: str = "any", n: int = 1) -> torch.Tensor:
    """Fresh random data for `shape` and `dtype`, deterministic in key.

    kind "sum": values small enough that a sum over n ranks neither overflows nor wraps (integer types).
    """
    gen = generator(*key)
    shape = tuple(int(s) for s in shape)
    if dtype in FLOAT_DTYPES:
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        x[x == 0] = 1.0
        return x.to(dtype_of(dtype))
    if dtype == "uint8":
        high = max(2, 256 // max(n, 1)) if kind == "sum" else 256
        return torch.randint(0, high, shape, generator=gen, dtype=torch.int64).to(torch.uint8)
    if dtype == "int32":
        bound = 1_000_000 if kind == "sum" else 2**31 - 1
        return torch.randint(-bound, bound, shape, generator=gen, dtype=torch.int64).to(torch.int32)
    if dtype == "int64":
        bound = 2**40 if kind == "sum" else 2**62
        return torch.randint(-bound, bound, shape, generator=gen, dtype=torch.int64)
    raise ValueError(dtype)


def place(t: torch.Tensor, mem: str) -> torch.Tensor:
    """A copy of t, either an ordinary tensor ("plain") or one in this rank's gfdit heap ("heap")."""
    import gfdit

    if mem == "plain":
        return t.clone()
    assert mem == "heap", mem
    h = gfdit.empty(tuple(t.shape), dtype=t.dtype)
    if h.numel() > 0:
        assert gfdit.is_heap_tensor(h), "gfdit.empty returned a tensor outside the heap"
    h.copy_(t)
    return h


def sentinel(shape, dtype: str, mem: str) -> torch.Tensor:
    """An output buffer prefilled with a recognisable non-zero pattern."""
    fill = torch.full(tuple(shape), 77, dtype=torch.int64).to(dtype_of(dtype))
    return place(fill, mem)


def reduce_ref(tensors, op: str, dtype: str) -> torch.Tensor:
    """Exact (float64 / int64) reduction of same-shape tensors."""
    wide = torch.stack([t.to(torch.float64 if dtype in FLOAT_DTYPES else torch.int64) for t in tensors])
    if op == "sum":
        return wide.sum(0)
    if op == "max":
        return wide.max(0).values
    if op == "min":
        return wide.min(0).values
    raise ValueError(op)


def reduce_scale(tensors) -> torch.Tensor:
    return torch.stack([t.to(torch.float64).abs() for t in tensors]).sum(0)


class Checker:
    """Collects mismatches; raise_if_any() at the end of a case."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list = []
        self.checks = 0

    def fail(self, what: str, detail: str) -> None:
        self.failures.append(f"[rank {self.rank}] {what}: {detail}")

    def equal(self, got: torch.Tensor, ref: torch.Tensor, what: str) -> bool:
        self.checks += 1
        if tuple(got.shape) != tuple(ref.shape) or got.dtype != ref.dtype:
            self.fail(what, f"shape/dtype {tuple(got.shape)}/{got.dtype} != {tuple(ref.shape)}/{ref.dtype}")
            return False
        if torch.equal(got, ref):
            return True
        bad = (got != ref).reshape(-1).nonzero()
        i = int(bad[0])
        self.fail(
            what,
            f"{bad.numel()} of {got.numel()} elements differ; first at flat index {i}: "
            f"got {got.reshape(-1)[i].item()} expected {ref.reshape(-1)[i].item()}",
        )
        return False

    def bitwise_equal(self, got: torch.Tensor, ref: torch.Tensor, what: str) -> bool:
        if got.numel() == 0:
            return self.equal(got, ref, what)
        return self.equal(got.reshape(-1).view(torch.uint8), ref.reshape(-1).view(torch.uint8), what)

    def reduced(
        self,
        got: torch.Tensor,
        ref: torch.Tensor,
        scale: torch.Tensor,
        dtype: str,
        what: str,
        slack: float = 1.0,
    ) -> bool:
        """got (dtype) against an exact reduction ref; floats within REDUCE_RTOL * scale, integers exact."""
        self.checks += 1
        if tuple(got.shape) != tuple(ref.shape):
            self.fail(what, f"shape {tuple(got.shape)} != {tuple(ref.shape)}")
            return False
        if dtype not in FLOAT_DTYPES:
            return self.equal(got, ref.to(dtype_of(dtype)), what)
        err = (got.to(torch.float64) - ref.to(torch.float64)).abs()
        tol = slack * REDUCE_RTOL[dtype] * scale + 1e-30
        over = err > tol
        if bool(over.any()):
            idx = over.reshape(-1).nonzero()
            i = int(idx[0])
            self.fail(
                what,
                f"{idx.numel()} of {got.numel()} elements beyond tolerance; first at flat index {i}: got "
                f"{got.reshape(-1)[i].item()} expected {ref.reshape(-1)[i].item()} "
                f"(tol {tol.reshape(-1)[i].item():.3g})",
            )
            return False
        return True

    def true(self, cond: bool, what: str, detail: str = "") -> None:
        self.checks += 1
        if not cond:
            self.fail(what, detail or "condition false")

    def raise_if_any(self) -> int:
        if self.failures:
            shown = self.failures[:20]
            more = len(self.failures) - len(shown)
            raise AssertionError("\n".join(shown) + (f"\n... and {more} more" if more else ""))
        return self.checks
