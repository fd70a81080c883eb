// reactgate.js (gateway/static/reactgate.js) against a real gateway: what its header promises —
// every seq delivered once, in order, across a cut connection; a command re-sent after a reconnect
// acts once; a token supplier asked again after close 4001. Run by tests/test_js.py (see harness.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";

import { ReactgateClient, newId } from "../../gateway/static/reactgate.js";
import { answerOf, gateway, mintToken, range, recordingWebSocket, seqs, until, watch } from "./harness.mjs";

const GATEWAY = gateway();
const TIMEOUT = { timeout: 60_000 };
const AUTH_ONLY = { ...TIMEOUT, skip: GATEWAY.secret ? false : "anonymous gateway: no token expires" };
const FAST = { baseMs: 50, capMs: 500 };  // reconnect quickly: the tests cut connections on purpose

// A client of the gateway under test; closed when the test ends.
function client(t, options = {}) {
  const c = new ReactgateClient({ url: GATEWAY.url, token: GATEWAY.token, backoff: FAST, ...options });
  t.after(() => c.close());
  return c;
}

test("a demo turn streams to its end and the assembled answer is turn.completed's final_answer", TIMEOUT, async (t) => {
  const c = client(t);
  const { conversationId, lastSeq } = await c.open();
  assert.match(conversationId, /^c_[\w-]{22}$/);
  assert.equal(lastSeq, 0);
  const { events, completed } = watch(c, conversationId);
  const ack = await c.send(conversationId, "What's the weather in Paris?");
  assert.deepEqual([ack.status, ack.resent], ["accepted", false]);

  const done = await completed();
  assert.equal(done.data.reason, "complete");
  assert.ok(events.filter((e) => e.event === "answer.delta").length > 1, "the answer streams in several deltas");
  assert.equal(answerOf(events), done.data.final_answer);
  assert.deepEqual(seqs(events), range(1, done.seq));
  assert.deepEqual([events[0].event, events[0].data.message_id], ["user.message", ack.id]);
  assert.equal(c.lastSeq(conversationId), done.seq);
});

test("a client cut mid-answer resumes after its last seq: every character once, seqs contiguous", TIMEOUT, async (t) => {
  const sockets = [];
  const statuses = [];
  let seqAtCut = null;
  let conversationId = null;
  const c = client(t, {
    WebSocket: recordingWebSocket(sockets),
    onStatus: (status) => {
      statuses.push(status);
      if (status.state === "down" && seqAtCut === null) seqAtCut = c.lastSeq(conversationId);
    },
  });
  ({ conversationId } = await c.open());
  const { events, completed } = watch(c, conversationId);
  await c.send(conversationId, "What's the weather in Paris?");
  await until(() => events.filter((e) => e.event === "answer.delta").length >= 3, "three answer deltas");
  assert.ok(!events.some((e) => e.event === "turn.completed"), "cut mid-answer");
  sockets[0].close();  // the test cuts the connection; the client did not ask for it

  const done = await completed();
  assert.equal(done.data.reason, "complete");
  assert.equal(answerOf(events), done.data.final_answer);       // every character, once
  assert.deepEqual(seqs(events), range(1, done.seq));             // contiguous: no gap, no duplicate
  assert.equal(new Set(seqs(events)).size, events.length);
  // It reconnected and subscribed after the last seq it had delivered, not from 0.
  assert.ok(sockets.length >= 2, `${sockets.length} connection(s)`);
  const resubscribe = sockets.at(-1).sent.find((f) => f.type === "subscribe");
  assert.equal(resubscribe.after_seq, seqAtCut);
  assert.ok(seqAtCut > 0 && seqAtCut < done.seq);
});

test("a user_message whose ack was lost is re-sent with its id after a reconnect and acts once", TIMEOUT, async (t) => {
  const id = newId();
  const sockets = [];
  // The first connection never shows the client the ack of `id`: it stays pending.
  const lose = (frame, socket) => socket === sockets[0] && frame.type === "ack" && frame.id === id;
  const c = client(t, { WebSocket: recordingWebSocket(sockets, { drop: lose }) });
  const { conversationId } = await c.open();
  const tab = client(t);  // another tab on the same conversation
  const seen = watch(tab, conversationId);

  const acked = c.send(conversationId, "What's the weather in Paris?", { id });
  await until(() => sockets[0].dropped.length === 1, "the (hidden) ack of the first copy");
  sockets[0].close();

  const ack = await acked;
  assert.deepEqual(ack, { id, status: "duplicate", resent: true });  // the server had it already
  const sentCopies = sockets.flatMap((s) => s.sent).filter((f) => f.type === "user_message");
  assert.deepEqual(sentCopies.map((f) => f.id), [id, id]);
  await seen.completed();
  // A fresh client reads the whole log: one message, one turn.
  const reader = client(t);
  const log = watch(reader, conversationId);
  const done = await log.completed();
  assert.deepEqual(seqs(log.events), range(1, done.seq));
  assert.deepEqual(log.events.filter((e) => e.event === "user.message").map((e) => e.data.message_id), [id]);
  assert.equal(log.events.filter((e) => e.event === "turn.started").length, 1);
});

