"""What people read of a gfdit error: the message without the C++ check's location and expression."""

from __future__ import annotations

import re

# "policies.cpp:183: check failed: s.height % m == 0: height 33 is ..." -> "height 33 is ..."
_LOCATION = re.compile(r"^[\w.+-]+\.(?:cpp|h|cu|cc):\d+: (?:check failed: .*?: )?")


def user_message(error: BaseException | str) -> str:
    """The message of a gfdit error (or a string) without its source location."""
    return _LOCATION.sub("", str(error), count=1)
