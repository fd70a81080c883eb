// AG-UI's own client (@ag-ui/client's HttpAgent, events checked with @ag-ui/core's EventSchemas)
// against a real gateway's /agui (docs/frontends.md#ag-ui). An `[ag-ui]` warning from the client
// (an event or field it refused) fails the test. What the user ends up with is checked against the
// conversation's own log, read with reactgate.js. Run by tests/test_js.py (see harness.mjs); the
// gateway serves "demo" (a slow answer), "ask" and "confirm" (demo.write_note asks approval).
import { test } from "node:test";
import assert from "node:assert/strict";

import { HttpAgent } from "@ag-ui/client";
import { EventSchemas } from "@ag-ui/core/schemas";

import { ReattachingAgent } from "../../gateway/static/agui-reattach.js";
import { answerOf, gateway, logOf, until } from "./harness.mjs";

const GATEWAY = gateway();
const URL_ = `${GATEWAY.httpUrl}/agui`;
const AUTH = GATEWAY.token ? { Authorization: `Bearer ${GATEWAY.token}` } : {};
const TIMEOUT = { timeout: 60_000 };
let threads = 0;

// Every warning the client prints about what it received fails the test that caused it.
const warnings = [];
for (const level of ["warn", "error"]) {
  const original = console[level];
  console[level] = (...args) => {
    if (String(args[0]).includes("[ag-ui]")) warnings.push(args.map(String).join(" "));
    original.apply(console, args);
  };
}

/** An agent on a new thread of this gateway; `events` collects what it received, each schema-checked. */
function agent(t, { agent: name, Agent = HttpAgent } = {}) {
  const before = warnings.length;
  const a = new Agent({ url: URL_, headers: AUTH, threadId: `thread-${process.pid}-${++threads}` });
  const events = [];
  a.subscribe({
    onEvent: ({ event }) => {
      const checked = EventSchemas.safeParse(event);
      assert.ok(checked.success, `${event.type} fails @ag-ui/core's schema: ${checked.error?.message}`);
      events.push(event);
    },
  });
  t.after(() => assert.deepEqual(warnings.slice(before), [], "the client warned"));
  const props = name ? { agent: name } : {};
  return { agent: a, events, props };
}

function say(a, text) {
  a.addMessage({ id: `u-${Date.now()}-${Math.random().toString(36).slice(2)}`, role: "user", content: text });
}


/** The conversation id: the first conversation of this caller's list whose title is `text`. */
async function conversationOf(text) {
  const response = await fetch(`${GATEWAY.httpUrl}/v1/conversations?limit=100`, { headers: AUTH });
  const page = await response.json();
  return page.conversations.find((c) => c.title === text).conversation_id;
}

const assistantText = (messages) => messages.filter((m) => m.role === "assistant").map((m) => m.content ?? "").join("");

test("HttpAgent runs a demo turn: every event schema-valid, the tool call and the whole answer", TIMEOUT, async (t) => {
  const { agent: a, events, props } = agent(t);
  const text = `weather ${process.pid}-${threads}`;
  say(a, text);
  await a.runAgent({ forwardedProps: props });
  const types = events.map((e) => e.type);
  assert.equal(types[0], "RUN_STARTED");
  assert.equal(types.at(-1), "RUN_FINISHED");
  assert.ok(types.includes("REASONING_MESSAGE_CONTENT") && !types.some((x) => x.startsWith("THINKING")));
  const call = a.messages.find((m) => m.role === "assistant" && m.toolCalls?.length)?.toolCalls[0];
  assert.equal(call.function.name, "demo.weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" });
  assert.ok(a.messages.some((m) => m.role === "tool" && m.toolCallId === call.id));
  const { events: log, done } = await logOf(t, await conversationOf(text));
  assert.equal(assistantText(a.messages), done.data.final_answer);
  assert.equal(assistantText(a.messages), answerOf(log));
  assert.ok(events.every((e) => e.type === "RUN_STARTED" || Number.isInteger(e.metadata?.reactgate?.seq)));
});

