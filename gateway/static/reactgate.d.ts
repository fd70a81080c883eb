// Types of reactgate.js, the JavaScript client of the `reactgate.v1` wire protocol
// (docs/wire-protocol.md). Server frames and event data are typed as they are on the wire
// (snake_case); what the client itself produces is camelCase.

export declare const SUBPROTOCOL: "reactgate.v1";
export declare const CLOSE_TOKEN_EXPIRED: 4001;
export declare const RETRY_PAUSE_MS: number;
/** The longest pause before sending again a frame refused `unavailable`, whatever its retry_after_ms. */
export declare const UNAVAILABLE_PAUSE_CAP_MS: number;
export declare const BACKOFF: Readonly<{ baseMs: number; capMs: number }>;

export type CommandType = "user_message" | "steer" | "answer" | "set_mode" | "cancel";
export declare const RESENT_AFTER_RECONNECT: Readonly<Record<CommandType | "list", boolean>>;

export type ErrorCode =
  | "bad_request" | "unauthorized" | "forbidden" | "not_found" | "rate_limited" | "too_large"
  | "slow_consumer" | "overloaded" | "internal" | "quota_exceeded" | "unavailable";
export type ErrorTarget = "open" | "subscribe" | "command" | "stream";
export type Reaction = "fatal" | "resubscribe" | "retry" | "drop" | "report";
export declare const FATAL: "fatal";
export declare const RESUBSCRIBE: "resubscribe";
export declare const RETRY: "retry";
export declare const DROP: "drop";
export declare const REPORT: "report";
export declare const ERROR_TARGETS: readonly ErrorTarget[];
export declare const ERROR_REACTIONS: Readonly<Record<ErrorCode, readonly [Reaction, Reaction, Reaction, Reaction]>>;
export declare function reaction(code: string, target: ErrorTarget): Reaction;
/** Milliseconds to wait before sending again the frame `error` refused: `unavailable`'s
 *  `retry_after_ms`, or without one max(pauseMs, 1)·2^streak (`streak`: `unavailable` errors since the
 *  last ack), both at most UNAVAILABLE_PAUSE_CAP_MS; any other code: `pauseMs` (default RETRY_PAUSE_MS). */
export declare function retryPause(error: Pick<ErrorFrame, "code" | "retry_after_ms">, streak?: number, pauseMs?: number): number;

export interface BackoffOptions {
  baseMs?: number;
  capMs?: number;
  /** Uniform in [0, 1): Math.random by default. */
  random?: () => number;
}
/** Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base·2ⁿ)) ms. */
export declare function backoffDelay(attempt: number, options?: BackoffOptions): number;
/** A fresh frame id: 32 hex characters (128 random bits). */
export declare function newId(): string;

export type Mode = "agent" | "ask";

/** An `error` frame (docs/wire-protocol.md#5-error-codes). */
export interface ErrorFrame {
  type: "error";
  code: ErrorCode | string;
  message: string;
  id?: string;
  conversation_id?: string;
  last_seq?: number;
  quota?: string;
  scope?: "user" | "tenant" | "ip" | string;
  resets_at?: string;
  /** `unavailable` only: send the same frame, same id, again after this many milliseconds. */
  retry_after_ms?: number;
}

/** A server error frame, or a failure of the client's own: "lost" (a `cancel` whose connection
 *  dropped before its ack: it is never re-sent), "closed" (`close()`), "token_expired" (close 4001
 *  with a fixed token), "deleted" (the conversation was deleted), "protocol", "fatal". */
export declare class ReactgateError extends Error {
  constructor(code: string, message: string, frame?: ErrorFrame);
  readonly code: ErrorCode | "lost" | "closed" | "token_expired" | "deleted" | "protocol" | "fatal" | string;
  readonly frame: ErrorFrame | undefined;
}

/** An `event` frame (docs/wire-protocol.md#7-events): `seq` starts at 1 and grows by exactly 1. */
export interface EventFrame<D = Record<string, unknown>> {
  type: "event";
  conversation_id: string;
  seq: number;
  event: EventName | string;
  data: D;
  ts: number;
}
export type EventName =
  | "user.message" | "turn.started" | "thinking.delta" | "answer.delta" | "tool.call" | "tool.result"
  | "ask_user" | "ui_command" | "fallback" | "round.completed" | "trace" | "turn.completed"
  | "conversation.deleted";

/** `turn.completed`'s data (docs/wire-protocol.md#turncompleted). */
export interface TurnCompleted {
  turn_id: string;
  reason: "complete" | "exit" | "salvaged" | "iteration_limit" | "protocol_violation" | "provider_error" | "error" | "cancelled" | string;
  final_answer: string;
  used_tools: boolean;
  finish_ok: boolean;
  partial?: true;
  error?: string;
}

