"""The cost model from Python: the tiny models' architectures against the real tiny models, the facade,
profile files, and the ``gfdit cost`` command."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import gfdit
import pytest
from gfdit._C import cost as C
from gfdit.planning import cost


# -- the tiny architectures are the tiny models ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-wan", "tiny-qwen-image"])
def test_tiny_arch_matches_the_tiny_model(name: str) -> None:
    model = gfdit.models.load(name)
    arch = C.model_arch(name)
    cfg = model.transformer.config
    assert arch.num_layers == cfg.num_layers
    assert arch.heads == cfg.num_attention_heads
    assert arch.head_dim == cfg.attention_head_dim
    assert arch.hidden == cfg.num_attention_heads * cfg.attention_head_dim
    assert arch.transformer_params == sum(p.numel() for p in model.transformer.parameters())
    assert arch.text_encoder_params == sum(p.numel() for p in model.text_encoder.parameters())
    assert (arch.patch_t, arch.patch_s, arch.patch_s) == tuple(model.patch_size)
    assert arch.is_video == model.is_video
    d = model.defaults
    assert (arch.default_height, arch.default_width, arch.default_frames) == (d.height, d.width, d.num_frames)
    assert arch.default_steps == d.num_inference_steps
    assert arch.default_guidance == d.guidance_scale
    assert arch.text_tokens == d.max_sequence_length
    if name == "tiny-wan":
        assert arch.ffn == cfg.ffn_dim
        assert arch.text_hidden == cfg.text_dim
        assert arch.vae_stride_s == model.scale_spatial == model.vae.config.scale_factor_spatial
        assert arch.vae_stride_t == model.scale_temporal == model.vae.config.scale_factor_temporal
        assert arch.latent_channels == cfg.in_channels
        assert arch.spatial_multiple() == model.scale_spatial * model.patch_size[1]
    else:
        assert arch.joint_attention
        assert arch.ffn == model.transformer.transformer_blocks[0].img_mlp.net[0].proj.out_features
        assert arch.text_hidden == cfg.joint_attention_dim
        assert arch.vae_stride_s == model.vae_scale == 2 ** len(model.vae.temperal_downsample)
        assert arch.latent_channels == cfg.in_channels // 4
        assert arch.spatial_multiple() == model.vae_scale * 2
    sizes = [(d.height, d.width, d.num_frames), (64, 96, 17 if arch.is_video else 1), (128, 128, 1)]
    for h, w, f in sizes:
        shape = model.latent_shape(height=h, width=w, num_frames=f)
        assert arch.tokens(h, w, f) == model.sequence_length(tuple(shape[2:])), (h, w, f)
    # The limits admit the defaults and refuse what a CPU cannot finish.
    assert d.height * d.width <= arch.max_pixels <= 256 * 256
    assert arch.max_frames <= 33 and arch.max_steps <= 200 and arch.max_tokens <= 4096


def test_registries_and_unknown_names() -> None:
    assert {"qwen-image", "wan2.2", "wan2.2-5b", "wan2.1-1.3b", "tiny-wan", "tiny-qwen-image"} == set(
        C.model_names()
    )
    assert C.model_arch("wan2.2").tokens(720, 1280, 81) == 75600
    assert C.model_arch("qwen-image").tokens(1024, 1024) == 4096
    with pytest.raises(gfdit.InvalidUsage, match="qwen-image"):
        C.model_arch("flux")
    with pytest.raises(gfdit.InvalidUsage, match="h200"):
        C.hardware("b200")
    with pytest.raises(gfdit.InvalidUsage, match="h20x16"):
        C.cluster("h20x2")
    cl = C.cluster("h20x16")
    assert cl.num_ranks == 16 and cl.node_of(9) == 1
    assert C.cluster("cpu", 3).num_ranks == 3


# -- the facade -----------------------------------------------------------------------------------------------
def test_estimate_defaults_and_shape() -> None:
    est = cost.estimate("qwen-image", "h20")
    assert set(est) == {"encode_s", "step_s", "decode_s", "migrate_s"}
    assert all(v > 0 and math.isfinite(v) for v in est.values())
    # The model's default guidance (4.0) doubles the step.
    off = cost.estimate("qwen-image", "h20", guidance_scale=1.0)
    assert est["step_s"] == pytest.approx(2 * off["step_s"])
    # A large image scales with the degree, a small one does not.
    big1 = cost.estimate("qwen-image", "h20", height=1536, width=1536)["step_s"]
    big4 = cost.estimate("qwen-image", "h20", height=1536, width=1536, ulysses=4)["step_s"]
    assert big1 / big4 > 2.5
    small2 = cost.estimate("qwen-image", "h20", height=512, width=512, ulysses=2)["step_s"]
    small4 = cost.estimate("qwen-image", "h20", height=512, width=512, ulysses=4)["step_s"]
    assert small4 > 0.95 * small2
    # Across two nodes: Ulysses over the NIC is slower; Torus recovers part of it.
    intra = cost.estimate("wan2.1-1.3b", "h100", ulysses=4)["step_s"]
    inter = cost.estimate("wan2.1-1.3b", "h100", ulysses=4, num_nodes=2)["step_s"]
    assert inter > intra
    with pytest.raises(gfdit.InvalidUsage, match="mode"):
        cost.estimate("qwen-image", mode="ring")
    # CFG-parallel on two ranks (a guidance pass each) beats Ulysses 2 with the passes in turn on a small image
    cfg2 = cost.estimate("qwen-image", "h20", height=512, width=512, cfg=2)["step_s"]
    assert cfg2 < 0.7 * small2
    with pytest.raises(gfdit.InvalidUsage, match="cfg"):
        cost.estimate("qwen-image", cfg=3)
    with pytest.raises(gfdit.InvalidUsage, match="guidance"):
        cost.estimate("qwen-image", cfg=2, guidance_scale=1.0)


def test_cost_model_analytic_and_profiled(tmp_path: Path) -> None:
    cm = cost.cost_model("tiny-wan", C.cluster("cpu", 4))
    assert isinstance(cm, C.CostModel)
    assert "analytic tiny-wan" in cm.describe() and cm.model.name == "tiny-wan"
    path = _write_profile(tmp_path)
    pm = cost.cost_model("tiny-wan", profile=path)
    assert "profile of tiny-wan" in pm.describe()
    assert pm.seconds(C.Stage.DENOISE, 32, 48, 9, guidance_scale=4.0, degree=2, ulysses=2) == pytest.approx(
        0.004
    )
    with pytest.raises(gfdit.InvalidUsage, match="tiny-qwen-image"):
        cost.cost_model("tiny-qwen-image", profile=path)


# -- profiles -------------------------------------------------------------------------------------------------
def _profile_dict() -> dict:
    step = {
        "stage": "denoise",
        "degree": 2,
        "ulysses": 2,
        "ring": 1,
        "mode": "usp",
        "guidance": True,
        "num_new": 0,
        "samples": 5,
    }
    return {
        "format": "gfdit-profile/2",
        "model": "tiny-wan",
        "hardware": "cpu",
        "world_size": 4,
        "num_cores": 2,
        "dispatch_s": 2.5e-05,
        "completion_s": 1.5e-05,
        "entries": [
            {**step, "tokens": 18, "seconds": 0.004},
            {**step, "tokens": 120, "seconds": 0.010},
            {"stage": "encode", "tokens": 18, "degree": 2, "guidance": True, "seconds": 0.002},
            {"stage": "decode", "tokens": 18, "degree": 1, "guidance": True, "seconds": 0.09},
            {"stage": "decode", "tokens": 120, "degree": 1, "guidance": True, "seconds": 0.3},
            {
                "stage": "migrate",
                "tokens": 18,
                "degree": 2,
                "ulysses": 2,
                "guidance": True,
                "num_new": 1,
                "seconds": 0.0003,
            },
        ],
    }


def _write_profile(tmp_path: Path, data: dict | None = None) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(_profile_dict() if data is None else data))
    return path


def test_load_profile_good(tmp_path: Path) -> None:
    p = cost.load_profile(_write_profile(tmp_path))
    assert p.model == "tiny-wan" and p.world_size == 4 and p.num_cores == 2
    assert p.dispatch_s == pytest.approx(2.5e-5)
    assert len(p.entries) == 6 and p.entries[0].stage == C.Stage.DENOISE and p.entries[0].guidance
    assert all(e.cfg == 1 for e in p.entries)  # written before CFG-parallel: no cfg field, cfg 1
    assert all(e.batch == 1 for e in p.entries)  # written before batches: no batch field, batch 1
    assert [e.samples for e in p.entries] == [5, 5, 0, 0, 0, 0]  # no samples field: 0
    assert p.entries[0].mode == gfdit._C.runtime.LayoutMode.USP
    pm = C.profiled(p)
    # Exact at measured points, linear between (tokens 18 -> 32x48x9, 120 -> 64x96x17).
    assert pm.seconds(C.Stage.DENOISE, 64, 96, 17, guidance_scale=4.0, degree=2, ulysses=2) == pytest.approx(
        0.010
    )
    assert pm.seconds(C.Stage.DECODE, 64, 96, 17, guidance_scale=4.0) == pytest.approx(0.3)
    assert pm.seconds(C.Stage.ENCODE, 256, 256, 33, guidance_scale=4.0, degree=2) == pytest.approx(0.002)
    with pytest.raises(gfdit.InvalidUsage, match=r"128x128x33"):
        pm.seconds(C.Stage.DENOISE, 128, 128, 33, guidance_scale=4.0, degree=2, ulysses=2)
    with pytest.raises(gfdit.InvalidUsage, match="degree 4"):
        pm.seconds(C.Stage.DENOISE, 32, 48, 9, guidance_scale=4.0, degree=4, ulysses=4)
    # A CFG-parallel entry is a layout of its own.
    data = _profile_dict()
    data["entries"].append({**data["entries"][0], "degree": 2, "ulysses": 1, "cfg": 2, "seconds": 0.003})
    data["entries"].append({**data["entries"][1], "degree": 2, "ulysses": 1, "cfg": 2, "seconds": 0.007})
    pc = C.profiled(cost.load_profile(_write_profile(tmp_path, data)))
    assert pc.seconds(C.Stage.DENOISE, 64, 96, 17, guidance_scale=4.0, degree=2, cfg=2) == pytest.approx(
        0.007
    )
    assert pc.seconds(C.Stage.DENOISE, 64, 96, 17, guidance_scale=4.0, degree=2, ulysses=2) == pytest.approx(
        0.010
    )
    # A Profile built in Python works the same.
    q = C.Profile()
    q.model = "tiny-qwen-image"
    q.entries = [
        C.ProfileEntry(stage=C.Stage.DENOISE, tokens=15, seconds=0.01),
        C.ProfileEntry(stage=C.Stage.DENOISE, tokens=60, seconds=0.03),
    ]
    assert C.profiled(q).seconds(C.Stage.DENOISE, 96, 80, 1) == pytest.approx(0.01 + 0.02 * 15 / 45)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.update(format="gfdit-profile/0"), "format"),
        (lambda d: d.update(model="flux"), "unknown model 'flux'"),
        (lambda d: d.update(world_size=0), "world_size"),
        (lambda d: d.update(entries=[]), "entries"),
        (
            lambda d: d["entries"][1].update(stage="step"),
            r"entry 1: stage must be one of \['encode', 'denoise'",
        ),
        (lambda d: d.update(format="gfdit-profile/1"), r"entry 0: stage must be one of \['encode', 'step'"),
        (lambda d: d["entries"][0].update(seconds=-0.1), r"entry 0: seconds"),
        (lambda d: d["entries"][2].update(tokens=0), r"entry 2: tokens"),
        (lambda d: d["entries"][0].update(ulysses=4), r"entry 0: ulysses 4 x ring 1 != degree 2"),
        (lambda d: d["entries"][5].update(num_new=-1), r"entry 5: num_new"),
        (lambda d: d["entries"][1].update(samples=1.5), r"entry 1: samples must be an integer >= 0"),
        (lambda d: d["entries"][0].update(mode="ring"), r"entry 0: mode"),
        (lambda d: d["entries"][0].update(cfg=3), r"entry 0: cfg must be 1 or 2"),
        (lambda d: d["entries"][0].update(batch=0), r"entry 0: batch must be a positive integer"),
        (lambda d: d["entries"][0].update(cfg=2), r"entry 0: ulysses 2 x ring 1 x cfg 2 != degree 2"),
        (
            lambda d: d["entries"][0].update(cfg=2, ulysses=1, guidance=False),
            r"entry 0: cfg 2 .* needs guidance",
        ),
    ],
)
def test_load_profile_bad(tmp_path: Path, edit, match: str) -> None:
    data = _profile_dict()
    edit(data)
    with pytest.raises(gfdit.InvalidUsage, match=match):
        cost.load_profile(_write_profile(tmp_path, data))


def test_profile_format_1_reads_step_as_denoise(tmp_path: Path) -> None:
    """A gfdit-profile/1 file loads, its "step" entries as the denoise stage (gfdit.planning.cost.PROFILE_FORMAT)."""
    data = _profile_dict()
    data["format"] = "gfdit-profile/1"
    for e in data["entries"]:
        if e["stage"] == "denoise":
            e["stage"] = "step"
    old = cost.load_profile(_write_profile(tmp_path, data))
    new = cost.load_profile(_write_profile(tmp_path))
    assert cost.profile_to_json(old) == cost.profile_to_json(new)
    assert [e.stage for e in old.entries][:2] == [C.Stage.DENOISE, C.Stage.DENOISE]


def test_profile_written_and_read_back(tmp_path: Path) -> None:
    """write_profile writes every field of the schema (the C++ ProfileEntry) and load_profile reads it all."""
    p = C.Profile()
    p.model, p.hardware, p.world_size, p.num_cores = "tiny-wan", "cpu", 4, 2
    p.dispatch_s, p.completion_s, p.collective_efficiency = 3e-5, 2e-6, 0.75
    p.entries = [
        C.ProfileEntry(
            stage=C.Stage.DENOISE,
            tokens=t,
            degree=4,
            ulysses=2,
            ring=2,
            mode="torus",
            guidance=True,
            seconds=t / 1000,
            samples=6,
        )
        for t in (18, 120)
    ] + [C.ProfileEntry(stage=C.Stage.MIGRATE, tokens=18, degree=2, num_new=1, seconds=0.01, samples=3)]
    path = tmp_path / "out.json"
    cost.write_profile(path, p, extra={"measured_with": {"steps": 2}})
    data = json.loads(path.read_text())
    assert data["format"] == cost.PROFILE_FORMAT == "gfdit-profile/2"
    assert data["measured_with"] == {"steps": 2}
    assert list(data) == [
        "format",
        "model",
        "hardware",
        "world_size",
        "num_cores",
        "dispatch_s",
        "completion_s",
        "collective_efficiency",
        "entries",
        "measured_with",
    ]
    assert data["entries"][0] == {
        "stage": "denoise",
        "tokens": 18,
        "degree": 4,
        "ulysses": 2,
        "ring": 2,
        "mode": "torus",
        "cfg": 1,
        "guidance": True,
        "num_new": 0,
        "batch": 1,
        "seconds": 0.018,
        "samples": 6,
    }
    back = cost.load_profile(path)
    assert cost.profile_to_json(back) == {k: v for k, v in data.items() if k != "measured_with"}
    assert back.entries[0].mode == gfdit._C.runtime.LayoutMode.TORUS
    with pytest.raises(gfdit.InvalidUsage, match="'model' is a profile field"):
        cost.write_profile(path, p, extra={"model": "x"})
    with pytest.raises(gfdit.InvalidUsage, match="unknown mode 'ring'; valid modes: usp, torus"):
        C.ProfileEntry(mode="ring")


def test_profile_batches(tmp_path: Path) -> None:
    """A batch is part of an entry: written and read back, interpolated between measured batches, refused
    outside them (NOTE [profile interpolation])."""
    data = _profile_dict()
    data["entries"] += [
        {**data["entries"][0], "batch": 4, "seconds": 0.010},
        {**data["entries"][1], "batch": 4, "seconds": 0.028},
    ]
    path = _write_profile(tmp_path, data)
    p = cost.load_profile(path)
    assert [e.batch for e in p.entries] == [1] * 6 + [4, 4]
    assert [e["batch"] for e in cost.profile_to_json(p)["entries"]] == [1] * 6 + [4, 4]
    pm = C.profiled(p)
    step = {"guidance_scale": 4.0, "degree": 2, "ulysses": 2}
    assert pm.seconds(C.Stage.DENOISE, 32, 48, 9, batch=4, **step) == pytest.approx(0.010)
    # batch 2, a third of the way from 1 (0.004) to 4 (0.010)
    assert pm.seconds(C.Stage.DENOISE, 32, 48, 9, batch=2, **step) == pytest.approx(0.004 + 0.006 / 3)
    with pytest.raises(gfdit.InvalidUsage, match=r"batch 5 is outside the measured batches \(1, 4\)"):
        pm.seconds(C.Stage.DENOISE, 32, 48, 9, batch=5, **step)


def test_decode_degree_and_batch_limits() -> None:
    """The helpers a policy uses: the best decode degree, a rank's activations, the largest batch that fits."""
    wan = cost.cost_model("wan2.2", "h20x8")
    one = wan.seconds(C.Stage.DECODE, 720, 1280, 81)
    assert wan.seconds(C.Stage.DECODE, 720, 1280, 81, degree=8) < one / 6
    assert cost.best_decode_degree(wan, 720, 1280, 81, max_degree=8) == 8
    assert cost.best_decode_degree(wan, 720, 1280, 81, max_degree=3) == 3
    # a profile measured at one and two ranks, faster on two; four never measured
    p = C.Profile()
    p.model = "tiny-wan"
    p.entries = [
        C.ProfileEntry(stage=C.Stage.DECODE, tokens=t, degree=d, seconds=s * t)
        for t in (18, 120)
        for d, s in ((1, 0.01), (2, 0.006))
    ]
    assert cost.best_decode_degree(C.profiled(p), 32, 48, 9, max_degree=4) == 2
    with pytest.raises(gfdit.InvalidUsage, match="degree 4"):
        C.profiled(p).seconds(C.Stage.DECODE, 32, 48, 9, degree=4)
    # Qwen-Image at 1024 px on an H20: 4224 rows of 2 H + 2 F = 30720 bf16 elements per request
    qwen = C.model_arch("qwen-image")
    per_request = 4224 * 30720 * 2
    assert cost.activation_bytes_per_rank(qwen, 1024, 1024, batch=2) == 2 * per_request
    assert cost.max_batch(qwen, C.hardware("h20"), 1024, 1024) == math.floor(
        (96e9 - 2 * 20.4e9) / per_request
    )
    # batches through the facade: decode runs them one after another
    single, double = cost.estimate("qwen-image", "h20"), cost.estimate("qwen-image", "h20", batch=2)
    assert double["decode_s"] == pytest.approx(2 * single["decode_s"])
    assert single["step_s"] < double["step_s"] < 2 * single["step_s"]


