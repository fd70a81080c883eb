"""A misconfigured model names its cause, over a real gateway on both backends (docs/design.md#validation,
docs/design.md#fallback, docs/wire-protocol.md#turncompleted).

The two mistakes a new team makes — an `api_key_env` variable that is not set where the model is
called, and a model string with no provider prefix — fail every call before anything is sent (the
api_base is a closed loopback port: nothing real is ever called). Each round's `provider_error`
notice says why and that it is not the model's mistake; once the retries are spent the turn ends
`provider_error`, with the cause in `turn.completed.error`; and the process that called the model
logs the cause once, however many calls met it. On the local backend that process is the test's own
(caplog); on Ray it is a ConversationHost, whose stderr is a worker log file of the Ray session.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from actors.profile import AgentProfile, ModelSettings, demo_profile
from actors.tools.demo import demo_registry
from actors.turn_machine import GIVE_UP_MESSAGES
from protocol.events import EndReason
from tests.e2e import LocalServer, RayHosting, local_server, ray_hosting, ray_server, weather_then_answer

CLOSED = "http://127.0.0.1:9/v1"    # the discard port: nothing listens, and nothing is ever sent to it


@dataclass(frozen=True)
class Misconfigured:
    model: str
    settings: ModelSettings
    notice: str     # every round's notice message
    cause: str      # turn.completed.error, and the log line's


CASES = {
    "unset-key": Misconfigured(
        "openai/acme-small-e2e", ModelSettings(api_base=CLOSED, api_key_env="REACTGATE_E2E_NEVER_SET_KEY"),
        "the model provider failed (auth) for model 'openai/acme-small-e2e': the variable REACTGATE_E2E_NEVER_SET_KEY "
        "(api_key_env) is not set where this model is called. This is not your mistake.",
        "auth: the variable REACTGATE_E2E_NEVER_SET_KEY (api_key_env) is not set where this model is called",
    ),
    "no-provider": Misconfigured(
        "acme-small-e2e", ModelSettings(api_base=CLOSED),
        "the model provider failed (bad_request) for model 'acme-small-e2e': no provider for model 'acme-small-e2e': "
        "a LiteLLM model string starts with its provider, e.g. 'openai/acme-small-e2e' for an OpenAI-compatible "
        "endpoint. This is not your mistake.",
        "bad_request: no provider for model 'acme-small-e2e': a LiteLLM model string starts with its provider, "
        "e.g. 'openai/acme-small-e2e' for an OpenAI-compatible endpoint",
    ),
}


def profile(name: str, case: Misconfigured) -> AgentProfile:
    return demo_profile(known_tools=demo_registry()).model_copy(
        update={"name": name, "model": case.model, "model_settings": case.settings})


def log_line(case: Misconfigured) -> str:
    return f"model {case.model} failed before responding: {case.cause} (conversation "


@pytest.fixture(scope="module")
def hosting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    agents = {name: profile(name, case) for name, case in CASES.items()}
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": weather_then_answer()}, unscripted=agents) as hosting:
        yield hosting


@dataclass
class Served:
    server: LocalServer
    backend: str

    def logged(self, caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
        """The log lines of the process that called the model that contain `text`, as `LEVEL logger: message`."""
        if self.backend == "local":
            return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if text in r.getMessage()]
        import ray

        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
        return [line for path in sorted(logs.glob("worker-*.err"))
                for line in path.read_text(errors="replace").splitlines() if text in line]


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def served(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> AsyncIterator[Served]:
    name = request.node.callspec.params["name"]
    if backend == "local":
        async with local_server(tmp_path / "local.sqlite3", profile=profile(name, CASES[name]), scripted=False) as s:
            yield Served(s, backend)
        return
    async with ray_server(request.getfixturevalue("hosting")) as s:
        yield Served(s, backend)


@pytest.mark.parametrize("name", list(CASES))
async def test_a_misconfigured_model_names_its_cause_in_every_round_in_the_turns_end_and_once_in_the_log(
    served: Served, name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    case = CASES[name]
    caplog.set_level(logging.WARNING, logger="reactgate.llm")
    async with served.server.client() as c:
        cid = await c.open(**({"agent": name} if served.backend == "ray" else {}))
        await c.subscribe(cid)
        await c.say(cid, "weather in Paris?")
        done = (await c.turn_completed(cid, timeout=60))["data"]
        rounds = [e["data"] for e in c.events[cid] if e["event"] == "round.completed"]

    assert done["reason"] == EndReason.PROVIDER_ERROR and done["finish_ok"] is False
    assert done["final_answer"] == GIVE_UP_MESSAGES[EndReason.PROVIDER_ERROR]
    assert done["error"] == case.cause
    assert [[(n["code"], n["message"]) for n in r["notices"]] for r in rounds] == [[("provider_error", case.notice)]] * 4
    assert not any(e["event"] == "answer.delta" for e in c.events[cid])
    lines = served.logged(caplog, log_line(case))
    assert len(lines) == 1, lines                                       # four calls failed, one line said so
    assert f"WARNING reactgate.llm: {log_line(case)}{cid})" in lines[0]
