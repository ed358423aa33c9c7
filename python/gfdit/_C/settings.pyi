"""
Every GFDIT_* environment variable gfdit reads: one registry.
"""

from __future__ import annotations

__all__: list[str] = ["entries", "get"]

def entries() -> list:
    """
    The registry in order: a dict {name, default, type, meaning, value} per setting, value the environment's (None while unset).
    """

def get(name: str) -> str:
    """
    The environment's value of a registered setting, else its default (as a string); InvalidUsage for a name the registry does not hold.
    """
