// reactgate.js's rules on scripted frames, without a server: a fake WebSocket the test drives shows
// what the client sends and what it delivers (the cases a live gateway does not produce on demand:
// a gap, rate_limited, unavailable, slow_consumer, a lost cancel). The same rules as tests/test_client_session.py.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  ERROR_REACTIONS, ERROR_TARGETS, RESENT_AFTER_RECONNECT, RETRY_PAUSE_MS, ReactgateClient, UNAVAILABLE_PAUSE_CAP_MS,
  backoffDelay, reaction, retryPause,
} from "../../gateway/static/reactgate.js";
import { until } from "./harness.mjs";

const TIMEOUT = { timeout: 10_000 };
const CID = "c_" + "a".repeat(22);

// A WebSocket the test plays the server of: `open()`, `receive(frame)`, `drop(code)`; `sent` holds
// the frames the client sent (parsed). Instances are listed in `sockets`.
function fakeWebSocket(sockets) {
  return class FakeWebSocket extends EventTarget {
    constructor(url, protocol) {
      super();
      this.url = url;
      this.protocol = protocol;
      this.readyState = 0;
      this.sent = [];
      sockets.push(this);
    }

    send(data) {
      if (this.readyState !== 1) throw new Error("send on a socket that is not open");
      this.sent.push(JSON.parse(data));
    }

    close(code = 1005, reason = "") {
      if (this.readyState === 3) return;
      this.readyState = 3;
      this.dispatchEvent(Object.assign(new Event("close"), { code, reason }));
    }

    open() {
      this.readyState = 1;
      this.dispatchEvent(new Event("open"));
    }

    receive(frame) {
      this.dispatchEvent(Object.assign(new Event("message"), { data: JSON.stringify(frame) }));
    }

    drop(code = 1006, reason = "") { this.close(code, reason); }

    last(type) { return this.sent.filter((f) => f.type === type).at(-1); }
  };
}

function setup(t, options = {}) {
  const sockets = [];
  const statuses = [];
  const client = new ReactgateClient({
    url: "ws://127.0.0.1:1/ws", WebSocket: fakeWebSocket(sockets), backoff: { random: () => 0 }, retryPauseMs: 0,
    onStatus: (s) => statuses.push(s), ...options,
  });
  t.after(() => client.close());
  // A connection whose conversation CID is open and watched: returns [socket, delivered events].
  const connect = async () => {
    await until(() => sockets.at(-1)?.readyState === 0, "a connection attempt", 2_000);
    const ws = sockets.at(-1);
    ws.open();
    return ws;
  };
  const ackOpen = (ws, lastSeq = 0) => {
    const open = ws.last("open");
    ws.receive({ type: "ack", id: open.id, status: "accepted", conversation_id: CID, last_seq: lastSeq });
  };
  const ackSubscribe = (ws, lastSeq = 0) => {
    const sub = ws.last("subscribe");
    ws.receive({ type: "ack", id: sub.id, status: "accepted", conversation_id: CID, last_seq: lastSeq, after_seq: sub.after_seq });
  };
  return { client, sockets, statuses, connect, ackOpen, ackSubscribe };
}

const event = (seq, name = "thinking.delta", data = { turn_id: "t1", round: 1, text: `${seq}` }) =>
  ({ type: "event", conversation_id: CID, seq, event: name, data, ts: seq });

test("the tables are total and say what client/session.py says", () => {
  for (const [code, row] of Object.entries(ERROR_REACTIONS)) assert.equal(row.length, ERROR_TARGETS.length, code);
  assert.equal(reaction("rate_limited", "command"), "retry");
  assert.equal(reaction("internal", "stream"), "resubscribe");
  assert.equal(reaction("some_new_code", "open"), "report");
  assert.deepEqual(ERROR_REACTIONS.unavailable, ["retry", "retry", "retry", "resubscribe"]);
  assert.equal(RESENT_AFTER_RECONNECT.cancel, false);
  assert.equal(RESENT_AFTER_RECONNECT.user_message, true);
  assert.equal(backoffDelay(0, { random: () => 1 }), 200);
  assert.equal(backoffDelay(10, { random: () => 1 }), 5000);
});

