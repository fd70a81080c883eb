"""Several agents per gateway (docs/design.md#several-agents): loaded together as `serve` loads them —
files or directories, the first the default — with one registry for their tools, and refused at
start-up, naming both files, when two of them cannot share one process. The tool modules are real
Python written into the test's temp dirs (each under a name of its own: a process imports a module once).
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

from actors.agent import load_agents, profile_paths
from actors.profile import ProfileError, parse_profile
from actors.ray.config import RayConfig
from actors.tools.demo import demo_registry
from gateway.app import StartupError, agent_setup, ray_config
from gateway.cli import main
from gateway.settings import Settings

TOOLS = '''
from actors.tools import tool


@tool(trait="exploration", description="Look up an order by id.")
async def lookup(order_id: str) -> dict:
    return {"order_id": order_id, "from": __name__}
'''


def module_name() -> str:
    return f"several_{uuid.uuid4().hex[:10]}"


def profile(root: Path, name: str, *, file: str | None = None, tools: str = "", extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / (file or f"{name}.toml")
    path.write_text(textwrap.dedent(f'name = "{name}"\nmodel = "scripted/demo"\n{extra}\n{tools}'))
    return path


def tool_entry(tool_id: str, module: str) -> str:
    return f'[[tools]]\nid = "{tool_id}"\nimpl = "{module}:lookup"\n'


def with_module(root: Path, module: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(TOOLS)
    return module


# -- loading them --------------------------------------------------------------------------------


async def test_several_profiles_load_in_order_with_every_agents_tools_in_one_registry(tmp_path: Path) -> None:
    a_mod, b_mod = with_module(tmp_path / "a", module_name()), with_module(tmp_path / "b", module_name())
    a = profile(tmp_path / "a", "alpha", tools=tool_entry("alpha.lookup", a_mod))
    b = profile(tmp_path / "b", "beta", tools=tool_entry("beta.lookup", b_mod) + '[[tools]]\nid = "demo.clock"\n')
    agents = await load_agents([a, b])
    assert [p.name for p in agents.profiles] == ["alpha", "beta"]
    assert {"alpha.lookup", "beta.lookup", "demo.clock"} <= {d.tool_id for d in agents.registry.catalog()}
    # each agent's gates see its own tools only
    beta = agents.profiles[1].catalog_from(agents.registry.catalog())
    assert {d.tool_id for d in beta} == {"beta.lookup", "demo.clock"}


async def test_no_profile_is_the_built_in_demo_agent(tmp_path: Path) -> None:
    assert [p.name for p in (await load_agents([])).profiles] == ["demo"]


def test_a_directory_stands_for_its_profiles_by_file_name_each_once(tmp_path: Path) -> None:
    b = profile(tmp_path / "dir", "beta", file="b.toml")
    a = profile(tmp_path / "dir", "alpha", file="a.toml")
    (tmp_path / "dir" / "notes.txt").write_text("not a profile")
    assert profile_paths([tmp_path / "dir", a]) == [a, b]


def test_a_directory_without_a_profile_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match=r"empty: no agent profile \(\*\.toml\) in this directory"):
        profile_paths([tmp_path / "empty"])


async def test_two_profiles_of_one_name_are_refused_naming_both_files(tmp_path: Path) -> None:
    first, second = profile(tmp_path / "x", "acme"), profile(tmp_path / "y", "acme")
    with pytest.raises(ProfileError) as err:
        await load_agents([first, second])
    assert str(err.value) == f"{first} and {second} both define the agent 'acme': agent names must be unique"


async def test_one_tool_id_with_two_impls_is_refused_naming_both_files(tmp_path: Path) -> None:
    one, two = with_module(tmp_path / "a", module_name()), with_module(tmp_path / "b", module_name())
    a = profile(tmp_path / "a", "alpha", tools=tool_entry("shared.lookup", one))
    b = profile(tmp_path / "b", "beta", tools=tool_entry("shared.lookup", two))
    with pytest.raises(ProfileError) as err:
        await load_agents([a, b])
    assert str(err.value) == (f"{a} and {b} both define the tool 'shared.lookup', as '{one}:lookup' and '{two}:lookup'")


async def test_one_tool_shared_by_two_agents_is_one_tool(tmp_path: Path) -> None:
    module = with_module(tmp_path, module_name())
    a = profile(tmp_path, "alpha", tools=tool_entry("shared.lookup", module))
    b = profile(tmp_path, "beta", tools=tool_entry("shared.lookup", module))
    agents = await load_agents([a, b])
    assert agents.sources.functions == (("shared.lookup", f"{module}:lookup"),)


async def test_two_modules_of_one_name_beside_two_profiles_are_refused_before_either_is_imported(tmp_path: Path) -> None:
    module = module_name()
    with_module(tmp_path / "a", module)
    with_module(tmp_path / "b", module)
    a = profile(tmp_path / "a", "alpha", tools=tool_entry("alpha.lookup", module))
    b = profile(tmp_path / "b", "beta", tools=tool_entry("beta.lookup", module))
    with pytest.raises(ProfileError) as err:
        await load_agents([a, b])
    assert str(err.value) == (f"{a} and {b} each have a module '{module}' beside them, and one process imports "
                              "one module of a name: rename one of them")
    import sys

    assert module not in sys.modules


async def test_every_profiles_own_problems_are_reported_at_once(tmp_path: Path) -> None:
    a = profile(tmp_path, "alpha", extra="[policies]\nmax_iterations = 0")
    b = profile(tmp_path, "beta", tools='[[tools]]\nid = "beta.nothing"\n')
    with pytest.raises(ProfileError) as err:
        await load_agents([a, b])
    assert "alpha.toml: policies.max_iterations" in str(err.value)
    assert "beta.toml: tools[0].id: unknown tool 'beta.nothing'" in str(err.value)


# -- serving them ----------------------------------------------------------------------------------


def test_the_first_agent_is_the_default_and_every_agent_is_served(tmp_path: Path) -> None:
    a, b = profile(tmp_path, "alpha"), profile(tmp_path, "beta")
    setup = agent_setup(Settings(agent=[a, b]))
    assert setup.profile.name == "alpha" and list(setup.profiles) == ["alpha", "beta"]
    assert list(ray_config(Settings(agent=[a, b]), setup).profiles) == ["alpha", "beta"]


def test_default_agent_picks_another_and_must_be_served(tmp_path: Path) -> None:
    a, b = profile(tmp_path, "alpha"), profile(tmp_path, "beta")
    setup = agent_setup(Settings(agent=[a, b], default_agent="beta"))
    assert setup.profile.name == "beta" and list(setup.profiles) == ["beta", "alpha"]
    with pytest.raises(StartupError, match="default agent 'gamma' is not one of the agents served: alpha, beta"):
        agent_setup(Settings(agent=[a, b], default_agent="gamma"))


def test_model_and_script_apply_to_every_agent(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rounds": [{"text": "<channel:thinking>x</channel:thinking>"}]}))
    setup = agent_setup(Settings(agent=[profile(tmp_path, "alpha"), profile(tmp_path, "beta")], script=script))
    assert {p.model for p in setup.profiles.values()} == {"scripted/serve"}


def test_reactgate_agent_takes_a_comma_separated_list_or_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = profile(tmp_path / "dir", "alpha", file="1.toml"), profile(tmp_path / "dir", "beta", file="2.toml")
    monkeypatch.setenv("REACTGATE_AGENT", f"{b}, {a}")
    assert Settings().agent == (b, a)
    monkeypatch.setenv("REACTGATE_AGENT", str(tmp_path / "dir"))
    assert list(agent_setup(Settings()).profiles) == ["alpha", "beta"]


def test_serve_with_two_profiles_of_one_name_stops_naming_both_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = profile(tmp_path / "x", "acme"), profile(tmp_path / "y", "acme")
    assert main(["serve", "--backend", "local", "--agent", str(first), "--agent", str(second)]) == 2
    assert capsys.readouterr().err == (f"reactgate serve: {first} and {second} both define the agent 'acme': agent "
                                       "names must be unique\n")


# -- generations (docs/design.md#generations) ------------------------------------------------------


def test_a_change_to_any_served_profile_is_a_new_generation_naming_it() -> None:
    def config(second_instructions: str) -> RayConfig:
        profiles = {name: parse_profile({"name": name, "model": "scripted/demo", "instructions": text},
                                        known_tools=demo_registry())
                    for name, text in (("alpha", "A."), ("beta", second_instructions))}
        return RayConfig(store_url="sqlite:///x.sqlite3", registry=demo_registry(), profiles=profiles)

    from actors.ray.generation import differences

    before, after = config("B."), config("B, changed.")
    assert before.generation != after.generation
    assert differences(before.sections, after.sections) == ["profile beta"]
    removed = RayConfig(store_url="sqlite:///x.sqlite3", registry=demo_registry(),
                        profiles={"alpha": before.profiles["alpha"]})
    assert differences(before.sections, removed.sections) == ["profile beta"]
