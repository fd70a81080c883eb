"""`reactgate loadtest` — many simulated users against one gateway on this machine (README.md#configuration).

Each simulated user is one WebSocket connection holding one conversation: it opens a new
conversation, subscribes, and sends `user_message` turns back to back (answering any `ask_user`
with its first option) until the duration is over; then it lets its last turn finish and checks
that it saw every event up to the conversation's head. Every user is a `ClientSession`
(client/session.py), so the protocol the load test exercises is the one every client runs.

- `user.py`: one simulated user (`SimUser`), the `SeqTracker` that judges the server's event stream,
  and the measurements — plain classes with no socket, clock or event loop;
- `runner.py`: `LoadConfig`, the asyncio shell (`LoadRunner`) that moves frames between users and
  real sockets and injects abrupt drops, and the `Result`;
- `report.py`: the terminal summary and the self-contained HTML report (template `report.html`);
- `command.py`: the command itself — check, run with a progress bar, print, write, exit code.

Load goes only to a loopback address literal (127.0.0.0/8 or ::1): this is a tool to measure a
gateway on this machine, never one to aim at somebody else's.
"""
