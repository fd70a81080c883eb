"""Agent profiles (docs/design.md#profiles): the demo profile, defaults, and bad profiles as clear start-up errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from actors.catalog import Trait
from actors.profile import AgentProfile, Policies, ProfileError, demo_profile, load_profile
from actors.tools.demo import demo_registry

DEMO_TOOLS = [
    "demo.search", "demo.weather", "demo.render", "demo.write_note", "demo.clock", "demo.sleep",
    "demo.fail", "demo.eval", "demo.focus_project", "demo.open_tab", "react.ask_user",
]

# docs/design.md#profiles, [policies] "defaults shown".
DOCUMENTED_DEFAULTS = {
    "max_actions_per_round": 2, "max_iterations": 15, "max_protocol_retries": 3, "finish_policy": "observe",
    "exploration_soft_cap": 7, "ask_user_timeout_s": 300, "tool_timeout_s": 30, "auto_continue_max": 2,
    "context_budget_tokens": 32000, "flush_interval_ms": 25, "stream_idle_timeout_s": 60,
    "preamble_hold_chars": 120,
}

MINIMAL = 'name = "a"\nmodel = "openai/gpt-4o-mini"\n'
VALID = """
name = "demo"
model = "scripted/demo"
fallbacks = ["openai/backup"]
states = ["default", "focused"]
initial_state = "default"

[policies]
max_iterations = 15

[[tools]]
id = "demo.search"
[[tools]]
id = "demo.write_note"
states = ["focused"]
[[tools]]
id = "demo.render"
trait = "exploitation"
"""


def test_demo_profile_loads_against_the_demo_tools() -> None:
    profile = demo_profile(known_tools=demo_registry())
    assert profile.name == "demo"
    assert profile.model == "scripted/demo" and profile.fallbacks == ()
    assert profile.states == ("default", "focused") and profile.initial_state == "default"
    assert sorted(profile.tool_ids) == sorted(DEMO_TOOLS)
    assert profile.tools_in("focused") == profile.tool_ids
    assert set(profile.tools_in("default")) == set(DEMO_TOOLS) - {"demo.write_note"}
    assert profile.tool_states()["demo.write_note"] == frozenset({"focused"})


def test_policy_defaults_are_the_spec_defaults() -> None:
    assert Policies().model_dump() == DOCUMENTED_DEFAULTS
    assert demo_profile().policies.model_dump() == DOCUMENTED_DEFAULTS


def test_spec_example_loads_with_its_overrides() -> None:
    profile = load_profile(VALID, known_tools=DEMO_TOOLS)
    assert profile.models == ("scripted/demo", "openai/backup")
    assert profile.trait_overrides() == {"demo.render": Trait.EXPLOITATION}
    assert profile.tool_states() == {"demo.search": None, "demo.write_note": frozenset({"focused"}),
                                     "demo.render": None}


def test_initial_state_defaults_to_the_first_state() -> None:
    profile = load_profile(MINIMAL + 'states = ["idle", "busy"]\n', known_tools=None)
    assert profile.initial_state == "idle"


def test_a_tool_less_agent_defaults_to_allow_no_tool() -> None:
    """docs/design.md#observe-before-finish: `observe` is the default *when the agent has tools*."""
    assert load_profile(MINIMAL, known_tools=None).policies.finish_policy == "allow_no_tool"
    explicit = load_profile(MINIMAL + '[policies]\nfinish_policy = "observe"\n', known_tools=None)
    assert explicit.policies.finish_policy == "observe"
    with_tools = load_profile(MINIMAL + '[[tools]]\nid = "demo.clock"\n', known_tools=None)
    assert with_tools.policies.finish_policy == "observe"


def test_with_script_makes_model_and_fallbacks_the_scripted_model() -> None:
    profile = load_profile(VALID, known_tools=None)
    scripted = profile.with_script("cli")
    assert scripted.models == ("scripted/cli", "scripted/cli")
    assert scripted.tools == profile.tools and scripted.policies == profile.policies
    assert profile.model == "scripted/demo"  # the original is untouched


def test_load_profile_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(VALID)
    assert load_profile(path, known_tools=DEMO_TOOLS) == load_profile(str(path), known_tools=DEMO_TOOLS)


