// reactgate web console: one conversation over /ws (subprotocol reactgate.v1), no dependencies.
//
// `Session` follows the rules of client/session.py, the reference implementation of the client side
// of the protocol (docs/wire-protocol.md#13-writing-a-client-checklist); keep the two in step:
// - the first `open` creates the conversation; after a reconnect it is re-opened (never with a mode:
//   the mode is sticky on the server); nothing but the open is sent before its ack;
// - on the open ack: subscribe after the last seq drawn, then send every pending command — again
//   with the same id after a reconnect (RESENT_AFTER_RECONNECT); an unacked cancel is never sent
//   again (a repeat could cancel the next turn) and the user is told it may not have arrived;
// - an event with seq <= the last drawn is dropped; a gap is never drawn and re-subscribes from the
//   last drawn seq, once per subscription in flight;
// - error frames: ERROR_REACTIONS, the same table as client/session.py.
// `Session` never touches the DOM beyond calling `View`. The conversation id lives in the URL hash,
// so a reload replays the conversation. The agent of a new conversation is the one picked in the
// header's select, filled from GET /agents (docs/wire-protocol.md#get-agents) and sent as `open`'s
// `agent`; picking another starts a new conversation with it (a conversation keeps its agent).
"use strict";

const SUBPROTOCOL = "reactgate.v1";
const RESENT_AFTER_RECONNECT = { user_message: true, steer: true, answer: true, set_mode: true, cancel: false };
const BACKOFF_BASE_MS = 200;
const BACKOFF_CAP_MS = 5000;
const RETRY_PAUSE_MS = 500; // a frame the server did not process (rate_limited) is sent again after this
// The gateway closes a connection at its token's `exp` (docs/wire-protocol.md#6-close-codes). The
// console's token is the page URL's ?token=: reconnecting would only be refused with it, so the
// session stops and the user signs in again (a new page URL with a fresh token).
const TOKEN_EXPIRED = 4001;

// (code, what the error answers) -> what the session does; columns: open, head, subscribe, command,
// stream (no id, our conversation). The console never checks the head; the column is kept so
// the table reads the same as client/session.py's ERROR_REACTIONS.
const FATAL = "fatal", RESUBSCRIBE = "resubscribe", RETRY = "retry", DROP = "drop", REPORT = "report";
const ERROR_TARGETS = ["open", "head", "subscribe", "command", "stream"];
const ERROR_REACTIONS = {
  bad_request:   [FATAL, FATAL, FATAL, DROP, REPORT],
  unauthorized:  [FATAL, FATAL, FATAL, DROP, FATAL],
  forbidden:     [FATAL, FATAL, FATAL, DROP, FATAL],
  not_found:     [FATAL, FATAL, FATAL, DROP, REPORT],
  rate_limited:  [RETRY, RETRY, RETRY, RETRY, REPORT],
  too_large:     [FATAL, FATAL, FATAL, DROP, REPORT],
  slow_consumer: [RESUBSCRIBE, RESUBSCRIBE, RESUBSCRIBE, RESUBSCRIBE, RESUBSCRIBE],
  overloaded:    [FATAL, FATAL, FATAL, DROP, REPORT],
  internal:      [FATAL, FATAL, RETRY, DROP, RESUBSCRIBE],
};

function reaction(code, target) {
  const row = ERROR_REACTIONS[code];
  return row ? row[ERROR_TARGETS.indexOf(target)] : REPORT;
}

function newId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes); // works on plain http too, unlike crypto.randomUUID
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function compact(value, limit = 160) {
  let text;
  try { text = JSON.stringify(value); } catch (e) { text = String(value); }
  if (text === undefined) text = "";
  return text.length <= limit ? text : text.slice(0, limit - 1) + "…";
}

function wsUrl() {
  const page = new URL(window.location.href);
  const url = new URL("/ws", page);
  url.protocol = page.protocol === "https:" ? "wss:" : "ws:";
  const token = page.searchParams.get("token");
  if (token) url.searchParams.set("token", token);
  return url.toString();
}

// GET /agents with the page's token, as the WebSocket gets it (the same auth): the agents served and
// the default; null when the gateway does not answer it (the select then stays empty: the default).
async function loadAgents() {
  const token = new URL(window.location.href).searchParams.get("token");
  try {
    const response = await fetch("/agents", { headers: token ? { Authorization: "Bearer " + token } : {} });
    return response.ok ? await response.json() : null;
  } catch (e) {
    return null;
  }
}

