"""The client side of `reactgate.v1`, for this repository's tools and for third parties.

`session.py` is the protocol logic, sans-I/O (one conversation); `connection.py` runs a session over
a real WebSocket with reconnects; `chat.py` (`reactgate chat`) and `loadtest/` (`reactgate
loadtest`) are built on them. This package imports nothing of the project but `protocol/`, so a
client never pulls in the server (docs/wire-protocol.md#13-writing-a-client-checklist).
"""
