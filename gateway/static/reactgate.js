// reactgate.js — a client of the `reactgate.v1` wire protocol (docs/wire-protocol.md).
//
// One ES module: no dependencies, no build step. It runs in browsers and in Node ≥ 20 (the global
// WebSocket: Node 22 has it, Node 20 with --experimental-websocket; or pass a `WebSocket`
// constructor). Types: reactgate.d.ts. The web console (console.js) is built on it.
//
//   const client = new ReactgateClient({ url: "ws://127.0.0.1:8765/ws", token: () => freshJwt() });
//   const { conversationId } = await client.open({ agent: "demo" });       // or keep one you have
//   client.subscribe(conversationId, { afterSeq: saved, onEvent: (e) => draw(e) });  // resume by seq
//   await client.send(conversationId, "What's the weather in Paris?");     // {id, status, resent}
//   // client.steer / answer(conversationId, askId, text) / setMode / cancel / list; client.close()
//
// WHAT IT GUARANTEES, per conversation (docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing)
//
//   Nothing lost, nothing twice. `onEvent` receives each seq exactly once, in order, from
//   `afterSeq + 1` on — across dropped connections, drains (close 1012), token expiry (close 4001),
//   slow-consumer pauses, and whatever replica the next connection reaches.
//   One command, one effect. A command keeps its frame id for its whole life: re-sent after a
//   reconnect with the same id, the server acks the repeat `duplicate` and does nothing. A `cancel`
//   is never re-sent (a repeat could cancel the *next* turn): its promise rejects with code "lost".
//   Nothing but `open` goes out for a conversation on a connection before that open's ack.
//
// It carries the rules of client/session.py (the Python client, whose unit tests pin them) and of
// client/connection.py (its reconnecting shell); keep them in step. What it adds: one connection
// for many conversations (at most 64 watched: docs/wire-protocol.md#11-limits-slow-consumers-drain),
// and promises for acks.
//
// THE RULES
//
//   When                              What the client does
//   ────────────────────────────────  ──────────────────────────────────────────────────────────────
//   any connection opens              re-open (`open {conversation_id}`) every conversation in use
//                                     (watched, or with commands pending); send `open {agent, mode}`
//                                     for each conversation being created (a fresh frame id: `open`
//                                     is not idempotent, so an ack lost with a connection may leave
//                                     an empty conversation behind); send pending `list`s
//   that re-open is acked             `subscribe {after_seq: last seq delivered}` if watched, then
//                                     every pending command, same ids, in the order issued
//   an event with seq ≤ last          dropped (a restarted subscription replays)
//   an event with seq = last + 1      delivered (`onEvent`); last = seq
//   an event with seq > last + 1      not delivered (a gap): re-subscribe after last, once per
//                                     subscribe in flight
//   `conversation.deleted`            delivered, then the conversation ends (`onEnd`)
//   an ack                            resolves the command's promise; the backoff starts over
//   an error frame                    ERROR_REACTIONS below; a frame the server did not process
//                                     (`rate_limited`, `unavailable`) goes again, same id, after
//                                     `retryPause`: `unavailable`'s retry_after_ms (the store is down)
//
//   Close code                        What the client does
//   ────────────────────────────────  ──────────────────────────────────────────────────────────────
//   ours (`close()`)                  nothing more: pending promises reject with code "closed"
//   4001 token expired                `token` is a function: reconnect, asking it for a fresh token;
//                                     a fixed token would only be refused (HTTP 401): the client
//                                     ends (code "token_expired", status `ended`)
//   1012 draining, any other, none    reconnect after `backoffDelay` (exponential, full jitter:
//                                     uniform(0, min(5 s, 0.2 s·2ⁿ)), n reset by the next ack), then
//                                     resume as above. A refused handshake (HTTP 401/403/503) looks
//                                     the same to a WebSocket API, so it is retried the same way,
//                                     until `close()` (watch `onStatus` to give up).
//
// The token (a string, or a function returning one, or a promise of one, asked before every
// connection attempt) travels as `?token=` in the URL: browsers cannot set a WebSocket's headers.