function conversationFromHash() {
  const match = /(?:^#|&)c=([^&]+)/.exec(window.location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

// localStorage may be disabled (privacy settings): the console then simply forgets across reloads.
function storageGet(key) {
  try { return localStorage.getItem(key); } catch (e) { return null; }
}

function storageSet(key, value) {
  try { localStorage.setItem(key, value); } catch (e) { /* see above */ }
}

// ---------------------------------------------------------------------------------------------
// Protocol state: frames in, callbacks out.

class Session {
  constructor(view, conversationId, onFatal, agent) {
    this.view = view;
    this.conversationId = conversationId;
    this.agent = conversationId === null ? agent || null : null; // a new conversation's agent (null: the default)
    this.reopening = conversationId !== null; // opened from the URL: it may not be ours
    this.onFatal = onFatal;
    this.lastSeq = 0;
    this.ready = false;
    this.opened = false;       // an open of this session was ever acked
    this.ws = null;
    this.attempt = 0;
    this.pending = new Map();  // id -> {type, fields, sent (on this connection), timesSent, waiting}
    this.openId = null;
    this.subscribeId = null;
    this.subscribeAcked = true; // no (re-)subscribe in flight
    this.turnActive = false;
    this.mode = storageGet(this.modeKey()) || "agent";
    this.closedByUs = false;
    this.ended = null;
  }

  modeKey() { return "reactgate.mode." + (this.conversationId || "new"); }

  connect() {
    if (this.ended) return;
    this.view.status("connecting…", "");
    let ws;
    try {
      ws = new WebSocket(wsUrl(), SUBPROTOCOL);
    } catch (err) {
      this.view.status("cannot connect: " + err.message, "down");
      return;
    }
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.openId = newId();
      this.raw(this.openFrame(this.openId));
    };
    ws.onmessage = (msg) => {
      let frame;
      try { frame = JSON.parse(msg.data); } catch (e) { return; }
      this.receive(frame);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.disconnected();
      if (this.closedByUs) return;
      if (ev.code === TOKEN_EXPIRED) return this.expired();
      const delay = Math.random() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** Math.min(this.attempt, 16));
      this.attempt += 1;
      // A drained gateway refuses reconnects until its replacement listens: say so, not "1006".
      const why = !opened ? "gateway unreachable"
        : ev.code && ev.code !== 1006 ? `closed ${ev.code}${ev.reason ? " " + ev.reason : ""}`
        : "connection lost";
      this.view.status(`${why} — reconnecting in ${(delay / 1000).toFixed(1)} s`, "down");
      setTimeout(() => this.connect(), delay);
    };
  }

  disconnected() {
    this.ws = null;
    this.ready = false;
    this.openId = this.subscribeId = null;
    this.subscribeAcked = true;
    for (const [id, p] of this.pending) {
      if (p.sent && !RESENT_AFTER_RECONNECT[p.type]) {
        this.pending.delete(id);
        this.view.note(`${p.type} may not have reached the server: send it again`);
      }
      p.sent = false;
    }
  }

  openFrame(id) {
    const frame = { type: "open", id };
    if (this.conversationId) frame.conversation_id = this.conversationId;
    else if (this.agent) frame.agent = this.agent;
    return frame;
  }

  raw(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(frame));
  }

  command(type, fields) {
    const id = newId();
    const p = { type, fields, sent: false, timesSent: 0, waiting: false };
    this.pending.set(id, p);
    if (this.ready) this.sendPending(id, p);
    return id;
  }

  sendPending(id, p) {
    p.sent = true;
    p.timesSent += 1;
    this.raw(Object.assign({ type: p.type, id, conversation_id: this.conversationId }, p.fields));
  }

  subscribe() {
    this.subscribeId = newId();
    this.subscribeAcked = false;
    this.raw({ type: "subscribe", id: this.subscribeId, conversation_id: this.conversationId, after_seq: this.lastSeq });
  }

  retry(id) {
    // Same id; a stale id (superseded frame, acked or dropped command) does nothing.
    const p = this.pending.get(id);
    if (p) {
      if (p.waiting) { p.waiting = false; if (this.ready) this.sendPending(id, p); }
      return;
    }
    if (id === this.openId && !this.ready) {
      this.raw(this.openFrame(id));
    } else if (id === this.subscribeId && this.ready) {
      this.raw({ type: "subscribe", id, conversation_id: this.conversationId, after_seq: this.lastSeq });
    }
  }

  receive(frame) {
    if (this.ended) return undefined;
    switch (frame.type) {
      case "ack": return this.onAck(frame);
      case "error": return this.onError(frame);
      case "event": return this.onEvent(frame);
      default: return undefined;
    }
  }

  onAck(ack) {
    if (ack.id === this.openId) return this.onOpened(ack);
    if (ack.id === this.subscribeId) { this.subscribeAcked = true; return; }
    const p = this.pending.get(ack.id);
    if (!p) return;
    this.pending.delete(ack.id);
    if (p.type === "set_mode") {
      this.mode = p.fields.mode;
      storageSet(this.modeKey(), this.mode);
      this.view.mode(this.mode);
    }
  }

  onOpened(ack) {
    if (!ack.conversation_id || (this.conversationId && ack.conversation_id !== this.conversationId)) {
      this.fatal("internal", `asked to open ${this.conversationId || "a new conversation"}, the server opened ${ack.conversation_id}`);
      return;
    }
    const created = !this.conversationId;
    this.conversationId = ack.conversation_id;
    if (created) {
      storageSet(this.modeKey(), this.mode);
      if (this.agent) storageSet("reactgate.agent." + this.conversationId, this.agent);
      history.replaceState(null, "", "#c=" + encodeURIComponent(this.conversationId));
    }
    this.ready = true;
    this.attempt = 0;
    this.view.conversation(this.conversationId);
    this.view.status(this.opened ? `connected — resumed after seq ${this.lastSeq}` : "connected", "up");
    this.opened = true;
    this.subscribe();
    for (const [id, p] of this.pending) if (!p.waiting) this.sendPending(id, p); // same ids: repeats are acked `duplicate`
  }

  target(err) {
    if (err.id) {
      if (err.id === this.openId) return "open";
      if (err.id === this.subscribeId) return "subscribe";
      if (this.pending.has(err.id)) return "command";
      return null; // a frame we no longer track
    }
    if (err.conversation_id && err.conversation_id === this.conversationId) return "stream";
    return null;
  }

  onError(err) {
    const target = this.target(err);
    if (target === null) {
      if (!err.conversation_id || err.conversation_id === this.conversationId) this.view.error(err.code, err.message);
      return;
    }
    switch (reaction(err.code, target)) {
      case FATAL: return this.fatal(err.code, err.message);
      case RESUBSCRIBE: if (this.ready) this.subscribe(); return; // from our last drawn seq: nothing lost
      case RETRY: {
        const p = this.pending.get(err.id);
        if (p) p.waiting = true;
        setTimeout(() => this.retry(err.id), RETRY_PAUSE_MS);
        return;
      }
      case DROP:
        this.pending.delete(err.id);
        this.view.error(err.code, err.message);
        return;
      default:
        this.view.error(err.code, err.message);
    }
  }

  onEvent(frame) {
    if (frame.conversation_id !== this.conversationId) return;
    if (frame.seq <= this.lastSeq) return; // replayed by a restarted subscription: already drawn
    if (frame.seq !== this.lastSeq + 1) {  // a gap: never draw out of order; restart the stream here
      if (this.ready && this.subscribeAcked) this.subscribe();
      return;
    }
    this.lastSeq = frame.seq;
    const d = frame.data || {};
    if (frame.event === "turn.started") this.turnActive = true;
    if (frame.event === "turn.completed") this.turnActive = false;
    this.view.event(frame.event, d);
    this.view.busy(this.turnActive);
  }

  expired() {
    // Like `fatal`, but the conversation is fine: a reload with a fresh token resumes it.
    this.ended = "token expired";
    this.closedByUs = true;
    this.ready = false;
    this.turnActive = false;
    this.view.busy(false);
    this.view.status("session expired — sign in again", "down");
  }

  fatal(code, message) {
    // No reconnect can fix it: this session is over (the wiring decides what comes next).
    this.ended = `${code}: ${message}`;
    this.close("session ended");
    this.onFatal(this, code, message);
  }

  close(reason) {
    this.closedByUs = true;
    if (this.ws) {
      const old = this.ws;
      this.ws = null;
      old.onclose = null;
      old.close(1000, reason);
    }
    this.ready = false;
    this.turnActive = false;
    this.view.busy(false);
  }
}

