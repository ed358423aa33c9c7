"""Outputs as the HTTP answers carry them: images as base64 PNG, videos as H.264 MP4, encoded on a small pool of
threads, or on the event loop when all the outputs of one answer are tiny (about half a millisecond of work,
less than the hop to a thread and back costs on a busy machine)."""

from __future__ import annotations

import asyncio
import base64
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# The outputs of one answer with up to this many values in all are encoded on the loop: one 64x64 PNG (the tiny
# models' default, 80x48, among them) takes about 0.5 ms, a 128x128 one 3 ms.
INLINE_ENCODE_VALUES = 3 * 64 * 64


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
    """Where outputs are encoded: on two threads (so the loop keeps answering), inline when tiny."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gfdit-serve-encode")

    async def run_all(self, fn: Any, outputs: list[Any]) -> list[Any]:
        """[fn(o) for o in outputs]: on the event loop when they hold INLINE_ENCODE_VALUES values at most in all,
        else on the pool (so that n images, or large ones, never hold the loop up for long)."""
        if sum(o.numel() for o in outputs) <= INLINE_ENCODE_VALUES:
            return [fn(o) for o in outputs]
        return list(await asyncio.gather(*(self.offload(fn, o) for o in outputs)))

    async def offload(self, fn: Any, *args: Any) -> Any:
        """fn(*args) on the pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
