"""The architecture as import rules (docs/design.md#overview), checked on the source itself.

Every `import` counts — at module level, inside functions, and under `TYPE_CHECKING` — because a
cycle hidden in any of them is still two modules that cannot be read apart.
- no import cycle between the project's modules;
- `protocol/` imports nothing from the other packages (the sans-I/O core);
- `client/` imports only `protocol/` (third parties build on it without the server);
- `actors/` never imports `gateway/` or `client/` (the runtime knows nothing of its edges);
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