test("ask_user is an interrupt; the next run's resume answers it and the same turn goes on", TIMEOUT, async (t) => {
  const { agent: a, events, props } = agent(t, { agent: "ask" });
  const text = `ask ${process.pid}-${threads}`;
  say(a, text);
  await a.runAgent({ forwardedProps: props });
  const finished = events.findLast((e) => e.type === "RUN_FINISHED");
  assert.equal(finished.outcome.type, "interrupt");
  const [interrupt] = a.pendingInterrupts;
  assert.deepEqual([interrupt.message, interrupt.responseSchema.enum], ["Which city?", ["Paris", "Oslo"]]);
  await a.runAgent({ forwardedProps: props, resume: [{ interruptId: interrupt.id, status: "resolved", payload: "Paris" }] });
  assert.equal(events.findLast((e) => e.type === "RUN_FINISHED").outcome?.type ?? "success", "success");
  const { done } = await logOf(t, await conversationOf(text));
  assert.equal(assistantText(a.messages), done.data.final_answer);
});

test("an Execute confirmation is an interrupt; resolved, the call runs once", TIMEOUT, async (t) => {
  const { agent: a, props } = agent(t, { agent: "confirm" });
  const text = `note ${process.pid}-${threads}`;
  say(a, text);
  await a.runAgent({ forwardedProps: props });
  const [interrupt] = a.pendingInterrupts;
  assert.equal(interrupt.reason, "reactgate.approval");
  assert.ok(interrupt.responseSchema.enum.includes("Approve"));
  await a.runAgent({ forwardedProps: props, resume: [{ interruptId: interrupt.id, status: "resolved", payload: "Approve" }] });
  const { events: log, done } = await logOf(t, await conversationOf(text));
  const ran = log.filter((e) => e.event === "tool.result" && e.data.tool_id === "demo.write_note");
  assert.deepEqual(ran.map((e) => e.data.ok), [true], "the approved call ran exactly once");
  assert.equal(assistantText(a.messages), done.data.final_answer);
});

test("a reloaded page gets the thread as MESSAGES_SNAPSHOT, the user's own words included", TIMEOUT, async (t) => {
  const first = agent(t);
  const text = `reload ${process.pid}-${threads}`;
  say(first.agent, text);
  await first.agent.runAgent({ forwardedProps: first.props });
  const reloaded = new HttpAgent({ url: URL_, headers: AUTH, threadId: first.agent.threadId });
  const snapshots = [];
  reloaded.subscribe({ onEvent: ({ event }) => { if (event.type === "MESSAGES_SNAPSHOT") snapshots.push(event); } });
  await reloaded.runAgent({});        // nothing new to say: the thread as it is
  assert.equal(snapshots.length, 1);
  assert.deepEqual(reloaded.messages.filter((m) => m.role === "user").map((m) => m.content), [text]);
  assert.equal(assistantText(reloaded.messages), assistantText(first.agent.messages));
});

test("a run cut mid-answer is reattached after its last seq: the whole answer, no character twice", TIMEOUT, async (t) => {
  const { agent: a, events, props } = agent(t, { Agent: ReattachingAgent });
  const text = `cut ${process.pid}-${threads}`;
  say(a, text);
  let contents = 0;
  a.subscribe({ onEvent: ({ event }) => { if (event.type === "TEXT_MESSAGE_CONTENT" && ++contents === 5) a.abortRun(); } });
  await a.runAgent({ forwardedProps: props });
  const cut = assistantText(a.messages);
  assert.ok(events.findLast((e) => e.type === "RUN_FINISHED") === undefined, "the first run was cut");
  await a.reattach();
  assert.equal(events.at(-1).type, "RUN_FINISHED");
  const { events: log, done } = await logOf(t, await conversationOf(text));
  assert.ok(cut.length > 0 && cut.length < done.data.final_answer.length);
  assert.equal(assistantText(a.messages), done.data.final_answer);
  assert.equal(assistantText(a.messages), answerOf(log));
});