// ---------------------------------------------------------------------------------------------
// Drawing. Only textContent: event text is never parsed as HTML.

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

class View {
  constructor() {
    this.main = document.getElementById("transcript");
    this.session = null;
    this.reset();
  }

  reset() {
    this.main.replaceChildren(el("div", "empty", ""));
    this.main.firstChild.append("Ask something — e.g. ", el("em", "", "weather in Paris?"));
    this.turns = new Map();      // turn_id -> section
    this.current = null;         // the section events without a turn id go to
    this.thinking = new Map();   // turn:round -> div
    this.runningTurn = null;     // the turn now running: a steer joins it
    this.answers = new Map();    // turn_id -> div
    this.tools = new Map();      // call_id -> row
    this.asks = new Map();       // ask_id -> card
    document.getElementById("conversation").textContent = "—";
  }

  stickToBottom(fn) {
    const m = this.main;
    const atBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 40;
    fn();
    if (atBottom) m.scrollTop = m.scrollHeight;
  }

  conversation(id) {
    const code = document.getElementById("conversation");
    code.textContent = id;
    code.title = id;
  }

  status(text, cls) {
    document.getElementById("status").textContent = text;
    document.getElementById("status-dot").className = "dot " + (cls || "");
  }

  agents(list, wanted) {
    // The select offers the agents served; it shows `wanted` if served, else the default.
    const picker = document.getElementById("agent");
    if (!list || !list.agents) { picker.disabled = true; return; }
    picker.replaceChildren(...list.agents.map((a) => {
      const option = el("option", "", a.name);
      option.value = a.name;
      if (a.description) option.title = a.description;
      return option;
    }));
    const names = list.agents.map((a) => a.name);
    picker.value = names.includes(wanted) ? wanted : list.default;
  }

