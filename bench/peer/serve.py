"""`langgraph dev`, with langgraph.json's `disable_persistence` honoured (bench/peer_bench.py).

langgraph-cli 0.4.40 reads `disable_persistence` from the config (`cli.py`: `config_json.get("disable_persistence")`)
but its `validate_config_file` returns only the keys it knows, which drops that one: the in-memory runtime then
pickles its state to `.langgraph_api/` every 10 s. This wrapper puts the key back, then runs the CLI unchanged:

    python serve.py dev --no-browser --no-reload --n-jobs-per-worker N --config langgraph.json
"""

import json
import pathlib
import sys

import langgraph_cli.config
from langgraph_cli.cli import cli

_validate = langgraph_cli.config.validate_config_file


def validate_config_file(path: pathlib.Path) -> dict:
    config = _validate(path)
    raw = json.loads(pathlib.Path(path).read_text())
    if "disable_persistence" in raw:
        config["disable_persistence"] = bool(raw["disable_persistence"])
    return config


langgraph_cli.config.validate_config_file = validate_config_file

if __name__ == "__main__":
    sys.exit(cli())
