"""`serve` without --ray-address starts a Ray of its own, whatever an earlier `ray start` left
behind (docs/design.md#hosting): a bare `ray.init()` would join the cluster recorded in
`<ray temp dir>/ray_current_cluster` — here a dead one — and fail.

Runs in a subprocess with its own RAY_TMPDIR, so the machine's /tmp/ray is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent('''
    import ray
    from actors.ray.backend import RayBackend
    from actors.ray.config import RayConfig
    from actors.tools.demo import demo_registry

    backend = RayBackend(RayConfig(store_url="sqlite:///:memory:", registry=demo_registry(), profiles={}, local_cpus=1),
                         default_agent="none")
    backend._init_ray()
    address = ray.get_runtime_context().gcs_address
    ray.shutdown()
    print("GCS", address)
''')


def test_a_leftover_cluster_address_is_ignored_and_a_local_ray_starts() -> None:
    # A short directory: Ray's socket paths live under it and must fit in 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="rg", dir="/tmp"))
    try:
        (tmp / "ray").mkdir()
        (tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")   # a cluster that is gone
        env = {**os.environ, "RAY_TMPDIR": str(tmp), "RAY_USAGE_STATS_ENABLED": "0",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        env.pop("RAY_ADDRESS", None)
        done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("GCS ")]
        assert not line.endswith(":1")                                       # not the leftover address
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
