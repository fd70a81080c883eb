"""The Ray shells around the hosting logic, and the pure cores only they use (docs/design.md#hosting,
#placement, #tool-pool). Only the shells import Ray (tests/test_layout.py).

- `config.py`: `RayConfig`, everything the cluster needs, built at the edge and passed in;
- `generation.py`: the content hash of what the hosts serve, naming each set of hosts;
- `names.py`: the named actors' namespace and names (pure);
- `singletons.py`: race-free creation of the one-of-a-name actors (the Directory, each tool pool);
- `directory_core.py`: `DirectoryCore`, the Directory's decisions (placement through
  `actors.hosting.placement.PlacementTable`, incarnations, orphans, generations) as effects (pure);
- `directory.py`: the Directory actor, a shell carrying out `DirectoryCore`'s effects;
- `host.py`: the ConversationHost actor, a shell around `actors.hosting.host.HostCore`;
- `outbox.py`: a host's outboxes, one per gateway, drained by its long poll (pure);
- `tool_pool.py`: the ToolPool actor, a shell around `actors.tools.pool.ToolPool`, and the client
  hosts run tools through;
- `backend.py`: `RayBackend`, the gateway as a Ray driver.

The package is `actors.ray`; its modules import Ray as `import ray`, which (absolute imports)
is always the top-level Ray package, never this one.
"""
