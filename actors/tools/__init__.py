"""Tools: what an agent can do, and how a call becomes an observation (docs/design.md#your-tools).

For a tool of your own, write a function and list it in your profile (`impl = "module:attr"`):

    from actors.tools import tool, ToolContext

    @tool(trait="exploration", safety="safe", description="Look up an order by id.")
    async def lookup_order(order_id: str, ctx: ToolContext) -> dict:
        return {"order_id": order_id, "status": "shipped"}
"""

from actors.tools.functions import tool
from actors.tools.registry import Tool, ToolContext

__all__ = ["Tool", "ToolContext", "tool"]
