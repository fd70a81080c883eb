"""The multi-node rehearsal (bench/cluster_rehearsal.py), shortened: a two-node `ray start` cluster
with token auth, two gateways on PostgreSQL behind one front door, clients streaming, then a gateway
drained (SIGTERM, step 1) and the worker node's raylet killed mid-answer (step 3). Every step must
lose, duplicate, reorder or garble nothing, run no turn twice and no tool call other than once — and
must have hit the clients, or it proved nothing.

Steps 2 (a gateway SIGKILLed) and 4 (a changed profile rolled out) each start more gateways, which
takes minutes here: the full bench runs them (its table is in bench/README.md). Shorter tests
cover most of what they show — a gateway process SIGKILLed and restarted in
tests/test_e2e_process.py, a changed configuration on one Ray cluster in tests/test_generations.py;
turns running on in the hosts while no gateway is up is shown by the full bench only.

The bench runs in a subprocess of its own (it is a Ray driver; this process stays out of Ray) and
writes its table as JSON. No time is asserted: how long clients took to resume is the bench's to print.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.postgres, pytest.mark.slow,
              pytest.mark.timeout(600)]  # the fixture starts a cluster and two gateway processes

REPO = Path(__file__).resolve().parents[1]
ZEROS = ("lost", "duplicated", "out_of_order", "garbled", "failed_turns", "double_activated", "tools_not_once")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.conftest import POSTGRES_DSN, require_service

    require_service("PostgreSQL", "127.0.0.1", 5432)
    out = tmp_path_factory.mktemp("rehearsal") / "rehearsal.json"
    env = {**os.environ, "REACTGATE_TEST_POSTGRES": POSTGRES_DSN}
    bench = subprocess.Popen([sys.executable, str(REPO / "bench" / "cluster_rehearsal.py"), "--quick", "--steps", "13",
                              "--json", str(out)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        stdout, stderr = bench.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        bench.send_signal(signal.SIGINT)  # the bench stops its cluster and gateways on the way out
        stdout, stderr = bench.communicate(timeout=60)
    done = subprocess.CompletedProcess(bench.args, bench.returncode, stdout, stderr)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-5000:]
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["error"] is None, data["error"] + "\n" + done.stdout[-3000:]
    data["output"] = done.stdout
    return data


def row(data: dict[str, Any], step: str) -> dict[str, Any]:
    [found] = [r for r in data["rows"] if r["step"].startswith(step + " ")]
    return found


@pytest.mark.parametrize("step", ["1", "3"])
def test_each_fault_loses_duplicates_garbles_and_double_runs_nothing(rehearsal: dict[str, Any], step: str) -> None:
    r = row(rehearsal, step)
    assert {k: r[k] for k in ZEROS} == dict.fromkeys(ZEROS, 0), rehearsal["output"]
    assert r["failures"] == [], rehearsal["output"]
    assert r["turns"] > 0 and r["conversations"] > 0


def test_a_drained_gateway_sends_its_clients_to_the_other(rehearsal: dict[str, Any]) -> None:
    assert row(rehearsal, "1")["reconnected"] > 0, rehearsal["output"]


def test_a_lost_node_cuts_answers_that_are_then_continued(rehearsal: dict[str, Any]) -> None:
    r = row(rehearsal, "3")
    assert r["cut_mid_answer"] > 0, rehearsal["output"]       # the fault landed mid-answer
    assert "worker" not in rehearsal["placements"]["after step 3"].values()


def test_the_table_is_printed(rehearsal: dict[str, Any]) -> None:
    assert "lost" in rehearsal["output"] and "3 SIGKILL worker raylet" in rehearsal["output"]
