"""Case functions of the gfdit.models tests; they run inside the rank processes of mp_harness worlds.

A case is a plain dict: the model ("wan" or "qwen", config overrides, weight seed), its inputs (seed and
shape options of gfdit.models.tiny), the group (None: the world) and the spec (None: the wrapper's
default). Every rank builds the same tiny model from the seed (cached per process, so a sequence of calls
reuses one model and one wrapper), runs the plain model and the parallel wrapper on the same inputs and
compares them. Mismatches are returned, not raised, so one wrong case does not desynchronise the world.
"""

from __future__ import annotations

import time

import mp_harness
import torch

F32_RTOL = 1e-4  # max |parallel - plain| / max |plain|

_MODELS: dict = {}


def _model(case: dict):
    """(model, wrapper) of a case, built once per process from the case's seed and overrides."""
    import gfdit.models as gm
    from gfdit.models import tiny

    key = (case["model"], case.get("weights", 0), tuple(sorted(case.get("config", {}).items())))
    if key not in _MODELS:
        build = tiny.tiny_wan if case["model"] == "wan" else tiny.tiny_qwen_image
        model = build(case.get("weights", 0), **case.get("config", {}))
        _MODELS[key] = (model, gm.parallelize(model))
    return _MODELS[key]


def _inputs(case: dict, model) -> dict:
    from gfdit.models import tiny

    make = tiny.wan_inputs if case["model"] == "wan" else tiny.qwen_image_inputs
    return make(model, case["seed"], **case.get("inputs", {}))


def _spec(case: dict):
    import gfdit

    return None if case.get("spec") is None else gfdit.ParallelSpec(**case["spec"])


def _processor_types(model) -> list:
    blocks = model.blocks if hasattr(model, "blocks") else model.transformer_blocks
    return [type(b.attn1.processor if hasattr(b, "attn1") else b.attn.processor).__name__ for b in blocks]


def run_case(ctx, case: dict) -> dict | None:
    """Runs one case on this rank; None when this rank is not in the case's group."""
    import gfdit

    ranks = case.get("group") or list(range(ctx.world_size))
    if ctx.rank not in ranks:
        return None
    group = None if case.get("group") is None else gfdit.new_group(ranks)
    model, wrapper = _model(case)
    before = _processor_types(model)
    kwargs = _inputs(case, model)
    with torch.no_grad():
        ref = model(**kwargs)[0]
        start = time.perf_counter()
        out = wrapper(**_inputs(case, model), group=group, spec=_spec(case))
        elapsed = time.perf_counter() - start
        again = model(**kwargs)[0]  # the plain model is untouched by the parallel call
    out = out[0]
    ok_shape = tuple(out.shape) == tuple(ref.shape)
    err = float("inf")
    if ok_shape:
        err = ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
    restored = _processor_types(model) == before and torch.equal(again, ref)
    return {
        "name": case["name"],
        "rank": ctx.rank,
        "err": err,
        "restored": restored,
        "time": elapsed,
        "shape": tuple(out.shape),
        "ok": ok_shape and err <= F32_RTOL and restored,
    }


def case_batch(ctx, cases: list) -> list:
    """Runs every case in order on this rank (see mp_harness.run_batch)."""
    return mp_harness.run_batch(ctx, cases, run_case)


def case_bad_call(ctx, kind: str) -> dict:
    """A parallel call that must be refused on every rank; then a good call must still work."""
    import gfdit

    n = ctx.world_size
    model_name = "qwen" if kind == "padded_mask" else "wan"
    case = {"model": model_name, "seed": 3}
    model, wrapper = _model(case)
    kwargs = _inputs(case, model)
    spec = None
    group = None
    called = wrapper
    if kind == "spec_size":
        spec = gfdit.ParallelSpec(ulysses=n, ring=2)
    elif kind == "heads":  # one head, Ulysses over the whole world: fewer heads than members
        one_head, called = _model({"model": "wan", "config": {"num_attention_heads": 1}})
        kwargs = _inputs(case, one_head)
    elif kind == "padded_mask":
        kwargs["encoder_hidden_states_mask"] = torch.ones(1, 5, dtype=torch.long)
        kwargs["encoder_hidden_states_mask"][0, -2:] = 0
    elif kind == "bad_args":
        kwargs["no_such_argument"] = 1
    else:
        raise ValueError(kind)
    try:
        with torch.no_grad():
            called(**kwargs, group=group, spec=spec)
    except Exception as exc:  # noqa: BLE001
        result = {"types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    else:
        result = {"types": [], "message": "no error"}
    with torch.no_grad():
        good = _inputs(case, model)
        ref = model(**good)[0]
        out = wrapper(**good)[0]
    result["after_err"] = ((out - ref).abs().max() / ref.abs().max()).item()
    result["restored"] = all(
        t.endswith("AttnProcessor") or t.endswith("AttnProcessor2_0") for t in _processor_types(model)
    )
    return result
