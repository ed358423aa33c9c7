"""gfdit serve's HTTP API against a real tiny engine (two CPU ranks): generations, bad input, the API key,
/health and /v1/models."""

from __future__ import annotations

import base64
import io
import json
import threading

import pytest

fastapi = pytest.importorskip("fastapi")
pytest.importorskip("httpx")
PIL = pytest.importorskip("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from gfdit.serving.engine import Engine  # noqa: E402
from gfdit.serving.server import create_app, serving  # noqa: E402
from PIL import Image  # noqa: E402

MODEL = "tiny-qwen-image"
KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine():
    with Engine(model=MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine, model=MODEL, max_queue=8, max_n=4)) as c:
        yield c


@pytest.fixture(scope="module")
def keyed(engine):
    with TestClient(create_app(engine, model=MODEL, api_key=KEY)) as c:
        yield c


def _png(b64: str) -> Image.Image:
    img = Image.open(io.BytesIO(base64.b64decode(b64)))
    img.load()
    assert img.format == "PNG"
    return img


def _gen(client, **body):
    return client.post("/v1/images/generations", json={"prompt": "a red fox", **body})


def _assert_error(r, status: int, param: str | None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param, err
    return err


@pytest.mark.timeout(60)
def test_generation_returns_png_of_the_asked_size(client):
    r = _gen(
        client, model=MODEL, size="64x32", n=2, num_inference_steps=2, seed=7, response_format="b64_json"
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["created"], int) and len(body["data"]) == 2
    imgs = [_png(d["b64_json"]) for d in body["data"]]
    assert all(img.size == (64, 32) and img.mode == "RGB" for img in imgs)
    assert imgs[0].tobytes() != imgs[1].tobytes()  # seeds 7 and 8
    # same seed, same image; defaults (size, steps) come from the model
    again = _gen(client, model=MODEL, size="64x32", num_inference_steps=2, seed=7)
    assert _png(again.json()["data"][0]["b64_json"]).tobytes() == imgs[0].tobytes()
    d = _gen(
        client,
        size="auto",
        n=None,
        negative_prompt="blurry",
        guidance_scale=2.5,
        slo_ms=60000,
        priority=1,
        user="u1",
    )
    assert d.status_code == 200, d.text
    info = client.app.state.server.engine.model_info.defaults
    assert _png(d.json()["data"][0]["b64_json"]).size == (info.width, info.height)
    assert client.app.state.server.admission.pending == 0


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "dall-e-3"}, 404, "model"),
        ({"size": "64"}, 400, "size"),
        ({"size": "64x33"}, 400, "size"),  # not a multiple of the stride
        ({"size": "-64x32"}, 400, "size"),
        ({"size": "4096x4096"}, 400, "size"),  # over max_pixels
        ({"n": 0}, 400, "n"),
        ({"n": 5}, 400, "n"),
        ({"n": "2"}, 400, "n"),
        ({"n": 1.5}, 400, "n"),
        ({"num_inference_steps": 0}, 400, "num_inference_steps"),
        ({"num_inference_steps": 10_000}, 400, "num_inference_steps"),
        ({"num_inference_steps": True}, 400, "num_inference_steps"),
        ({"guidance_scale": "high"}, 400, "guidance_scale"),
        ({"guidance_scale": -1.0}, 400, "guidance_scale"),
        ({"seed": "x"}, 400, "seed"),
        ({"seed": -1}, 400, "seed"),
        ({"slo_ms": 0}, 400, "slo_ms"),
        ({"priority": 2**40}, 400, "priority"),
        ({"response_format": "url"}, 400, "response_format"),
        ({"output_format": "jpeg"}, 400, "output_format"),
        ({"stream": True}, 400, "stream"),
        ({"prompt": 3}, 400, "prompt"),
        ({"prompt": "   "}, 400, "prompt"),
        ({"prompt": "x" * 70_000}, 400, "prompt"),  # over the engine's payload limit
        ({"negative_prompt": ["a"]}, 400, "negative_prompt"),
        ({"guidance_scale_2": 1.0}, 400, "guidance_scale_2"),  # a one-expert model
        ({"n": 2, "extra_field": {"x": 1}, "size": "64x33"}, 400, "size"),  # unknown fields are ignored
    ],
)
def test_bad_input_gets_a_4xx_naming_the_field(client, body, status, param):
    _assert_error(_gen(client, **body), status, param)
    assert client.app.state.server.admission.pending == 0


