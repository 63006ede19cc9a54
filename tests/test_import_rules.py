"""The import graph of aioserve (and schedulers/) has no circle, and each sub-package
imports only what its ``__init__`` docstring allows.

The rule, exactly (read from the source with ``ast``; nothing is imported):

* An import is an ``import X`` or ``from X import Y`` statement anywhere in a module:
  at module level, in a class, in a function, under ``try`` or ``if``; except inside
  an ``if TYPE_CHECKING:`` block (its ``else`` branch counts). Relative imports are
  resolved. ``from P import N`` imports the module ``P.N`` when that is a module of
  the package, else ``P``; a name outside the package counts as what it names
  (``torch.nn`` is ``torch``'s).
* **No circle**: among the modules of ``aioserve`` and ``schedulers``, no module
  reaches itself through imports (the parent packages that Python runs on the way,
  ``__init__`` files, are not counted as edges here).
* **Allowed imports**: each directory of ``aioserve`` with Python files has an
  ``__init__.py`` whose docstring has an ``Imports (checked by ...)`` section. Its
  ``may import:`` names packages (an aioserve module is in package P when it sits
  directly in P's directory; the package ``aioserve`` is the core, its top-level
  modules) or single modules; a module of the directory may import modules of its
  own package, of the packages and the modules named, and nothing else of aioserve.
* **Never at module level**: the names under ``never at module level:`` are not loaded
  when the package's modules are imported: no module-level import of them (not in a
  function or method, TYPE_CHECKING aside) by the package's modules, nor by any
  aioserve module those load at module level, their parent packages included,
  transitively (so ``import aioserve`` loads no torch).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("aioserve", "schedulers")
KEYS = ("may import:", "never at module level:")


def _modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]


@dataclass
class Imports:
    anywhere: set[str] = field(default_factory=set)
    module_level: set[str] = field(default_factory=set)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str) -> str:
    """The module of the package ``name`` belongs to, or the top-level name outside."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(name: str) -> Imports:
    package = package_of(name)
    found = Imports()

    def add(target: str, module_level: bool) -> None:
        target = _resolve(target)
        if target != name:
            found.anywhere.add(target)
            if module_level:
                found.module_level.add(target)

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_node(other, module_level)
                continue
            visit_node(child, module_level)

    def visit_node(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, module_level)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in MODULES else base, module_level)
        inner = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(node, module_level and not inner)

    visit(ast.parse(MODULES[name].read_text()), True)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(GRAPH[node].anywhere & MODULES.keys()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            connect(node)
    return found


def rules(package: str) -> dict[str, list[str]]:
    """The package docstring's ``Imports`` section: key -> names."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    match = re.search(r"^Imports \(checked by tests/test_import_rules\.py\):\n(.*?)(?:\n\n|\Z)",
                      doc, re.S | re.M)
    assert match, f"{package}/__init__.py: no 'Imports (checked by ...)' section"
    section = " ".join(match.group(1).split())
    found: dict[str, list[str]] = {}
    for key in KEYS:
        if key in section:
            text = section.split(key, 1)[1]
            for other in KEYS:
                text = text.split(other, 1)[0]
            found[key] = re.findall(r"[a-z_][a-z_0-9.]*", text.replace("(nothing else in "
                                                                       "aioserve)", ""))
    assert "may import:" in found, f"{package}: no 'may import:' line"
    return found


PACKAGES = sorted({package_of(name) for name in MODULES if name.startswith("aioserve")})


def _loaded_at_import(name: str) -> set[str]:
    """Every name loaded when ``name`` is imported: module-level imports, through
    aioserve modules and their parent packages, transitively."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        parents = [".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)]
        for target in [*GRAPH[current].module_level, *parents] if current in GRAPH else []:
            if target not in seen:
                todo.append(target)
    return seen


def test_no_import_circle():
    assert circles() == []


def test_each_package_imports_only_what_its_docstring_allows():
    wrong = []
    for package in PACKAGES:
        allowed = {package, *rules(package)["may import:"]}
        for name in MODULES:
            if not name.startswith("aioserve") or package_of(name) != package:
                continue
            for target in GRAPH[name].anywhere:
                if target.startswith("aioserve") and not (
                        target in allowed or package_of(target) in allowed):
                    wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_what_a_package_never_loads_at_module_level():
    wrong = []
    for package in PACKAGES:
        banned = rules(package).get("never at module level:", [])
        for name in (n for n in MODULES if package_of(n) == package):
            for loaded in _loaded_at_import(name):
                hit = [b for b in banned if loaded == b or loaded.startswith(b + ".")]
                if hit:
                    wrong.append(f"{name} loads {loaded}")
    assert wrong == []


def test_the_checker_sees_what_it_checks():
    """The rule's parts, on the real graph: function-level imports count, TYPE_CHECKING
    ones do not, module-level loading is followed through other modules."""
    engine = GRAPH["aioserve.engine"]
    assert "aioserve.runners.torch.runner" in engine.anywhere
    assert "aioserve.runners.torch.runner" not in engine.module_level
    assert "aioserve.kv_cache" not in GRAPH["aioserve.prefix_cache"].anywhere  # TYPE_CHECKING
    assert "torch" in _loaded_at_import("aioserve.runners.torch.setup")
    assert "torch" not in _loaded_at_import("aioserve.engine")
    assert rules("aioserve")["never at module level:"] == [
        "aioserve.runners.torch", "torch", "numpy", "transformers"]