def test_stage_and_mode_names() -> None:
    """One name per stage (its task kind's) and per mode, from the C++."""
    assert cost.STAGES == {
        "encode": C.Stage.ENCODE,
        "denoise": C.Stage.DENOISE,
        "migrate": C.Stage.MIGRATE,
        "decode": C.Stage.DECODE,
        "gather": C.Stage.GATHER,
    }
    assert [C.stage_from_name(n) for n in cost.STAGES] == list(cost.STAGES.values())
    assert list(cost.MODES) == ["usp", "torus"]
    with pytest.raises(gfdit.InvalidUsage, match="valid stages: encode, denoise, migrate, decode, gather"):
        C.stage_from_name("step")


def test_load_profile_not_json(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(gfdit.InvalidUsage, match="cannot read"):
        cost.load_profile(path)


# -- the command ----------------------------------------------------------------------------------------------
def _cli(argv: list[str]) -> int:
    """`gfdit <argv>` through gfdit.tools.cli when every subcommand module is importable, else the cost module's
    own add_arguments/run on the same kind of subparser (other subcommands may not exist yet)."""
    import importlib

    from gfdit.tools import cli

    try:
        for module, _ in cli.COMMANDS.values():
            importlib.import_module(module)
    except ModuleNotFoundError:
        parser = argparse.ArgumentParser(prog="gfdit")
        sub = parser.add_subparsers(dest="command", required=True)
        cost.add_arguments(sub.add_parser("cost"), "cost")
        args = parser.parse_args(argv)
        return cost.run(args, args.command)
    return cli.main(argv)


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "cost",
        "--model",
        "qwen-image",
        "--hardware",
        "h20",
        "--height",
        "1024",
        "--width",
        "1024",
        "--num-frames",
        "1",
        "--ulysses",
        "4",
        "--ring",
        "1",
        "--json",
    ]
    assert _cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"encode_s", "step_s", "decode_s", "migrate_s"}
    assert out["step_s"] == pytest.approx(cost.estimate("qwen-image", "h20", ulysses=4)["step_s"])


def test_cli_readable_and_torus(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _cli(
            [
                "cost",
                "--model",
                "wan2.2",
                "--hardware",
                "h20",
                "--ulysses",
                "2",
                "--ring",
                "8",
                "--mode",
                "torus",
                "--num-nodes",
                "2",
                "--guidance-scale",
                "1",
            ]
        )
        == 0
    )
    line = capsys.readouterr().out
    assert "step_s=" in line and "migrate_s=" in line


@pytest.mark.parametrize(
    "argv, match",
    [
        (["cost", "--model", "flux"], "valid models: qwen-image"),
        (["cost", "--hardware", "b200"], "valid hardware: h20"),
        (["cost", "--model", "qwen-image", "--ulysses", "25"], "exceeds the 24 heads"),
        (["cost", "--cfg", "2", "--guidance-scale", "1"], "needs guidance"),
    ],
)
def test_cli_refuses(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(argv) == 2
    assert match in capsys.readouterr().err
