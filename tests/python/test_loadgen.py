"""gfdit bench against real servers (tiny engines on two CPU ranks, uvicorn on a thread): open and closed
loop, trace replay, errors by kind, the API key, videos; and its statistics against hand-computed values."""

from __future__ import annotations

import json
import math
import socket

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("tqdm")
uvicorn = pytest.importorskip("uvicorn")

from gfdit.planning.trace import TraceRequest, write_trace  # noqa: E402
from gfdit.serving.engine import Engine  # noqa: E402
from gfdit.serving.server import create_app, serving  # noqa: E402
from gfdit.tools import cli, loadgen  # noqa: E402
from gfdit.tools.loadgen import BenchError, RequestRecord, run_bench, summarize_records  # noqa: E402

MODEL = "tiny-qwen-image"
VIDEO_MODEL = "tiny-wan"
KEY = "bench-key"


_serve = serving  # ``app`` on a real uvicorn server (loopback, a free port) on a thread; yields its URL


@pytest.fixture(scope="module")
def engine():
    with Engine(model=MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        yield eng


@pytest.fixture(scope="module")
def url(engine):
    with _serve(create_app(engine, model=MODEL)) as u:
        yield u


def _requests(n: int, gap_s: float, **fields) -> list[TraceRequest]:
    base = {"model": MODEL, "height": 64, "width": 64, "num_frames": 1, "num_inference_steps": 2}
    base.update(fields)
    return [TraceRequest(id=i, arrival_s=i * gap_s, **base) for i in range(n)]


def _check_consistent(report: dict) -> None:
    """The counts add up and the statistics agree with the records."""
    recs = report["records"]
    assert report["num_requests"] == len(recs)
    assert report["num_ok"] + report["num_errors"] == report["num_requests"]
    assert sum(report["errors"].values()) == report["num_errors"]
    assert report["num_ok"] == sum(r["kind"] == "ok" for r in recs)
    if report["num_ok"]:
        lat = [report[f"{k}_latency_s"] for k in ("p50", "p95", "p99", "max")]
        assert 0 < lat[0] <= lat[1] <= lat[2] <= lat[3]
        assert math.isclose(report["throughput_rps"], report["num_ok"] / report["duration_s"])
        ok = [r for r in recs if r["kind"] == "ok"]
        assert all(r["sent_s"] <= r["done_s"] and r["latency_s"] > 0 and r["status"] == 200 for r in ok)


# ---- statistics ----


def test_summarize_records_by_hand():
    recs = [
        RequestRecord(0, False, 0.0, 0.0, 1.0, 200, "ok", slo_s=1.5),  # latency 1, met
        RequestRecord(1, False, 1.0, 1.0, 3.0, 200, "ok", slo_s=1.5),  # latency 2, missed
        RequestRecord(2, False, 2.0, 2.5, 3.5, 200, "ok"),  # latency 1, sent 0.5 late
        RequestRecord(3, False, 3.0, 3.0, 3.25, 429, "429 queue_full", slo_s=1.0),  # failed: missed
        RequestRecord(4, False, 4.0, 4.0, 4.5, 500, "500 generation_failed"),
        RequestRecord(5, True, 4.0, None, None, None, "unsupported_video", slo_s=2.0),  # never sent
        RequestRecord(6, False, 5.0, 5.0, 6.0, 200, "ok"),  # latency 1
    ]
    s = summarize_records(recs)
    assert s["num_requests"] == 7 and s["num_sent"] == 6 and s["num_ok"] == 4 and s["num_errors"] == 3
    assert s["num_5xx"] == 1
    assert s["errors"] == {"429 queue_full": 1, "500 generation_failed": 1, "unsupported_video": 1}
    assert s["duration_s"] == pytest.approx(6.0)  # first send 0.0, last answer 6.0
    assert s["throughput_rps"] == pytest.approx(4 / 6)
    assert s["send_rate_rps"] == pytest.approx(5 / 5.0)  # six sends from 0.0 to 5.0
    assert s["offered_rate_rps"] == pytest.approx(5 / 5.0)  # their due times 0 .. 5
    # latencies of the successes: 1, 2, 1, 1 -> sorted 1, 1, 1, 2
    assert s["mean_latency_s"] == pytest.approx(1.25)
    assert s["p50_latency_s"] == pytest.approx(1.0)
    assert s["p95_latency_s"] == pytest.approx(1.0 + 0.85 * 1.0)  # position 0.95 * 3 = 2.85
    assert s["p99_latency_s"] == pytest.approx(1.0 + 0.97 * 1.0)
    assert s["max_latency_s"] == pytest.approx(2.0)
    assert s["max_send_lag_s"] == pytest.approx(0.5)
    assert s["num_with_deadline"] == 4 and s["slo_attainment"] == pytest.approx(1 / 4)
    assert [r.met_slo for r in recs] == [True, False, None, False, None, False, None]
    text = loadgen.format_report({"url": "u", "model": "m", "mode": "open", "concurrency": None, **s})
    assert "429 queue_full" in text and "25.0% of 4 with deadlines" in text


def test_summarize_nothing_succeeded():
    s = summarize_records([RequestRecord(0, False, 0.0, 0.0, None, None, "timeout")])
    assert s["num_ok"] == 0 and s["duration_s"] is None and s["throughput_rps"] is None
    assert s["p50_latency_s"] is None and s["slo_attainment"] is None and s["send_rate_rps"] is None
    assert "-" in loadgen.format_report({**s, "mode": "closed", "concurrency": 1})


def _err(type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": "m", "type": type, "param": param, "code": code}}


@pytest.mark.parametrize(
    "status, body, kind",
    [
        (429, _err("rate_limit_error", code="queue_full"), "429 queue_full"),
        (400, _err("invalid_request_error", param="size"), "400 size"),
        (401, _err("invalid_request_error", code="invalid_api_key"), "401 invalid_api_key"),
        (500, _err("server_error", code="generation_failed"), "500 generation_failed"),
        (500, _err("server_error"), "500 server_error"),
        (502, "<html>bad gateway</html>", "502"),
    ],
)
def test_error_kind(status, body, kind):
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    assert loadgen.error_kind(status, raw) == kind


# ---- against a server ----


def test_open_loop_rate_run_writes_json_and_plots(url, tmp_path):
    out = tmp_path / "bench.json"
    plots = tmp_path / "plots"
    argv = ["bench", "--url", url, "--rate", "10", "--duration", "1.5", "--size", "64x64", "--steps", "2"]
    argv += ["--json", str(out), "--plot", str(plots), "--no-progress", "--seed", "3"]
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == "open" and report["model"] == MODEL and report["num_requests"] >= 3
    assert report["num_ok"] == report["num_requests"] and report["errors"] == {} and report["num_5xx"] == 0
    _check_consistent(report)
    recs = report["records"]
    assert [r["arrival_s"] for r in recs] == sorted(r["arrival_s"] for r in recs) and recs[-1][
        "arrival_s"
    ] < 1.5
    assert all(r["sent_s"] >= r["arrival_s"] for r in recs)  # open loop: never before its arrival
    for name in ("latency_cdf.png", "latency_over_time.png", "throughput.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_replay_with_deadlines(url, tmp_path, capsys):
    reqs = _requests(4, 0.1)
    reqs[0].deadline_s = reqs[0].arrival_s + 60.0  # met
    reqs[1].deadline_s = reqs[1].arrival_s + 1e-4  # missed: no generation is that fast
    path = tmp_path / "t.jsonl"
    write_trace(str(path), reqs)
    out = tmp_path / "r.json"
    argv = [
        "bench",
        "--url",
        url,
        "--trace",
        str(path),
        "--slo-ms",
        "30000",
        "--json",
        str(out),
        "--no-progress",
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "latency" in printed and "SLO attainment" in printed
    report = json.loads(out.read_text())
    _check_consistent(report)
    assert report["num_ok"] == 4
    by_id = {r["id"]: r for r in report["records"]}
    assert by_id[0]["slo_s"] == pytest.approx(60.0) and by_id[0]["met_slo"] is True
    assert by_id[1]["met_slo"] is False
    assert by_id[2]["slo_s"] == pytest.approx(30.0)  # --slo-ms where the trace has no deadline
    assert report["num_with_deadline"] == 4 and report["slo_attainment"] == pytest.approx(3 / 4)


def test_closed_loop(url):
    report = run_bench(url, _requests(6, 0.0), concurrency=2)
    assert report["mode"] == "closed" and report["concurrency"] == 2
    assert report["num_ok"] == 6
    _check_consistent(report)
    recs = sorted(report["records"], key=lambda r: r["sent_s"])
    for r in recs:  # never more than two requests in flight
        in_flight = sum(1 for o in recs if o["sent_s"] <= r["sent_s"] < o["done_s"])
        assert in_flight <= 2
    one = run_bench(url, _requests(3, 0.0), concurrency=1)
    recs = sorted(one["records"], key=lambda r: r["sent_s"])
    assert all(a["done_s"] <= b["sent_s"] for a, b in zip(recs, recs[1:]))  # one after another


def test_rejections_and_bad_sizes_are_counted_by_kind(engine):
    with _serve(create_app(engine, model=MODEL, max_queue=1)) as u:
        burst = _requests(8, 0.0, num_inference_steps=20)  # all at once: one fits in the queue
        burst.append(TraceRequest(8, 0.0, MODEL, 64, 65, 1, 2))  # width not a multiple of 16
        report = run_bench(u, burst)
    _check_consistent(report)
    assert report["num_ok"] >= 1 and report["num_5xx"] == 0
    assert report["errors"]["429 queue_full"] >= 1
    assert report["errors"]["400 size"] == 1
    assert {r["status"] for r in report["records"]} <= {200, 400, 429}


def test_api_key(engine, capsys):
    with _serve(create_app(engine, model=MODEL, api_key=KEY)) as u:
        with pytest.raises(BenchError, match="401"):
            run_bench(u, _requests(1, 0.0))
        assert cli.main(["bench", "--url", u, "--concurrency", "1", "--requests", "1", "--no-progress"]) == 2
        assert "401" in capsys.readouterr().err
        report = run_bench(u, _requests(2, 0.0), api_key=KEY)
        assert report["num_ok"] == 2


def test_videos_on_an_image_model_are_an_error_kind(url):
    reqs = _requests(2, 0.0)
    reqs.append(TraceRequest(2, 0.0, VIDEO_MODEL, 32, 48, 5, 2))
    report = run_bench(url, reqs)
    assert report["num_ok"] == 2 and report["errors"] == {"unsupported_video": 1}
    video = [r for r in report["records"] if r["video"]][0]
    assert video["sent_s"] is None and video["status"] is None


def test_video_jobs_are_polled_until_completed():
    with Engine(model=VIDEO_MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        with _serve(create_app(eng, model=VIDEO_MODEL)) as u:
            reqs = [
                TraceRequest(0, 0.0, VIDEO_MODEL, 32, 48, 5, 2),
                TraceRequest(1, 0.05, VIDEO_MODEL, 32, 48, 1, 2),  # one frame: an image
            ]
            report = run_bench(u, reqs, poll_s=0.02, fetch_content=True)
    _check_consistent(report)
    assert report["num_ok"] == 2
    assert [r["video"] for r in sorted(report["records"], key=lambda r: r["id"])] == [True, False]


def test_generated_workloads_fit_the_served_model():
    reqs = loadgen.workload_requests(MODEL, "image", 50.0, 1.0, seed=1)
    assert reqs and all(r.model == MODEL and r.deadline_s is None for r in reqs)
    assert all(r.height * r.width <= 256 * 256 for r in reqs)  # the tiny model's menu, scaled down
    timed = loadgen.workload_requests(MODEL, "image", 50.0, 1.0, seed=1, slo_scale=3.0)
    assert all(r.deadline_s > r.arrival_s for r in timed)
    with pytest.raises(BenchError, match="makes only images"):
        loadgen.workload_requests(MODEL, "video", 1.0, 1.0)
    videos = loadgen.workload_requests(VIDEO_MODEL, "mixed", 20.0, 1.0)
    assert {r.num_frames > 1 for r in videos} == {True, False}


@pytest.mark.parametrize(
    "extra",
    [
        [],  # nothing to send
        ["--rate", "5"],  # no duration
        ["--rate", "-1", "--duration", "1"],
        ["--rate", "5", "--duration", "1", "--concurrency", "2"],
        ["--concurrency", "2"],  # no request count
        ["--concurrency", "0", "--requests", "3"],
        ["--duration", "3", "--concurrency", "1", "--requests", "1"],
        ["--rate", "5", "--duration", "1", "--size", "64by64"],
        ["--rate", "5", "--duration", "1", "--steps", "0"],
        ["--trace", "no-such-trace.jsonl"],
    ],
)
def test_bad_arguments_exit_2(url, extra, capsys):
    assert cli.main(["bench", "--url", url, "--no-progress", *extra]) == 2
    assert capsys.readouterr().err.startswith("gfdit bench: ")


def test_unreachable_server_exits_2(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    argv = ["bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1", "--requests", "1"]
    assert cli.main(argv) == 2
    assert "cannot reach" in capsys.readouterr().err
