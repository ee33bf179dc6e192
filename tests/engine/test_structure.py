"""The house rules the code keeps (docs/design.md, "Module map"): no import circles in
cowfs/ or tools/, no module over 500 lines, and the CLI side of cowfs (control, mount
facts, the socket protocol, the parsers) runs without importing the FUSE binding."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
while not (REPO / "pyproject.toml").exists():
    REPO = REPO.parent
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Modules `path` imports, type-only ones (`if TYPE_CHECKING:`) and those inside functions
    included: a circle through any of them is a circle for a reader and a type checker.
    `from PKG import MOD` counts as importing MOD (not PKG's __init__)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            out.update(subs if subs else {base})
    return out


def _graph(top: str) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in (REPO / top).rglob("*.py")}
    names = set(files)
    return {name: {m for m in _imports(path, name, names) if m in names and m != name}
            for name, path in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


@pytest.mark.parametrize("top", ["cowfs", "tools"])
def test_no_import_circles(top: str) -> None:
    graph = _graph(top)
    assert len(graph) > 5, f"found too few modules under {top}/"
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_type_only_imports_count() -> None:
    """A circle closed only by an `if TYPE_CHECKING:` import is still found."""
    src = REPO / "cowfs" / "store" / "upkeep" / "gc.py"
    assert "cowfs.store.parts" in _imports(src, "cowfs.store.upkeep.gc", {"cowfs.store.parts"})


STORE = REPO / "cowfs" / "store"


def _may_import(package: Path) -> set[str]:
    """The engine packages (and top-level modules of cowfs/store) that the package's docstring
    allows it to import, from its line `May import: a, b.` (`nothing else of the engine`: none)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    assert len(lines) == 1, f"{package.name}/__init__.py: no single 'May import:' line in its docstring"
    allowed = lines[0].removeprefix("May import:").strip().rstrip(".")
    return set() if allowed.startswith("nothing") else {a.strip() for a in allowed.split(",")}


def _engine_part(module: str) -> str:
    """`cowfs.store.log.device` -> `log`; `cowfs.store.parts` -> `parts`; `cowfs.store` -> `store`."""
    rest = module.removeprefix("cowfs.store").lstrip(".")
    return rest.split(".")[0] if rest else "store"


def test_engine_packages_import_only_what_their_docstring_allows() -> None:
    graph = _graph("cowfs")
    packages = sorted(p for p in STORE.iterdir() if (p / "__init__.py").exists())
    assert {p.name for p in packages} >= {"log", "catalog", "data", "tensors", "upkeep", "checkpoints"}
    wrong = []
    for package in packages:
        allowed = _may_import(package) | {package.name}
        for module, imported in graph.items():
            if module != f"cowfs.store.{package.name}" and not module.startswith(f"cowfs.store.{package.name}."):
                continue
            for other in imported:
                if other.startswith("cowfs.store") and _engine_part(other) not in allowed:
                    wrong.append(f"{module} imports {other}")
    assert not wrong, f"imports outside the package's 'May import:' line: {sorted(wrong)}"


@pytest.mark.parametrize("top", ["cowfs", "tools"])
def test_no_module_over_500_lines(top: str) -> None:
    long = {str(p.relative_to(REPO)): n for p in (REPO / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_cli_side_imports_no_fuse() -> None:
    """Nor the heavy libraries only some commands use (blosc2, boto3: ~0.35 s of CPU per command;
    numpy and the compactor: 0.08 s)."""
    code = ("import sys, cowfs.cli, cowfs.control, cowfs.mountinfo, cowfs.protocol, cowfs.units, cowfs.service; "
            "print(sorted(m for m in ('pyfuse3', 'trio', 'torch', 'blosc2', 'boto3', 'numpy', 'cowfs.store.tensors.compact')"
            " if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"the CLI side imported {r.stdout.strip()}"
