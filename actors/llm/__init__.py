"""Every model call goes through here: LiteLLM, the scripted provider, the mock HTTP endpoint.

LiteLLM is imported lazily (≈3 s, ≈200 MB, in `lite.py` only) and only after the cost map is pinned
to the local copy: without `LITELLM_LOCAL_MODEL_COST_MAP` it fetches one from the internet at import and
stalls for seconds offline (docs/design.md#fallback). This must run before anything imports litellm, so it
lives in the package's `__init__`.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
