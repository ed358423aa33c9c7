"""The bodies ``gfdit serve`` takes and answers, as pydantic models: OpenAI's fields (images, videos, models,
errors) and gfdit's additions (steps, guidance, seed, scheduling), and the error answers of each route
(``error_responses``). The routes take their bodies as these models, so the OpenAPI schema the server publishes
is what it parses.

A field's type is declared here; its value limits are the engine's (``gfdit.Engine.check``: sizes against the
model's strides and max_pixels, steps, frames, guidance, seed, priority, the deadline, the prompt's length),
which refuses a request with a 400 naming the field. Only what HTTP alone knows (the form of ``size``, the
formats offered, ``fps``) is constrained here. Unknown request fields are ignored, as OpenAI's own clients may
send fields a server does not use."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)

MAX_FPS = 120

# A JSON number: finite (Python's json module reads NaN and Infinity, JSON has neither), an integer allowed.
Number = Annotated[float, Strict(), AllowInfNan(False)]


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "must be Unicode text: a \\uD800-\\uDFFF escape stands only in a surrogate pair"
        ) from None
    return text


# A JSON string is Unicode text, but Python's json module reads a lone surrogate escape ("\ud800") into a str
# that no UTF-8 consumer (the engine's C++ request) can take
Text = Annotated[StrictStr, AfterValidator(_unicode)]


def _not_true(stream: bool) -> bool:
    if stream:
        raise ValueError("streaming is not supported")
    return stream


# stream is accepted only as false: a boolean of which the schema allows one value
NoStream = Annotated[
    StrictBool, AfterValidator(_not_true), WithJsonSchema({"type": "boolean", "const": False})
]


class GenerationRequest(BaseModel):
    """The fields images and videos share."""

    model_config = ConfigDict(extra="ignore")

    prompt: Text
    model: Text | None = None
    size: (
        Annotated[
            StrictStr,
            Field(
                pattern=r"^(auto|[1-9][0-9]{0,5}x[1-9][0-9]{0,5})$",
                description="'WIDTHxHEIGHT' in pixels, or 'auto' (the model's default)",
            ),
        ]
        | None
    ) = None
    user: Text | None = None
    negative_prompt: Text | None = None
    num_inference_steps: StrictInt | None = None
    guidance_scale: Number | None = None
    guidance_scale_2: Number | None = Field(
        None, description="Wan 2.2's low-noise expert (two-expert models)"
    )
    seed: StrictInt | None = Field(None, description="absent: a random one")
    slo_ms: Number | None = Field(None, description="the deadline in milliseconds after the request arrives")
    priority: StrictInt = Field(0, description="larger is more urgent (policies that use priorities)")
    cache: Text | None = Field(
        None,
        description="the step cache: 'fbcache[:THRESHOLD]' or 'teacache[:THRESHOLD]' with optional "
        "',warmup=N,max_skip=M', or 'none'; absent: the server's default (gfdit serve --cache)",
        examples=["fbcache:0.08", "teacache:0.1,warmup=2,max_skip=3", "none"],
    )

    def width_height(self, default: tuple[int, int]) -> tuple[int, int]:
        """(width, height) of ``size`` ("WIDTHxHEIGHT"), or ``default`` (the model's) when absent or "auto"."""
        if self.size is None or self.size == "auto":
            return default
        w, _, h = self.size.partition("x")
        return int(w), int(h)


class ImageGenerationRequest(GenerationRequest):
    """POST /v1/images/generations."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"prompt": "a lighthouse at dusk", "n": 1, "response_format": "b64_json"}]
        }
    )

    n: Annotated[StrictInt, Field(ge=1, description="images to make (at most the server's max_n)")] | None = (
        None
    )
    response_format: Literal["b64_json"] | None = None
    output_format: Literal["png"] | None = None
    stream: NoStream | None = None


class VideoGenerationRequest(GenerationRequest):
    """POST /v1/videos."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"prompt": "waves breaking on a beach"}]})

    seconds: Text | Number | None = Field(
        None, description="the length (OpenAI sends a string, '4'); num_frames wins when both are given"
    )
    num_frames: StrictInt | None = None
    fps: Annotated[StrictInt, Field(ge=1, le=MAX_FPS)] = 16


class ImageData(BaseModel):
    b64_json: str = Field(description="a PNG, base64")


class ImagesResponse(BaseModel):
    """The answer of POST /v1/images/generations (with a ``Server-Timing`` header)."""

    created: int
    data: list[ImageData]


class VideoError(BaseModel):
    message: str


class VideoJobObject(BaseModel):
    """A video job, as POST /v1/videos and GET /v1/videos/{id} answer it."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled"]
    progress: int = Field(ge=0, le=100, description="percent")
    created_at: int
    completed_at: int | None
    expires_at: int | None
    size: str
    num_frames: int
    error: VideoError | None


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = Field(description="the request field the error is about, if one is")
    code: str | None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx answer but /health's 503."""

    error: ErrorDetail


class Health(BaseModel):
    """GET /health: "ok" (200: every worker alive), "degraded" (200: some workers are alive and serve, others
    are dead or being replaced) or "unavailable" (503: no worker alive, the engine closed, or its control loop
    not answering or stalled), with the reason when not "ok"."""

    status: Literal["ok", "degraded", "unavailable"]
    alive: list[bool] = Field(description="per worker, empty when the control loop did not answer")
    alive_workers: int
    world_size: int
    restarting: list[int] = Field(description="workers being replaced")
    deaths: int = Field(description="workers that died so far")
    replacements: int = Field(description="replacement workers that joined so far")
    reason: str | None = None


ERROR_DESCRIPTIONS = {
    400: "a request error: a field of the wrong type, or a value the model or the server refuses; "
    "``param`` names the field",
    401: "missing or wrong API key (only when the server has one)",
    404: "no such model, job or path",
    409: "the video job has no content yet",
    413: "the request body is too large",
    429: "the queue is full; retry after Retry-After seconds",
    499: "the client closed the connection first (nobody reads this answer)",
    500: "a fault of the server or the model",
    503: "the engine cancelled the request (shutdown)",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}


def error_responses(*statuses: int, ok: dict[str, Any] | None = None) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that can answer these error statuses, each an ErrorResponse body (500 is
    added: any route can fail); ``ok``: its 200 when not the JSON of its response_model."""
    out: dict[int | str, dict[str, Any]] = {} if ok is None else {200: ok}
    for s in sorted({*statuses, 500}):
        out[s] = {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[s]}
        if s == 429:
            out[s]["headers"] = _RETRY_AFTER
    return out


def error_response_object(status: int) -> dict[str, Any]:
    """The OpenAPI response object of an error status (for a schema edited after FastAPI made it)."""
    return {
        "description": ERROR_DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
