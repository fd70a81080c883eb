"""The architecture as import rules (docs/design.md#overview), checked on the source itself.

Every `import` counts — at module level, inside functions, and under `TYPE_CHECKING` — because a
cycle hidden in any of them is still two modules that cannot be read apart.
- no import cycle between the project's modules;
- `protocol/` imports nothing from the other packages (the sans-I/O core);
- `client/` imports only `protocol/` (third parties build on it without the server);
- `actors/` never imports `gateway/` or `client/` (the runtime knows nothing of its edges);
- no import runs up a floor (`FLOORS`), but for the few listed in `UPWARD` until they are moved;
- only the Ray shells import Ray: the logic they host is constructed by unit tests without it;
- nothing under `actors/` reads the environment: configuration is injected at the edge;
- the repository stands alone: no file cites a document outside it.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "actors", "gateway", "client")
# The environment accesses allowed under actors/: LiteLLM reads its cost-map switch at import, in
# every process that imports it (Ray workers included), so the guard sits where LiteLLM is imported;
# and a model's key is read where the model is called, from the variable its profile names.
ENVIRONMENT_ALLOWED = {"actors/llm/__init__.py", "actors/llm/keys.py"}
# The floors, lowest first: a module imports from its own floor and those below, never from one
# above. A module's floor is that of the most specific entry naming it or a package holding it, so a
# new module under actors/ starts on the rules floor and moves up here if it needs to. `client/`
# stands beside them, on `protocol/` alone (test_package_imports_only_what_it_may).
FLOORS: dict[str, tuple[str, ...]] = {
    "protocol": ("protocol",),                  # sans-I/O: frames, events, parser, decoder, notices
    "rules": ("actors", "actors.catalog", "actors.gates", "actors.round", "actors.turn_machine",
              "actors.continuation", "actors.context", "actors.profile", "actors.quotas", "actors.identity"),
    "store": ("actors.store",),
    "tools and models": ("actors.tools", "actors.llm"),
    # The turn's shell and its spans drive the model and the tools; its rules are a floor below.
    "conversation": ("actors.conversation", "actors.turn", "actors.round_streams", "actors.tracing", "actors.eventlog",
                     "actors.recovery", "actors.replay", "actors.agent"),
    "hosting": ("actors.hosting",),             # the backend interface, the host core, the local backend
    "ray": ("actors.ray",),                     # the Ray shells, and the cores only they use
    "gateway": ("gateway",),
}
# Imports that run up a floor today, each with what has to move down to end it. The list must match
# the code exactly: a new upward import fails, and so does a fixed one still listed.
UPWARD: dict[tuple[str, str], str] = {}
# The only modules that import Ray (STYLE.md: the actor is a shell, the logic it hosts a plain class).
RAY_SHELLS = {"actors.ray.backend", "actors.ray.directory", "actors.ray.host", "actors.ray.tool_pool",
              "actors.ray.singletons"}
# The outside contract's name, spelled so that this file does not cite it.
OUTSIDE_DOCUMENT = re.compile(r"\b" + "SP" + r"EC\b")


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def imported(path: Path, name: str) -> Iterator[str]:
    """The project modules `path` imports, resolved to the most specific module that exists."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] in PACKAGES:
                yield target


GRAPH = {name: sorted(set(imported(path, name)) - {name}) for name, path in MODULES.items()}


def test_the_packages_exist() -> None:
    assert {name.split(".")[0] for name in MODULES} == set(PACKAGES)


def test_no_import_cycle() -> None:
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert cycles == []


@pytest.mark.parametrize(("package", "allowed"), [
    ("protocol", {"protocol"}),
    ("client", {"client", "protocol"}),
    ("actors", {"actors", "protocol"}),
])
def test_package_imports_only_what_it_may(package: str, allowed: set[str]) -> None:
    wrong = {
        f"{name} → {target}"
        for name, targets in GRAPH.items() if name.split(".")[0] == package
        for target in targets if target.split(".")[0] not in allowed
    }
    assert wrong == set()


def floor_of(module: str) -> int | None:
    """The index of the module's floor in FLOORS; None for a module beside them (client/)."""
    best: tuple[int, int] | None = None  # (length of the entry, floor)
    for floor, entries in enumerate(FLOORS.values()):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), floor)
    return best[1] if best is not None else None


def test_every_module_but_the_clients_has_a_floor() -> None:
    assert {name for name in MODULES if floor_of(name) is None} == {n for n in MODULES if n.split(".")[0] == "client"}


def test_no_import_runs_up_a_floor() -> None:
    floors = list(FLOORS)
    upward = {}
    for name, targets in GRAPH.items():
        mine = floor_of(name)
        for target in targets:
            theirs = floor_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward[(name, target)] = f"{floors[mine]} → {floors[theirs]}"
    assert upward.keys() == UPWARD.keys(), upward


def imports_ray(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "ray":
            return True
    return False


def test_only_the_ray_shells_import_ray() -> None:
    assert {name for name, path in MODULES.items() if name.startswith("actors") and imports_ray(path)} == RAY_SHELLS


def test_no_module_under_actors_but_a_shell_reaches_a_shell() -> None:
    # So the cores the shells host (actors/ray/directory_core.py, outbox.py, the hosting layer) are
    # imported by their unit tests without Ray.
    def reach(name: str, seen: set[str]) -> set[str]:
        for target in GRAPH[name]:
            if target not in seen:
                seen.add(target)
                reach(target, seen)
        return seen

    wrong = {name: sorted(reach(name, set()) & RAY_SHELLS)
             for name in MODULES if name.startswith("actors") and name not in RAY_SHELLS}
    assert {name: shells for name, shells in wrong.items() if shells} == {}


def test_nothing_under_actors_reads_the_environment() -> None:
    readers = {
        str(path.relative_to(REPO))
        for name, path in MODULES.items()
        if name.startswith("actors") and re.search(r"\bos\.(environ|getenv)\b", path.read_text(encoding="utf-8"))
    }
    assert readers <= ENVIRONMENT_ALLOWED


def test_no_file_cites_an_outside_document() -> None:
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    citing = [f for f in tracked if (REPO / f).is_file() and not f.startswith("tests/fixtures/")
              and OUTSIDE_DOCUMENT.search((REPO / f).read_text(encoding="utf-8", errors="replace"))]
    assert citing == []


def anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_citation_of_the_design_documents_resolves() -> None:
    known = {name: anchors(REPO / "docs" / name) for name in ("design.md", "wire-protocol.md")}
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    broken = set()
    for f in tracked:
        path = REPO / f
        if not path.is_file() or f.startswith("tests/fixtures/") or path.suffix not in {".py", ".md", ".js", ".toml", ".yaml"}:
            continue
        for doc, anchor in re.findall(r"(design\.md|wire-protocol\.md)#([\w-]+)", path.read_text(encoding="utf-8")):
            if anchor not in known[doc]:
                broken.add(f"{f}: {doc}#{anchor}")
    assert broken == set()
