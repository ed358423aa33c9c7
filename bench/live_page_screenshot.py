"""A screenshot of the live page of ``gfdit serve`` after a short mix of requests (docs/live-page.png).

Starts ``gfdit serve`` (tiny-qwen-image, 4 CPU ranks, fcfs) on a free loopback port, sends a mix of image
requests of several sizes and step counts in waves, so that early requests start on several ranks and are
regrouped when later ones arrive, then opens the page in headless Chromium (Debian's ``chromium``) with a
prompt that runs on load, and saves the window as a PNG.

    python bench/live_page_screenshot.py                 # writes docs/live-page.png
    python bench/live_page_screenshot.py --out page.png --world-size 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (seconds after the first request, size, steps): waves of arrivals; a wave's first request starts on several
# ranks and gives ranks up as the rest arrive, and grows again when they end. The last one still runs when the
# screenshot is taken.
MIX = [
    (0.0, "256x256", 150),
    (0.6, "192x192", 40),
    (1.0, "128x128", 30),
    (1.4, "128x128", 30),
    (6.0, "256x256", 150),
    (6.5, "192x192", 60),
    (7.5, "96x96", 20),
    (8.0, "128x128", 30),
    (12.0, "256x256", 200),
    (13.0, "128x128", 40),
    (13.5, "64x64", 10),
]
SHOT_AT_S = 15.5  # seconds after the first request
PAGE_PROMPT = {"prompt": "a lighthouse on a cliff at dusk", "size": "160x96", "steps": "12", "autorun": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gfdit serve exited with {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gfdit serve not healthy within {timeout_s} s")


def generate(url: str, size: str, steps: int, seed: int) -> None:
    body = {"prompt": f"request {seed}", "size": size, "num_inference_steps": steps, "seed": seed}
    req = urllib.request.Request(
        url + "/v1/images/generations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
    except OSError as e:  # HTTPError included: say which request, let the others go on
        print(f"live_page_screenshot: request {seed} ({size}, {steps} steps): {e}", file=sys.stderr)


def send_mix(url: str) -> list[threading.Thread]:
    """Sends MIX at its times, each request on its own thread; returns the threads."""
    t0 = time.monotonic()
    threads = []
    for i, (at, size, steps) in enumerate(MIX):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        t = threading.Thread(target=generate, args=(url, size, steps, i + 1), daemon=True)
        t.start()
        threads.append(t)
    return threads


def chromium_screenshot(chromium: str, url: str, out: Path, width: int, height: int, budget_ms: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gfdit-chromium-") as profile:
        subprocess.run(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--virtual-time-budget={budget_ms}",
                f"--screenshot={out}",
                url,
            ],
            check=True,
            timeout=120,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "live-page.png"))
    p.add_argument("--model", default="tiny-qwen-image")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--size", default="1280x800", help="window size WxH")
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = p.parse_args()
    if not args.chromium:
        print("live_page_screenshot: no chromium binary (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    width, height = (int(v) for v in args.size.split("x"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "gfdit.tools.cli", "serve", "--model", args.model, "--world-size"]
    cmd += [str(args.world_size), "--policy", args.policy, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url, proc, 180)
        t0 = time.monotonic()
        threads = send_mix(url)
        time.sleep(max(0.0, t0 + SHOT_AT_S - time.monotonic()))
        page = f"{url}/?{urllib.parse.urlencode(PAGE_PROMPT)}"
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        chromium_screenshot(args.chromium, page, out, width, height, budget_ms=4000)
        print(f"wrote {out}")
        for t in threads:
            t.join(120)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
