"""The rules of the code's shape, kept by a test rather than by memory: no private name is
imported across modules (tests included), no function is over 60 lines and no module over
500, no import cycle among the packages' modules (function-local imports count), and the
contract between parent and cell imports only the standard library. The package layers
themselves are import-linter's contracts (pyproject.toml), run by `make test`."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "arms", "harness", "reports")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def _modules(roots=(*PACKAGES, "tests")) -> dict[str, Path]:
    found = {}
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, without what is imported only for annotations."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    return tree


def _source(module: str, node: ast.ImportFrom) -> str | None:
    """The module an ImportFrom names, relative imports resolved."""
    if not node.level:
        return node.module
    package = module.split(".")
    if MODULES[module].name != "__init__.py":
        package = package[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join([*package, *([node.module] if node.module else [])])


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(imported project module, the name taken from it or None) of every import in
    `module`, at any depth."""
    found = []
    for node in ast.walk(_tree(MODULES[module])):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _source(module, node)
            found += [(source, a.name) for a in node.names if source]
    return [(m, name) for m, name in found if m.split(".")[0] in (*PACKAGES, "tests")]


def test_no_private_name_is_imported_from_another_module():
    crossing = [f"{module} imports {name} from {source}"
                for module in MODULES for source, name in _imports(module)
                if name and name.startswith("_") and not name.startswith("__")
                and source != module]
    assert crossing == []


def test_no_function_is_over_60_lines_and_no_module_over_500():
    long_functions, long_modules = [], []
    for module, path in _modules(PACKAGES).items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            long_modules.append(f"{module}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{module}.{node.name}: {length} lines")
    assert (long_functions, long_modules) == ([], [])


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth (a `from package import
    module` counts as the module)."""
    graph = {}
    for module in _modules(PACKAGES):
        edges = set()
        for source, name in _imports(module):
            target = f"{source}.{name}" if name and f"{source}.{name}" in MODULES else source
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_counting_function_local_imports():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_contract_imports_only_the_standard_library():
    tree = _tree(MODULES["harness.contract"])
    imported = {a.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


@pytest.mark.parametrize("module", ["harness.cli", "harness.contract", "harness.system.reaper",
                                    "harness.grid.suites"])
def test_modules_started_first_import_no_third_party_package(module):
    """The command line (its --help, its one-line errors, a Ctrl-C as it starts), the
    contract, the reaper and the suites load in milliseconds: a process that imports them
    imports no third-party package (JAX, numpy, pandas); what a command needs it imports
    when it runs."""
    probe = ("import importlib, sys; before = set(sys.modules); "
             f"importlib.import_module({module!r}); "
             "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - "
             "set(sys.stdlib_module_names) - {'harness'}))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