test("nothing but open goes out before its ack; then subscribe after the last seq, then the commands", TIMEOUT, async (t) => {
  const { client, connect, ackOpen } = setup(t);
  const events = [];
  client.subscribe(CID, { afterSeq: 7, onEvent: (e) => events.push(e.seq) });
  const acked = client.send(CID, "hello", { id: "m1" });
  const ws = await connect();
  assert.deepEqual(ws.sent.map((f) => f.type), ["open"]);
  assert.equal(ws.sent[0].conversation_id, CID);
  ackOpen(ws, 9);
  assert.deepEqual(ws.sent.slice(1), [
    { type: "subscribe", id: ws.sent[1].id, conversation_id: CID, after_seq: 7 },
    { type: "user_message", id: "m1", conversation_id: CID, text: "hello" },
  ]);
  ws.receive({ type: "ack", id: "m1", status: "accepted", conversation_id: CID });
  assert.deepEqual(await acked, { id: "m1", status: "accepted", resent: false });
});

test("each seq once and in order: a repeat is dropped, a gap re-subscribes from the last seq delivered", TIMEOUT, async (t) => {
  const { client, connect, ackOpen, ackSubscribe } = setup(t);
  const events = [];
  const sub = client.subscribe(CID, { onEvent: (e) => events.push(e.seq) });
  const ws = await connect();
  ackOpen(ws);
  ackSubscribe(ws);
  ws.receive(event(1));
  ws.receive(event(1));
  ws.receive(event(3));  // a gap: 2 is missing
  ws.receive(event(4));  // still the old stream: not a second re-subscribe while one is in flight
  assert.deepEqual(events, [1]);
  assert.deepEqual(ws.sent.filter((f) => f.type === "subscribe").map((f) => f.after_seq), [0, 1]);
  ackSubscribe(ws, 4);
  for (const seq of [2, 3, 4]) ws.receive(event(seq));
  assert.deepEqual(events, [1, 2, 3, 4]);
  assert.equal(sub.duplicatesDropped, 1);
});

test("a reconnect re-sends pending commands with their ids, but never a cancel (its promise: lost)", TIMEOUT, async (t) => {
  const { client, sockets, connect, ackOpen, ackSubscribe } = setup(t);
  client.subscribe(CID, {});
  const message = client.send(CID, "hello", { id: "m1" });
  const cancel = client.cancel(CID, { id: "x1" });
  const first = await connect();
  ackOpen(first);
  ackSubscribe(first);
  first.receive(event(1));
  first.drop(1012, "server draining");
  await assert.rejects(cancel, { code: "lost" });
  const second = await connect();
  assert.equal(second.sent.length, 1);
  ackOpen(second, 1);
  const resumed = second.sent.slice(1).map((f) => (f.type === "subscribe" ? [f.type, f.after_seq] : [f.type, f.id]));
  assert.deepEqual(resumed, [["subscribe", 1], ["user_message", "m1"]]);
  second.receive({ type: "ack", id: "m1", status: "duplicate", conversation_id: CID });
  assert.deepEqual(await message, { id: "m1", status: "duplicate", resent: true });
  assert.equal(sockets.length, 2);
});

test("rate_limited: sent again with the same id; slow_consumer: re-subscribed from the last seq delivered", TIMEOUT, async (t) => {
  const { client, connect, ackOpen, ackSubscribe } = setup(t);
  client.subscribe(CID, {});
  const ws = await connect();
  ackOpen(ws);
  ackSubscribe(ws);
  const acked = client.steer(CID, "shorter", { id: "s1" });
  ws.receive({ type: "error", code: "rate_limited", message: "rate limit exceeded: frame not processed", id: "s1" });
  await until(() => ws.sent.filter((f) => f.id === "s1").length === 2, "the steer, again");
  ws.receive({ type: "ack", id: "s1", status: "accepted", conversation_id: CID });
  assert.deepEqual(await acked, { id: "s1", status: "accepted", resent: true });

  ws.receive(event(1));
  ws.receive(event(2));
  ws.receive({ type: "error", code: "slow_consumer", message: "send queue full", conversation_id: CID, last_seq: 5 });
  assert.equal(ws.last("subscribe").after_seq, 2);  // ours, not the error's: nothing is lost
});

test("a refused command rejects with the server's code; an error about nothing tracked is reported", TIMEOUT, async (t) => {
  const reported = [];
  const { client, connect, ackOpen } = setup(t, { onError: (e) => reported.push(e.code) });
  const answered = client.answer(CID, "t1.2.0", "Paris", { id: "a1" });
  const ws = await connect();
  ackOpen(ws);
  ws.receive({ type: "error", code: "not_found", message: "no question waits for that ask_id", id: "a1", conversation_id: CID });
  await assert.rejects(answered, (err) => err.code === "not_found" && err.frame.id === "a1");
  ws.receive({ type: "error", code: "bad_request", message: "?", id: "unknown-frame" });
  assert.deepEqual(reported, ["bad_request"]);
});

