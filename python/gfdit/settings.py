"""The ``GFDIT_*`` environment variables, read through the one registry in the C++ core
(``include/gfdit/settings.h``; ``gfdit._C.settings``): every variable gfdit reads, from C++ or from Python,
with its default and meaning there; ``gfdit info`` prints them. Python code reads a setting only here, so an
unknown name is an error rather than a silent default."""

from __future__ import annotations

from gfdit._C import InvalidUsage
from gfdit._C import settings as _registry

_FALSE = ("0", "false", "off", "no", "")


def entries() -> list[dict]:
    """Every registered setting: name, default, type, meaning, and its value here (None: unset)."""
    return [dict(e) for e in _registry.entries()]


def value(name: str) -> str | None:
    """The environment's value of a registered setting, or None when it is unset."""
    for e in _registry.entries():
        if e["name"] == name:
            return e["value"]
    raise InvalidUsage(f"gfdit: {name} is not a registered setting")


def get(name: str) -> str:
    """The setting's value, or its registered default when unset."""
    return str(_registry.get(name))


def get_bool(name: str) -> bool:
    """A switch: "0", "false", "off", "no" or empty are off, anything else on."""
    return get(name).strip().lower() not in _FALSE


def get_int(name: str) -> int:
    """An integer setting; a value that is not one raises InvalidUsage naming the variable."""
    text = get(name).strip()
    try:
        return int(text, 0)
    except ValueError:
        raise InvalidUsage(f"gfdit: {name}={text!r} is not an integer") from None


def get_seconds(name: str) -> float:
    """A positive duration in seconds; anything else raises InvalidUsage naming the variable."""
    text = get(name).strip()
    try:
        value = float(text)
    except ValueError:
        raise InvalidUsage(f"gfdit: {name}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise InvalidUsage(f"gfdit: {name}={text!r} must be a positive number of seconds")
    return value
