"""Shared fixtures of the Python tests.

Multi-rank tests run their case functions (in the `cases_*.py` modules beside this file) on persistent
rank processes from `mp_harness`. This directory is put on sys.path here, so that the spawned ranks can
import those modules whatever pytest's import mode is.
"""

from __future__ import annotations

import fnmatch
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import mp_harness  # noqa: E402
import netns_cluster  # noqa: E402
from gfdit.tools import profile_cache  # noqa: E402


def gfdit_shm_names() -> set[str]:
    """gfdit's shared-memory objects in /dev/shm now."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("gfdit")}


@pytest.fixture
def no_shm_leftovers():
    """Fails a test that leaves gfdit shared memory behind (engines, their worlds, outputs)."""
    before = gfdit_shm_names()
    yield
    assert gfdit_shm_names() <= before, f"left in /dev/shm: {gfdit_shm_names() - before}"


@pytest.fixture(autouse=True, scope="session")
def _engines_plan_without_profiles():
    """Tests' engines without a cost model plan with none, as before cached profiles (NOTE [cached profiles]
    in gfdit.tools.profile_cache): a profile per model and world size would cost minutes, and the tests that
    check plans pass their own cost model (test_profile_cache.py turns the cache on for itself)."""
    with profile_cache.engine_default(False):
        yield


# Every test is bounded by pytest-timeout (pinned in the Makefile; the default bound is in pyproject.toml,
# @pytest.mark.timeout(seconds) sets another): past it the test fails with its stacks and the session goes on.

# The test tiers.
# `make test` runs every test; `make test-fast` (at most 3 minutes on a 2-core machine) leaves out the tests
# marked `slow`: those that take more than a few seconds on an idle 2-core machine (worlds of 3 ranks and
# more, whole trajectories of several models, engines and servers started for one test, stress and timeout
# tests), chosen so that every test module keeps quick tests in the fast tier (test_tiers.py checks it, and
# the C++ side of it). A test is slow when it carries @pytest.mark.slow or matches a pattern of SLOW below
# (fnmatch on the test's name with its parameters, per module); a module whose every test is slow is in
# ALL_SLOW with the reason ("[[]" is fnmatch's literal "["). Nothing else differs between the tiers.
ALL_SLOW = {
    "test_fidelity.py": "its one test replays a workload on the engine and on the simulator (minutes)",
    "test_stages.py": "its one test runs every placement of every stage on a world of 4",
}
SLOW = {
    "test_attention.py": [
        "*[[]ws4*",
        "test_uneven_heads_on_a_3x2_grid",
    ],
    "test_batch_models.py": [
        "test_batched_step_equals_each_alone[[]tiny-wan*",
        "test_batched_step_on_a_pair_equals_one_rank[[]*",
        "test_batched_trajectory_*",
    ],
    "test_batching.py": [
        "test_requests_submitted_together_*",
        "test_a_batch_on_two_ranks_*",
        "test_builtin_policy_batches_*",
    ],
    "test_collectives.py": [
        "*[[]ws3*",
        "*[[]ws4*",
        "*[[]ws8*",
        "*_ws8*",
        "*_large*",
        "test_put_with_signal[[]*",
    ],
    "test_cuda_args.py": ["test_stream_paths_on_cpu_tensors[[]*"],
    "test_engine.py": [
        "test_bad_requests_are_refused_at_submit_*",
        "test_mixed_requests_*",
        "test_output_does_not_depend_on_the_schedule",
        "test_static_policy_keeps_groups",
        "test_worker_killed_mid_trajectory_requests_continue",
        "test_a_task_that_never_completes_*",
        "test_cfg_parallel_decisions_*",
        "test_idle_engine_sleeps_*",
        "test_python_policy_*",
        "test_shutdown_*",
        "test_listeners_hear_*",
    ],
    "test_errors.py": [
        "test_bad_input_is_refused_locally[[]2]",
        "test_mismatch_across_ranks[[]send_recv_size]",
        "test_mismatch_across_ranks[[]all_gather_size]",
        "test_slow_peer_*",
        "test_timeout_names_*",
        "test_killed_peer[[]3-*",
        "test_killed_peer[[]2-1-exit-0]",
        "test_killed_peer[[]2-1-sigkill-5]",
        "test_bad_input_is_refused_locally[[]3]",
        "test_no_shm_names_while_running",
    ],
    "test_healing.py": [
        "test_two_deaths_in_a_row_*",
        "test_a_replacement_that_cannot_start_*",
        "test_a_worker_killed_under_load_*",
        "test_the_only_worker_dies_*",
        "test_requests_wait_for_the_replacement_*",
    ],
    "test_live_page.py": [
        "test_timeline_spans_match_*",
        "test_chromium_autorun_on_a_video_model_*",
        "test_chromium_labels_*",
    ],
    "test_loadgen.py": ["test_open_loop_rate_run_*", "test_video_jobs_are_polled_*"],
    "test_models.py": ["*[[]ws4*", "test_every_layout_matches_plain_model[[]*"],
    "test_openapi.py": ["test_schemathesis_*"],
    "test_parallel_decode.py": [
        "test_the_engine_decodes_*",
        "test_group_decode_equals_the_one_rank_decode[[]wan-*",
        "test_group_decode_equals_the_one_rank_decode[[]wan22-*",
    ],
    "test_policies_real.py": [
        "test_policy_completes_every_request_*[[]fcfs]",
        "test_policy_completes_every_request_*[[]srtf]",
        "test_policy_completes_every_request_*[[]priority]",
        "test_policy_completes_every_request_*[[]static:*",
        "test_one_python_policy_object_*",
    ],
    "test_profile.py": ["test_reduced_profile_run", "test_batch_profile_prices_batches"],
    "test_profile_cache.py": ["test_second_engine_reuses_*"],
    "test_run_trace.py": [
        "test_run_trace_reports_sane_metrics[[]*",
        "test_replay_records_*",
        "test_replay_with_a_profile_*",
    ],
    "test_samplers.py": [
        "test_multistep_trajectory_*",
        "test_bf16_*",
        "test_wan_*",
        "test_wan22_*",
        "test_qwen_image_bf16_*",
        "test_qwen_image_generate_equals_*[[]unipc]",
    ],
    "test_server.py": [
        "test_sigterm_drains_*",
        "test_a_worker_killed_under_load",
        "test_200_concurrent_*",
        "test_video_*",
        "test_finished_video_jobs_*",
        "test_deleting_a_running_video_job_*",
        "test_bad_video_input[[]*",
    ],
    "test_settings.py": ["test_gfdit_info_prints_every_setting"],
    "test_simulate_cli.py": ["test_simulate_cpu_with_profile", "test_plots_stay_readable_*"],
    "test_soak.py": ["test_short_soak_*"],
    "test_staged.py": [
        "test_trajectory_with_switching_groups_matches_one_rank[[]tiny-wan]",
        "test_deterministic_shapes_and_dtypes[[]*",
        "test_save_and_load_by_path[[]tiny-wan-*",
        "test_cfg_parallel_trajectory_*[[]tiny-wan*",
        "test_torus_*",
    ],
    "test_step_cache.py": ["test_gathered_regroups_keep_the_cache[[]*", "test_regroups_without_gather_*"],
    "test_stress.py": ["test_overlapping_groups[[]*"],
    "test_torch_backend.py": [
        "*[[]ws4*",
        "test_functional_collectives_equal_gloo[[]*",
        "test_device_maps[[]cuda:gloo*",
        "test_device_maps[[]cpu:gfdit,cuda:gloo*",
    ],
    "test_torch_backend_diffusers.py": [
        "test_diffusers_context_parallel[[]qwen--2-1]",
        "test_diffusers_context_parallel[[]wan-*",
        "test_yunchang_usp[[]4-*",
    ],
}


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError("the tests need pytest-timeout (make venv installs it)")
    config.addinivalue_line("markers", "multirank(n): the test starts an n-rank world")
    config.addinivalue_line("markers", "ws8: a test_collectives test that also runs at world size 8")
    config.addinivalue_line("markers", "slow: not in make test-fast (the tiers: above)")
    config.addinivalue_line("markers", "cluster(**kwargs): the arguments of the `cluster` fixture's cluster")


@pytest.fixture(scope="module")
def world_pool():
    """Persistent rank worlds for one test module (one live world at a time)."""
    pool = mp_harness.WorldPool()
    yield pool
    pool.close()


def is_slow_by_table(module: str, name: str) -> bool:
    """Whether the tables above put this test (a module's file name, the test's name) out of the fast tier."""
    return module in ALL_SLOW or any(fnmatch.fnmatchcase(name, p) for p in SLOW.get(module, ()))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow_by_table(item.path.name, item.name):
            item.add_marker(pytest.mark.slow)
        marker = item.get_closest_marker("multirank")
        if marker and marker.args and int(marker.args[0]) > mp_harness.MAX_WORLD:
            reason = f"world size {marker.args[0]} > GFDIT_TEST_MAX_WORLD={mp_harness.MAX_WORLD}"
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(params=["netns", "local"])
def cluster(request):
    """An emulated cluster of 2 nodes in each mode of netns_cluster, so that a test is written once for both:
    "netns", nodes in namespaces of their own on shaped links (skipped, with the reason, where this host
    cannot make them: it needs root), and "local", nodes that are labels on this host (where namespaces can be
    made, only for test_netns_cluster.py unless GFDIT_TEST_CLUSTER_MODES=both).
    @pytest.mark.cluster(nodes=3, rate="500mbit", ...) passes other arguments (LocalNodes ignores shaping)."""
    marker = request.node.get_closest_marker("cluster")
    kwargs = dict(marker.kwargs) if marker else {}
    if request.param == "netns":
        reason = netns_cluster.namespace_support()
        if reason is not None:
            pytest.skip(reason)
        made = netns_cluster.EmulatedCluster(**kwargs)
    else:
        # Where namespaces can be made, the fallback runs only for the fixture's own tests: the others' cases are
        # the same in both modes, and the namespaces are the stricter (GFDIT_TEST_CLUSTER_MODES=both runs both).
        if (
            netns_cluster.namespace_support() is None
            and request.node.path.name != "test_netns_cluster.py"
            and os.environ.get("GFDIT_TEST_CLUSTER_MODES", "") != "both"
        ):
            pytest.skip("the namespace mode runs here (GFDIT_TEST_CLUSTER_MODES=both runs the local one too)")
        made = netns_cluster.LocalNodes(**kwargs)
    with made as cl:  # torn down also when the test fails or times out
        yield cl
