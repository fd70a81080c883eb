// The AI SDK's own client (the `ai` package: the Chat behind useChat, DefaultChatTransport, and the
// UI message stream parser) against a real gateway's /api/chat (docs/frontends.md#the-ai-sdk).
// What the user ends up with is checked against the conversation's own log, read with reactgate.js:
// the assembled answer is turn.completed's final_answer, every character once.
// Run by tests/test_js.py (see harness.mjs); the gateway serves "demo" (a slow answer), "ask" and
// "confirm" (demo.write_note waits for the user's approval).
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  AbstractChat, DefaultChatTransport, parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema,
} from "ai";

import { answerOf, gateway, logOf, until } from "./harness.mjs";

const GATEWAY = gateway();
const API = `${GATEWAY.httpUrl}/api/chat`;
const AUTH = GATEWAY.token ? { Authorization: `Bearer ${GATEWAY.token}` } : {};
const TIMEOUT = { timeout: 60_000 };
let chats = 0;

// The state a useChat hook keeps, without React.
class State {
  status = "ready"; error = undefined; messages = [];
  pushMessage = (m) => { this.messages = this.messages.concat(m); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; };
  snapshot = (v) => structuredClone(v);
}

// Send again by itself once the user answered a question or an approval (docs/frontends.md#the-ai-sdk).
const answered = ({ messages }) => {
  const last = messages.at(-1);
  return last?.role === "assistant" && last.parts.some((p) => p.state === "approval-responded"
    || (p.type === "tool-ask_user" && p.state === "output-available" && typeof p.output === "string"));
};

/** A Chat as useChat makes one, on this gateway; `conversations` collects the ids it was told. */
function chat({ agent, id = `chat-${process.pid}-${++chats}`, messages = [] } = {}) {
  const conversations = [];
  const state = new State();
  state.messages = messages;
  const c = new (class extends AbstractChat {})({
    id,
    state,
    transport: new DefaultChatTransport({
      api: API,
      headers: AUTH,
      body: agent ? { agent } : {},
      fetch: async (url, init) => {
        const response = await fetch(url, init);
        const cid = response.headers.get("x-reactgate-conversation-id");
        if (cid && !conversations.includes(cid)) conversations.push(cid);
        return response;
      },
    }),
    sendAutomaticallyWhen: answered,
  });
  return { chat: c, conversations, state };
}


const lastAssistant = (c) => c.messages.filter((m) => m.role === "assistant").at(-1);
const textOf = (message) => message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
const settled = (c, what) => until(() => c.status === "ready" && c.messages.length > 1, what, 40_000);

test("the official parser reads a demo turn as one assistant message: the tool part and the whole answer", TIMEOUT, async (t) => {
  const response = await fetch(API, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...AUTH },
    body: JSON.stringify({ id: `raw-${process.pid}`, trigger: "submit-message", messages: [
      { id: "m1", role: "user", parts: [{ type: "text", text: "What's the weather in Paris?" }] }] }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("x-vercel-ai-ui-message-stream"), "v1");
  const cid = response.headers.get("x-reactgate-conversation-id");
  const chunks = parseJsonEventStream({ stream: response.body, schema: uiMessageChunkSchema }).pipeThrough(
    new TransformStream({
      transform(parsed, controller) {
        assert.ok(parsed.success, `a chunk the SDK's schema refuses: ${JSON.stringify(parsed.rawValue)}`);
        controller.enqueue(parsed.value);
      },
    }));
  const snapshots = [];
  for await (const message of readUIMessageStream({ stream: chunks })) snapshots.push(message);
  const message = snapshots.at(-1);
  assert.equal(new Set(snapshots.map((m) => m.id)).size, 1, "one assistant message");
  assert.equal(message.role, "assistant");
  const tool = message.parts.find((p) => p.type === "tool-demo.weather");
  assert.deepEqual([tool?.state, tool?.input], ["output-available", { city: "Paris" }]);
  const { events, done } = await logOf(t, cid);
  assert.equal(textOf(message), done.data.final_answer);
  assert.equal(textOf(message), answerOf(events));
});

test("useChat's Chat: a question comes as a client-side tool, addToolOutput answers it, the turn goes on", TIMEOUT, async (t) => {
  const { chat: c, conversations } = chat({ agent: "ask" });
  await c.sendMessage({ text: "What's the weather?" });
  const asked = await until(() => lastAssistant(c)?.parts.find((p) => p.type === "tool-ask_user"
    && p.state === "input-available"), "the question");
  assert.deepEqual(asked.input, { question: "Which city?", options: ["Paris", "Oslo"] });
  await until(() => c.status === "ready", "the paused response to end");
  await c.addToolOutput({ tool: "ask_user", toolCallId: asked.toolCallId, output: "Paris" });
  await until(() => c.status === "ready" && textOf(lastAssistant(c)), "the answer after the question");
  const { done } = await logOf(t, conversations[0]);
  assert.equal(conversations.length, 1);
  assert.equal(textOf(lastAssistant(c)), done.data.final_answer);
  assert.equal(c.messages.filter((m) => m.role === "assistant").length, 1, "the same assistant message goes on");
});

