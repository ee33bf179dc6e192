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


def _runtime_imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Modules `path` imports when it runs: `if TYPE_CHECKING:` blocks are left out, and
    `from PKG import MOD` counts as importing MOD (not PKG's __init__)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = package.split(".")
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                subs = {f"{base}.{a.name}" for a in child.names} & modules
                out.update(subs if subs else {base})
            visit(child)

    visit(tree)
    return out


def _graph(top: str) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in (REPO / top).rglob("*.py")}
    names = set(files)
    return {name: {m for m in _runtime_imports(path, name, names) if m in names and m != name}
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


@pytest.mark.parametrize("top", ["cowfs", "tools"])
def test_no_module_over_500_lines(top: str) -> None:
    long = {str(p.relative_to(REPO)): n for p in (REPO / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_cli_side_imports_no_fuse() -> None:
    """Nor the heavy libraries only some commands use (blosc2, boto3: ~0.35 s of CPU per command;
    numpy and the compactor: 0.08 s)."""
    code = ("import sys, cowfs.cli, cowfs.control, cowfs.mountinfo, cowfs.protocol, cowfs.units, cowfs.service; "
            "print(sorted(m for m in ('pyfuse3', 'trio', 'torch', 'blosc2', 'boto3', 'numpy', 'cowfs.store.compact')"
            " if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"the CLI side imported {r.stdout.strip()}"
