// An AG-UI HttpAgent that can go on after a cut stream (docs/frontends.md#reattach).
//
// AG-UI 1.0 defines no resume: a run whose stream breaks is simply over for the client. reactgate's
// runs are views of a durable event log, and every event carries its seq in
// `metadata.reactgate.seq`; this agent remembers the last one it saw, and `reattach()` asks the
// gateway for what came after it (`forwardedProps.after_seq`). The gateway first re-opens the run
// and whatever message was open at that seq, so the client's order checks pass, and then streams
// the rest: every character once. Copy this file into your app (it imports the official client).
import { HttpAgent } from "@ag-ui/client";

export class ReattachingAgent extends HttpAgent {
  /** @param {import("@ag-ui/client").HttpAgentConfig} config */
  constructor(config) {
    super(config);
    /** The seq of the last event this agent saw, or null before any. */
    this.lastSeq = null;
    this.subscribe({
      onEvent: ({ event }) => {
        const seq = event.metadata?.reactgate?.seq;
        if (Number.isInteger(seq)) this.lastSeq = seq;
      },
    });
  }

  /** Continue the conversation's run after the last event seen (a new run on the client's side). */
  reattach(parameters = {}) {
    const forwardedProps = { ...parameters.forwardedProps, after_seq: this.lastSeq ?? 0 };
    return this.runAgent({ ...parameters, forwardedProps });
  }
}
