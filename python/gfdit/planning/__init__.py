"""Planning: what work costs and what load looks like, apart from running it.

``cost`` (the analytic and profiled cost models, ``gfdit cost``), ``workload`` (synthetic request traces,
``gfdit trace``), ``trace`` (trace files, per-request outcomes and their summary) and ``simulate`` (the control
plane on a virtual clock, ``gfdit simulate``)."""
