"""The ``gfdit`` command and its tools that drive a running system: ``cli`` (the command), ``profile``
(``gfdit profile``: measures a model on this machine), ``replay`` (``gfdit run-trace``: a trace on the real
engine) and ``loadgen`` (``gfdit bench``: load on a running server)."""
