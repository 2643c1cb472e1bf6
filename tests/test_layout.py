"""Packages import downward only (README.md, "Layout"; docs/architecture.md): every import in
relax/, at module level or inside a function, read from the source (nothing is imported), is
checked against the layers below. A test of the checker itself plants an upward import.

No module imports itself around a loop (:func:`import_cycles`).

The rollout's sub-packages (generation/, prompts/, reward/, agents/, backends/) and the
fully-asynchronous package (trainer/fully_async/) are checked where they exist, so the same
test holds on the flat layout the layout codemod starts from.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules directly in relax/ that sit on top (commands), not at the bottom.
COMMANDS = {"relax.cli", "relax.__main__", "relax.plotting"}

# (importer, imported it must not reach, why): prefixes of dotted module names.
RULES = [
    ("relax.config", "relax.algorithms", "config/ is below algorithms/"),
    ("relax.config", "relax.rollout", "config/ names what rollout/ implements, never imports it"),
    ("relax.metrics", "relax.rollout", "metrics/ is below rollout/"),
    ("relax.algorithms", "relax.rollout", "the algorithm core is pure tensor math"),
    ("relax.rollout", "relax.trainer", "rollout/ is below trainer/"),
    ("relax.rollout", "relax.eval", "rollout/ is below eval/"),
    ("relax.eval", "relax.trainer", "eval/ is below trainer/"),
    *[(low, high, "config/, metrics/, algorithms/ are below trainer/ and eval/")
      for low in ("relax.config", "relax.metrics", "relax.algorithms")
      for high in ("relax.trainer", "relax.eval")],
    *[(low, "relax.cli", "cli.py is over everything")
      for low in ("relax.config", "relax.metrics", "relax.algorithms", "relax.rollout",
                  "relax.eval", "relax.trainer")],
]

# Below everything the rollout side of a step uses (lowest first); backends/ uses generation/.
ROLLOUT_ORDER = ["generation", "prompts", "reward", "agents"]


def _layout_rules(root: Path) -> list[tuple[str, str, str]]:
    """The rules of the sub-packages that exist under ``root``."""
    rollout = root / "relax" / "rollout"
    subs = sorted(p.name for p in rollout.iterdir() if (p / "__init__.py").is_file()) \
        if rollout.is_dir() else []
    rules = []
    if subs:
        tops = [p.stem for p in rollout.glob("*.py") if p.stem != "__init__"]
        for sub in subs:
            rules += [(f"relax.rollout.{sub}", f"relax.rollout.{top}",
                       "a rollout sub-package is below the collectors and the assembly")
                      for top in tops]
        ranks = {name: i for i, name in enumerate(ROLLOUT_ORDER)}
        for low in subs:
            for high in subs:
                above = (low in ranks and high in ranks and ranks[high] > ranks[low]) or \
                    (low != "backends" and high == "backends") or \
                    (low == "backends" and high in ranks and high != "generation")
                if above:
                    rules.append((f"relax.rollout.{low}", f"relax.rollout.{high}",
                                  f"rollout/{low}/ is below rollout/{high}/"))
        base = [f"relax.{p.stem}" for p in (root / "relax").glob("*.py")
                if f"relax.{p.stem}" not in COMMANDS | {"relax.__init__"}]
        rules += [(b, f"relax.{pkg}", "the modules directly in relax/ are the bottom layer")
                  for b in base for pkg in ("rollout", "trainer", "eval", "algorithms")]
    if (root / "relax" / "trainer" / "fully_async" / "__init__.py").is_file():
        rules += [("relax.trainer.fully_async", f"relax.trainer.{root_module}",
                   "fully_async/ is below the trainer's composition roots")
                  for root_module in ("loop", "launch", "build")]
    return rules


def _name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``path``; ``from p import m`` also yields
    ``p.m``, since m may be a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _name(root, path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def upward_imports(root: Path) -> list[str]:
    """One line per import under ``root``/relax that breaks a rule: file:line, what, why."""
    rules = RULES + _layout_rules(root)
    found: dict[str, str] = {}  # the first broken rule of each import statement
    for path in sorted((root / "relax").rglob("*.py")):
        importer = _name(root, path)
        for line, imported in _imports(root, path):
            where = f"{path.relative_to(root)}:{line}"
            for low, high, why in rules:
                if where not in found and _under(importer, low) and _under(imported, high):
                    found[where] = f"{where}: {importer} imports {imported} ({why})"
    return sorted(found.values())


def test_packages_import_downward_only():
    assert upward_imports(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_an_upward_import_is_named_with_its_line(tmp_path):
    root = _tree(tmp_path, {
        "relax/__init__.py": "", "relax/errors.py": "",
        "relax/rollout/__init__.py": "",
        "relax/rollout/collectors.py": "from relax.errors import InputError\n\n\n"
                                       "def f():\n    from relax.trainer import loop\n",
        "relax/trainer/__init__.py": "",
        "relax/trainer/loop.py": "import relax.rollout.collectors\n",
    })
    assert upward_imports(root) == [
        "relax/rollout/collectors.py:5: relax.rollout.collectors imports relax.trainer "
        "(rollout/ is below trainer/)"]


def test_sub_packages_are_checked_where_they_exist(tmp_path):
    root = _tree(tmp_path, {
        "relax/__init__.py": "", "relax/models.py": "from relax.rollout import collectors\n",
        "relax/rollout/__init__.py": "", "relax/rollout/collectors.py": "",
        "relax/rollout/generation/__init__.py": "",
        "relax/rollout/generation/decode.py": "from ..reward import score\n",
        "relax/rollout/reward/__init__.py": "",
        "relax/rollout/reward/score.py": "from relax.rollout.collectors import X\n"
                                         "from relax.rollout.generation import decode\n",
        "relax/rollout/backends/__init__.py": "",
        "relax/rollout/backends/vllm/__init__.py": "",
        "relax/rollout/backends/vllm/client.py": "from relax.rollout.generation import decode\n",
        "relax/trainer/__init__.py": "", "relax/trainer/loop.py": "",
        "relax/trainer/fully_async/__init__.py": "",
        "relax/trainer/fully_async/remote.py": "from relax.trainer.loop import T\n",
    })
    found = upward_imports(root)
    assert [line.split(": ")[0] for line in found] == [
        "relax/models.py:1",  # the bottom layer reaching rollout/
        "relax/rollout/generation/decode.py:1",  # a relative import, upward
        "relax/rollout/reward/score.py:1",  # a sub-package importing the collectors
        "relax/trainer/fully_async/remote.py:1",
    ]


def _module_imports(root: Path, path: Path, modules) -> set[str]:
    """The relax modules ``path`` imports (``modules``: every module's dotted name).
    ``from package import module`` imports the module; the package's ``__init__`` counts only
    when a name is taken from it."""
    found = set()
    for line, name in _imports(root, path):
        found.add((line, name))
    out = set()
    by_line: dict[int, set[str]] = {}
    for line, name in found:
        by_line.setdefault(line, set()).add(name)
    for names in by_line.values():
        modules_here = {n for n in names if n in modules}
        # a package whose every sub-name here is a module of its own was only a path
        out.update(n for n in modules_here
                   if not any(m.startswith(n + ".") for m in names)
                   or any(m.startswith(n + ".") and m not in modules for m in names))
    return out


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of relax/ modules that import each other, directly or around a loop (Tarjan's
    strongly connected components over every import, module level or in a function)."""
    paths = {_name(root, p): p for p in (root / "relax").rglob("*.py")}
    graph = {m: sorted(_module_imports(root, p, paths) - {m}) for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def test_no_import_cycles():
    assert import_cycles(ROOT) == []


def test_an_import_cycle_is_found(tmp_path):
    root = _tree(tmp_path, {
        "relax/__init__.py": "", "relax/a.py": "from relax import b\n",
        "relax/b.py": "def f():\n    from relax.c import x\n", "relax/c.py": "import relax.a\n",
        "relax/d.py": "from relax import a\n",
    })
    assert import_cycles(root) == [["relax.a", "relax.b", "relax.c"]]
# The composition roots: the only functions outside config/ that may read the whole
# configuration; everything below them takes its sections (STYLE.md, "Avoid passing the
# whole config into math functions").
WHOLE_CONFIG_LIMIT = 10


def whole_config_functions(root: Path) -> list[str]:
    """``file:line name`` of every function outside relax/config/ with a ``cfg`` or
    ``config`` parameter."""
    found = []
    for path in sorted((root / "relax").rglob("*.py")):
        if (root / "relax" / "config") in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
                if names & {"cfg", "config"}:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


def test_few_functions_take_the_whole_configuration():
    found = whole_config_functions(ROOT)
    assert len(found) <= WHOLE_CONFIG_LIMIT, "\n".join(found)
