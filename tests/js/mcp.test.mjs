// The MCP face (docs/design.md#mcp-face) with the official TypeScript SDK, @modelcontextprotocol/sdk
// (pinned in package.json / package-lock.json), over streamable HTTP against a real gateway:
// tests/test_js.py serves the agents of tests/mcpkit.py ("face", and "big" with a compact catalog),
// with auth on, on the local and the Ray backend. The conversation's owner watches on /ws with
// reactgate.js where the owner has a part.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema, ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

import { ReactgateClient } from "../../gateway/static/reactgate.js";
import { gateway, mintToken, until, watch } from "./harness.mjs";

const EXECUTE = { reactgate_access: "execute" };

/** A connected SDK client on /mcp, bound to a new conversation of `agent` (`query`: more of the URL's
 *  query, e.g. a conversation to bind to); closed when test `t` ends. */
async function connect(t, { claims = {}, sub = null, agent = "face", query = "", elicit = null, name = "node-agent" } = {}) {
  const { httpUrl } = gateway();
  const token = mintToken({ claims, sub });
  const client = new Client({ name, version: "1.0.0" }, elicit ? { capabilities: { elicitation: {} } } : {});
  if (elicit) client.setRequestHandler(ElicitRequestSchema, elicit);
  const transport = new StreamableHTTPClientTransport(new URL(`${httpUrl}/mcp?agent=${agent}${query}`), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  t.after(() => client.close());
  const meta = client.getInstructions() ?? "";
  const conversationId = /conversation (c_[\w-]+)/.exec(meta)?.[1];
  return { client, conversationId, instructions: meta };
}

const names = (listed) => new Set(listed.tools.map((tool) => tool.name));
const textOf = (result) => JSON.parse(result.content[0].text);

function owner(t, conversationId) {
  const { url, token } = gateway();
  const ws = new ReactgateClient({ url, token });
  t.after(() => ws.close());
  return { ws, ...watch(ws, conversationId) };
}

test("initialize and tools/list: write tools are absent in observe, present in execute", async (t) => {
  const observe = await connect(t);
  assert.match(observe.instructions, /access observe \(ask mode/);
  const execute = await connect(t, { claims: EXECUTE });
  assert.match(execute.instructions, /access execute \(agent mode\)/);
  const seen = names(await observe.client.listTools());
  const full = names(await execute.client.listTools());
  assert.ok(!seen.has("demo.write_note") && full.has("demo.write_note"));
  assert.deepEqual([...full].filter((n) => !seen.has(n)), ["demo.write_note"]);
});

test("a state transition sends notifications/tools/list_changed", async (t) => {
  const { client } = await connect(t, { claims: EXECUTE });
  let changed = 0;
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { changed += 1; });
  assert.ok(!names(await client.listTools()).has("demo.render"));
  const focused = await client.callTool({ name: "demo.focus_project", arguments: { name: "atlas" } });
  assert.deepEqual(focused.structuredContent, { project: "atlas", state: "focused" });
  await until(() => changed > 0, "notifications/tools/list_changed");
  assert.ok(names(await client.listTools()).has("demo.render"));
});

test("search_capabilities on a large catalog returns ids, schemas, a digest and a route", async (t) => {
  const { client } = await connect(t, { claims: EXECUTE, agent: "big" });
  assert.deepEqual(names(await client.listTools()), new Set(["demo.clock", "react.ask_user", "search_capabilities"]));
  const found = await client.callTool({ name: "search_capabilities", arguments: { query: "weather for a city" } });
  const [first] = found.structuredContent.capabilities;
  assert.equal(first.id, "demo.weather");
  assert.equal(first.route, "read");
  assert.match(first.digest, /^[0-9a-f]{12}$/);
  assert.deepEqual(first.inputSchema.required, ["city"]);
  const weather = await client.callTool({ name: "demo.weather", arguments: { city: "Paris" } });
  assert.deepEqual(weather.structuredContent, { city: "Paris", condition: "rain", temp_c: 12 });
});

test("a write tool in observe is a tool error carrying the ASK_MODE_DENIED notice", async (t) => {
  const { client } = await connect(t);
  const denied = await client.callTool({ name: "demo.write_note", arguments: { text: "milk" } });
  assert.equal(denied.isError, true);
  assert.deepEqual(textOf(denied), {
    code: "ASK_MODE_DENIED", tool_id: "demo.write_note",
    message: "demo.write_note writes, and the conversation is in ask mode; it was not run",
  });
});

test("the exploration budget stops a client that keeps exploring", async (t) => {
  const { client } = await connect(t, { claims: EXECUTE });
  for (const city of ["Paris", "Tokyo", "Paris"]) {
    assert.ok(!(await client.callTool({ name: "demo.weather", arguments: { city } })).isError);
  }
  const over = await client.callTool({ name: "demo.weather", arguments: { city: "Tokyo" } });
  assert.deepEqual(textOf(over), { error: "EXPLORATION_BUDGET_REACHED", cap: 3 });
  const again = await client.callTool({ name: "demo.search", arguments: { query: "rain" } });
  assert.equal(textOf(again).code, "exploration_budget.confirmation_required");
});

test("a confirm tool approved and denied through elicitation runs exactly once, and never", async (t) => {
  const answers = ["Approve", "Deny"];
  const asked = [];
  const { client } = await connect(t, {
    claims: EXECUTE,
    elicit: async (request) => {
      asked.push(request.params.message);
      return { action: "accept", content: { decision: answers[asked.length - 1] } };
    },
  });
  const approved = await client.callTool({ name: "demo.write_note", arguments: { text: "milk" } });
  assert.deepEqual(approved.structuredContent, { stored: true, count: 1 });   // the note count: ran once
  const denied = await client.callTool({ name: "demo.write_note", arguments: { text: "eggs" } });
  assert.equal(denied.isError, true);
  assert.deepEqual(textOf(denied).error, "denied_by_user");
  answers.push("Approve");
  const later = await client.callTool({ name: "demo.write_note", arguments: { text: "bread" } });
  assert.deepEqual(later.structuredContent, { stored: true, count: 2 });      // the denied one never ran
  assert.equal(asked.length, 3);
});

test("a /ws subscriber of the bound conversation sees every external call", async (t) => {
  const { client, conversationId } = await connect(t, { claims: EXECUTE, name: "claude-node" });
  const { ws, events } = owner(t, conversationId);
  await client.callTool({ name: "demo.weather", arguments: { city: "Paris" } });
  const pending = client.callTool({ name: "demo.write_note", arguments: { text: "x" } });   // no elicitation: the owner approves
  const ask = await until(() => events.find((e) => e.event === "ask_user" && e.data.kind === "approval"), "the approval");
  await ws.answer(conversationId, ask.data.ask_id, "Approve");
  assert.deepEqual((await pending).structuredContent, { stored: true, count: 1 });
  await until(() => events.filter((e) => e.event === "tool.result").length === 2, "both results");
  const calls = events.filter((e) => e.event === "tool.call").map((e) => e.data.tool_id);
  assert.deepEqual(calls, ["demo.weather", "demo.write_note"]);
  for (const e of events) assert.deepEqual(e.data.client, { face: "mcp", name: "claude-node" }, e.event);
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1));
});

test("a foreign conversation at initialize is refused like on /ws", async (t) => {
  const { conversationId } = await connect(t);
  await assert.rejects(connect(t, { sub: "mallory", query: `&conversation_id=${conversationId}` }), /403|forbidden/i);
});

test("cancelling a long call cuts it: the conversation logs it cancelled", async (t) => {
  const { client, conversationId } = await connect(t, { claims: EXECUTE });
  const { events } = owner(t, conversationId);
  const abort = new AbortController();
  const long = client.callTool({ name: "demo.sleep", arguments: { seconds: 600 } }, undefined, { signal: abort.signal });
  const call = await until(() => events.find((e) => e.event === "tool.call" && e.data.tool_id === "demo.sleep"), "the call");
  abort.abort();
  await assert.rejects(long);
  const result = await until(() => events.find((e) => e.event === "tool.result" && e.data.call_id === call.data.call_id),
    "its result");
  assert.equal(result.data.error, "cancelled");
});
