"""The repository stands alone: no file cites a document outside it (the product's spec or reference
notes that the project was built from); what users need is in docs/, in our own words."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile(r"\.\./" + "shared|/work/" + r"shared|(^|[^a-z_])(spec|reference)/[a-z-]+\." + "md")


def test_no_file_cites_a_path_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    citing = []
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary: weights, images, parquet
        citing += [
            f"{name.decode()}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line)
        ]
    assert not citing, "\n".join(citing)


def test_the_docs_shell_examples_run_programs_a_default_system_has() -> None:
    """A command substitution in an example (`$(uuidgen)` once) names a program on this machine's
    PATH (a plain Debian with Python): a reader pasting the example gets no 'command not found'."""
    missing = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for program in re.findall(r"\$\(\s*([A-Za-z0-9_.-]+)", line):
                if shutil.which(program) is None:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {program}")
    assert not missing, "\n".join(missing)


# docs/architecture.md names code; these rules keep every name it gives true.
PACKAGES = {
    "sdk/relay/": ROOT / "sdk/relay",
    "engine/relay_engine/": ROOT / "engine/relay_engine",
    "api/relay_api/": ROOT / "api/relay_api",
    "worker/relay_worker/": ROOT / "worker/relay_worker",
}
IMPORTS = {"relay": "sdk/relay", "relay_engine": "engine/relay_engine"}
IMPORTS |= {"relay_api": "api/relay_api", "relay_worker": "worker/relay_worker"}
PATH_REFERENCE = re.compile(r"^((?:[\w.-]+/)*[\w-]+\.py)(?::([A-Za-z_][\w.]*))?$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
FILE_NAME = re.compile(r"\.(json|jsonl|md|toml|safetensors|txt|ya?ml|sh|ini|cfg|parquet|png)$")
# A bare CamelCase name (`LeaseKeeper`) is a class or name of the packages, but for these.
CAMEL_CASE = re.compile(r"^[A-Z]\w*[a-z]\w*$")
NOT_OURS = frozenset({"None", "True", "False", "Range"})
MODULE_ROW = re.compile(r"^\| `([\w/]+)` \| (.*) \|$")
TABLE_HEAD = re.compile(r"^\| `((?:sdk|engine|api|worker)/\w+/)` \| what it does \|$")


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines: functions, classes and assignments, also those
    under a module-level `if` or `try` (imports do not count)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, (ast.If, ast.Try)):
            inner = node.body + node.orelse + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            names |= _defined(inner)
    return names


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _all_classes() -> dict[str, list[ast.ClassDef]]:
    classes: dict[str, list[ast.ClassDef]] = {}
    for root in PACKAGES.values():
        for path in root.rglob("*.py"):
            for node in ast.walk(_tree(path)):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, []).append(node)
    return classes


def _has(scope: ast.AST, dotted: list[str], classes: dict[str, list[ast.ClassDef]]) -> bool:
    """Whether `a.b.c` is defined in a module, class or function body; a class's methods may
    come from a base class of the four packages (by name)."""
    if not dotted:
        return True
    names = _defined(getattr(scope, "body", []))
    if dotted[0] in names:
        return _has(names[dotted[0]], dotted[1:], classes)
    if isinstance(scope, ast.ClassDef):
        for base in scope.bases:
            base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            for parent in classes.get(base_name, []):
                if parent is not scope and _has(parent, dotted, classes):
                    return True
    return False


def _file_of(reference: str) -> Path | None:
    """A path from the repository root; else the one file of the four packages whose path ends
    with it (`fine_tune.py`, `pi05/family.py`); None when there is none, or more than one."""
    if (ROOT / reference).is_file():
        return ROOT / reference
    found = [path for root in PACKAGES.values() for path in root.rglob("*.py") if path.match(reference)]
    return found[0] if len(found) == 1 else None


def _module_of(dotted: list[str]) -> tuple[Path, list[str]] | None:
    """`relay_engine.core.loop.run_loop` → (engine/relay_engine/core/loop.py, [run_loop])."""
    for cut in range(len(dotted), 0, -1):
        parts = [IMPORTS[dotted[0]], *dotted[1:cut]]
        for path in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
            if path.is_file():
                return path, dotted[cut:]
    return None


def _exported(tree: ast.Module) -> set[str]:
    """What `import module; module.name` finds: its definitions, its imports, and the names it
    loads on first use (the strings of `_PUBLIC` / `__all__`)."""
    names = set(_defined(tree.body))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def _names_anywhere() -> set[str]:
    """Every name the four packages define, at any depth (classes, functions, assignments)."""
    names = set()
    for root in PACKAGES.values():
        for path in root.rglob("*.py"):
            for node in ast.walk(_tree(path)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return names


class _Code:
    """The four packages, as the code map's references are looked up in them."""

    def __init__(self) -> None:
        self.classes = _all_classes()
        self.names = _names_anywhere()
        self.modules: dict[str, list[Path]] = {}
        for root in PACKAGES.values():
            for path in root.rglob("*.py"):
                # A package is named by its folder (`families.family_for`).
                stem = path.parent.name if path.stem == "__init__" else path.stem
                self.modules.setdefault(stem, []).append(path)

    def problem(self, span: str) -> str | None:
        """Why a backticked span names nothing, or None (also for what is not ours)."""
        if match := PATH_REFERENCE.match(span):
            return self._path_problem(match[1], match[2])
        if CAMEL_CASE.match(span) and span not in NOT_OURS and span not in self.names:
            return "no class or name of the packages is called so"
        if not DOTTED.match(span) or FILE_NAME.search(span):
            return None
        head, *rest = span.split(".")
        if head in IMPORTS:
            return self._import_problem(span.split("."))
        if head in self.modules:
            if not any(_has(_tree(path), rest, self.classes) for path in self.modules[head]):
                return f"not defined in any module named {head}"
            return None
        if head in self.classes:
            if not any(_has(node, rest, self.classes) for node in self.classes[head]):
                return f"not defined in any class named {head}"
            return None
        if head[0].isupper():
            return f"no class of the packages is named {head}"
        return None  # not ours (torch.distributed.run, os.replace): skipped

    def _path_problem(self, file: str, name: str | None) -> str | None:
        path = _file_of(file)
        if path is None:
            return "no such file (or more than one)"
        if name and not _has(_tree(path), name.split("."), self.classes):
            return f"{name} is not defined in {path.relative_to(ROOT)}"
        return None

    def _import_problem(self, dotted: list[str]) -> str | None:
        found = _module_of(dotted)
        if found is None:
            return "no such module"
        tree, name = _tree(found[0]), found[1]
        if name and name[0] not in _exported(tree):
            return "no such name in that module"
        if len(name) > 1 and not _has(tree, name, self.classes):
            return "no such name in that module"
        return None