BAD_CASES = [
    ("[policies]\nmax_iterations = 0\n", "demo.toml: policies.max_iterations: Input should be greater than 0"),
    ("[policies]\nmax_actions_per_round = 0\n", "demo.toml: policies.max_actions_per_round: Input should be greater than 0"),
    ("[policies]\nmax_iterations = true\n", "demo.toml: policies.max_iterations:"),
    ("[policies]\ntool_timeout_s = -1\n", "demo.toml: policies.tool_timeout_s: Input should be greater than 0"),
    ("[policies]\nmax_protocol_retries = -1\n", "demo.toml: policies.max_protocol_retries:"),
    ('[policies]\nfinish_policy = "yolo"\n', "demo.toml: policies.finish_policy: Input should be 'observe' or 'allow_no_tool'"),
    ("[policies]\nmax_iteration = 3\n", "demo.toml: policies.max_iteration: Extra inputs are not permitted"),
    ('colour = "red"\n', "demo.toml: colour: Extra inputs are not permitted"),
    ('initial_state = "nowhere"\n', "demo.toml: initial_state: 'nowhere' is not one of the states"),
    ('states = []\n', "demo.toml: states: Tuple should have at least 1 item"),
    ('states = ["a", "a"]\ninitial_state = "a"\n', "demo.toml: states: duplicate state names"),
    ('[[tools]]\nid = "demo.clock"\nstates = ["elsewhere"]\n', "demo.toml: tools[0].states: 'elsewhere' is not one of the states"),
    ('[[tools]]\nid = "demo.clock"\nstates = []\n', "demo.toml: tools[0].states: Tuple should have at least 1 item"),
    ('[[tools]]\nid = "demo.clock"\n[[tools]]\nid = "demo.clock"\n', "demo.toml: tools[1].id: duplicate tool id 'demo.clock'"),
    ('[[tools]]\nid = "demo.teleport"\n', "demo.toml: tools[0].id: unknown tool 'demo.teleport'"),
    ('[[tools]]\nid = "demo.clock"\ntrait = "magic"\n', "demo.toml: tools[0].trait: Input should be"),
    ('[[tools]]\nid = "demo.clock"\nsafety = "write"\n', "demo.toml: tools[0].safety: Extra inputs are not permitted"),
    ('[[tools]]\nstates = ["default"]\n', "demo.toml: tools[0].id: Field required"),
]


@pytest.mark.parametrize(("snippet", "message"), BAD_CASES)
def test_bad_profile_names_the_file_and_the_field(tmp_path: Path, snippet: str, message: str) -> None:
    path = tmp_path / "demo.toml"
    path.write_text(MINIMAL + snippet)
    with pytest.raises(ProfileError) as err:
        load_profile(path, known_tools=DEMO_TOOLS)
    assert message in str(err.value)


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "demo.toml"
    path.write_text('name = "a"\n')
    with pytest.raises(ProfileError, match=r"demo\.toml: model: Field required"):
        load_profile(path, known_tools=None)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.toml"
    path.write_text("name = \n")
    with pytest.raises(ProfileError, match=r"demo\.toml: invalid TOML"):
        load_profile(path, known_tools=None)


def test_missing_file_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "absent.toml", known_tools=None)


def test_every_violation_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "demo.toml"
    path.write_text(MINIMAL + "[policies]\nmax_iterations = 0\nexploration_soft_cap = 0\n")
    with pytest.raises(ProfileError) as err:
        load_profile(path, known_tools=None)
    assert "policies.max_iterations" in str(err.value) and "policies.exploration_soft_cap" in str(err.value)


def test_an_inconsistent_profile_cannot_be_constructed_directly() -> None:
    with pytest.raises(ValidationError, match="initial_state"):
        AgentProfile(name="a", model="m", states=("a",), initial_state="b")


@pytest.mark.parametrize(("extra", "summary"), [
    ('description = "  Tracks orders.  "\ninstructions = "You are Acme.\\nBe brief."', "Tracks orders."),
    ('instructions = "\\n  You are Acme.\\nBe brief."', "You are Acme."),   # the instructions' first line
    ("", ""),
])
def test_the_listed_description_is_the_profiles_else_its_instructions_first_line(extra: str, summary: str) -> None:
    assert load_profile(MINIMAL + extra + "\n", known_tools=None).summary == summary


def test_two_tools_that_become_the_same_function_stop_a_native_profile_naming_both() -> None:
    """docs/design.md#native: a function name is the tool id with `.` (and anything else providers
    refuse) as `_`; two ids with one name could not be told apart in the model's calls."""
    text = 'name = "a"\nmodel = "openai/x"\ndecision = "native"\n[[tools]]\nid = "acme.lookup"\nimpl = "m:f"\n' \
           '[[tools]]\nid = "acme_lookup"\nimpl = "m:g"\n'
    with pytest.raises(ProfileError, match=r"'acme\.lookup' and 'acme_lookup' both become the function 'acme_lookup'"):
        load_profile(text, known_tools=None)
    load_profile(text.replace('decision = "native"\n', ""), known_tools=None)   # the channel protocol names tools by their ids


def test_the_decision_protocol_is_channels_unless_the_profile_says_native() -> None:
    assert load_profile('name = "a"\nmodel = "openai/x"\n', known_tools=None).decision == "channels"
    assert load_profile('name = "a"\nmodel = "openai/x"\ndecision = "native"\n', known_tools=None).decision == "native"
    with pytest.raises(ProfileError, match="decision"):
        load_profile('name = "a"\nmodel = "openai/x"\ndecision = "tools"\n', known_tools=None)
