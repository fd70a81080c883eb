"""The rehearsal cluster's node start (bench/cluster_rehearsal.py `Cluster._start_node`), with a stand-in
for `ray start`: a node that timed out registering with the GCS is started again, once; any other
failure, or a second time-out, is the rehearsal's error at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.cluster_rehearsal import REGISTRATION_TIMED_OUT, Cluster

STARTED = "echo 'Ray runtime started.'; exec sleep 600"
TIMED_OUT = f"echo '{REGISTRATION_TIMED_OUT.decode()}'; exit 1"
BROKEN = "echo 'something else went wrong'; exit 1"


class StandIn(Cluster):
    """A cluster whose `ray start` runs the next of `scripts` (shell), one per start."""

    scripts: list[str]

    def _ray_start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        return subprocess.Popen(["sh", "-c", self.scripts.pop(0)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def cluster(tmp_path: Path, *scripts: str) -> StandIn:
    c = StandIn(tmp_path)
    c.scripts = list(scripts)
    return c


def test_a_node_that_timed_out_registering_is_started_again_once(tmp_path: Path) -> None:
    c = cluster(tmp_path, TIMED_OUT, STARTED)
    proc = c._start_node("head", list, timeout_s=30)
    try:
        assert proc.poll() is None and c.scripts == []   # the second start is the one running
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("scripts", [[BROKEN, STARTED], [TIMED_OUT, TIMED_OUT, STARTED]], ids=["other-failure", "twice"])
def test_any_other_failure_or_a_second_time_out_is_the_rehearsals_error(tmp_path: Path, scripts: list[str]) -> None:
    c = cluster(tmp_path, *scripts)
    with pytest.raises(RuntimeError, match="ray start of the head failed"):
        c._start_node("head", list, timeout_s=30)
    assert c.scripts == scripts[-1:]   # no start after the one that failed for good