test("an Execute confirmation approved with addToolApprovalResponse runs the call once", TIMEOUT, async (t) => {
  const { chat: c, conversations } = chat({ agent: "confirm" });
  await c.sendMessage({ text: "Note that it rains." });
  const waiting = await until(() => lastAssistant(c)?.parts.find((p) => p.type === "tool-demo.write_note"
    && p.state === "approval-requested"), "the approval request");
  await until(() => c.status === "ready", "the paused response to end");
  await c.addToolApprovalResponse({ id: waiting.approval.id, approved: true });
  await until(() => c.status === "ready" && textOf(lastAssistant(c)), "the answer after the approval");
  const { events, done } = await logOf(t, conversations[0]);
  const ran = events.filter((e) => e.event === "tool.result" && e.data.tool_id === "demo.write_note");
  assert.deepEqual(ran.map((e) => e.data.ok), [true], "the approved call ran exactly once");
  assert.ok(events.some((e) => e.event === "trace" && e.data.kind === "approval" && e.data.decision === "approved"));
  const part = lastAssistant(c).parts.find((p) => p.type === "tool-demo.write_note");
  assert.equal(part.state, "output-available");
  assert.equal(textOf(lastAssistant(c)), done.data.final_answer);
});

test("a reloaded page rebuilds the chat, the user's own words included, and goes on from there", TIMEOUT, async (t) => {
  const first = chat();
  await first.chat.sendMessage({ text: "What's the weather in Paris?" });
  await settled(first.chat, "the first turn");
  const response = await fetch(`${API}/${encodeURIComponent(first.chat.id)}/messages`, { headers: AUTH });
  assert.equal(response.status, 200);
  const messages = await response.json();
  assert.deepEqual(messages.map((m) => m.role), ["user", "assistant"]);
  assert.deepEqual(messages[0].parts, [{ type: "text", text: "What's the weather in Paris?" }]);
  assert.equal(textOf(messages[1]), textOf(lastAssistant(first.chat)));

  const reloaded = chat({ id: first.chat.id, messages });   // the page's useChat({id, messages})
  await reloaded.chat.sendMessage({ text: "And tomorrow?" });
  await until(() => reloaded.chat.status === "ready" && reloaded.chat.messages.length === 4, "the second turn");
  const { done } = await logOf(t, first.conversations[0], "t2");
  assert.deepEqual(reloaded.conversations, first.conversations, "the same conversation");
  assert.equal(textOf(lastAssistant(reloaded.chat)), done.data.final_answer);
});

test("a chat cut mid-answer resumes with GET …/stream: the whole answer, no character twice", TIMEOUT, async (t) => {
  const { chat: c, conversations } = chat();
  const sent = c.sendMessage({ text: "What's the weather in Paris?" });
  await until(() => textOf(lastAssistant(c) ?? { parts: [] }).length > 20, "the answer to stream");
  await c.stop();                      // the AI SDK's stop(): a disconnect, the turn goes on
  await sent;
  const cut = textOf(lastAssistant(c));
  await c.resumeStream();              // GET /api/chat/{id}/stream: the running turn from its start
  await until(() => c.status === "ready", "the resumed stream to end");
  const { events, done } = await logOf(t, conversations[0]);
  const answer = textOf(lastAssistant(c));
  assert.ok(cut.length < answer.length, "the answer was cut before its end");
  assert.equal(answer, done.data.final_answer);
  assert.equal(answer, answerOf(events));
  const again = await fetch(`${API}/${encodeURIComponent(c.id)}/stream`, { headers: AUTH });
  assert.equal(again.status, 204, "no turn runs any more");
});

test("POST …/cancel stops the turn (stop() alone only disconnects)", TIMEOUT, async (t) => {
  const { chat: c, conversations } = chat();
  const sent = c.sendMessage({ text: "What's the weather in Paris?" });
  await until(() => textOf(lastAssistant(c) ?? { parts: [] }).length > 0, "the answer to stream");
  const response = await fetch(`${API}/${encodeURIComponent(c.id)}/cancel`, { method: "POST", headers: AUTH });
  assert.deepEqual([response.status, (await response.json()).status], [200, "accepted"]);
  await sent;
  const { done } = await logOf(t, conversations[0]);
  assert.equal(done.data.reason, "cancelled");
});
