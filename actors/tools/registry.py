"""Tool definitions and the registry that turns them into a catalog (docs/design.md#traits, #demo-tools).

A tool is its declaration (what the gates decide from), a params model (what a valid call looks
like) and an async handler (what running it does). The gates only ever see the declarations;
the executor is the only caller of handlers.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import jsonschema  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, ValidationError

from actors.catalog import Catalog, Safety, ToolDecl, Trait
from actors.identity import Caller

Clock = Callable[[], datetime]

# Longest field name quoted back in a violation: an unknown key is model-written text too.
_MAX_FIELD_NAME = 64


def utc_now() -> datetime:
    """The default clock: real time. Tests and scripted demos inject a fixed one."""
    return datetime.now(UTC)


class Params(BaseModel):
    """Base for params models: an unknown parameter is a validation error, never ignored."""

    model_config = ConfigDict(extra="forbid")


P = TypeVar("P", bound=BaseModel)


@dataclass(slots=True)
class ToolContext:
    """What a handler may know about the call it serves."""

    conversation_id: str
    turn_id: str
    call_id: str
    code: str | None = None  # the code channel, for uses_code tools
    workspace: dict[str, Any] = field(default_factory=dict)  # per conversation, JSON-able
    clock: Clock = utc_now
    # Who the call serves: the tenant and sub of the message's token and the claims an operator
    # passes on (REACTGATE_TOOL_CLAIMS). None when nobody authenticated sent it (a test, a bench).
    caller: Caller | None = None


Handler = Callable[[P, ToolContext], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Tool(Generic[P]):
    """One tool: its declaration, its params model and its handler.

    A handler returns the result JSON. It may put a `ui_commands` list in it; the executor moves
    that list to `Observation.ui_commands` (docs/design.md#ui-commands). Raising is how a handler reports failure.
    """

    tool_id: str
    params_model: type[P]
    handler: Handler[P]
    trait: Trait = Trait.UNKNOWN
    safety: Safety = Safety.SAFE
    uses_code: bool = False
    transitions_state: bool = False
    description: str = ""
    confirm: bool = False   # the user approves each call first (docs/design.md#execute-confirmation)
    # A tool described by a JSON Schema instead of a pydantic model (an MCP tool's inputSchema):
    # calls are validated against it, and the handler gets a `SchemaParams` holding the params.
    params_schema: Mapping[str, Any] | None = None

    def decl(self) -> ToolDecl:
        return ToolDecl(
            tool_id=self.tool_id,
            trait=self.trait,
            safety=self.safety,
            uses_code=self.uses_code,
            transitions_state=self.transitions_state,
            confirm=self.confirm,
            description=self.description,
            params_schema=self.params_schema if self.params_schema is not None else self.params_model.model_json_schema(),
        )


class SchemaParams(BaseModel):
    """The params of a JSON-Schema tool, already checked against its schema; `model_dump()` gives them back."""

    model_config = ConfigDict(extra="allow")


class ToolRegistry:
    """Tool id → Tool. The source of the default catalog and of params validation."""

    def __init__(self, tools: Iterable[Tool[Any]] = (), *, rebuild: tuple[Callable[..., ToolRegistry], tuple[Any, ...]] | None = None) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        self._catalog: Catalog | None = None
        # How another process builds the same registry (a Ray host, the tool pool): a function and its
        # picklable arguments, e.g. a profile's tool sources. None: the tools pickle themselves, by
        # reference to their module-level handlers (the demo tools).
        self._rebuild = rebuild
        for tool in tools:
            self.register(tool)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._rebuild is not None:
            return self._rebuild
        return (ToolRegistry, (list(self._tools.values()),))

    def register(self, tool: Tool[Any]) -> None:
        if tool.tool_id in self._tools:
            raise ValueError(f"tool {tool.tool_id!r} is already registered")
        self._tools[tool.tool_id] = tool
        self._catalog = None

    def get(self, tool_id: str) -> Tool[Any] | None:
        return self._tools.get(tool_id)

    def __contains__(self, tool_id: object) -> bool:
        return tool_id in self._tools

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tools.values())

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(tool.decl() for tool in self._tools.values())
        return self._catalog

    def validate_params(
        self, tool_id: str, params: Mapping[str, Any]
    ) -> tuple[BaseModel | None, list[str]]:
        """The params model instance, or the violations that name what is wrong.

        Violations go back to the model as corrective feedback, so they name fields and rules
        but never quote a rejected value (docs/design.md#timeline "no echo of rejected parameters").
        """
        tool = self._tools.get(tool_id)
        if tool is None:
            return None, ["unknown tool"]
        if tool.params_schema is not None:
            violations = schema_violations(tool.params_schema, params)
            return (None, violations) if violations else (SchemaParams.model_validate(dict(params)), [])
        try:
            return tool.params_model.model_validate(dict(params)), []
        except ValidationError as exc:
            return None, describe_violations(exc)


def schema_violations(schema: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """`field: rule` lines for params that break a JSON Schema, naming the rule, never the value
    (jsonschema's own messages quote the instance)."""
    validator = jsonschema.Draft202012Validator(dict(schema))
    out = []
    for err in sorted(validator.iter_errors(dict(params)), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(part)[:_MAX_FIELD_NAME] for part in err.absolute_path) or "params"
        rule = err.validator
        if rule == "additionalProperties":
            out.append(f"{path}: unknown parameter")
        elif rule == "required":
            missing = [name for name in err.validator_value if name not in (err.instance or {})]
            out.extend(f"{'' if path == 'params' else path + '.'}{name[:_MAX_FIELD_NAME]}: Field required"
                       for name in missing)
        else:
            out.append(f"{path}: must satisfy {rule} {json.dumps(err.validator_value)[:80]}")
    return out


def describe_violations(exc: ValidationError) -> list[str]:
    """`field: rule` lines from a ValidationError, built without its `input` values."""
    out: list[str] = []
    for err in exc.errors(include_url=False, include_context=False):
        path = ".".join(str(part)[:_MAX_FIELD_NAME] for part in err["loc"]) or "params"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown parameter"
        elif _quotes(msg, err.get("input")):
            # A few pydantic messages (union tags, custom validators) quote the input.
            msg = err["type"].replace("_", " ")
        out.append(f"{path}: {msg}")
    return out


def _quotes(msg: str, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return False
    text = str(value)
    return len(text) >= 2 and text in msg
