"""The OpenAPI schema ``gfdit serve`` publishes: it declares every request body and error answer, and
Schemathesis, run against it with every check on, finds no response that breaks it and no 5xx."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from gfdit.serving.engine import Engine  # noqa: E402
from gfdit.serving.server import create_app, serving  # noqa: E402

MODEL = "tiny-wan"  # a video model: it serves images and video jobs, so every route generates
KEY = "schema-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Every request Schemathesis may make stays cheap: the engine refuses (400) more steps, pixels or frames than
# a little over the model's defaults (48x32, 9 frames, 4 steps)
LIMITS = {"max_steps": 4, "max_pixels": 64 * 64, "max_frames": 9}
MAX_N = 2


@pytest.fixture(scope="module")
def engine():
    with Engine(model=MODEL, world_size=1, policy="fcfs", timeout_s=20.0, limits=LIMITS) as eng:
        yield eng


@pytest.fixture(scope="module")
def schema(engine):
    with TestClient(create_app(engine, model=MODEL, api_key=KEY, max_n=MAX_N)) as c:
        r = c.get("/openapi.json")
        assert r.status_code == 200
        assert c.get("/docs").status_code == 200
        return r.json()


def _operations(schema):
    return {(m.upper(), p): op for p, ops in schema["paths"].items() for m, op in ops.items()}


def _body_ref(op) -> str:
    return op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]


def test_schema_declares_the_request_bodies(schema):
    ops = _operations(schema)
    assert _body_ref(ops["POST", "/v1/images/generations"]) == "ImageGenerationRequest"
    assert _body_ref(ops["POST", "/v1/videos"]) == "VideoGenerationRequest"
    assert all("requestBody" not in op for (method, _), op in ops.items() if method != "POST")
    image = schema["components"]["schemas"]["ImageGenerationRequest"]
    assert image["required"] == ["prompt"]
    props = image["properties"]
    assert {"prompt", "n", "size", "seed", "num_inference_steps", "guidance_scale_2"} <= set(props)
    (n,) = (s for s in props["n"]["anyOf"] if s["type"] == "integer")
    assert (n["minimum"], n["maximum"]) == (1, MAX_N)  # this app's max_n
    # the engine's limits stay the engine's: a type, no bounds
    assert props["num_inference_steps"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]


def test_schema_documents_every_error_with_the_openai_body(schema):
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    expected = {
        ("POST", "/v1/images/generations"): {"200", "400", "401", "404", "413", "429", "499", "500", "503"},
        ("POST", "/v1/videos"): {"200", "400", "401", "404", "413", "429", "500"},
        ("GET", "/v1/videos/{video_id}"): {"200", "400", "401", "404", "500"},
        ("GET", "/v1/videos/{video_id}/content"): {"200", "401", "404", "409", "500"},
        ("DELETE", "/v1/videos/{video_id}"): {"200", "401", "404", "500"},
        ("GET", "/v1/models"): {"200", "401", "500"},
        ("GET", "/v1/timeline"): {"200", "401", "500"},
        ("GET", "/metrics"): {"200", "401", "500"},
        ("GET", "/health"): {"200", "503"},
        ("GET", "/"): {"200"},
    }
    ops = _operations(schema)
    assert set(ops) == set(expected)
    for key, statuses in expected.items():
        responses = ops[key]["responses"]
        assert set(responses) == statuses, key
        for status in statuses - {"200"}:
            if key[1] != "/health":
                assert responses[status]["content"] == {"application/json": {"schema": error}}, (key, status)
        assert ("security" in ops[key]) == ("401" in statuses), key
    assert ops["GET", "/health"]["responses"]["503"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Health"
    }
    content = ops["GET", "/v1/videos/{video_id}/content"]["responses"]["200"]["content"]
    assert set(content) == {"video/mp4"}
    assert set(ops["GET", "/metrics"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(ops["GET", "/"]["responses"]["200"]["content"]) == {"text/html"}
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"message", "type", "param", "code"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # no 422 is ever answered


def test_an_open_server_declares_no_key(engine):
    with TestClient(create_app(engine, model=MODEL)) as c:
        ops = _operations(c.get("/openapi.json").json())
    assert all("security" not in op and "401" not in op["responses"] for op in ops.values())


# A schema-valid request may still be refused: the engine's limits (steps, pixels, frames, the model's
# strides, guidance_scale_2 on a one-expert model) are its own, so the schema gives their types only and a
# value past them is a documented 400 naming the field. Schemathesis's default for schema-valid requests
# leaves 400 out; everything else is its default.
SCHEMATHESIS_CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429"]
"""


@pytest.mark.timeout(180)
def test_schemathesis_finds_nothing(engine, tmp_path):
    """Every phase (examples, coverage, fuzzing, stateful) and every check, a few examples per operation, on a
    keyed server (so the checks of authentication run too); the server is healthy afterwards."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    finished = engine.stats()["finished"]
    with serving(create_app(engine, model=MODEL, api_key=KEY, max_n=MAX_N, max_queue=64)) as url:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(config),
                "run",
                f"{url}/openapi.json",
                "--checks",
                "all",
                "--max-examples",
                "10",
                "--seed",
                "7",
                "--workers",
                "1",
                "--no-color",
                "--request-timeout",
                "30",
                "--suppress-health-check",
                "too_slow",
                "-H",
                f"Authorization: Bearer {KEY}",
            ],
            capture_output=True,
            text=True,
            timeout=150,
            cwd=tmp_path,
        )
        import httpx

        health = httpx.get(f"{url}/health", timeout=10)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
    assert "No issues found" in out, out[-6000:]
    # it made bodies the engine generated from, not only ones refused
    assert engine.stats()["finished"] > finished