test("close 4001: a token supplier is asked again; a fixed token ends the client", TIMEOUT, async (t) => {
  let n = 0;
  const withSupplier = setup(t, { token: () => `tok${++n}` });
  withSupplier.client.subscribe(CID, {});
  const first = await withSupplier.connect();
  assert.equal(first.url, "ws://127.0.0.1:1/ws?token=tok1");
  first.drop(4001, "token expired");
  const second = await withSupplier.connect();
  assert.equal(second.url, "ws://127.0.0.1:1/ws?token=tok2");
  assert.equal(withSupplier.client.ended, null);

  const fixed = setup(t, { token: "tok" });
  const ended = [];
  fixed.client.subscribe(CID, { onEnd: (e) => ended.push(e.code) });
  const only = await fixed.connect();
  only.drop(4001, "token expired");
  assert.equal(fixed.client.ended, "token expired");
  assert.deepEqual(ended, ["token_expired"]);
  assert.equal(fixed.statuses.at(-1).state, "ended");
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.equal(fixed.sockets.length, 1);
});

test("retryPause: unavailable waits its retry_after_ms, bounded; without it the pause doubles; other codes: the pause", () => {
  assert.equal(retryPause({ code: "rate_limited" }), RETRY_PAUSE_MS);
  assert.equal(retryPause({ code: "internal" }, 5, 20), 20);
  assert.equal(retryPause({ code: "unavailable", retry_after_ms: 1200 }, 5), 1200);  // the server's word first
  assert.equal(retryPause({ code: "unavailable", retry_after_ms: 1e9 }), UNAVAILABLE_PAUSE_CAP_MS);
  assert.equal(retryPause({ code: "unavailable", retry_after_ms: -5 }), 0);
  assert.deepEqual([0, 1, 2, 6, 7, 1e6].map((n) => retryPause({ code: "unavailable" }, n)),
                   [500, 1000, 2000, 30_000, 30_000, 30_000]);
});

const unavailable = (id, retryAfterMs, extra = {}) => ({
  type: "error", code: "unavailable", id, retry_after_ms: retryAfterMs,
  message: `store unavailable: failover; frame not processed, send it again (same id) after ${retryAfterMs} ms`, ...extra,
});
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("unavailable: a command goes again with the same id after retry_after_ms, then its ack resolves it", TIMEOUT, async (t) => {
  const { client, connect, ackOpen, ackSubscribe } = setup(t);
  client.subscribe(CID, {});
  const ws = await connect();
  ackOpen(ws);
  ackSubscribe(ws);
  const acked = client.send(CID, "hello", { id: "m1" });
  ws.receive(unavailable("m1", 150, { conversation_id: CID }));
  await sleep(50);
  assert.equal(ws.sent.filter((f) => f.id === "m1").length, 1);  // not before its pause
  await until(() => ws.sent.filter((f) => f.id === "m1").length === 2, "the message, again");
  assert.deepEqual(ws.sent.filter((f) => f.id === "m1")[1], { type: "user_message", id: "m1", conversation_id: CID, text: "hello" });
  ws.receive({ type: "ack", id: "m1", status: "accepted", conversation_id: CID });
  assert.deepEqual(await acked, { id: "m1", status: "accepted", resent: true });
});

test("unavailable: a creating open and a subscribe go again with their ids; the stream re-subscribes", TIMEOUT, async (t) => {
  const { client, connect, ackSubscribe } = setup(t);
  const created = client.open({ agent: "demo" });
  const ws = await connect();
  const open = ws.last("open");
  ws.receive(unavailable(open.id, 20));
  await until(() => ws.sent.filter((f) => f.id === open.id).length === 2, "the open, again");
  ws.receive({ type: "ack", id: open.id, status: "accepted", conversation_id: CID, last_seq: 0 });
  assert.deepEqual(await created, { conversationId: CID, lastSeq: 0 });

  client.subscribe(CID, {});
  const subscribe = ws.last("subscribe");
  ws.receive(unavailable(subscribe.id, 20, { conversation_id: CID }));
  await until(() => ws.sent.filter((f) => f.id === subscribe.id).length === 2, "the subscribe, again");
  ackSubscribe(ws);
  ws.receive(event(1));
  ws.receive({ type: "error", code: "unavailable", message: "store unavailable: failover", conversation_id: CID, last_seq: 1 });
  assert.equal(ws.last("subscribe").after_seq, 1);
  assert.notEqual(ws.last("subscribe").id, subscribe.id);
});