export const SUBPROTOCOL = "reactgate.v1";
export const CLOSE_TOKEN_EXPIRED = 4001;
export const RETRY_PAUSE_MS = 500;   // a frame the server did not process (rate_limited) goes again after this
export const UNAVAILABLE_PAUSE_CAP_MS = 30_000;  // the longest pause after `unavailable`, whatever it asks
export const BACKOFF = Object.freeze({ baseMs: 200, capMs: 5000 });

// Which commands go out again, with the same id, on the next connection when no ack came back.
export const RESENT_AFTER_RECONNECT = Object.freeze({
  user_message: true,  // idempotent by (conversation_id, id): a repeat is acked `duplicate`
  steer: true,         // same key space
  answer: true,        // same key space
  set_mode: true,      // not deduplicated, but a value, not a toggle: a repeat changes nothing
  cancel: false,       // neither: a repeat could cancel the next turn (its promise rejects "lost")
  list: true,          // changes nothing
});

// (error code, what the error answers) → what the client does (docs/wire-protocol.md#5-error-codes).
// What it answers: `open` (a conversation's open on this connection, or one being created),
// `subscribe` (its current subscribe), `command` (a pending command or list), `stream` (no frame id,
// a conversation we hold: the server paused or ended its stream). client/session.py has one more
// column, `head` (its head check), that this client has no use for.
export const FATAL = "fatal";              // the conversation ends (`onEnd`); a creation's promise rejects
export const RESUBSCRIBE = "resubscribe";  // subscribe again after the last delivered seq: nothing is lost
export const RETRY = "retry";              // not processed: send it again, same id, after `retryPause`
export const DROP = "drop";                // the command will never be acted on: its promise rejects
export const REPORT = "report";            // tell the app (`onError`); nothing to do
export const ERROR_TARGETS = Object.freeze(["open", "subscribe", "command", "stream"]);
const F = FATAL, S = RESUBSCRIBE, R = RETRY, D = DROP, P = REPORT;
export const ERROR_REACTIONS = Object.freeze({
  //               open subscribe command stream
  bad_request:    [F,   F,        D,      P],
  unauthorized:   [F,   F,        D,      F],
  forbidden:      [F,   F,        D,      F],  // stream: ended, not ours
  not_found:      [F,   F,        D,      P],
  rate_limited:   [R,   R,        R,      P],
  too_large:      [F,   F,        D,      P],
  slow_consumer:  [S,   S,        S,      S],  // always the stream: paused
  overloaded:     [F,   F,        D,      P],
  internal:       [F,   R,        D,      S],  // stream: ended after the server's retries
  quota_exceeded: [F,   F,        D,      P],  // the frame carries `quota`, `scope`, `resets_at`
  unavailable:    [R,   R,        R,      S],  // the store is down: again after `retry_after_ms`
});

export function reaction(code, target) {
  const row = ERROR_REACTIONS[code];
  return row ? row[ERROR_TARGETS.indexOf(target)] : REPORT;  // a code this client does not know
}

/** How long to wait before sending again the frame an error refused (docs/wire-protocol.md#5-error-codes):
 *  for `unavailable`, its `retry_after_ms`, or without one max(pauseMs, 1)·2^streak (`streak`: the
 *  `unavailable` errors since the last ack), both at most UNAVAILABLE_PAUSE_CAP_MS; else `pauseMs`.
 *  As client/session.py's `retry_pause`. */
export function retryPause(err, streak = 0, pauseMs = RETRY_PAUSE_MS) {
  if (err.code !== "unavailable") return pauseMs;
  if (typeof err.retry_after_ms === "number") return Math.min(UNAVAILABLE_PAUSE_CAP_MS, Math.max(0, err.retry_after_ms));
  return Math.min(UNAVAILABLE_PAUSE_CAP_MS, Math.max(pauseMs, 1) * 2 ** Math.min(streak, 16));
}

/** Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base·2ⁿ)) ms. */
export function backoffDelay(attempt, { baseMs = BACKOFF.baseMs, capMs = BACKOFF.capMs, random = Math.random } = {}) {
  return random() * Math.min(capMs, baseMs * 2 ** Math.min(attempt, 32));
}

/** A fresh frame id: 128 random bits (crypto.getRandomValues works on plain http, unlike randomUUID). */
export function newId() {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** An error frame, or a failure of the client's own: `code` is the server's error code, or one of
 *  "lost", "closed", "token_expired", "deleted", "protocol". `frame`: the error frame, if any. */
export class ReactgateError extends Error {
  constructor(code, message, frame = undefined) {
    super(message);
    this.name = "ReactgateError";
    this.code = code;
    this.frame = frame;
  }
}

function wsUrl(url, token) {
  const u = new URL(url, globalThis.location?.href);
  if (u.protocol === "http:") u.protocol = "ws:";
  else if (u.protocol === "https:") u.protocol = "wss:";
  if (token) u.searchParams.set("token", token);
  return u.toString();
}

// An app callback runs outside the protocol's state changes: if it throws, the error surfaces
// (uncaught, in the next microtask) and the client goes on.
function call(fn, ...args) {
  if (!fn) return;
  try {
    fn(...args);
  } catch (err) {
    queueMicrotask(() => { throw err; });
  }
}

// A conversation this client holds: its last delivered seq, its state on the current connection,
// and its commands not yet acked.
class Conversation {
  constructor(id) {
    this.id = id;
    this.lastSeq = 0;           // events ≤ this were delivered; a resume starts after it
    this.ready = false;         // its `open` was acked on this connection
    this.openId = null;         // our `open` of it in flight on this connection
    this.headId = null;         // a head check in flight: an `open` of it once it is open here
    this.subscribeId = null;    // our current `subscribe`
    this.subscribeAcked = true; // no (re-)subscribe in flight
    this.sub = null;            // the Subscription delivering its events, if watched
    this.pending = new Map();   // frame id → command not yet acked, in the order issued
    this.openWaiters = [];      // open({conversationId}) promises
    this.duplicates = 0;        // events dropped because their seq was already delivered
  }

  inUse() {
    return this.sub !== null || this.pending.size > 0 || this.openWaiters.length > 0;
  }
}

/** One conversation watched by one client: `onEvent` gets each of its seqs once, in order. */
export class Subscription {
  constructor(client, conv, handlers) {
    this.conversationId = conv.id;
    this._client = client;
    this._conv = conv;
    this._handlers = handlers;
    this._acks = 0;
    this._active = true;
  }

  /** The seq of the last event delivered: keep it to resume later (`subscribe(id, {afterSeq})`). */
  get lastSeq() { return this._conv.lastSeq; }

  /** Events dropped because their seq had already been delivered (replays of restarted subscriptions). */
  get duplicatesDropped() { return this._conv.duplicates; }

  get active() { return this._active; }

  /** Stop watching: no event follows. */
  unsubscribe() { this._client._unsubscribe(this); }

  _subscribed(ack, afterSeq) {
    call(this._handlers.onSubscribed, { afterSeq, head: ack.last_seq ?? 0, resumed: this._acks++ > 0 });
  }

  _event(frame) { call(this._handlers.onEvent, frame); }

  _error(error) { call(this._handlers.onError, error); }

  _end(error) {
    if (!this._active) return;
    this._active = false;
    call(this._handlers.onEnd, error);
  }
}

export class ReactgateClient {
  /**
   * @param {object} options
   * @param {string} options.url  ws(s)://host:port/ws (in a browser, a path like "/ws" works too)
   * @param {string|null|(() => string|null|Promise<string|null>)} [options.token]
   * @param {typeof WebSocket} [options.WebSocket]  default: the global one
   * @param {(status: object) => void} [options.onStatus]
   * @param {(error: ReactgateError) => void} [options.onError]  errors about nothing this client tracks
   * @param {{baseMs?: number, capMs?: number, random?: () => number}} [options.backoff]
   * @param {number} [options.retryPauseMs]
   */
  constructor({ url, token = null, WebSocket: WS = globalThis.WebSocket, onStatus = null, onError = null,
                backoff = {}, retryPauseMs = RETRY_PAUSE_MS } = {}) {
    if (!url) throw new TypeError("ReactgateClient: `url` is required (ws://host:port/ws)");
    if (typeof WS !== "function") {
      throw new TypeError("ReactgateClient: no WebSocket here: pass {WebSocket} (Node 20: run with --experimental-websocket)");
    }
    this.url = url;
    this._token = token;
    this._WebSocket = WS;
    this._onStatus = onStatus;
    this._onError = onError;
    this._backoff = { ...BACKOFF, ...backoff };
    this._retryPauseMs = retryPauseMs;
    this._convs = new Map();      // conversation id → Conversation
    this._creating = new Set();   // conversations being created: {frameId, agent, mode, waiting, resolve, reject}
    this._lists = new Map();      // frame id → pending `list`
    this._ws = null;
    this._connecting = false;
    this._reconnectTimer = null;
    this._attempt = 0;
    this._unavailable = 0;        // `unavailable` errors since the last ack: `retryPause`'s streak
    this._timers = new Set();
    this._ended = null;           // why the client is over, or null
  }

  /** Why the client is over ("closed", "token expired", …), or null while it works. */
  get ended() { return this._ended?.message ?? null; }

  /** A WebSocket is open now. */
  get connected() { return this._isOpen(); }

  /** The last seq delivered for a conversation (0: none). */
  lastSeq(conversationId) { return this._convs.get(conversationId)?.lastSeq ?? 0; }

  // -- conversations ---------------------------------------------------------------------------

  /** Create a conversation (`agent`: the server's default when omitted; `mode` applied once), or with
   *  `conversationId` re-open one of yours (one open here already is asked again: a head check).
   *  Resolves with its id and its last seq (its head). */
  open({ agent, mode, conversationId } = {}) {
    if (this._ended) return Promise.reject(this._ended);
    if (conversationId) {
      return new Promise((resolve, reject) => {
        const conv = this._conv(conversationId);
        conv.openWaiters.push({ resolve, reject });
        if (!conv.ready) this._activate(conv);   // the open ack answers
        else if (conv.headId === null) {          // open already: ask again, for its head now
          conv.headId = newId();
          this._send({ type: "open", id: conv.headId, conversation_id: conv.id });
        }
      });
    }
    return new Promise((resolve, reject) => {
      const creation = { frameId: null, agent, mode, waiting: false, resolve, reject };
      this._creating.add(creation);
      if (this._isOpen()) this._sendCreation(creation);
      else this._ensureConnected();
    });
  }

  /** Watch a conversation: every event after `afterSeq` (default 0: from the start), then live ones,
   *  each once, in order, to `onEvent`. One subscription per conversation per client. */
  subscribe(conversationId, { afterSeq, onEvent, onSubscribed, onError, onEnd } = {}) {
    if (this._ended) throw this._ended;
    const conv = this._conv(conversationId);
    if (conv.sub) throw new Error(`already subscribed to ${conversationId} on this client: unsubscribe first`);
    if (afterSeq !== undefined) conv.lastSeq = afterSeq;
    conv.sub = new Subscription(this, conv, { onEvent, onSubscribed, onError, onEnd });
    if (conv.ready) this._sendSubscribe(conv);
    else this._activate(conv);
    return conv.sub;
  }

  // -- commands: each resolves on its ack with {id, status: "accepted"|"duplicate", resent} -----
  // `id`: the frame id, also the idempotency key (default: a fresh one). Reuse it to retry the
  // same user action later (e.g. after a page reload): the server acks the repeat `duplicate`.

  send(conversationId, text, { id } = {}) { return this._command(conversationId, "user_message", { text }, id); }

  steer(conversationId, text, { id } = {}) { return this._command(conversationId, "steer", { text }, id); }

  answer(conversationId, askId, answer, { id } = {}) {
    return this._command(conversationId, "answer", { ask_id: askId, answer }, id);
  }

  setMode(conversationId, mode, { id } = {}) { return this._command(conversationId, "set_mode", { mode }, id); }

  cancel(conversationId, { id } = {}) { return this._command(conversationId, "cancel", {}, id); }

  /** A page of your conversations, newest activity first: {conversations, nextBefore} (the entries as
   *  on the wire, docs/wire-protocol.md#conversations). Pass `nextBefore` as `before` for the next page. */
  list({ limit = 20, before } = {}) {
    if (this._ended) return Promise.reject(this._ended);
    return new Promise((resolve, reject) => {
      const frame = { type: "list", id: newId(), limit };
      if (before) frame.before = before;
      const pending = { id: frame.id, type: "list", frame, waiting: false, resolve, reject };
      this._lists.set(frame.id, pending);
      if (this._isOpen()) this._send(frame);
      else this._ensureConnected();
    });
  }

  /** Close the connection (1000) and stop: pending promises reject with code "closed". */
  close(reason = "client closed") {
    if (this._ended) return;
    this._end(new ReactgateError("closed", reason), { notify: false });
  }

  // -- the connection ----------------------------------------------------------------------------

  _isOpen() { return this._ws !== null && this._ws.readyState === 1; }

  _ensureConnected() {
    if (this._ended || this._ws || this._connecting || this._reconnectTimer !== null) return;
    this._connect();
  }

  async _connect() {
    this._connecting = true;
    this._status({ state: "connecting", attempt: this._attempt });
    let token = this._token;
    if (typeof token === "function") {
      try {
        token = await token();
      } catch (err) {
        this._connecting = false;
        this._reconnect(`cannot get a token: ${err?.message ?? err}`, {});
        return;
      }
    }
    this._connecting = false;
    if (this._ended) return;
    let ws;
    try {
      ws = new this._WebSocket(wsUrl(this.url, token), SUBPROTOCOL);
    } catch (err) {  // a malformed URL: no retry can fix it
      this._end(new ReactgateError("fatal", `cannot connect to ${this.url}: ${err?.message ?? err}`));
      return;
    }
    this._ws = ws;
    let opened = false;
    ws.addEventListener("open", () => {
      if (this._ws !== ws) return;
      opened = true;
      this._status({ state: "connected" });
      this._connected();
    });
    ws.addEventListener("message", (msg) => {
      if (this._ws === ws) this._receive(msg.data);
    });
    ws.addEventListener("close", (ev) => {
      if (this._ws !== ws) return;
      this._ws = null;
      this._disconnected();
      this._closed(ev, opened);
    });
    ws.addEventListener("error", () => {});  // a close event follows
  }

  _connected() {
    for (const conv of this._convs.values()) if (conv.inUse() && conv.openId === null) this._sendOpen(conv);
    for (const creation of this._creating) if (!creation.waiting) this._sendCreation(creation);
    for (const pending of this._lists.values()) if (!pending.waiting) this._send(pending.frame);
  }

  _disconnected() {
    for (const conv of this._convs.values()) {
      conv.ready = false;
      conv.openId = conv.subscribeId = conv.headId = null;  // an unanswered head check: the next open ack answers
      conv.subscribeAcked = true;
      for (const p of [...conv.pending.values()]) {
        if (p.onThisConnection && !RESENT_AFTER_RECONNECT[p.type]) {
          conv.pending.delete(p.id);
          p.reject(new ReactgateError("lost", `${p.type} may not have reached the server (the connection dropped before its ack)`));
        }
        p.onThisConnection = false;
      }
    }
    for (const creation of this._creating) creation.frameId = null;
  }

  _closed(ev, opened) {
    if (this._ended) return;
    if (ev.code === CLOSE_TOKEN_EXPIRED && typeof this._token !== "function") {
      this._end(new ReactgateError("token_expired", "token expired"), { closeCode: ev.code });
      return;
    }
    // A drained gateway refuses reconnects until its replacement listens: say so, not "1006".
    const reason = !opened ? "gateway unreachable"
      : ev.code && ev.code !== 1006 ? `closed ${ev.code}${ev.reason ? " " + ev.reason : ""}`
      : "connection lost";
    this._reconnect(reason, { closeCode: ev.code, closeReason: ev.reason });
  }

  _reconnect(reason, { closeCode, closeReason }) {
    const delay = backoffDelay(this._attempt, this._backoff);
    this._attempt += 1;
    this._status({ state: "down", reason, closeCode, closeReason, retryInMs: delay });
    this._reconnectTimer = this._later(delay, () => {
      this._reconnectTimer = null;
      this._connect();
    });
  }

  _end(error, { closeCode, notify = true } = {}) {
    this._ended = error;
    for (const timer of this._timers) clearTimeout(timer);
    this._timers.clear();
    this._reconnectTimer = null;
    const ws = this._ws;
    this._ws = null;
    if (ws) ws.close(1000, error.code === "closed" ? error.message.slice(0, 120) : undefined);
    const convs = [...this._convs.values()];
    this._convs.clear();
    for (const conv of convs) this._fail(conv, error, notify);
    for (const creation of this._creating) creation.reject(error);
    this._creating.clear();
    for (const pending of this._lists.values()) pending.reject(error);
    this._lists.clear();
    this._status({ state: "ended", reason: error.message, code: error.code, closeCode });
  }

  _status(status) { call(this._onStatus, status); }

  _later(ms, fn) {
    const timer = setTimeout(() => {
      this._timers.delete(timer);
      fn();
    }, ms);
    this._timers.add(timer);
    return timer;
  }

  _send(frame) {
    if (this._isOpen()) this._ws.send(JSON.stringify(frame));
  }

  // -- sending -----------------------------------------------------------------------------------

  _conv(id) {
    let conv = this._convs.get(id);
    if (!conv) {
      conv = new Conversation(id);
      this._convs.set(id, conv);
    }
    return conv;
  }

  // A conversation needs this connection: open it here, unless that is under way.
  _activate(conv) {
    if (!this._isOpen()) this._ensureConnected();
    else if (!conv.ready && conv.openId === null) this._sendOpen(conv);
  }

  _sendOpen(conv) {
    conv.openId = newId();
    this._send({ type: "open", id: conv.openId, conversation_id: conv.id });  // never a mode: sticky server-side
  }

  _sendCreation(creation) {
    creation.frameId ??= newId();
    const frame = { type: "open", id: creation.frameId };
    if (creation.agent) frame.agent = creation.agent;
    if (creation.mode) frame.mode = creation.mode;
    this._send(frame);
  }

  _sendSubscribe(conv) {
    conv.subscribeId = newId();
    conv.subscribeAcked = false;
    this._send({ type: "subscribe", id: conv.subscribeId, conversation_id: conv.id, after_seq: conv.lastSeq });
  }

  _command(conversationId, type, fields, id = newId()) {
    if (this._ended) return Promise.reject(this._ended);
    const conv = this._conv(conversationId);
    const already = conv.pending.get(id);
    if (already) return already.promise;  // the same command, still pending
    const p = { id, type, fields, timesSent: 0, onThisConnection: false, waiting: false };
    p.promise = new Promise((resolve, reject) => { p.resolve = resolve; p.reject = reject; });
    conv.pending.set(id, p);
    if (conv.ready) this._sendPending(conv, p);
    else this._activate(conv);
    return p.promise;
  }

  _sendPending(conv, p) {
    p.timesSent += 1;
    p.onThisConnection = true;
    this._send({ type: p.type, id: p.id, conversation_id: conv.id, ...p.fields });
  }

  _unsubscribe(sub) {
    const conv = sub._conv;
    sub._active = false;
    if (conv.sub !== sub) return;
    conv.sub = null;
    conv.subscribeId = null;
    conv.subscribeAcked = true;
    if (conv.ready) this._send({ type: "unsubscribe", id: newId(), conversation_id: conv.id });
  }

  // -- receiving ---------------------------------------------------------------------------------

  _receive(data) {
    let frame;
    try {
      frame = JSON.parse(typeof data === "string" ? data : "");
    } catch (err) {
      this._report(new ReactgateError("protocol", "a server frame that is not JSON text: skipped"));
      return;
    }
    switch (frame.type) {
      case "event": return this._onEvent(frame);
      case "ack": this._attempt = this._unavailable = 0; return this._onAck(frame);
      case "error": return this._onErrorFrame(frame);
      case "conversations": this._attempt = this._unavailable = 0; return this._onConversations(frame);
      default: return undefined;  // pong, export.completed: nothing this client asked for
    }
  }

  _onEvent(frame) {
    const conv = this._convs.get(frame.conversation_id);
    if (!conv || !conv.sub) return;  // not watched (the tail of a stream we unsubscribed)
    if (frame.event === "conversation.deleted") {  // the last event there is, whatever its seq
      conv.lastSeq = Math.max(conv.lastSeq, frame.seq);
      conv.sub._event(frame);
      this._drop(conv, new ReactgateError("deleted", "the conversation was deleted"));
      return;
    }
    if (frame.seq <= conv.lastSeq) {  // replayed by a restarted subscription: already delivered
      conv.duplicates += 1;
      return;
    }
    if (frame.seq !== conv.lastSeq + 1) {  // a gap: never deliver out of order; restart the stream here
      if (conv.ready && conv.subscribeAcked) this._sendSubscribe(conv);
      return;
    }
    conv.lastSeq = frame.seq;
    conv.sub._event(frame);
  }

  _onAck(ack) {
    for (const creation of this._creating) {
      if (creation.frameId === ack.id) return this._onCreated(creation, ack);
    }
    const conv = this._convs.get(ack.conversation_id);
    if (!conv) return undefined;
    if (ack.id === conv.openId) {
      conv.openId = null;
      conv.ready = true;
      this._resolveOpen(conv, ack.last_seq ?? 0);
      if (conv.sub) this._sendSubscribe(conv);
      for (const p of conv.pending.values()) if (!p.waiting) this._sendPending(conv, p);  // same ids: repeats are `duplicate`
    } else if (ack.id === conv.headId) {
      conv.headId = null;
      this._resolveOpen(conv, ack.last_seq ?? 0);
    } else if (ack.id === conv.subscribeId) {
      conv.subscribeAcked = true;
      conv.sub?._subscribed(ack, ack.after_seq ?? conv.lastSeq);
    } else {
      const p = conv.pending.get(ack.id);
      if (p) {
        conv.pending.delete(ack.id);
        p.resolve({ id: p.id, status: ack.status, resent: p.timesSent > 1 });
      }
    }
    return undefined;
  }

  _onCreated(creation, ack) {
    this._creating.delete(creation);
    if (!ack.conversation_id) {
      creation.reject(new ReactgateError("protocol", "the server acked open without a conversation id"));
      return;
    }
    const conv = this._conv(ack.conversation_id);
    conv.ready = true;  // opened on this connection: subscribe and commands go out at once
    creation.resolve({ conversationId: conv.id, lastSeq: ack.last_seq ?? 0 });
  }

  _resolveOpen(conv, head) {
    for (const waiter of conv.openWaiters.splice(0)) waiter.resolve({ conversationId: conv.id, lastSeq: head });
  }

  _onConversations(frame) {
    const pending = this._lists.get(frame.id);
    if (!pending) return;
    this._lists.delete(frame.id);
    pending.resolve({ conversations: frame.conversations, nextBefore: frame.next_before ?? null });
  }

  // What an error frame answers: {target, conv?, creation?, pending?, lists?}, or null (nothing we track).
  _target(err) {
    if (err.id !== undefined) {
      for (const creation of this._creating) if (creation.frameId === err.id) return { target: "open", creation };
      const list = this._lists.get(err.id);
      if (list) return { target: "command", pending: list, lists: true };
      const named = this._convs.get(err.conversation_id);
      for (const conv of named ? [named] : this._convs.values()) {
        if (err.id === conv.openId || err.id === conv.headId) return { target: "open", conv };
        if (err.id === conv.subscribeId) return { target: "subscribe", conv };
        const pending = conv.pending.get(err.id);
        if (pending) return { target: "command", conv, pending };
      }
      return null;  // a frame we no longer track (superseded, acked, dropped)
    }
    const conv = this._convs.get(err.conversation_id);
    return conv ? { target: "stream", conv } : null;
  }

  _onErrorFrame(err) {
    const error = new ReactgateError(err.code, err.message, err);
    const t = this._target(err);
    if (t === null) {
      const conv = this._convs.get(err.conversation_id);
      if (conv?.sub) conv.sub._error(error);
      else this._report(error);
      return;
    }
    switch (reaction(err.code, t.target)) {
      case FATAL:
        if (t.creation) {
          this._creating.delete(t.creation);
          t.creation.reject(error);
        } else {
          this._drop(t.conv, error);
        }
        return;
      case RESUBSCRIBE:  // from our own last delivered seq, not the error's: nothing is lost
        if (t.conv.ready && t.conv.sub) this._sendSubscribe(t.conv);
        return;
      case RETRY: {
        const pause = retryPause(err, this._unavailable, this._retryPauseMs);
        if (err.code === "unavailable") this._unavailable += 1;
        this._retryLater(t, err.id, pause);
        return;
      }
      case DROP:
        if (t.lists) this._lists.delete(t.pending.id);
        else t.conv.pending.delete(t.pending.id);
        t.pending.reject(error);
        return;
      default:
        if (t.conv?.sub) t.conv.sub._error(error);
        else this._report(error);
    }
  }

  _report(error) {
    if (this._onError) call(this._onError, error);
  }

  // Send again, with the same id, a frame the server did not process; a stale one does nothing.
  _retryLater(t, frameId, pauseMs) {
    const item = t.creation ?? t.pending;
    if (item) item.waiting = true;  // not re-sent by a reconnect meanwhile: the timer sends it
    this._later(pauseMs, () => {
      if (t.creation) {
        if (!this._creating.has(t.creation)) return;
        t.creation.waiting = false;
        if (this._isOpen()) this._sendCreation(t.creation);
      } else if (t.lists) {
        if (!this._lists.has(frameId)) return;
        t.pending.waiting = false;
        this._send(t.pending.frame);
      } else if (t.pending) {
        if (t.conv.pending.get(frameId) !== t.pending) return;
        t.pending.waiting = false;
        if (t.conv.ready) this._sendPending(t.conv, t.pending);  // else it goes out with the next open ack
      } else if (t.target === "open" && ((t.conv.openId === frameId && !t.conv.ready)
                                         || (t.conv.headId === frameId && t.conv.ready))) {
        this._send({ type: "open", id: frameId, conversation_id: t.conv.id });
      } else if (t.target === "subscribe" && t.conv.subscribeId === frameId && t.conv.ready) {
        this._send({ type: "subscribe", id: frameId, conversation_id: t.conv.id, after_seq: t.conv.lastSeq });
      }
    });
  }

  // The conversation is over for this client (fatal error, deleted): its commands reject, `onEnd`.
  _drop(conv, error) {
    this._convs.delete(conv.id);
    this._fail(conv, error, true);
  }

  _fail(conv, error, notify) {
    for (const p of conv.pending.values()) p.reject(error);
    conv.pending.clear();
    for (const waiter of conv.openWaiters.splice(0)) waiter.reject(error);
    const sub = conv.sub;
    conv.sub = null;
    if (sub) {
      if (notify) sub._end(error);
      else sub._active = false;
    }
  }
}