def _post_raw(client, raw: bytes, url: str = "/v1/images/generations"):
    return client.post(url, content=raw, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("field", ["prompt", "negative_prompt", "user"])
def test_a_lone_surrogate_is_a_request_error(client, field):
    """JSON's "\\ud800" escape alone reads as a Python str that is not Unicode text: the engine's C++ request
    cannot take it (it was a 500)."""
    body = {"prompt": "p", field: "a \ud800 b"}
    _assert_error(_post_raw(client, json.dumps(body).encode()), 400, field)
    paired = _post_raw(client, json.dumps({"prompt": "\U0001f98a fox", "num_inference_steps": 1}).encode())
    assert paired.status_code == 200, paired.text


def test_json_without_numbers_of_json(client):
    """Python's json module reads NaN and Infinity, which JSON has not: refused as the field's type."""
    for raw, param in (
        (b'{"prompt": "p", "guidance_scale": NaN}', "guidance_scale"),
        (b'{"prompt": "p", "slo_ms": Infinity}', "slo_ms"),
    ):
        _assert_error(_post_raw(client, raw), 400, param)


def test_405_lists_every_method_of_the_path(client):
    """GET and DELETE of /v1/videos/{id} are two routes; a 405 names both (and only the schema's methods)."""
    r = client.patch("/v1/videos/video_x")
    assert r.status_code == 405 and r.headers["Allow"] == "DELETE, GET"
    r = client.options("/v1/images/generations")
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    assert "error" in r.json()


def test_a_chunked_body_past_the_limit_gets_413(engine):
    with TestClient(create_app(engine, model=MODEL, max_body_bytes=1000)) as c:

        def chunks():
            yield b'{"prompt": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        r = c.post("/v1/images/generations", content=chunks(), headers={"Content-Type": "application/json"})
        _assert_error(r, 413, None)
        metrics = c.get("/metrics").text
    assert 'gfdit_http_requests_total{kind="image",outcome="bad_request"} 1.0' in metrics


def test_malformed_and_missing_bodies(client):
    url = "/v1/images/generations"
    hdr = {"Content-Type": "application/json"}
    _assert_error(client.post(url, content=b'{"prompt": "x",', headers=hdr), 400, None)
    _assert_error(client.post(url, content=b"\xff\xfe", headers=hdr), 400, None)
    _assert_error(client.post(url, content=b'["prompt"]', headers=hdr), 400, None)
    _assert_error(client.post(url, json={}), 400, "prompt")
    _assert_error(client.post(url, content=b"x" * ((1 << 20) + 1), headers=hdr), 413, None)
    assert client.get("/v1/nothing").status_code == 404
    assert "error" in client.get("/v1/nothing").json()
    assert client.get(url).status_code == 405


def test_full_queue_gets_429_with_retry_after(client):
    admission = client.app.state.server.admission
    assert admission.acquire(admission.max_queue - 1)  # as if other requests were outstanding
    try:
        r = _gen(client, n=2)
        err = _assert_error(r, 429, None)
        assert err["code"] == "queue_full" and int(r.headers["Retry-After"]) >= 1
    finally:
        admission.release(admission.max_queue - 1)
    assert _gen(client, n=1, num_inference_steps=1).status_code == 200


def test_retry_after_follows_the_completion_rate(engine):
    """With no answers yet Retry-After is the configured least; once the server has answered 2 images in about
    the last 30 s, 8 more need several seconds, and it says so (never more than a minute)."""
    with TestClient(create_app(engine, model=MODEL, max_queue=1, retry_after_s=1)) as c:
        admission = c.app.state.server.admission
        assert admission.acquire(1)
        try:
            assert _gen(c, n=8).headers["Retry-After"] == "1"
            c.app.state.server.admission.finished(2)
            wait = int(_gen(c, n=8).headers["Retry-After"])
            assert 2 <= wait <= 60
        finally:
            admission.release(1)


def test_server_timing_splits_the_latency(client):
    r = _gen(client, num_inference_steps=1)
    assert r.status_code == 200
    parts = dict(p.strip().split(";dur=") for p in r.headers["Server-Timing"].split(","))
    engine_ms, encode_ms, total_ms = (float(parts[k]) for k in ("engine", "encode", "total"))
    assert 0 < engine_ms <= total_ms and 0 <= encode_ms <= total_ms


def test_a_request_the_engine_cancels_gets_503(client, monkeypatch):
    """A cancel from the engine's side (not the client's) answers 503 "cancelled", not a dropped connection."""
    import time

    engine = client.app.state.server.engine
    handles = []
    submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda r: handles.append(submit(r)) or handles[-1])
    answer = {}
    t = threading.Thread(target=lambda: answer.setdefault("r", _gen(client, num_inference_steps=40)))
    t.start()
    deadline = time.monotonic() + 30
    while not handles and time.monotonic() < deadline:
        time.sleep(0.005)
    handles[0].cancel()
    t.join(60)
    err = _assert_error(answer["r"], 503, None)
    assert err["code"] == "cancelled"


