// What every tests/js/*.test.mjs shares: the gateway under test, tokens, a recording WebSocket, waits.
//
// The tests run against a real `reactgate` gateway on loopback that tests/test_js.py starts (local or
// Ray backend, anonymous or with auth) and describes in the environment:
//   REACTGATE_URL          ws://127.0.0.1:PORT/ws                     (required)
//   REACTGATE_TOKEN        a valid JWT (1 h) when auth is on           (absent: anonymous)
//   REACTGATE_AUTH_SECRET  the HS256 secret, for tests that mint their own tokens (e.g. short-lived)
//   REACTGATE_BACKEND      "local" or "ray", for messages
// Run them through pytest (tests/test_js.py), not bare `node --test`.
import { createHmac } from "node:crypto";

import { ReactgateClient } from "../../gateway/static/reactgate.js";

export function gateway() {
  const url = process.env.REACTGATE_URL;
  if (!url) throw new Error("REACTGATE_URL is not set: run these tests through pytest tests/test_js.py");
  return {
    url,
    httpUrl: url.replace(/^ws/, "http").replace(/\/ws$/, ""),
    token: process.env.REACTGATE_TOKEN || null,
    secret: process.env.REACTGATE_AUTH_SECRET || null,
    backend: process.env.REACTGATE_BACKEND || "local",
  };
}

const b64url = (value) => Buffer.from(typeof value === "string" ? value : JSON.stringify(value)).toString("base64url");

/** An HS256 JWT for the owner of REACTGATE_TOKEN (same sub and tenant), living `expInS` seconds, with
 *  `claims` added (e.g. the MCP face's access claim), or another owner's (`sub`). */
export function mintToken({ expInS = 3600, claims = {}, sub = null } = {}) {
  const { token, secret } = gateway();
  if (!secret) throw new Error("mintToken needs REACTGATE_AUTH_SECRET (a gateway with auth on)");
  const owner = JSON.parse(Buffer.from(token.split(".")[1], "base64url").toString());
  const iat = Math.floor(Date.now() / 1000);
  const payload = { sub: sub ?? owner.sub, tenant: owner.tenant, iat, exp: iat + expInS, ...claims };
  const body = `${b64url({ alg: "HS256", typ: "JWT" })}.${b64url(payload)}`;
  return `${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`;
}

/** A WebSocket class that records its instances in `sockets`, each with the frames it `sent` and
 *  `received` (parsed), and hides from its listeners the received frames `drop(frame, socket)`
 *  selects (kept in `dropped`): a frame lost on the way, as far as the client can tell. */
export function recordingWebSocket(sockets, { drop = () => false, Base = globalThis.WebSocket } = {}) {
  return class RecordingWebSocket extends Base {
    constructor(...args) {
      super(...args);
      this.sent = [];
      this.received = [];
      this.dropped = [];
      sockets.push(this);
    }

    send(data) {
      this.sent.push(JSON.parse(data));
      super.send(data);
    }

    addEventListener(type, listener, options) {
      if (type !== "message") return super.addEventListener(type, listener, options);
      return super.addEventListener(type, (ev) => {
        const frame = JSON.parse(ev.data);
        this.received.push(frame);
        if (drop(frame, this)) this.dropped.push(frame);
        else listener(ev);
      }, options);
    }
  };
}

/** Resolves once `predicate()` is truthy (polled), or rejects after `ms` naming `what`. */
export async function until(predicate, what, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Watch a conversation: `events` fills up; `completed(turnId)` resolves with that turn's turn.completed. */
export function watch(client, conversationId, options = {}) {
  const events = [];
  const subscription = client.subscribe(conversationId, {
    ...options,
    onEvent: (event) => {
      events.push(event);
      options.onEvent?.(event);
    },
  });
  const completed = (turnId = "t1") => until(
    () => events.find((e) => e.event === "turn.completed" && e.data.turn_id === turnId),
    `turn.completed of ${turnId} in ${conversationId}`,
  );
  return { events, subscription, completed };
}

/** The answer as the user saw it stream: a turn's answer.delta texts, in order. */
export function answerOf(events, turnId = "t1") {
  return events.filter((e) => e.event === "answer.delta" && e.data.turn_id === turnId).map((e) => e.data.text).join("");
}

export const seqs = (events) => events.map((e) => e.seq);
export const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

/** The conversation's log as reactgate.js reads it, once turn `turnId` completed: what a frontend's
 *  assembled answer is checked against (the client is closed when test `t` ends). */
export async function logOf(t, conversationId, turnId = "t1") {
  const { url, token } = gateway();
  const client = new ReactgateClient({ url, token });
  t.after(() => client.close());
  const { events, completed } = watch(client, conversationId);
  const done = await completed(turnId);
  return { events, done };
}
