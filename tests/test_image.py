"""The image (Dockerfile): no Docker daemon here, so what can be checked without building it is
checked — the pins agree with pyproject.toml, k8s/raycluster.yaml and the Ray the tests run
against, the final stage is non-root with no build tools, the project is installed non-editable,
and the build context holds only what the image installs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import ray
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")


def arg(name: str) -> str:
    [value] = re.findall(rf"^ARG {name}=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    return value


def stages() -> list[str]:
    return re.split(r"^FROM ", DOCKERFILE, flags=re.MULTILINE)[1:]


def pyproject() -> dict[str, object]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]  # type: ignore[no-any-return]


def test_the_ray_pin_agrees_with_pyproject_the_raycluster_and_the_tested_ray() -> None:
    pinned = Version(arg("RAY_VERSION"))
    [ray_req] = [Requirement(r) for r in pyproject()["dependencies"] if Requirement(r).name == "ray"]  # type: ignore[attr-defined]
    assert pinned in ray_req.specifier and "default" in ray_req.extras
    cluster = yaml.safe_load((REPO / "k8s" / "raycluster.yaml").read_text(encoding="utf-8"))
    assert Version(cluster["spec"]["rayVersion"]) == pinned
    assert Version(ray.__version__) == pinned, "the tests must run against the Ray the image ships"
    assert '"ray[default]==${RAY_VERSION}"' in DOCKERFILE


def test_the_python_pin_agrees_with_pyproject_and_the_tested_python() -> None:
    python = arg("PYTHON_VERSION")
    assert Version(python + ".0") in SpecifierSet(str(pyproject()["requires-python"]))
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_images_k8s_deploys_are_this_projects_version() -> None:
    version = pyproject()["version"]
    text = "".join(p.read_text() for p in (REPO / "k8s").glob("*.yaml"))
    images = set(re.findall(r"^\s*image: (\S+)$", text, flags=re.MULTILINE))
    assert images == {f"ghcr.io/reactgate/reactgate:{version}"}


def test_the_runtime_stage_is_non_root_without_build_tools_and_installs_the_project_non_editable() -> None:
    build, runtime = stages()
    assert "build-essential" in build and "build-essential" not in runtime and "apt-get install" not in runtime
    assert re.search(r"pip install \"ray\[default\]==\$\{RAY_VERSION\}\" \.( |$)", build, flags=re.MULTILINE)
    assert " -e " not in build and "--editable" not in build
    assert re.search(r"^USER 10001:10001$", runtime, flags=re.MULTILINE)
    assert "HOME=/tmp" in runtime and "COPY --from=build /opt/reactgate /opt/reactgate" in runtime


def test_the_build_context_holds_only_what_the_image_installs() -> None:
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert ignore[ignore.index("*")] == "*"          # everything is out, then the COPY sources back in
    copied = set(re.findall(r"^COPY (?!--)(\S+)", DOCKERFILE, flags=re.MULTILINE))
    allowed = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    assert copied - {"pyproject.toml"} <= allowed and "pyproject.toml" in allowed
    assert not {".venv", ".git", "tests", "data"} & allowed
