"""The house rules, read from the source with ``ast``: floors without import cycles (imports inside
functions count), no cross-module use of another module's underscore names, the core never
imports the tools, and no module over 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gqa_jax"
TESTS = Path(__file__).resolve().parent
CORE_NEVER_IMPORTS = ("gqa_jax.tools", "gqa_jax.cli", "gqa_jax.__main__", "gqa_jax.reproduce")
TOP_FLOORS = ("gqa_jax.tools", "gqa_jax.cli", "gqa_jax.__main__", "gqa_jax.reproduce")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every gqa_jax module ``module`` imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, path, node)
            # `from gqa_jax import cache` imports the module gqa_jax.cache (and the package)
            names = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        else:
            continue
        for name in names:
            while name and name not in known:  # a submodule attribute: its closest module
                name = name.rpartition(".")[0]
            if name.startswith("gqa_jax") and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges = {m: imports(m, p, known) for m, p in found.items()}
    # A package's __init__ runs before any of its modules: importing gqa_jax.x.y imports gqa_jax.x.
    for m in list(edges):
        edges[m] = {e for e in edges[m] if not m.startswith(e + ".")}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_no_import_cycle_counting_imports_inside_functions():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_never_imports_the_tools_the_cli_or_the_demo():
    bad = [
        f"{m} imports {n}"
        for m, ns in graph().items()
        if not m.startswith(TOP_FLOORS)
        for n in ns
        if n.startswith(CORE_NEVER_IMPORTS)
    ]
    assert not bad, bad


def underscore_uses(path: Path, aliases: dict[str, str]) -> list[str]:
    """``alias._name`` attribute uses and ``from gqa_jax.x import _name`` imports in ``path``."""
    tree = ast.parse(path.read_text())
    local = dict(aliases)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gqa_jax"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{a.name}")
                local[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gqa_jax") and a.asname:  # import gqa_jax.x as y
                    local[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and local.get(node.value.id, "").startswith("gqa_jax")
        ):
            found.append(f"{path.name}:{node.lineno} uses {local[node.value.id]}.{node.attr}")
    return found


def own_test(test: Path) -> str:
    """The module a test file belongs to: tests/test_<name>.py tests gqa_jax's module <name>."""
    return test.stem.removeprefix("test_")


def test_no_cross_module_use_of_underscore_names():
    found = []
    for path in modules().values():
        found += underscore_uses(path, {})
    for test in sorted(TESTS.glob("*.py")):
        own = own_test(test)  # a module's own tests may reach into it
        found += [u for u in underscore_uses(test, {}) if f".{own}." not in u.rsplit(" ", 1)[-1]]
    assert not found, "\n".join(found)


def test_the_underscore_check_sees_both_forms(tmp_path):
    file = tmp_path / "x.py"
    file.write_text("from gqa_jax import decoding\nfrom gqa_jax.layers import _hidden\ndecoding._loop(1)\n")
    uses = underscore_uses(file, {})
    assert any("gqa_jax.layers._hidden" in u for u in uses) and any("decoding._loop" in u for u in uses)


def test_no_module_over_500_lines():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_the_readme_layout_names_every_module():
    """README's layout block names every module of gqa_jax (a package's modules on the indented lines
    after its entry) and nothing that is not there."""
    readme = (PACKAGE.parent / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed: set[str] = set()
    package = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if not words:
            continue
        if indent == 2:  # an entry of gqa_jax/: a module or a package
            package = words[0].rstrip("/") if words[0].endswith("/") else ""
            listed.add(words[0].rstrip("/"))
        if indent == 4 or (indent == 2 and package):  # a package's modules
            for name in (w.strip(",();") for w in words):
                if name.endswith(".py") and name != "__init__.py":
                    listed.add(f"{package}/{name}")
    tree = {
        str(p.relative_to(PACKAGE).with_suffix(".py"))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py"
    }
    tree |= {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert tree - listed == set(), "in gqa_jax/ but not in README's layout"
    assert listed - tree == set(), "in README's layout but not in gqa_jax/"
