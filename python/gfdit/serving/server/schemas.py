"""The bodies ``gfdit serve`` takes and answers, as pydantic models: OpenAI's fields (images, videos, models,
errors) and gfdit's additions (steps, guidance, seed, scheduling). Unknown request fields are ignored, as
OpenAI's own clients may send fields a server does not use.

The routes read a body as JSON first (to bound its size) and then validate it with these models, so a bad
field is answered by gfdit.serving.server.errors with the field's name as ``param``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr


class GenerationRequest(BaseModel):
    """The fields images and videos share."""

    model_config = ConfigDict(extra="ignore")

    prompt: StrictStr
    model: StrictStr | None = None
    size: StrictStr | None = None  # "WIDTHxHEIGHT" or "auto"
    user: StrictStr | None = None
    negative_prompt: StrictStr | None = None
    num_inference_steps: StrictInt | None = None
    guidance_scale: StrictFloat | None = None
    guidance_scale_2: StrictFloat | None = None  # Wan 2.2's low-noise expert
    seed: StrictInt | None = None  # None: a random one
    slo_ms: StrictFloat | None = None  # the deadline, after the request arrives
    priority: StrictInt = 0  # larger is more urgent (policies that use priorities)


class ImageGenerationRequest(GenerationRequest):
    """POST /v1/images/generations."""

    n: StrictInt | None = None
    response_format: StrictStr | None = None  # "b64_json" only
    output_format: StrictStr | None = None  # "png" only
    stream: StrictBool | None = None  # refused when true


class VideoGenerationRequest(GenerationRequest):
    """POST /v1/videos."""

    seconds: StrictStr | StrictFloat | None = None  # OpenAI sends a string ("4")
    num_frames: StrictInt | None = None
    fps: StrictInt = 16


class ImageData(BaseModel):
    b64_json: str  # a PNG


class ImagesResponse(BaseModel):
    """The answer of POST /v1/images/generations (with a ``Server-Timing`` header)."""

    created: int
    data: list[ImageData]


class VideoError(BaseModel):
    message: str


class VideoJobObject(BaseModel):
    """A video job, as POST /v1/videos and GET /v1/videos/{id} answer it."""

    id: str
    object: str = "video"
    model: str
    status: str  # queued, in_progress, completed, failed, cancelled
    progress: int  # percent
    created_at: int
    completed_at: int | None
    expires_at: int | None
    size: str
    num_frames: int
    error: VideoError | None


class VideoDeleted(BaseModel):
    id: str
    object: str = "video.deleted"
    deleted: bool


class ModelObject(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelObject]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx answer."""

    error: ErrorDetail


class Health(BaseModel):
    """GET /health: "ok" (200) or "unavailable" with the reason (503)."""

    status: str
    alive: list[bool]
    reason: str | None = None