test("several clients on one conversation see the same events; one resumes from any seq", TIMEOUT, async (t) => {
  const first = client(t);
  const { conversationId } = await first.open();
  const a = watch(first, conversationId);
  const b = watch(client(t), conversationId);  // another tab, its own connection
  await first.send(conversationId, "What's the weather in Paris?");
  const done = await a.completed();
  await b.completed();
  assert.deepEqual(b.events, a.events);  // frame for frame, ts included

  const from = Math.floor(done.seq / 2);  // e.g. kept in storage by a page that reloaded
  const later = client(t);
  const resumed = [];
  const replayed = watch(later, conversationId, { afterSeq: from, onSubscribed: (s) => resumed.push(s) });
  await replayed.completed();
  assert.deepEqual(replayed.events, a.events.slice(from));
  assert.deepEqual(resumed, [{ afterSeq: from, head: done.seq, resumed: false }]);
});

test("set_mode, list and a re-open answer on acks; a conversation not ours ends with forbidden", TIMEOUT, async (t) => {
  const c = client(t);
  const { conversationId } = await c.open({ mode: "ask" });
  assert.equal((await c.setMode(conversationId, "agent")).status, "accepted");
  const page = await c.list({ limit: 100 });
  assert.ok(page.conversations.some((e) => e.conversation_id === conversationId));
  const reopened = await c.open({ conversationId });  // open here already: a head check
  assert.equal(reopened.conversationId, conversationId);
  assert.equal(reopened.lastSeq, (await c.list({ limit: 100 })).conversations
    .find((e) => e.conversation_id === conversationId).last_seq);

  const ghost = "c_" + "q".repeat(22);
  const ended = [];
  c.subscribe(ghost, { onEnd: (error) => ended.push(error.code) });
  await assert.rejects(c.send(ghost, "hello"), { code: "forbidden" });
  assert.deepEqual(ended, ["forbidden"]);
});

test("with auth, a token supplier is asked again after close 4001 and the conversation resumes", AUTH_ONLY, async (t) => {
  const asked = [];
  const statuses = [];
  const supplier = async () => {
    asked.push(Date.now());
    return mintToken({ expInS: asked.length === 1 ? 2 : 3600 });  // the first expires at once
  };
  const c = client(t, { token: supplier, onStatus: (status) => statuses.push(status) });
  const { conversationId } = await c.open();
  const { events, completed } = watch(c, conversationId);
  await c.send(conversationId, "What's the weather in Paris?");
  await until(() => statuses.some((s) => s.state === "down" && s.closeCode === 4001), "close 4001", 15_000);
  await until(() => c.connected && asked.length === 2, "a reconnect with a fresh token");

  const first = await completed("t1");
  await c.send(conversationId, "And in Oslo?");  // the fresh connection carries on
  const second = await completed("t2");
  assert.equal(asked.length, 2);
  assert.equal(answerOf(events, "t1"), first.data.final_answer);
  assert.equal(answerOf(events, "t2"), second.data.final_answer);
  assert.deepEqual(seqs(events), range(1, second.seq));
  assert.equal(c.ended, null);
});

test("with auth, a fixed token ends the client at close 4001 instead of retrying it", AUTH_ONLY, async (t) => {
  const sockets = [];
  const statuses = [];
  const c = client(t, {
    token: mintToken({ expInS: 2 }), WebSocket: recordingWebSocket(sockets), onStatus: (s) => statuses.push(s),
  });
  const { conversationId } = await c.open();
  const ended = [];
  c.subscribe(conversationId, { onEnd: (error) => ended.push(error.code) });
  await until(() => c.ended !== null, "the end of the client", 15_000);
  assert.equal(c.ended, "token expired");
  assert.deepEqual(ended, ["token_expired"]);
  assert.deepEqual(statuses.at(-1), { state: "ended", reason: "token expired", code: "token_expired", closeCode: 4001 });
  await assert.rejects(c.send(conversationId, "hello"), { code: "token_expired" });
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.equal(sockets.length, 1);  // never reconnected with the stale token
});
