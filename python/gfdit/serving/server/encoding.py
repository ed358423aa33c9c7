"""Outputs as the HTTP answers carry them: images as base64 PNG, videos as H.264 MP4, encoded on the event
loop when small (under a millisecond) or on a small pool of threads when not."""

from __future__ import annotations

import asyncio
import base64
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

INLINE_ENCODE_VALUES = 3 * 128 * 128  # outputs up to this many values are encoded on the loop (< 1 ms)


def to_uint8(t: Any) -> Any:
    """A float tensor with values in [0, 1] as a uint8 numpy array of the same shape (round half to even).

    NumPy, not torch: a torch operation here would wake torch's OpenMP pool in the server's process, whose
    threads then spin for a while after every image and take CPU from the workers on a small machine."""
    import numpy as np

    a = np.clip(np.nan_to_num(t.detach().cpu().numpy(), nan=0.0), 0.0, 1.0) * 255.0
    return np.rint(a).astype(np.uint8)


def png_b64(image: Any) -> str:
    """An image tensor [3, H, W] (or [3, 1, H, W] from a video model) with values in [0, 1] as a base64 PNG."""
    from PIL import Image

    if image.dim() == 4:
        image = image[:, 0]
    hwc = to_uint8(image).transpose(1, 2, 0).copy()
    buf = io.BytesIO()
    Image.fromarray(hwc, mode="RGB").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def mp4(video: Any, fps: int) -> bytes:
    """A video tensor [3, F, H, W] with values in [0, 1] as an H.264 MP4 (yuv420p)."""
    import av

    frames = to_uint8(video).transpose(1, 2, 3, 0).copy()  # [F, H, W, 3]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


class Encoders:
    """Where outputs are encoded: inline when small, else on two threads (so the loop keeps answering)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gfdit-serve-encode")

    async def run(self, fn: Any, *args: Any) -> Any:
        """fn(*args) on the event loop when the output (args[0]) is small, else on the pool."""
        if args[0].numel() <= INLINE_ENCODE_VALUES:
            return fn(*args)
        return await self.offload(fn, *args)

    async def offload(self, fn: Any, *args: Any) -> Any:
        """fn(*args) on the pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
