"""Tools written as Python functions (docs/design.md#your-tools): the `@tool` decorator and the
loader that turns a profile's `impl = "module:attr"` into a `Tool`.

The function's annotated parameters are its params model (pydantic, unknown keys forbidden), so a
wrong call is a violation fed back to the model like any other. A parameter annotated
`ToolContext` receives the call's context instead. `async def` functions run on the host's loop;
plain `def` functions run in a worker thread, so a blocking tool never stalls other conversations.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import create_model

from actors.catalog import Safety, Trait
from actors.tools.registry import Params, Tool, ToolContext

MARK = "__reactgate_tool__"


@dataclass(frozen=True)
class ToolMeta:
    """What `@tool` declares; the id comes from the profile that lists the function."""

    trait: Trait
    safety: Safety
    description: str
    uses_code: bool
    transitions_state: bool
    confirm: bool = False


def tool(
    *,
    trait: Trait | str,
    safety: Safety | str = Safety.SAFE,
    description: str = "",
    uses_code: bool = False,
    transitions_state: bool = False,
    confirm: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a function a tool. The function is returned unchanged (callable, testable as is).
    `confirm`: each call waits for the user's approval (docs/design.md#execute-confirmation)."""
    meta = ToolMeta(Trait(trait), Safety(safety), description, uses_code, transitions_state, confirm)

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, MARK, meta)
        return fn

    return mark


class ToolLoadError(ValueError):
    """An `impl` that is not a loadable tool; the message says why (the caller adds where)."""


def load_tool(tool_id: str, impl: str, search_path: Sequence[str] = ()) -> Tool[Any]:
    """The tool `impl` ("module:attr") names, under `tool_id`: a `@tool` function or a `Tool`."""
    module_name, sep, attr = impl.partition(":")
    if not sep or not module_name or not attr:
        raise ToolLoadError(f"{impl!r} is not of the form 'module:attribute'")
    for path in reversed(search_path):
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolLoadError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module's own code failed at import
        raise ToolLoadError(f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ToolLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, Tool):
        return replace(target, tool_id=tool_id)
    meta = getattr(target, MARK, None)
    if callable(target) and isinstance(meta, ToolMeta):
        return function_tool(tool_id, target, meta)
    raise ToolLoadError(f"{impl!r} is neither a function decorated with @tool nor a Tool")


def function_tool(tool_id: str, fn: Callable[..., Any], meta: ToolMeta) -> Tool[Any]:
    hints = typing.get_type_hints(fn)
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolLoadError(f"parameter {name!r}: a tool takes named parameters only")
        annotation = hints.get(name)
        if annotation is ToolContext:
            context_param = name
            continue
        if annotation is None:
            raise ToolLoadError(f"parameter {name!r} has no type annotation")
        fields[name] = (annotation, ... if param.default is param.empty else param.default)
    params_model = create_model(f"{fn.__name__}_params", __base__=Params, **fields)
    names = tuple(fields)
    is_async = inspect.iscoroutinefunction(fn)

    async def handler(params: Params, ctx: ToolContext) -> dict[str, Any]:
        kwargs = {name: getattr(params, name) for name in names}
        if context_param is not None:
            kwargs[context_param] = ctx
        result = await fn(**kwargs) if is_async else await asyncio.to_thread(fn, **kwargs)
        # A tool may return any JSON value; the observation is always an object.
        return result if isinstance(result, dict) else {"result": result}

    description = meta.description or (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
    return Tool(tool_id, params_model, handler, meta.trait, meta.safety, meta.uses_code,
                meta.transitions_state, description, meta.confirm)
