"""The defaults of ``gfdit serve`` and ``create_app`` (a module of its own: the command must not import FastAPI)."""

MAX_QUEUE = 256  # generations (images and video jobs) outstanding before 429
MAX_N = 10  # the largest n of one image request
MAX_BODY_BYTES = 1 << 20  # larger request bodies get 413
MAX_VIDEO_BYTES = 1 << 30  # MP4s of finished video jobs kept in memory at most
JOB_TTL_S = 3600.0  # how long a finished video job is kept
