"""`gfdit profile --network --links-only` on a world of 2 nodes x 2 ranks (netns_cluster, both modes of the
`cluster` fixture), and what its profile does to the cost model (NOTE [inter-node calibration] in
src/runtime/cost.cpp).

The ranks are four `python -m gfdit profile --network` processes, ranks 0 and 1 on node 0, 2 and 3 on node 1,
started as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). In "netns" mode the link is shaped to
1 Gbit/s and its nominal rate is stated (--line-gbit 1), so the profile can also scale another cluster; in
"local" mode the nodes talk over loopback, no rate is stated, and scaling another cluster is refused. The
calibrated terms are checked against the same arithmetic done here from the file's numbers.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from gfdit._C import InvalidUsage
from gfdit.planning import cost
from netns_cluster import free_port

NODE_IDS = [0, 0, 1, 1]
START_S = 120.0  # four interpreters importing torch on 2 cores, then the measurement (a few seconds)
LINE_BYTES_PER_S = 1e9 / 8  # the netns mode's link, as tc shapes it


def run_links_only(cluster, out: str) -> list[int]:
    """`gfdit profile --network --links-only` on the 4 ranks; their exit statuses."""
    env = (
        {"GFDIT_NODE_IDS": "", "GFDIT_NET_EDGES": "auto"} if cluster.isolated else cluster.world_env(NODE_IDS)
    )
    env.update(
        MASTER_ADDR=cluster.node(0).address,
        MASTER_PORT=str(29541 if cluster.isolated else free_port()),
        WORLD_SIZE=str(len(NODE_IDS)),
        PYTHONWARNINGS="ignore",
    )
    argv = [sys.executable, "-m", "gfdit", "profile", "--network", "--links-only", "--model", "tiny-wan"]
    argv += ["--out", out, "--line-gbit", "1" if cluster.isolated else "0"]
    procs = [
        cluster.node(node).run(
            argv, env={**env, "RANK": str(rank)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for rank, node in enumerate(NODE_IDS)
    ]
    codes = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=START_S)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        assert p.returncode == 0, err.decode(errors="replace")[-3000:]
        codes.append(p.returncode)
    return codes


def step_seconds(cm, tokens_shape, ulysses: int, ring: int, placement: str, num_nodes: int) -> float:
    arch = cost.model_arch("tiny-wan")
    h, w, f = tokens_shape
    return cm.seconds(
        cost.Stage.DENOISE,
        h,
        w,
        f,
        num_steps=int(arch.default_steps),
        guidance_scale=float(arch.default_guidance),
        degree=ulysses * ring,
        ulysses=ulysses,
        ring=ring,
        mode="usp",
        placement=placement,
        num_nodes=num_nodes,
    )


@pytest.mark.timeout(300)
def test_links_only_profile_calibrates_the_inter_node_terms(cluster, tmp_path):
    out = str(tmp_path / "links.json")
    assert run_links_only(cluster, out) == [0, 0, 0, 0]
    with open(out) as f:
        data = json.load(f)
    assert data["format"] == cost.PROFILE_FORMAT
    assert data["model"] == "tiny-wan" and data["world_size"] == 4 and data["entries"] == []
    assert "layouts" not in data
    (lk,) = data["links"]

    # sane links: one pair of nodes of two ranks each; rates and times positive, finite and plausible
    assert (lk["node_a"], lk["node_b"], lk["ranks_per_node"]) == (0, 1, 2)
    for key in (
        "stream_bytes_per_s",
        "concurrent_bytes_per_s",
        "round_trip_s",
        "collective_s",
        "intra_collective_s",
    ):
        assert math.isfinite(lk[key]) and lk[key] > 0, (key, lk)
    assert 1e-6 < lk["round_trip_s"] < 0.05, lk
    assert 1e-6 < lk["collective_s"] < 0.05 and 1e-7 < lk["intra_collective_s"] < 0.05, lk
    if cluster.isolated:  # the shaped link: its rate bounds both streams (tbf's burst allows a little more)
        assert lk["line_bytes_per_s"] == LINE_BYTES_PER_S
        for key in ("stream_bytes_per_s", "concurrent_bytes_per_s"):
            assert 0.5 * LINE_BYTES_PER_S < lk[key] < 1.1 * LINE_BYTES_PER_S, (key, lk)
    else:
        assert lk["line_bytes_per_s"] == 0

    # the profile file round-trips through load_profile and profile_to_json
    prof = cost.load_profile(out)
    assert cost.profile_to_json(prof)["links"] == [{k: lk[k] for k in cost.LINK_FIELDS}]

    # fitted on the cluster measured: each rank's share of the concurrent rate, the collective across nodes, the
    # world's two ranks per node; computed here from the file's numbers
    sheet = cost.cluster("cpu", 4)
    fitted = cost.calibrated_cluster("cpu", out)
    assert fitted.num_ranks == 4 and fitted.ranks_per_node == 2 and fitted.node_of(2) == 1
    assert fitted.hw.inter_node_bw == pytest.approx(lk["concurrent_bytes_per_s"] / 2, rel=1e-12)
    assert fitted.hw.inter_node_latency_s == pytest.approx(lk["collective_s"], rel=1e-12)
    # the datasheet's 5 GB/s per rank across nodes is more than the ranks get over TCP, emulated link or loopback
    assert fitted.hw.inter_node_bw < sheet.hw.inter_node_bw
    assert (
        fitted.hw.link_bw == sheet.hw.link_bw
        and fitted.hw.collective_latency_s == sheet.hw.collective_latency_s
    )

    # cost_model loads the file: the analytic model on the fitted cluster, so a layout whose Ulysses crosses the
    # nodes costs more than with the datasheet's link, by the bytes over the measured bandwidth
    cm = cost.cost_model("tiny-wan", "cpu", profile=out)
    assert "links measured" in cm.describe()
    datasheet = cost.cost_model("tiny-wan", sheet)
    shape = (256, 256, 61)
    for placement in ("ring-low", "ulysses-low"):
        assert step_seconds(cm, shape, 2, 2, placement, 2) > step_seconds(
            datasheet, shape, 2, 2, placement, 2
        )
    # inside one node nothing crosses: the links change nothing
    assert step_seconds(cm, shape, 2, 2, "ring-low", 1) == pytest.approx(
        step_seconds(datasheet, shape, 2, 2, "ring-low", 1), rel=1e-12
    )

    # another cluster (another hardware than the one measured): scaled, not fitted
    h20 = cost.cluster("h20x16")
    if cluster.isolated:
        scaled = cost.calibrated_cluster(h20, out)
        share = lk["concurrent_bytes_per_s"] / LINE_BYTES_PER_S
        ratio = max(1.0, lk["collective_s"] / lk["intra_collective_s"])
        assert scaled.hw.inter_node_bw == pytest.approx(h20.hw.inter_node_bw * share, rel=1e-12)
        assert scaled.hw.inter_node_latency_s == pytest.approx(h20.hw.collective_latency_s * ratio, rel=1e-12)
        assert scaled.ranks_per_node == 8 and scaled.hw.link_bw == h20.hw.link_bw
        # a profile of links alone describes the network: any model may use it
        assert "scaled by measured links" in cost.cost_model("wan2.2", "h20x16", profile=out).describe()
    else:
        with pytest.raises(InvalidUsage, match="line rate"):
            cost.calibrated_cluster(h20, out)


def test_a_profile_without_links_or_entries_and_bad_links_are_refused(tmp_path):
    base = {
        "format": cost.PROFILE_FORMAT,
        "model": "tiny-wan",
        "hardware": "cpu",
        "world_size": 4,
        "entries": [],
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(base))
    with pytest.raises(InvalidUsage, match="entries must be a non-empty list"):
        cost.load_profile(path)
    link = {
        "node_a": 0,
        "node_b": 1,
        "ranks_per_node": 2,
        "stream_bytes_per_s": 1.2e8,
        "concurrent_bytes_per_s": 1.1e8,
        "round_trip_s": 6e-5,
        "collective_s": 7e-5,
    }
    path.write_text(json.dumps({**base, "links": [link]}))
    prof = cost.load_profile(path)  # the optional fields may be left out (older profiles): 0
    assert prof.links[0].intra_collective_s == 0 and prof.links[0].line_bytes_per_s == 0
    path.write_text(json.dumps({**base, "links": [{**link, "collective_s": -1.0}]}))
    with pytest.raises(InvalidUsage, match="link 0: collective_s must be a positive number"):
        cost.load_profile(path)
    path.write_text(json.dumps({**base, "links": [{**link, "ranks_per_node": 0}]}))
    with pytest.raises(InvalidUsage, match="ranks_per_node"):
        cost.load_profile(path)


def test_the_network_command_refuses_bad_arguments():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    base = [sys.executable, "-m", "gfdit", "profile", "--network", "--model", "tiny-wan"]
    p = subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--out required" in p.stderr, p.stderr
    p = subprocess.run(
        [*base, "--out", "x.json", "--line-gbit", "-1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2 and "--line-gbit must be >= 0" in p.stderr, p.stderr