def _stale_references(text: str) -> list[str]:
    code = _Code()
    return [
        f"docs/architecture.md:{number}: `{span}`: {problem}"
        for number, line in enumerate(text.splitlines(), 1)
        for span in re.findall(r"`([^`\s]+)`", line)
        if (problem := code.problem(span))
    ]


def _module_tables(text: str) -> dict[str, dict[str, str]]:
    """§8's tables: package folder → {module path without .py: its line}."""
    tables: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        if head := TABLE_HEAD.match(line):
            current = tables.setdefault(head[1], {})
        elif current is not None and (row := MODULE_ROW.match(line)):
            current[row[1]] = row[2]
        elif not line.startswith("|"):
            current = None
    return tables


ARCHITECTURE = ROOT / "docs/architecture.md"


def test_the_code_map_names_only_code_that_exists() -> None:
    """Every backticked reference on docs/architecture.md names something the code defines:

    - `path.py`, `path.py:name`, `path.py:Class.method`: the file exists (from the repository root,
      or the one file of the four packages whose path ends so: `fine_tune.py`, `pi05/family.py`)
      and defines the name (a function, class, method or assignment; a method may be a base
      class's);
    - `relay_engine.core.loop.run_loop` (an import path): the module exists and defines or
      imports the name;
    - `module.name` (`fine_tunes.check_memory`, `families.family_for`): some module (or package)
      of the four of that name defines it; `Class.method`: some class of that name defines it;
      a capitalised first part must be a class of the packages;
    - a bare CamelCase name (`LeaseKeeper`) is defined somewhere in the packages.

    Not checked: other dotted names (`torch.distributed.run`, `os.replace`), file names of other
    kinds (`norm_stats.json`), bare lower-case names (columns, settings: `lease_until`)."""
    stale = _stale_references(ARCHITECTURE.read_text())
    assert not stale, "\n".join(stale)


def test_the_code_map_lists_every_module_once() -> None:
    """§8 has one row per module of the four packages, none missing or left over, and the
    backticked names on a row are defined in (or imported into) that module."""
    tables = _module_tables(ARCHITECTURE.read_text())
    assert sorted(tables) == sorted(PACKAGES)
    wrong = []
    for folder, root in PACKAGES.items():
        have = {str(path.relative_to(root).with_suffix("")) for path in root.rglob("*.py")}
        listed = set(tables[folder])
        wrong += [f"{folder}{name}.py: no row" for name in sorted(have - listed)]
        wrong += [f"{folder}{name}: no such module" for name in sorted(listed - have)]
        for name, description in tables[folder].items():
            if name not in have:
                continue
            known = _exported(_tree(root / f"{name}.py"))
            for span in re.findall(r"`([A-Za-z_]\w*)`", description):
                if span not in known:
                    wrong.append(f"{folder}{name}: `{span}` is not defined there")
    assert not wrong, "\n".join(wrong)
