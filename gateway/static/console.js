// reactgate web console: one conversation over /ws (subprotocol reactgate.v1), no dependencies.
//
// The protocol is reactgate.js's (the client of this repository's browsers and Node programs, with
// the rules of client/session.py): frame ids, pending commands re-sent after a reconnect with their
// ids, each seq drawn once and in order, resume after the last seq drawn, reconnect with backoff,
// the error reactions. This file only draws: `Session` adapts one ReactgateClient to the page and
// `View` touches the DOM.
// - The conversation id lives in the URL hash, so a reload replays the conversation from seq 1.
// - The agent of a new conversation is the one picked in the header's select, filled from
//   GET /agents (docs/wire-protocol.md#get-agents) and sent as `open`'s `agent`; picking another
//   starts a new conversation with it (a conversation keeps its agent).
// - The token is the page URL's ?token=, a fixed string: at its `exp` (close 4001) the client ends
//   instead of reconnecting with it (it would be refused), and the page says to sign in again.
import { ReactgateClient, newId } from "./reactgate.js";

function compact(value, limit = 160) {
  let text;
  try { text = JSON.stringify(value); } catch (e) { text = String(value); }
  if (text === undefined) text = "";
  return text.length <= limit ? text : text.slice(0, limit - 1) + "…";
}

function pageToken() {
  return new URL(window.location.href).searchParams.get("token");
}

// GET /agents with the page's token, as the WebSocket gets it (the same auth): the agents served and
// the default; null when the gateway does not answer it (the select then stays empty: the default).
async function loadAgents() {
  const token = pageToken();
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
// One conversation of the page on one ReactgateClient: client callbacks in, View calls out.

class Session {
  constructor(view, conversationId, onFatal, agent) {
    this.view = view;
    this.conversationId = conversationId;
    this.agent = conversationId === null ? agent || null : null; // a new conversation's agent (null: the default)
    this.reopening = conversationId !== null; // opened from the URL: it may not be ours
    this.onFatal = onFatal;
    this.ready = false;        // subscribed on the current connection
    this.pending = new Map();  // id -> type: commands sent and not answered yet
    this.turnActive = false;
    this.mode = storageGet(this.modeKey()) || "agent";
    this.ended = null;
    this.client = null;
    this.conversation = null;  // Promise of the conversation id
  }

  modeKey() { return "reactgate.mode." + (this.conversationId || "new"); }

  connect() {
    this.client = new ReactgateClient({
      url: "/ws",
      token: pageToken(),
      onStatus: (status) => this.onStatus(status),
      onError: (err) => this.view.error(err.code, err.message),
    });
    this.conversation = this.conversationId !== null
      ? Promise.resolve(this.conversationId)
      : this.client.open({ agent: this.agent || undefined }).then(({ conversationId }) => this.created(conversationId));
    this.conversation.then((cid) => this.watch(cid), (err) => this.fail(err));
  }

  created(conversationId) {
    this.conversationId = conversationId;
    storageSet(this.modeKey(), this.mode);
    if (this.agent) storageSet("reactgate.agent." + conversationId, this.agent);
    history.replaceState(null, "", "#c=" + encodeURIComponent(conversationId));
    return conversationId;
  }

  watch(conversationId) {
    if (this.ended) return;
    this.view.conversation(conversationId);
    this.client.subscribe(conversationId, {
      afterSeq: 0, // the page draws the conversation from its start
      onEvent: (frame) => this.onEvent(frame),
      onSubscribed: ({ afterSeq, resumed }) => {
        this.ready = true;
        this.view.status(resumed ? `connected — resumed after seq ${afterSeq}` : "connected", "up");
      },
      onError: (err) => this.view.error(err.code, err.message),
      onEnd: (err) => this.fail(err),
    });
  }

  onStatus(status) {
    if (this.ended) return;
    switch (status.state) {
      case "connecting":
        this.view.status("connecting…", "");
        return;
      case "down":
        this.ready = false;
        this.view.status(`${status.reason} — reconnecting in ${(status.retryInMs / 1000).toFixed(1)} s`, "down");
        return;
      case "ended":
        if (status.code === "token_expired") this.expired();
        return;
      default:
    }
  }

  // A command of the user: its id now (the page draws the user's words under it), the frame once the
  // conversation exists; the client keeps it pending, with that id, until it is acked.
  command(type, fields) {
    const id = newId();
    if (this.ended) return id;
    this.pending.set(id, type);
    this.conversation
      .then((cid) => this.issue(cid, type, fields, id))
      .then(() => {
        this.pending.delete(id);
        if (type === "set_mode") {
          this.mode = fields.mode;
          storageSet(this.modeKey(), this.mode);
          this.view.mode(this.mode);
        }
      }, (err) => {
        this.pending.delete(id);
        if (this.ended) return;  // said once, by fail() or expired()
        if (err.code === "lost") this.view.note(`${type} may not have reached the server: send it again`);
        else this.view.error(err.code, err.message);
      });
    return id;
  }

  issue(cid, type, fields, id) {
    const c = this.client;
    switch (type) {
      case "user_message": return c.send(cid, fields.text, { id });
      case "steer": return c.steer(cid, fields.text, { id });
      case "answer": return c.answer(cid, fields.ask_id, fields.answer, { id });
      case "set_mode": return c.setMode(cid, fields.mode, { id });
      case "cancel": return c.cancel(cid, { id });
      default: return Promise.reject(new Error(`unknown command ${type}`));
    }
  }

  onEvent(frame) {
    const d = frame.data || {};
    if (frame.event === "turn.started") this.turnActive = true;
    if (frame.event === "turn.completed") this.turnActive = false;
    this.view.event(frame.event, d);
    this.view.busy(this.turnActive);
  }

  expired() {
    // The client ended at close 4001; the conversation is fine: a reload with a fresh token resumes it.
    this.ended = "token expired";
    this.ready = false;
    this.turnActive = false;
    this.view.busy(false);
    this.view.status("session expired — sign in again", "down");
  }

  fail(err) {
    // No reconnect can fix it (a fatal error, the conversation deleted): this session is over, and
    // the wiring decides what comes next. Our own close and the token's expiry are said elsewhere.
    if (this.ended || err.code === "closed" || err.code === "token_expired") return;
    this.ended = `${err.code}: ${err.message}`;
    this.close("session ended");
    this.onFatal(this, err.code, err.message);
  }

  close(reason) {
    if (this.client) this.client.close(reason);
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
