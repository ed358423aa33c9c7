"""The live page of gfdit serve: GET /v1/timeline checked against each request's own timeline and against the
wall clock around its HTTP call, the recorder's window and caps, and the page itself in headless Chromium
(Debian's ``chromium``; those tests are skipped without it)."""

from __future__ import annotations

import base64
import contextlib
import io
import re
import shutil
import subprocess
import threading
import time

import pytest

fastapi = pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from gfdit.serving.engine import Engine, Result, Stage  # noqa: E402
from gfdit.serving.server import create_app, serving  # noqa: E402
from gfdit.serving.server.live import MERGE_GAP_NS, ActivityRecorder, layout_label  # noqa: E402

MODEL = "tiny-qwen-image"
KEY = "live-key"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium; `make system-deps`)"
)


class _SubmitSpy:
    """The engine, except that submit remembers each handle by its request's seed."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.by_seed: dict[int, object] = {}

    def submit(self, request):
        handle = self._engine.submit(request)
        self.by_seed[request.seed] = handle
        return handle

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def engine():
    with Engine(model=MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        yield eng


@pytest.fixture(scope="module")
def spy(engine):
    return _SubmitSpy(engine)


@pytest.fixture(scope="module")
def client(spy):
    with TestClient(create_app(spy, model=MODEL)) as c:
        yield c


def _post(c, results: dict, seed: int, size: str, steps: int) -> None:
    t0 = time.monotonic()
    r = c.post(
        "/v1/images/generations",
        json={"prompt": f"p{seed}", "size": size, "num_inference_steps": steps, "seed": seed},
    )
    results[seed] = (r.status_code, t0, time.monotonic())


@pytest.mark.timeout(120)
def test_timeline_spans_match_each_requests_timeline(client, spy):
    seeds = {101: ("128x128", 12), 102: ("64x64", 6), 103: ("96x64", 8)}
    answers: dict = {}
    _post(client, answers, 100, "128x128", 6)  # alone: both ranks
    threads = [threading.Thread(target=_post, args=(client, answers, s, *a)) for s, a in seeds.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert sorted(code for code, _, _ in answers.values()) == [200] * 4
    tl = client.get("/v1/timeline").json()
    now = tl["now_s"]
    assert tl["world_size"] == 2 and tl["alive"] == [True, True] and tl["is_video"] is False
    assert tl["model"] == MODEL and tl["queued"] == 0 and tl["running"] == 0
    by_id = {q["request_id"]: q for q in tl["requests"]}
    degrees = set()
    for seed, (_, t_sent, t_answered) in answers.items():
        result: Result = spy.by_seed[seed].result(0)
        rid = result.request_id
        spans = [s for s in tl["spans"] if s["request_id"] == rid]
        assert spans, f"request {rid} has no span"
        # every stage that ran is inside exactly one span of the same kind, ranks and layout
        for st in result.timeline:
            if st.start_ns <= 0:
                continue
            holders = [
                s
                for s in spans
                if s["kind"] == st.kind
                and s["ranks"] == st.ranks
                and (s["ulysses"], s["ring"], s["mode"]) == (st.ulysses, st.ring, st.mode)
                and s["step_begin"] <= st.step_begin
                and st.step_begin + st.num_steps <= s["step_begin"] + s["num_steps"]
                and now + s["start_s"] <= st.start_ns / 1e9 + 1e-6
                and st.end_ns / 1e9 <= now + s["end_s"] + 1e-6
            ]
            assert len(holders) == 1, (st, spans)
        denoise = [s for s in spans if s["kind"] == "denoise"]
        assert sum(s["num_steps"] for s in denoise) == seeds.get(seed, ("", 6))[1]
        for prev, cur in zip(denoise, denoise[1:]):
            assert cur["regroup"] == (sorted(prev["ranks"]) != sorted(cur["ranks"]))
        for s in spans:
            assert s["layout"] == layout_label(s["ulysses"], s["ring"], s["mode"])
            # the runtime's clock is the one time.monotonic reads: each span lies within its HTTP call
            assert t_sent - 1e-3 <= now + s["start_s"] <= now + s["end_s"] <= t_answered + 1e-3, s
        degrees.update(len(s["ranks"]) for s in denoise)
        e2e = (result.transitions[-1][2] - result.transitions[0][2]) / 1e9
        assert by_id[rid]["latency_s"] == pytest.approx(e2e)
        assert by_id[rid]["num_steps"] == sum(s["num_steps"] for s in denoise)
    assert 2 in degrees  # the first request ran on both ranks
    lat = tl["latency"]
    assert lat["count"] >= 4 and 0 < lat["p50_s"] <= lat["p95_s"] and lat["mean_s"] > 0


@pytest.mark.timeout(120)
def test_a_running_request_shows_live_with_its_ranks(client, spy):
    def post() -> None:
        with contextlib.suppress(
            Exception
        ):  # how the server answers a request cancelled under it: not tested here
            _post(client, {}, 200, "256x256", 200)

    t = threading.Thread(target=post)
    t.start()
    live = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and t.is_alive():
        tl = client.get("/v1/timeline").json()
        if tl["live"]:
            live = tl["live"][0]
            assert tl["running"] >= 1
            break
        time.sleep(0.05)
    handle = spy.by_seed[200]
    handle.cancel()  # seen: no need to wait for the rest
    t.join(90)
    assert live is not None, "the request never showed as running"
    assert live["request_id"] == handle.request_id and live["num_steps"] == 200 and 0 <= live["step"] <= 200
    assert live["ranks"] and set(live["ranks"]) <= {0, 1} and live["since_s"] <= 0
    assert live["state"] in ("encoding", "denoising", "decoding")
    tl = client.get("/v1/timeline").json()
    assert tl["live"] == [] and tl["running"] == 0


def _stage(kind, ranks, step, n, t0_ms, t1_ms, ulysses=None, regroup=False, batch=1):
    return Stage(
        batch=batch,
        regroup=regroup,  # the control plane's mark (NOTE [regroups]): the recorder shows it, never decides it
        kind=kind,
        ranks=ranks,
        ulysses=ulysses if ulysses is not None else (len(ranks) if kind == "denoise" else 1),
        ring=1,
        mode="usp",
        step_begin=step,
        num_steps=n,
        dispatch_ns=int(t0_ms * 1e6),
        start_ns=int(t0_ms * 1e6),
        end_ns=int(t1_ms * 1e6),
    )


def _result(rid, stages):
    return Result(
        request_id=rid,
        output=None,
        state="DONE",
        reason="",
        timeline=stages,
        transitions=[
            ("QUEUED", 0, stages[0].start_ns - 1_000_000),
            ("DONE", 0, max(s.end_ns for s in stages)),
        ],
    )


def test_recorder_merges_steps_marks_regroups_and_forgets_the_past():
    now = [1_500_000_000]  # ns
    rec = ActivityRecorder(window_s=5.0, max_spans=1000, clock=lambda: now[0])
    gap_ms = MERGE_GAP_NS / 1e6
    stages = [
        _stage("encode", [0], 0, 0, 1000, 1010),
        _stage("denoise", [0, 1], 0, 1, 1010, 1020),
        _stage("denoise", [0, 1], 1, 1, 1021, 1030),  # merged with the one before
        _stage("migrate", [0], 2, 0, 1030, 1031),
        _stage("denoise", [0], 2, 1, 1031, 1040, regroup=True),  # regrouped: fewer ranks
        _stage("denoise", [0], 3, 1, 1040 + 2 * gap_ms, 1050 + 2 * gap_ms),  # a long gap: not merged
        _stage(
            "denoise", [0, 1], 4, 1, 1300, 1310, ulysses=1, regroup=True
        ),  # again (ring 1, ulysses 1: "U1")
        _stage("decode", [1], 5, 0, 1310, 1400),
        _stage("denoise", [1], 9, 1, 0, 0),  # never ran: left out
    ]
    rec.record(_result(7, stages))
    snap = rec.snapshot(_FakeEngine())
    got = [(s["kind"], s["ranks"], s["step_begin"], s["num_steps"], s["regroup"]) for s in snap["spans"]]
    assert got == [
        ("encode", [0], 0, 0, False),
        ("denoise", [0, 1], 0, 2, False),
        ("migrate", [0], 2, 0, False),
        ("denoise", [0], 2, 1, True),
        ("denoise", [0], 3, 1, False),
        ("denoise", [0, 1], 4, 1, True),
        ("decode", [1], 5, 0, False),
    ]
    merged = snap["spans"][1]
    assert merged["start_s"] == pytest.approx(1.010 - 1.5) and merged["end_s"] == pytest.approx(1.030 - 1.5)
    assert [s["layout"] for s in snap["spans"][1:2]] == ["U2"]
    (req,) = snap["requests"]
    assert req == {
        "request_id": 7,
        "end_s": pytest.approx(1.4 - 1.5),
        "latency_s": pytest.approx(0.401),
        "num_steps": 5,
        "max_degree": 2,
        "regroups": 2,
    }
    assert snap["latency"]["count"] == 1 and snap["latency"]["p95_s"] == pytest.approx(0.401)
    # 5 s later (window 5 s) everything has ended before the window
    now[0] = 1_400_000_000 + 5_000_000_001
    snap = rec.snapshot(_FakeEngine())
    assert snap["spans"] == [] and snap["requests"] == [] and snap["latency"]["count"] == 0


def test_recorder_shows_batches_and_decode_groups():
    """A batched denoise task is in each member's timeline: each member's span carries the batch size, steps of
    another batch size are not merged into it, and a decode split over several ranks keeps them all."""
    now = [2_000_000_000]
    rec = ActivityRecorder(window_s=5.0, max_spans=1000, clock=lambda: now[0])
    for rid in (3, 4, 5):  # three requests stepped together on rank 0, then 3 and 4 on (its steps ran out)
        stages = [
            _stage("encode", [0], 0, 0, 1000 + rid, 1001 + rid),
            _stage("denoise", [0], 0, 1, 1010, 1020, batch=3),
            _stage("denoise", [0], 1, 1, 1020, 1030, batch=3),  # merged: the same batch
        ]
        if rid != 5:
            stages.append(_stage("denoise", [0], 2, 1, 1030, 1040, batch=2))  # not merged: another batch
        stages.append(_stage("decode", [0, 1], 3, 0, 1040 + rid, 1050 + rid))  # parallel decode on 2 ranks
        rec.record(_result(rid, stages))
    spans = rec.snapshot(_FakeEngine())["spans"]
    denoise = [
        (s["request_id"], s["step_begin"], s["num_steps"], s["batch"])
        for s in spans
        if s["kind"] == "denoise"
    ]
    assert denoise == [(3, 0, 2, 3), (3, 2, 1, 2), (4, 0, 2, 3), (4, 2, 1, 2), (5, 0, 2, 3)]
    assert all(s["batch"] == 1 for s in spans if s["kind"] != "denoise")
    assert [s["ranks"] for s in spans if s["kind"] == "decode"] == [[0, 1]] * 3


def test_recorder_caps_its_spans():
    now = [0]
    rec = ActivityRecorder(window_s=300.0, max_spans=50, clock=lambda: now[0])
    for rid in range(1, 41):
        t = rid * 100.0
        now[0] = int((t + 50) * 1e6)
        rec.record(
            _result(
                rid,
                [
                    _stage("encode", [0], 0, 0, t, t + 10),
                    _stage("denoise", [0], 0, 1, t + 10, t + 20),
                    _stage("decode", [0], 1, 0, t + 20, t + 30),
                ],
            )
        )
    snap = rec.snapshot(_FakeEngine())
    assert len(snap["spans"]) == 50 and len(snap["requests"]) == 40
    assert {s["request_id"] for s in snap["spans"]} >= {40, 39}  # the newest stay
    assert min(s["request_id"] for s in snap["spans"]) > 1  # the oldest went first


def test_layout_labels():
    assert layout_label(1, 1) == "U1"
    assert layout_label(2, 1) == "U2"
    assert layout_label(1, 2) == "R2"
    assert layout_label(2, 2) == "U2R2"
    assert layout_label(2, 2, "torus") == "U2R2t"


class _FakeEngine:
    world_size = 2

    def requests(self):
        return {}

    def alive_workers(self):
        return [True, True]


def test_page_and_timeline_with_an_api_key(engine):
    with TestClient(create_app(engine, model=MODEL, api_key=KEY)) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<svg id="timeline"' in page.text and "/v1/timeline" in page.text
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text)  # nothing from elsewhere
        r = c.get("/v1/timeline")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.get("/v1/timeline", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json()["world_size"] == 2


# ---- the page in headless Chromium ----


def _serving(app):
    """``app`` on a real uvicorn server (loopback, a free port), run on a thread; yields its URL."""
    pytest.importorskip("uvicorn")
    return serving(app)


@pytest.fixture(scope="module")
def live_url(spy):
    with _serving(create_app(spy, model=MODEL)) as url:
        yield url


def _dump_dom(url: str, profile_dir, budget_ms: int = 4000) -> str:
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile_dir}",
            "--window-size=1280,800",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@needs_chromium
@pytest.mark.timeout(180)
def test_chromium_timeline_shows_the_requests_that_ran(live_url, spy, tmp_path):
    import httpx

    answers: dict = {}

    def post(seed: int, size: str, steps: int) -> None:
        r = httpx.post(
            live_url + "/v1/images/generations",
            json={"prompt": "p", "size": size, "num_inference_steps": steps, "seed": seed},
            timeout=90,
        )
        answers[seed] = r.status_code

    post(300, "128x128", 8)
    threads = [threading.Thread(target=post, args=(s, "64x64", 6)) for s in (301, 302)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert answers == {300: 200, 301: 200, 302: 200}
    ran = {spy.by_seed[s].request_id: spy.by_seed[s].result(0) for s in answers}
    dom = _dump_dom(live_url + "/", tmp_path / "profile")
    svg = dom.split('<svg id="timeline"', 1)[1].split("</svg>", 1)[0]  # the drawing, not the script
    bars = re.findall(r'<rect class="span" ([^>]*)>', svg)
    assert bars, dom[-3000:]
    shown: dict[int, set[str]] = {}
    for attrs in bars:
        a = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attrs))
        shown.setdefault(int(a["request-id"]), set()).add(a["ranks"])
    for rid, result in ran.items():
        assert rid in shown, f"no bar for request {rid}: {sorted(shown)}"
        assert {",".join(map(str, st.ranks)) for st in result.timeline if st.start_ns > 0} == shown[rid]
    assert '<span class="v" id="queued">0</span>' in dom
    assert re.search(r'id="done">(\d+)<', dom) and int(re.search(r'id="done">(\d+)<', dom).group(1)) >= 3
    for rid in ran:
        assert f'<tr data-request-id="{rid}">' in dom


@needs_chromium
@pytest.mark.timeout(180)
def test_chromium_autorun_shows_the_generated_image(live_url, tmp_path):
    from PIL import Image

    dom = _dump_dom(
        live_url + "/?prompt=a%20red%20fox&size=64x32&steps=2&autorun=1", tmp_path / "profile", budget_ms=6000
    )
    fig = dom.split('<figure id="result">', 1)[1].split("</figure>", 1)[0]
    m = re.search(r'<img id="result-image"[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', fig)
    assert m, dom[-3000:]
    img = Image.open(io.BytesIO(base64.b64decode(m.group(1))))
    assert img.format == "PNG" and img.size == (64, 32)
    assert "64×32 · 2 steps" in fig and "a red fox" in fig  # the caption


@needs_chromium
@pytest.mark.timeout(180)
def test_chromium_autorun_on_a_video_model_shows_the_video(tmp_path):
    pytest.importorskip("av")
    with Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        with _serving(create_app(eng, model="tiny-wan")) as url:
            dom = _dump_dom(url + "/?prompt=a%20cat&steps=2&autorun=1", tmp_path / "profile", budget_ms=8000)
    fig = dom.split('<figure id="result">', 1)[1].split("</figure>", 1)[0]
    assert re.search(r'<video id="result-video"[^>]*src="blob:http://127\.0\.0\.1:\d+/', fig), fig
    assert "frames" in fig and "a cat" in fig


@needs_chromium
@pytest.mark.timeout(180)
def test_chromium_labels_batches_and_decode_groups(engine, tmp_path):
    """Spans recorded as a batch of 3 and a decode over two ranks (synthetic: an fcfs engine without a cost
    model never batches) are drawn with "×3" and with the decode's ranks."""
    from gfdit._C import runtime as rt

    app = create_app(engine, model=MODEL)
    t = rt.now_ns() / 1e6 - 8000  # ms: the last 8 s, wide enough bars for their labels
    for k, rid in enumerate((901, 902, 903)):
        stages = [
            _stage("encode", [0], 0, 0, t, t + 100),
            _stage("denoise", [0], 0, 4, t + 100, t + 2000, batch=3),
            _stage("decode", [0, 1], 4, 0, t + 2000 + k * 2000, t + 4000 + k * 2000),  # one after another
        ]
        app.state.server.live.record(_result(rid, stages))
    with _serving(app) as url:
        dom = _dump_dom(url + "/", tmp_path / "profile")
    svg = dom.split('<svg id="timeline"', 1)[1].split("</svg>", 1)[0]
    bars = [
        dict(re.findall(r'data-([a-z-]+)="([^"]*)"', a))
        for a in re.findall(r'<rect class="span" ([^>]*)>', svg)
    ]
    assert {(a["request-id"], a["batch"]) for a in bars if a["kind"] == "denoise"} == {
        (str(rid), "3") for rid in (901, 902, 903)
    }, svg[-3000:]
    assert {(a["request-id"], a["rank"]) for a in bars if a["kind"] == "decode"} == {
        (str(rid), r) for rid in (901, 902, 903) for r in ("0", "1")
    }
    labels = re.findall(r'<text class="bar[^"]*"[^>]*>([^<]*)</text>', svg)
    assert any(re.fullmatch(r"#90[123] U1 ×3", s) for s in labels), labels
    assert any(re.fullmatch(r"#90[123] dec 0,1", s) for s in labels), labels