  mode(mode) {
    for (const b of document.querySelectorAll(".mode button")) {
      b.setAttribute("aria-pressed", String(b.dataset.mode === mode));
    }
  }

  busy(active) {
    document.getElementById("steer").disabled = !active;
    document.getElementById("cancel").disabled = !active;
  }

  section(turnId) {
    if (turnId && this.turns.has(turnId)) return this.turns.get(turnId);
    if (!turnId && this.current) return this.current;
    const empty = this.main.querySelector(".empty");
    if (empty) empty.remove();
    const sec = el("section", "turn");
    if (turnId) { sec.dataset.turn = turnId; this.turns.set(turnId, sec); }
    this.main.append(sec);
    this.current = sec;
    return sec;
  }

  localMessage(id, text) {
    this.stickToBottom(() => this.userBubble(id, text));
  }

  // The user's words, drawn once: when typed here, or from `user.message` (another tab, another
  // device, a reload). Its turn adopts the bubble at `turn.started`.
  userBubble(id, text, kind) {
    if (this.main.querySelector(`[data-message="${CSS.escape(id || "")}"]`)) return;
    if (kind === "steer" && this.runningTurn) {  // it joins the running turn, which then finalizes
      const line = el("div", "user steer", `${text} (steer)`);
      line.dataset.message = id;
      this.section(this.runningTurn).append(line);
      return;
    }
    const empty = this.main.querySelector(".empty");
    if (empty) empty.remove();
    const sec = el("section", "turn pending-turn");
    sec.dataset.message = id;
    sec.append(el("div", "user", kind === "steer" ? `${text} (steer)` : text));
    this.main.append(sec);
  }

  error(code, message) {
    this.stickToBottom(() => this.main.append(el("div", "error", `error ${code}: ${message}`)));
  }

  note(text) {
    this.stickToBottom(() => this.main.append(el("div", "meta", text)));
  }

  event(name, d) {
    this.stickToBottom(() => this.draw(name, d));
  }