def test_concurrent_requests_all_answered(client):
    codes: list[int] = []

    def one(i: int) -> None:
        codes.append(_gen(client, seed=i, num_inference_steps=1).status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(codes) == [200] * 8


def test_api_key(keyed):
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": KEY},
        {"Authorization": "Basic x"},
    ):
        r = keyed.post("/v1/images/generations", json={"prompt": "a"}, headers=headers)
        err = _assert_error(r, 401, None)
        assert err["code"] == "invalid_api_key"
        assert keyed.get("/v1/models", headers=headers).status_code == 401
    ok = keyed.post("/v1/images/generations", json={"prompt": "a", "num_inference_steps": 1}, headers=AUTH)
    assert ok.status_code == 200, ok.text
    assert keyed.get("/v1/models", headers=AUTH).status_code == 200
    assert keyed.get("/health").status_code == 200  # probes need no key


def test_models_and_health(client, engine):
    m = client.get("/v1/models").json()
    assert m["object"] == "list" and [d["id"] for d in m["data"]] == [MODEL]
    h = client.get("/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"


class _FakeEngine:
    """Stands in for an engine whose workers or control loop have a problem: stats() reports ``alive`` and the
    healing counters given, and blocks until ``unblock`` is set (when given)."""

    def __init__(self, engine, alive, wakeups, unblock=None, **healing):
        self.model_info, self.limits = engine.model_info, engine.limits
        self._alive, self._wakeups, self._unblock, self._healing = alive, wakeups, unblock, healing
        self.closed = False
        self.stats_calls = 0

    def alive_workers(self) -> list[bool]:
        return list(self._alive)

    def stats(self) -> dict:
        self.stats_calls += 1
        if self._unblock is not None:
            self._unblock.wait(5.0)
        return {
            "alive": list(self._alive),
            "loop_wakeups": next(self._wakeups),
            "regroups": 0,
            **self._healing,
        }

    def requests(self) -> dict:
        return {}

    def add_progress_listener(self, fn) -> None:
        pass


def _health(engine, alive, **healing):
    import itertools

    with TestClient(create_app(_FakeEngine(engine, alive, itertools.count(), **healing), model=MODEL)) as c:
        r = c.get("/health")
        return r.status_code, r.json()


def test_health_is_ok_while_every_worker_lives(engine):
    status, body = _health(engine, [True, True])
    assert status == 200 and body["status"] == "ok" and body["reason"] is None
    assert (body["alive_workers"], body["world_size"], body["restarting"], body["deaths"]) == (2, 2, [], 0)


def test_health_is_degraded_while_some_workers_live(engine):
    """A dead worker that is being replaced: 200 "degraded" (a load balancer keeps a server that still
    serves), saying how many are alive and which are being replaced; engines without the healing counters
    read as none."""
    status, body = _health(engine, [True, False, True], worker_deaths=3, replacements=2, restarting=[1])
    assert status == 200 and body["status"] == "degraded" and "workers not alive: 1" in body["reason"]
    assert (body["alive_workers"], body["world_size"]) == (2, 3)
    assert (body["restarting"], body["deaths"], body["replacements"]) == ([1], 3, 2)
    status, body = _health(engine, [False, True])
    assert status == 200 and body["status"] == "degraded"
    assert (body["restarting"], body["deaths"], body["replacements"]) == ([], 0, 0)


def test_health_is_unavailable_when_no_worker_lives(engine):
    status, body = _health(engine, [False, False], worker_deaths=2, restarting=[0, 1])
    assert status == 503 and body["status"] == "unavailable" and body["reason"] == "no worker alive"
    assert body["alive_workers"] == 0 and body["restarting"] == [0, 1]


def test_health_is_unavailable_once_the_engine_is_closed(engine):
    import itertools

    fake = _FakeEngine(engine, [True, True], itertools.count())
    with TestClient(create_app(fake, model=MODEL)) as c:
        assert c.get("/health").status_code == 200
        fake.closed = True
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["reason"] == "the engine is closed"


def test_health_answers_while_stats_block(engine):
    """stats() blocks (as when the control thread holds its lock for seconds): /health answers 503 "control loop
    not answering" while it still blocks, probes meanwhile do not pile up threads, and once stats() answers
    again so does /health."""
    import itertools

    unblock = threading.Event()
    fake = _FakeEngine(engine, [True, True], itertools.count(), unblock=unblock)
    try:
        with TestClient(create_app(fake, model=MODEL)) as c:
            for _ in range(3):
                r = c.get("/health")
                assert not unblock.is_set()  # answered while stats() still blocks
                assert r.status_code == 503 and r.json()["reason"] == "control loop not answering", r.text
                assert r.json()["alive"] == [] and r.json()["world_size"] == 2
            assert fake.stats_calls == 1  # the later probes waited on the first call
            unblock.set()
            r = c.get("/health")
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    finally:
        unblock.set()


def test_health_reports_a_stalled_control_loop(engine):
    import itertools
    import time

    app = create_app(_FakeEngine(engine, [True, True], itertools.repeat(7)), model=MODEL, loop_stall_s=0.2)
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200
        time.sleep(0.3)
        r = c.get("/health")
        assert r.status_code == 503 and "control loop" in r.json()["reason"]


def test_metrics_count_workers_alive_dead_and_replaced(engine):
    import itertools

    fake = _FakeEngine(
        engine, [True, False, True], itertools.count(), worker_deaths=3, replacements=2, restarting=[1]
    )
    with TestClient(create_app(fake, model=MODEL)) as c:
        samples = _samples(c.get("/metrics").text)
    assert samples[("gfdit_workers_alive", ())] == 2
    assert samples[("gfdit_worker_deaths_total", ())] == 3
    assert samples[("gfdit_worker_replacements_total", ())] == 2


def _samples(text: str) -> dict:
    """The samples of a /metrics answer by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return samples


def test_metrics(client, engine):
    assert _gen(client, num_inference_steps=2, slo_ms=60_000).status_code == 200
    _gen(client, n=0)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = _samples(r.text)
    assert samples[("gfdit_http_requests_total", (("kind", "image"), ("outcome", "ok")))] >= 1
    assert samples[("gfdit_http_requests_total", (("kind", "image"), ("outcome", "bad_request")))] >= 1
    assert samples[("gfdit_slo_requests_total", (("kind", "image"), ("result", "met")))] >= 1
    assert samples[("gfdit_request_latency_seconds_count", (("kind", "image"),))] >= 1
    for stage in ("encode", "denoise", "decode"):
        assert samples[("gfdit_stage_seconds_count", (("stage", stage),))] >= 1
    assert all(samples[("gfdit_rank_busy_seconds_total", (("rank", str(w)),))] > 0 for w in range(2))
    assert samples[("gfdit_outstanding_images", ())] == 0
    assert ("gfdit_requests_in_engine", (("state", "QUEUED"),)) in samples
    assert ("gfdit_regroups", ()) in samples
    decodes = {k[1][0][1]: v for k, v in samples.items() if k[0] == "gfdit_decodes_total"}
    assert decodes and sum(decodes.values()) >= 1 and all(int(d) >= 1 for d in decodes), decodes
    assert samples[("gfdit_request_steps_total", (("batch", "1"),))] >= 2
    # the engine's own count (whether fcfs batches depends on the cost model the engine plans with)
    assert samples[("gfdit_batched_steps", ())] == engine.stats()["batched_steps"]
    assert ("gfdit_refused_decisions", ()) in samples


class _StatsEngine:
    """What Metrics reads of an engine, with control-plane counters of a test's choosing."""

    def __init__(self, stats: dict) -> None:
        self._stats = stats

    def alive_workers(self):
        return [True, True]

    def requests(self):
        return {}

    def stats(self):
        return dict(self._stats)


def test_metrics_count_request_steps_by_batch():
    """Three requests stepped 4 steps as one batch of 3 on rank 0 and decoded together on ranks 0 and 1; one
    more stepped alone: steps by batch count each request's own steps, busy seconds count the batched task once,
    and the control plane's batched_steps and refused_decisions are gauges."""
    from gfdit.serving.engine import Result, Stage
    from gfdit.serving.server.admission import Admission
    from gfdit.serving.server.metrics import Metrics
    from prometheus_client import generate_latest

    def stage(kind, ranks, step, n, t0_s, t1_s, batch=1):
        return Stage(
            kind, ranks, 1, 1, "usp", step, n, int(t0_s * 1e9), int(t0_s * 1e9), int(t1_s * 1e9), batch=batch
        )

    def result(rid, stages):
        times = [("QUEUED", 0, stages[0].start_ns), ("DONE", 0, stages[-1].end_ns)]
        return Result(rid, None, "DONE", "", stages, times)

    m = Metrics(_StatsEngine({"regroups": 1, "batched_steps": 2, "refused_decisions": 3}), Admission(8))
    for rid in (1, 2, 3):
        m.observe(
            result(
                rid,
                [stage("denoise", [0], 0, 4, 10.0, 13.0, batch=3), stage("decode", [0, 1], 4, 0, 13.0, 14.0)],
            ),
            None,
            "image",
        )
    m.observe(
        result(4, [stage("denoise", [1], 0, 2, 20.0, 21.0), stage("denoise", [1], 2, 1, 0, 0)]), None, "image"
    )
    samples = _samples(generate_latest(m.registry).decode())
    assert samples[("gfdit_request_steps_total", (("batch", "3"),))] == 12
    # request 4's second stage never ran: not counted
    assert samples[("gfdit_request_steps_total", (("batch", "1"),))] == 2
    assert samples[("gfdit_rank_busy_seconds_total", (("rank", "0"),))] == pytest.approx(3.0 + 3 * 1.0)
    assert samples[("gfdit_rank_busy_seconds_total", (("rank", "1"),))] == pytest.approx(3 * 1.0 + 1.0)
    assert samples[("gfdit_decodes_total", (("degree", "2"),))] == 3
    assert samples[("gfdit_stage_seconds_count", (("stage", "denoise"),))] == 4  # the batched step per member
    assert samples[("gfdit_batched_steps", ())] == 2 and samples[("gfdit_refused_decisions", ())] == 3
    assert samples[("gfdit_regroups", ())] == 1


@pytest.fixture(scope="module")
def live_url(engine):
    """The app on a real uvicorn server (loopback, a free port), run on a thread."""
    pytest.importorskip("uvicorn")
    with serving(create_app(engine, model=MODEL, api_key=KEY)) as url:
        yield url


def test_official_openai_client(live_url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=live_url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    out = client.images.generate(
        model=MODEL,
        prompt="a lighthouse at dusk",
        n=2,
        size="32x48",
        response_format="b64_json",
        user="tester",
        extra_body={"num_inference_steps": 1, "seed": 3, "negative_prompt": "fog"},
    )
    assert len(out.data) == 2 and all(_png(d.b64_json).size == (32, 48) for d in out.data)
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(model=MODEL, prompt="x", size="33x48")
    assert e.value.body["param"] == "size"
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="dall-e-3", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live_url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_client_disconnect_cancels_its_requests(live_url, engine):
    import json
    import socket
    import time

    host, port = live_url.removeprefix("http://").split(":")
    body = json.dumps(
        {"prompt": "slow", "n": 4, "size": "256x256", "num_inference_steps": 200}  # ~8 s on two CPU ranks
    ).encode()
    head = (
        f"POST /v1/images/generations HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head + body)
    deadline = time.monotonic() + 10
    # the server submits the four images one after another: wait for all four, not just the first
    while len(engine.requests()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(engine.requests()) == 4
    sock.close()
    t0 = time.monotonic()
    while engine.requests() and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert not engine.requests(), "the requests of a client that left are still running"


def test_serve_command_refuses_bad_arguments(capsys):
    from gfdit.tools import cli

    assert cli.main(["serve", "--policy", "nope", "--world-size", "1"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert cli.main(["serve", "--max-queue", "0"]) == 2


# ---- videos (tiny-wan) ----

VIDEO_MODEL = "tiny-wan"


@pytest.fixture(scope="module")
def video_engine():
    with Engine(model=VIDEO_MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        yield eng


@pytest.fixture(scope="module")
def vclient(video_engine):
    with TestClient(create_app(video_engine, model=VIDEO_MODEL, job_ttl_s=2.0)) as c:
        yield c


def _wait_job(c, job_id: str, timeout: float = 30.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = c.get(f"/v1/videos/{job_id}").json()
        assert 0 <= job["progress"] <= 100
        if job["status"] not in ("queued", "in_progress"):
            return job
        time.sleep(0.02)
    raise AssertionError(f"video job {job_id} not finished within {timeout} s")


def test_video_job_makes_an_h264_mp4(vclient):
    av = pytest.importorskip("av")
    r = vclient.post(
        "/v1/videos",
        json={
            "model": VIDEO_MODEL,
            "prompt": "waves",
            "size": "48x32",
            "num_frames": 9,
            "num_inference_steps": 2,
        },
    )
    assert r.status_code == 200, r.text
    job = r.json()
    assert (
        job["object"] == "video"
        and job["status"] in ("queued", "in_progress")
        and job["id"].startswith("video_")
    )
    done = _wait_job(vclient, job["id"])
    assert done["status"] == "completed" and done["progress"] == 100 and done["expires_at"] is not None
    content = vclient.get(f"/v1/videos/{job['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(content.content)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert stream.codec_context.name == "h264"
    assert len(frames) == 9 and (frames[0].width, frames[0].height) == (48, 32)
    # seconds at fps become 1 + 4k frames
    s = vclient.post(
        "/v1/videos", json={"prompt": "waves", "seconds": "1", "fps": 8, "num_inference_steps": 1}
    )
    assert s.status_code == 200 and s.json()["num_frames"] == 9
    assert _wait_job(vclient, s.json()["id"])["status"] == "completed"


def test_video_long_poll_answers_when_the_job_ends(vclient):
    import time

    job = vclient.post("/v1/videos", json={"prompt": "a", "num_frames": 5, "num_inference_steps": 2}).json()
    done = vclient.get(f"/v1/videos/{job['id']}", params={"wait_s": 30}).json()
    assert done["status"] == "completed"  # the poll answered when the job ended, not after wait_s
    t0 = time.monotonic()
    assert vclient.get(f"/v1/videos/{job['id']}", params={"wait_s": 30}).json()["status"] == "completed"
    assert time.monotonic() - t0 < 15  # an ended job does not make the poll wait its wait_s
    for bad in ("-1", "31", "soon", "nan"):
        _assert_error(vclient.get(f"/v1/videos/{job['id']}", params={"wait_s": bad}), 400, "wait_s")


def test_video_job_expires_after_its_ttl(vclient):
    import time

    job = vclient.post("/v1/videos", json={"prompt": "a", "num_frames": 1, "num_inference_steps": 1}).json()
    assert _wait_job(vclient, job["id"])["status"] == "completed"
    time.sleep(2.2)
    _assert_error(vclient.get(f"/v1/videos/{job['id']}"), 404, "video_id")


def test_finished_video_jobs_past_the_memory_cap_are_forgotten_oldest_first(video_engine):
    """max_video_bytes of 1 keeps only the newest finished job (its MP4 alone is over the cap, but the newest
    is always kept); video jobs count in the metrics by kind."""
    with TestClient(create_app(video_engine, model=VIDEO_MODEL, max_video_bytes=1)) as c:
        body = {"prompt": "a", "size": "48x32", "num_frames": 5, "num_inference_steps": 1, "slo_ms": 60_000.0}
        first = c.post("/v1/videos", json=body).json()
        assert _wait_job(c, first["id"])["status"] == "completed"
        assert c.get(f"/v1/videos/{first['id']}/content").status_code == 200
        second = c.post("/v1/videos", json=body).json()
        assert _wait_job(c, second["id"])["status"] == "completed"
        _assert_error(c.get(f"/v1/videos/{first['id']}"), 404, "video_id")
        assert c.get(f"/v1/videos/{second['id']}/content").status_code == 200
        metrics = c.get("/metrics").text
        assert 'gfdit_http_requests_total{kind="video",outcome="ok"} 2.0' in metrics
        assert 'gfdit_slo_requests_total{kind="video",result="met"} 2.0' in metrics
        assert 'gfdit_request_latency_seconds_count{kind="video"} 2.0' in metrics


def test_deleting_a_running_video_job_cancels_it(vclient, video_engine):
    import time

    body = {"prompt": "slow", "size": "256x128", "num_frames": 33, "num_inference_steps": 200}
    job = vclient.post("/v1/videos", json=body).json()
    _assert_error(vclient.get(f"/v1/videos/{job['id']}/content"), 409, "video_id")
    assert vclient.delete(f"/v1/videos/{job['id']}").json()["deleted"] is True
    t0 = time.monotonic()
    while video_engine.requests() and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert not video_engine.requests()
    _assert_error(vclient.get(f"/v1/videos/{job['id']}"), 404, "video_id")
    _assert_error(vclient.delete(f"/v1/videos/{job['id']}"), 404, "video_id")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"num_frames": 0}, "num_frames"),
        ({"num_frames": 1000}, "num_frames"),
        ({"num_frames": "9"}, "num_frames"),
        ({"seconds": "soon"}, "seconds"),
        ({"seconds": -1.0}, "seconds"),
        ({"seconds": 1e308}, "seconds"),  # finite, but its frames are not (it was a 500)
        ({"seconds": "1e308"}, "seconds"),
        ({"seconds": "100"}, "seconds"),  # the frames it makes are too many: the seconds are at fault
        ({"seconds": True}, "seconds"),
        ({"fps": 0}, "fps"),
        ({"size": "50x32"}, "size"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
    ],
)
def test_bad_video_input(vclient, body, param):
    _assert_error(vclient.post("/v1/videos", json={"prompt": "p", **body}), 400, param)


def test_video_endpoints_on_an_image_model_and_images_on_a_video_model(client, vclient):
    _assert_error(client.post("/v1/videos", json={"prompt": "p"}), 400, "model")
    _assert_error(client.get("/v1/videos/video_nope"), 404, "video_id")
    r = vclient.post(
        "/v1/images/generations", json={"prompt": "p", "size": "48x32", "num_inference_steps": 1}
    )
    assert r.status_code == 200, r.text
    assert _png(r.json()["data"][0]["b64_json"]).size == (48, 32)


# ---- resilience ----


def test_200_concurrent_requests_none_lost(live_url, engine):
    import asyncio

    import httpx

    async def main() -> list[int]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=live_url, headers=AUTH, limits=limits, timeout=120) as c:
            rs = await asyncio.gather(
                *(
                    c.post(
                        "/v1/images/generations",
                        json={"prompt": f"p{i}", "seed": i, "num_inference_steps": 1},
                    )
                    for i in range(200)
                )
            )
        for r in rs:
            assert r.status_code != 200 or _png(r.json()["data"][0]["b64_json"]).size == (80, 48)
        return [r.status_code for r in rs]

    codes = asyncio.run(main())
    assert codes == [200] * 200  # the default max_queue (256) admits them all
    assert not engine.requests()


@pytest.mark.timeout(120)
def test_a_worker_killed_under_load():
    import os
    import signal
    import time

    with Engine(model=MODEL, world_size=4, policy="fcfs", timeout_s=5.0, task_timeout_s=5.0) as eng:
        with TestClient(create_app(eng, model=MODEL)) as c:
            codes: list[int] = []

            def one(i: int) -> None:
                body = {"prompt": "p", "seed": i, "num_inference_steps": 20}
                codes.append(c.post("/v1/images/generations", json=body).status_code)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while not eng.requests() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert c.get("/health").json()["status"] == "ok"
            os.kill(eng.worker_pids[3], signal.SIGKILL)
            t0 = time.monotonic()
            while (health := c.get("/health")).json()["status"] == "ok" and time.monotonic() - t0 < 10:
                time.sleep(0.01)
            # the other three still serve: degraded, not unavailable
            assert health.status_code == 200, health.text
            assert health.json()["status"] == "degraded", "/health did not notice the dead worker"
            assert "workers not alive: 3" in health.json()["reason"]
            for t in threads:
                t.join(90)
            assert sorted(codes) == [200] * 16  # served on the remaining ranks, none lost
            after = _gen(c, num_inference_steps=2)
            assert after.status_code == 200, after.text


@pytest.mark.timeout(120)
def test_sigterm_drains_and_leaves_nothing(tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shm_before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gfdit",
            "serve",
            "--model",
            MODEL,
            "--world-size",
            "2",
            "--port",
            str(port),
            "--cluster",
            "cpu",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "serve.log", "wb"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        codes: list[int] = []
        body = {"prompt": "p", "size": "256x256", "num_inference_steps": 30}  # about 0.3 s
        t = threading.Thread(
            target=lambda: codes.append(
                httpx.post(url + "/v1/images/generations", json=body, timeout=60).status_code
            )
        )
        t.start()
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert codes == [200]  # the request in flight was drained, not dropped
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = (
        time.monotonic() + 5
    )  # helpers such as multiprocessing's resource tracker exit after the server
    while True:
        left = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(proc.pid)], capture_output=True, text=True)
        if not left.stdout.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left.stdout.strip(), f"processes left in the server's session: {left.stdout}"
    leaked = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("gfdit")}
    assert not leaked, leaked