/** `ask_user`'s data: answer it with `client.answer(conversationId, ask_id, answer)`. */
export interface AskUser {
  turn_id: string;
  ask_id: string;
  question: string;
  options: string[];
  timeout_s: number;
  kind?: "approval";
  tool_id?: string;
  params?: Record<string, unknown>;
}

/** An entry of the `list` reply (docs/wire-protocol.md#conversations). */
export interface ConversationEntry {
  conversation_id: string;
  agent: string;
  created_at: number;
  last_active_at: number;
  last_seq: number;
  title: string;
  running: boolean;
}

export interface Opened {
  conversationId: string;
  /** The conversation's last seq when it was opened (0: a new one). */
  lastSeq: number;
}

export interface CommandAck {
  /** The frame id, also the idempotency key. */
  id: string;
  /** "duplicate": an earlier copy of this id had already been accepted. */
  status: "accepted" | "duplicate";
  /** It was sent more than once (re-sent after a reconnect, or retried). */
  resent: boolean;
}

export interface ConversationPage {
  conversations: ConversationEntry[];
  /** Pass as `before` for the next page; null on the last page. */
  nextBefore: string | null;
}

export interface Subscribed {
  /** Events after this seq follow. */
  afterSeq: number;
  /** The conversation's last seq when the subscribe was acked (events ≤ head are a replay). */
  head: number;
  /** Not this subscription's first ack: it resumed (a reconnect, a slow-consumer pause, a gap). */
  resumed: boolean;
}

export interface SubscribeOptions {
  /** Deliver the events after this seq (default: 0, or the last seq this client delivered). */
  afterSeq?: number;
  /** Each seq once, in order. */
  onEvent?: (event: EventFrame) => void;
  onSubscribed?: (subscribed: Subscribed) => void;
  /** An error about this conversation that needs nothing from the client (reaction "report"). */
  onError?: (error: ReactgateError) => void;
  /** The subscription is over: a fatal error (e.g. "forbidden"), "deleted", "token_expired". */
  onEnd?: (error: ReactgateError) => void;
}

export declare class Subscription {
  readonly conversationId: string;
  /** The seq of the last event delivered: keep it to resume later. */
  readonly lastSeq: number;
  /** Events dropped because their seq had already been delivered. */
  readonly duplicatesDropped: number;
  readonly active: boolean;
  unsubscribe(): void;
}

export type Status =
  | { state: "connecting"; attempt: number }
  | { state: "connected" }
  | { state: "down"; reason: string; closeCode?: number; closeReason?: string; retryInMs: number }
  | { state: "ended"; reason: string; code: string; closeCode?: number };

/** A WebSocket constructor: the global one, or any with the same interface (e.g. a test's subclass). */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

export type TokenSupplier = () => string | null | undefined | Promise<string | null | undefined>;

export interface ClientOptions {
  /** ws(s)://host:port/ws; in a browser a path such as "/ws" works too. */
  url: string;
  /** A JWT, or what returns the current one (asked before every connection attempt). Sent as ?token=. */
  token?: string | null | TokenSupplier;
  WebSocket?: WebSocketConstructor;
  onStatus?: (status: Status) => void;
  /** Errors about nothing this client tracks. */
  onError?: (error: ReactgateError) => void;
  backoff?: BackoffOptions;
  /** The pause before re-sending a frame the server did not process (`rate_limited`, `internal` on a
   *  subscribe); `unavailable` waits its `retry_after_ms` instead (`retryPause`). */
  retryPauseMs?: number;
}

export interface CommandOptions {
  /** The frame id and idempotency key (default: a fresh one). Reuse it to retry the same action. */
  id?: string;
}

export declare class ReactgateClient {
  constructor(options: ClientOptions);
  readonly url: string;
  /** Why the client is over ("client closed", "token expired", …), or null while it works. */
  readonly ended: string | null;
  /** A WebSocket is open now. */
  readonly connected: boolean;
  /** The last seq delivered for a conversation (0: none). */
  lastSeq(conversationId: string): number;
  /** Create a conversation, or with `conversationId` re-open one of yours (resolves with its head). */
  open(options?: { agent?: string; mode?: Mode; conversationId?: string }): Promise<Opened>;
  subscribe(conversationId: string, options?: SubscribeOptions): Subscription;
  send(conversationId: string, text: string, options?: CommandOptions): Promise<CommandAck>;
  steer(conversationId: string, text: string, options?: CommandOptions): Promise<CommandAck>;
  answer(conversationId: string, askId: string, answer: string, options?: CommandOptions): Promise<CommandAck>;
  setMode(conversationId: string, mode: Mode, options?: CommandOptions): Promise<CommandAck>;
  /** Never re-sent after a reconnect: rejects with code "lost" if its connection dropped before the ack. */
  cancel(conversationId: string, options?: CommandOptions): Promise<CommandAck>;
  list(options?: { limit?: number; before?: string }): Promise<ConversationPage>;
  close(reason?: string): void;
}