  draw(name, d) {
    const turnId = d.turn_id;
    switch (name) {
      case "user.message": {
        this.userBubble(d.message_id, d.text, d.kind);
        return;
      }
      case "turn.started": {
        this.runningTurn = turnId;
        // Adopt the bubble we drew when sending, so the turn sits under its message.
        const mine = this.main.querySelector(`section.pending-turn[data-message="${CSS.escape(d.user_message_id || "")}"]`);
        let sec;
        if (mine) {
          mine.classList.remove("pending-turn");
          mine.dataset.turn = turnId;
          this.turns.set(turnId, mine);
          this.current = mine;
          this.main.append(mine); // follow-ups queued behind a running turn move to the end
          sec = mine;
        } else {  // a conversation recorded before user.message existed
          sec = this.section(turnId);
          sec.append(el("div", "user unknown", "(message not recorded)"));
        }
        return;
      }
      case "thinking.delta": {
        const key = turnId + ":" + d.round;
        let div = this.thinking.get(key);
        if (!div) { div = el("div", "thinking", ""); this.thinking.set(key, div); this.section(turnId).append(div); }
        div.textContent += d.text || "";
        return;
      }
      case "answer.delta": {
        this.answer(turnId).textContent += d.text || "";
        return;
      }
      case "tool.call": {
        const row = el("div", "tool");
        row.append(el("span", "arrow", "→"), el("span", "name", d.tool_id), el("span", "params mono", compact(d.params)));
        if (d.trait) row.append(el("span", "meta", d.trait));
        const badge = el("span", "badge wait", "running");
        row.append(badge);
        row.badge = badge;
        this.tools.set(d.call_id, row);
        this.section(turnId).append(row);
        return;
      }
      case "tool.result": {
        let row = this.tools.get(d.call_id);
        if (!row) {
          row = el("div", "tool");
          row.append(el("span", "arrow", "←"), el("span", "name", d.tool_id));
          row.badge = el("span", "badge", "");
          row.append(row.badge);
          this.section(turnId).append(row);
        }
        row.badge.className = "badge " + (d.ok ? "ok" : "error");
        const took = d.duration_ms !== undefined ? ` ${d.duration_ms} ms` : "";
        row.badge.textContent = (d.ok ? "ok" : "error") + took;
        row.append(el("span", "result mono", compact(d.ok ? d.result : d.error)));
        const ask = this.asks.get(d.call_id);
        if (ask) this.resolveAsk(ask, d.ok ? "answered: " + ((d.result || {}).answer ?? "") : "no answer: " + compact(d.error));
        return;
      }
      case "ask_user": return this.askUser(turnId, d);
      case "ui_command":
        this.section(turnId).append(el("div", "ui", `⇢ ui ${d.command} ${compact(d.args)}`));
        return;
      case "fallback":
        this.section(turnId).append(el("div", "fallback", `⇄ fallback ${d.from} → ${d.to} (${d.error})`));
        return;
      case "round.completed":
        for (const n of d.notices || []) {
          const tool = n.tool_id ? ` [${n.tool_id}]` : "";
          this.section(turnId).append(el("div", "notice", `${n.code}${tool}: ${n.message}`));
        }
        return;
      case "trace":
        if (d.kind === "approval") {
          this.section(turnId).append(el("div", "meta", `${d.tool_id}: ${d.decision.replace("_", " ")}`));
        } else if (d.kind !== "illegal_finish") {
          this.section(turnId).append(el("div", "meta", "trace " + d.kind));
        }
        return;
      case "turn.completed": {
        if (this.runningTurn === turnId) this.runningTurn = null;
        const answer = this.answers.get(turnId);
        const final = d.final_answer || "";
        if (final && (!answer || answer.textContent !== final)) {
          // An answer that never streamed (e.g. a plain error message) is shown once here.
          const div = this.answer(turnId);
          div.textContent = final;
        }
        const a = this.answers.get(turnId);
        if (a) a.classList.remove("streaming");
        let cls = d.reason === "complete" ? "ok" : (d.reason === "exit" || d.reason === "salvaged") ? "warn" : "bad";
        let label = d.reason;
        if (d.partial) {  // cut and not continued: shown as cut, not as a finished answer
          cls = "bad";
          label += " · answer cut short";
          if (a) a.classList.add("cut");
        }
        if (d.used_tools === false) label += " · no tools";
        this.section(turnId).append(el("div", "done " + cls, label));
        for (const card of this.asks.values()) if (!card.classList.contains("resolved")) this.resolveAsk(card, "closed");
        return;
      }
      default:
        this.section(turnId).append(el("div", "meta", name + " " + compact(d)));
    }
  }

  answer(turnId) {
    let div = this.answers.get(turnId);
    if (!div) {
      div = el("div", "answer streaming", "");
      this.answers.set(turnId, div);
      this.section(turnId).append(div);
    }
    return div;
  }

