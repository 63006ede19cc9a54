"""The import graph of aioserve (and schedulers/) has no circle, and each package
imports only what :data:`RULES` allows.

The rule, exactly (read from the source with ``ast``; nothing is imported):

* An import is an ``import X`` or ``from X import Y`` statement anywhere in a module:
  at module level, in a class, in a function, under ``try`` or ``if``. Relative imports
  are resolved. ``from P import N`` imports the module ``P.N`` when that is a module of
  the package, else ``P``; a name outside the package counts as what it names
  (``torch.nn`` is ``torch``'s).
* **No circle**: among the modules of ``aioserve`` and ``schedulers``, no module
  reaches itself through imports, those under ``if TYPE_CHECKING:`` included (the
  parent packages that Python runs on the way, ``__init__`` files, are not counted as
  edges here).
* **Allowed imports**: every package of ``aioserve`` (a directory with Python files;
  the package ``aioserve`` is its top-level modules) has an entry in :data:`RULES`. A
  module of the package may import modules of its own package, of the packages and
  the modules its entry names, and nothing else of aioserve; an ``__init__`` may also
  re-export what :data:`REEXPORTS` names. ``if TYPE_CHECKING:`` imports are not exempt.
* **Never at module level**: the names an entry lists second are not loaded when the
  package's modules are imported: no module-level import of them (not in a function
  or method, TYPE_CHECKING aside) by the package's modules, nor by any aioserve
  module those load at module level, their parent packages included, transitively
  (so ``import aioserve`` loads no torch).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("aioserve", "schedulers")


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
    anywhere: set[str] = field(default_factory=set)  # TYPE_CHECKING ones aside
    module_level: set[str] = field(default_factory=set)
    type_checking: set[str] = field(default_factory=set)  # only under TYPE_CHECKING


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

    def add(target: str, module_level: bool, typing_only: bool) -> None:
        target = _resolve(target)
        if target == name:
            return
        if typing_only:
            found.type_checking.add(target)
            return
        found.anywhere.add(target)
        if module_level:
            found.module_level.add(target)

    def visit(node: ast.AST, module_level: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.body:
                    visit_node(other, module_level, True)
                for other in child.orelse:
                    visit_node(other, module_level, typing_only)
                continue
            visit_node(child, module_level, typing_only)

    def visit_node(node: ast.AST, module_level: bool, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, module_level, typing_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in MODULES else base, module_level, typing_only)
        inner = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(node, module_level and not inner, typing_only)

    visit(ast.parse(MODULES[name].read_text()), True, False)
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
        for target in sorted((GRAPH[node].anywhere | GRAPH[node].type_checking) & MODULES.keys()):
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


_NO_HEAVY = ("torch", "numpy", "transformers")

#: package -> (what it may import besides its own modules, what it never loads at
#: module level). "aioserve" is the top-level modules: the nouns every room shares.
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "aioserve": ((), ("aioserve.runners.torch", *_NO_HEAVY)),
    "aioserve.engine": (("aioserve", "aioserve.scheduling", "aioserve.runners.base",
                         "aioserve.runners.torch"), ("aioserve.runners.torch", *_NO_HEAVY)),
    "aioserve.scheduling": (("aioserve",), _NO_HEAVY),
    "aioserve.server": (("aioserve", "aioserve.engine", "aioserve.dashboard",
                         "aioserve.scheduling", "aioserve.server.schema",
                         "aioserve.server.openai", "aioserve.server.ws",
                         "aioserve.runners.base"), _NO_HEAVY),
    "aioserve.server.schema": (("aioserve.sampling_params", "aioserve.request_meta"),
                               _NO_HEAVY),
    "aioserve.server.ws": (("aioserve", "aioserve.engine", "aioserve.dashboard",
                            "aioserve.server", "aioserve.server.openai",
                            "aioserve.server.schema"), _NO_HEAVY),
    "aioserve.server.openai": (("aioserve", "aioserve.engine", "aioserve.server",
                                "aioserve.server.schema"), _NO_HEAVY),
    "aioserve.deploy": (("aioserve", "aioserve.server", "aioserve.routing"), ()),
    "aioserve.sim": (("aioserve", "aioserve.engine", "aioserve.dashboard", "aioserve.runners",
                      "aioserve.scheduling", "aioserve.routing", "aioserve.workloads"),
                     ("torch", "transformers")),
    "aioserve.workloads": (("aioserve",), ("torch", "transformers")),
    "aioserve.reports": (("aioserve", "aioserve.engine", "aioserve.dashboard", "aioserve.sim",
                          "aioserve.scheduling", "aioserve.workloads"),
                         ("torch", "transformers", "matplotlib")),
    "aioserve.routing": (("aioserve", "aioserve.scheduling"), _NO_HEAVY),
    "aioserve.runners": (("aioserve", "aioserve.runners.cpu"), ()),
    "aioserve.runners.model": (("aioserve", "aioserve.runners.attention",
                                "aioserve.runners.cpu"), ()),
    "aioserve.runners.attention": (("aioserve.runners", "aioserve.runners.cpu",
                                    "aioserve.runners.attention.flex"), ()),
    "aioserve.runners.attention.flex": (("aioserve.runners.attention",), ()),
    "aioserve.runners.torch": (("aioserve", "aioserve.runners", "aioserve.runners.attention",
                                 "aioserve.runners.cpu", "aioserve.runners.cpu.threads",
                                 "aioserve.runners.gpu", "aioserve.runners.model"), ()),
    "aioserve.runners.cpu": ((), ()),
    "aioserve.runners.cpu.threads": ((), ("torch", "numpy")),
    "aioserve.runners.gpu": (("aioserve.runners.attention",), ()),
    "aioserve.dashboard": (("aioserve", "aioserve.engine", "aioserve.reports.stats"), ()),
    "aioserve.commands": (("aioserve", "aioserve.engine", "aioserve.bench",
                           "aioserve.bench.models", "aioserve.bench.online", "aioserve.deploy",
                           "aioserve.runners.attention", "aioserve.scheduling", "aioserve.server",
                           "aioserve.sim", "aioserve.reports", "aioserve.workloads",
                           "aioserve.routing",
                           "aioserve.runners.torch.runner",
                           "aioserve.runners.cpu.cpu_info", "aioserve.runners.cpu.native_dtypes"),
                          ("torch", "transformers")),
    "aioserve.bench": (("aioserve", "aioserve.engine", "aioserve.runners",
                        "aioserve.runners.torch", "aioserve.sim", "aioserve.bench.models",
                        "aioserve.workloads"), ()),
    "aioserve.bench.online": (("aioserve", "aioserve.engine", "aioserve.bench", "aioserve.sim",
                               "aioserve.workloads", "aioserve.reports"),
                              ("torch", "transformers", "matplotlib")),
    "aioserve.bench.models": (("aioserve", "aioserve.bench"), ()),
}

#: package -> what its ``__init__`` re-exports from below it (its public names).
REEXPORTS = {"aioserve": ("aioserve.engine",)}


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


def test_every_package_has_rules():
    assert sorted(RULES) == PACKAGES


def test_each_package_imports_only_what_its_rules_allow():
    wrong = []
    for name in MODULES:
        if not name.startswith("aioserve"):
            continue
        package = package_of(name)
        allowed = {package, *RULES[package][0]}
        if name == package:
            allowed.update(REEXPORTS.get(package, ()))
        found = GRAPH[name]
        for target in found.anywhere | found.type_checking:
            if target.startswith("aioserve") and not (
                    target in allowed or package_of(target) in allowed):
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_what_a_package_never_loads_at_module_level():
    wrong = []
    for package in PACKAGES:
        banned = RULES[package][1]
        for name in (n for n in MODULES if package_of(n) == package):
            for loaded in _loaded_at_import(name):
                hit = [b for b in banned if loaded == b or loaded.startswith(b + ".")]
                if hit:
                    wrong.append(f"{name} loads {loaded}")
    assert wrong == []


def _read_behind(name: str, kinds: tuple[str, ...], subject: str) -> list[str]:
    """``getattr``/``hasattr`` calls of ``kinds`` in module ``name`` on an object whose
    expression names ``subject`` (``self.runner``, ``engine.runner``, ``runner``)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in kinds and node.args
                and subject in ast.unparse(node.args[0]).lower()):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_runner_member_is_declared_on_the_boundary():
    """What the engine, the server and the lab use of a runner is declared on
    ``runners.base.ModelRunner``: no ``getattr``/``hasattr`` on a runner anywhere else."""
    wrong = [hit for name in MODULES if name != "aioserve.runners.base"
             for hit in _read_behind(name, ("getattr", "hasattr"), "runner")]
    assert wrong == []


