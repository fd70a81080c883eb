"""Hosting conversations, whatever the shell (docs/design.md#hosting).

- `backend.py`: the interface the gateway uses (`Backend`), its DTOs, commands and refusals;
- `owners.py`: who owns which conversation, and conversation ids;
- `meter.py`: the quota shell: charges `actors/quotas.py` plans, against the store's counters;
- `host.py`: `HostCore`, many conversations in one process (activation, mailbox, checkpoints,
  passivation) — used directly by the local backend, wrapped by the Ray ConversationHost actor;
- `subscription.py`: replay-then-live, the consumer side both backends' `subscribe` share;
- `placement.py`: rendezvous hashing and the single-activation table (pure);
- `local.py`: the in-process backend.

The Ray shells live in `actors/ray/`.
"""