  askUser(turnId, d) {
    const approval = d.kind === "approval";  // a confirm tool waits for the user's yes (design.md#execute-confirmation)
    const card = el("div", approval ? "ask approval" : "ask");
    card.dataset.ask = d.ask_id;
    card.append(el("div", "question", d.question || "(question)"));
    if (approval) card.append(el("div", "params mono", `${d.tool_id} ${compact(d.params || {})}`));
    const send = (text) => {
      if (card.classList.contains("resolved") || !text) return;
      this.session.command("answer", { ask_id: d.ask_id, answer: text });
      this.resolveAsk(card, "answered: " + text);
    };
    if ((d.options || []).length) {
      const opts = el("div", "options");
      for (const option of d.options) {
        const b = el("button", "", option);
        b.type = "button";
        b.addEventListener("click", () => send(option));
        opts.append(b);
      }
      card.append(opts);
    }
    if (!approval) {  // an approval is a yes or a no: its three buttons
      const free = el("form", "free");
      const input = el("input");
      input.placeholder = "or type an answer";
      const ok = el("button", "", "Answer");
      ok.type = "submit";
      free.append(input, ok);
      free.addEventListener("submit", (ev) => { ev.preventDefault(); send(input.value.trim()); });
      card.append(free);
    }
    if (d.timeout_s) card.append(el("div", "meta", `waits up to ${d.timeout_s} s`));
    this.asks.set(d.ask_id, card);
    this.section(turnId).append(card);
  }

  resolveAsk(card, outcome) {
    if (card.classList.contains("resolved")) return;
    card.classList.add("resolved");
    for (const c of card.querySelectorAll("button, input")) c.disabled = true;
    card.append(el("div", "outcome", outcome));
  }
}

// ---------------------------------------------------------------------------------------------
// Wiring.

function main() {
  const view = new View();
  const picker = document.getElementById("agent");
  let session = null;

  const start = (conversationId) => {
    session = new Session(view, conversationId, onFatal, picker.value);
    view.session = session;
    view.mode(session.mode);
    session.connect();
  };
  function onFatal(ended, code, message) {
    if (ended.reopening) {
      // The conversation in the URL is not ours (or is gone): start a fresh one instead.
      history.replaceState(null, "", window.location.pathname + window.location.search);
      view.reset();
      view.error(code, message + " — starting a new conversation");
      start(null);
      return;
    }
    view.error(code, message);
    view.status(`stopped — ${code} (press New to start again)`, "down");
  }

  const input = document.getElementById("input");
  const take = () => { const t = input.value.trim(); if (t) input.value = ""; return t; };

  document.getElementById("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = take();
    if (!text) return;
    const id = session.command("user_message", { text });
    view.localMessage(id, text);
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      document.getElementById("composer").requestSubmit();
    }
  });
  document.getElementById("steer").addEventListener("click", () => {
    const text = take();
    if (!text) { input.focus(); input.placeholder = "Type the steer text first, then press Steer"; return; }
    const id = session.command("steer", { text });
    view.userBubble(id, text, "steer");
  });
  document.getElementById("cancel").addEventListener("click", () => session.command("cancel", {}));
  for (const b of document.querySelectorAll(".mode button")) {
    b.addEventListener("click", () => {
      const mode = b.dataset.mode;
      session.command("set_mode", { mode });
      view.mode(mode); // optimistic; the ack confirms it
    });
  }
  const startNew = () => {
    session.close("new conversation");
    history.replaceState(null, "", window.location.pathname + window.location.search);
    view.reset();
    start(null);
  };
  document.getElementById("new-conversation").addEventListener("click", startNew);
  picker.addEventListener("change", () => {  // a conversation keeps its agent: another one is a new conversation
    storageSet("reactgate.agent", picker.value);
    startNew();
  });
  window.addEventListener("hashchange", () => {
    const cid = conversationFromHash();
    if (cid && cid !== session.conversationId) window.location.reload();
  });

  window.reactgate = { get session() { return session; }, view }; // for tests and the curious
  const fromUrl = conversationFromHash();
  const agents = loadAgents().then((list) => {
    view.agents(list, storageGet(fromUrl ? "reactgate.agent." + fromUrl : "reactgate.agent"));
  });
  // A conversation in the URL is re-opened at once; a new one waits for the agents, to open with the pick.
  if (fromUrl) start(fromUrl); else agents.finally(() => start(null));
  input.focus();
}

main();