def test_the_policy_contract_keeps_no_old_version_alive():
    """Contract 1.0: nothing in scheduling/ inspects a hook's signature or asks for a
    method that earlier versions had."""
    wrong = [f"{name}: {word}" for name, path in MODULES.items()
             if name.startswith("aioserve.scheduling")
             for word in ("choose_victim", "_takes_state", "inspect.signature(hook")
             if word in path.read_text()]
    assert wrong == []


def _room(package: str) -> str:
    """The room of a package: ``engine`` for ``aioserve.engine.x``, ``aioserve`` for the
    top-level modules, ``schedulers`` for the built-in policies."""
    parts = package.split(".")
    return parts[1] if parts[0] == "aioserve" and len(parts) > 1 else parts[0]


def test_the_architecture_doc_names_every_room():
    """docs/ARCHITECTURE.md's table of rooms names each room of the code, and no other."""
    table = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("## The rooms", 1)[1]
    rows = [line for line in table.split("\n## ", 1)[0].splitlines() if line.startswith("| `")]
    named = {row.split("`")[1].strip("/") for row in rows}
    assert named == {_room(p) for p in RULES} | {_room(package_of(n)) for n in MODULES}


def test_the_checker_sees_what_it_checks():
    """The rule's parts, on the real graph: function-level imports count, TYPE_CHECKING
    ones are seen apart, module-level loading is followed through other modules."""
    engine = GRAPH["aioserve.engine.async_engine"]
    assert "aioserve.runners.torch.runner" in engine.anywhere
    assert "aioserve.runners.torch.runner" not in engine.module_level
    prefix_cache = GRAPH["aioserve.engine.prefix_cache"]
    assert "aioserve.kv_cache" in prefix_cache.type_checking
    assert "aioserve.kv_cache" not in prefix_cache.anywhere
    assert "torch" in _loaded_at_import("aioserve.runners.torch.setup")
    assert "torch" not in _loaded_at_import("aioserve")
    assert "aioserve.engine.async_engine" in _loaded_at_import("aioserve")
