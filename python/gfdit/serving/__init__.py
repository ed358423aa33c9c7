"""Serving: ``engine`` (``gfdit.Engine``, the facade over the C++ control plane), ``worker`` (one process per
rank running the model) and ``server`` (``gfdit serve``: the OpenAI-compatible HTTP front end and its live
page)."""
