"""The element types gfdit moves, as torch names them and as the C++ core does (``gfdit._C.DType``)."""

from __future__ import annotations

import torch

from gfdit import _C

# torch dtype -> the core's DType, for every dtype a collective or an output may carry
TORCH_TO_DTYPE = {
    torch.float32: _C.DType.float32,
    torch.float16: _C.DType.float16,
    torch.bfloat16: _C.DType.bfloat16,
    torch.int32: _C.DType.int32,
    torch.int64: _C.DType.int64,
    torch.uint8: _C.DType.uint8,
    torch.float64: _C.DType.float64,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_TO_DTYPE.items()}
