"""The package's architecture, read from its source with ``ast``: layered imports (no cycle, no
import hidden in a function), no private names shared across modules, and a docstring on every
public function and class."""

from __future__ import annotations

import ast
import re
import importlib
import inspect
from pathlib import Path

PACKAGE = "numpyro_sg"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    """``{module name: (path, parsed source)}`` of every module of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        out[_module_name(path)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


SOURCES = _sources()
MODULES = set(SOURCES)


def _is_package(module: str) -> bool:
    return SOURCES[module][0].name == "__init__.py"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imported_from(module: str, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from … import …`` in ``module`` reads from (None if outside)."""
    if node.level == 0:
        base = node.module or ""
    else:
        package = module if _is_package(module) else module.rpartition(".")[0]
        parts = package.split(".")
        if node.level > 1:
            parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return base if base == PACKAGE or base.startswith(PACKAGE + ".") else None


def _imports(module: str, node: ast.AST) -> list[tuple[str, str | None]]:
    """``(target module, imported name or None)`` for each package module ``node`` imports.

    ``import numpyro_sg.x`` and ``from numpyro_sg import x`` (x a submodule) target
    ``numpyro_sg.x``; ``from numpyro_sg.x import y`` targets ``numpyro_sg.x`` (or the submodule
    ``numpyro_sg.x.y``); ``import numpyro_sg`` targets the package ``__init__``.  Parent
    packages run on the way are not counted.
    """
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                out.append((alias.name, None))
    elif isinstance(node, ast.ImportFrom):
        base = _imported_from(module, node)
        if base is not None:
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, None) if sub in MODULES else (base, alias.name))
    return out


def _graph() -> dict[str, set[str]]:
    """Module-level import edges between the package's modules."""
    graph = {m: set() for m in MODULES}
    for module, (_, tree) in SOURCES.items():
        for stmt in tree.body:
            for target, _name in _imports(module, stmt):
                if target != module:
                    graph[module].add(target)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle ``[a, b, …, a]`` of ``graph``, or None (iterative depth-first search)."""
    state = {m: 0 for m in graph}  # 0 new, 1 on the current path, 2 done
    for root in sorted(graph):
        if state[root]:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt, 2) == 1:
                return path[path.index(nxt):] + [nxt]
            elif state.get(nxt, 2) == 0:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def _nested_imports(tree: ast.Module):
    """Import statements that are not directly in the module body (in a def, class, if, try…)."""
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            yield node


def _module_aliases(module: str, tree: ast.Module) -> dict[str, str]:
    """Local names bound to package modules (``import numpyro_sg.x as m``, ``from numpyro_sg
    import x``), mapped to the module."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases[alias.name.split(".")[0]] = PACKAGE
        elif isinstance(node, ast.ImportFrom):
            for target, name in _imports(module, node):
                if name is None:
                    local = next(a.asname or a.name for a in node.names if target.endswith("." + a.name))
                    aliases[local] = target
    return aliases


def test_no_import_cycle_between_package_modules():
    graph = _graph()
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_function_level_import_of_package_modules():
    found = []
    for module, (path, tree) in sorted(SOURCES.items()):
        for node in _nested_imports(tree):
            if _imports(module, node):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "imports of numpyro_sg modules below module level:\n" + "\n".join(found)


def test_no_private_name_imported_from_another_module():
    found = []
    for module, (path, tree) in sorted(SOURCES.items()):
        where = path.relative_to(ROOT.parent)
        for node in ast.walk(tree):
            for target, name in _imports(module, node) if isinstance(node, ast.ImportFrom) else ():
                if name is not None and _is_private(name) and target != module:
                    found.append(f"{where}:{node.lineno}: {name} from {target}")
        aliases = _module_aliases(module, tree)
        for node in ast.walk(tree):
            # m._private, numpyro_sg.x._private through an imported module
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                chain, value = [node.attr], node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    found.append(f"{where}:{node.lineno}: {value.id}.{'.'.join(reversed(chain))}")
    assert not found, "private names used across numpyro_sg modules:\n" + "\n".join(found)


def _own_doc(obj) -> str | None:
    """The object's own docstring (a class does not inherit one from its bases here)."""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__")
        return inspect.cleandoc(doc) if isinstance(doc, str) else None
    return inspect.getdoc(obj)


def _public_names(module: str, mod) -> list[str]:
    """The public functions and classes defined in ``module`` (not imported into it), and the
    names of its ``__all__``."""
    defined = {name for name, obj in vars(mod).items()
               if not name.startswith("_") and (inspect.isclass(obj) or callable(obj))
               and getattr(obj, "__module__", None) == module}
    return sorted(defined | set(getattr(mod, "__all__", ())))


def test_every_public_function_and_class_has_a_docstring():
    missing = []
    for module in sorted(MODULES):
        mod = importlib.import_module(module)
        for name in _public_names(module, mod):
            if not hasattr(mod, name):
                missing.append(f"{module}.{name} (in __all__ but not defined)")
                continue
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or callable(obj)) and not (_own_doc(obj) or "").strip():
                missing.append(f"{module}.{name}")
    assert not missing, "public functions/classes without a docstring:\n" + "\n".join(missing)


#: the most names the package exports in all its ``__all__`` lists together: what users call is
#: exported (the top level and the modules the docs import from), helpers are not
MAX_PUBLIC_NAMES = 250


def test_the_public_surface_stays_small():
    counts = {module: len(getattr(importlib.import_module(module), "__all__", ())) for module in sorted(MODULES)}
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    assert total <= MAX_PUBLIC_NAMES, f"{total} names in __all__ lists (at most {MAX_PUBLIC_NAMES}); largest: {largest}"


# -- the layout: layers, sizes, user-facing text --------------------------------------------------
#: what each part of the package may import from the others (subpackage or top-level module):
#: infer is the bottom layer (model tracing, mini-batching, preconditioning, Laplace, warmup);
#: diagnostics and spike_slab read models through it; kernels stand on the three; results,
#: tuning and datasets sit on top; the package ``__init__`` and the command line see everything.
LAYERS = {
    "version": set(),
    "arviz_compat": set(),  # the ArviZ 0.x / 1.x differences, used wherever runs are read
    "infer": {"version"},
    "spike_slab": {"infer"},
    "locals": {"infer", "arviz_compat"},
    "diagnostics": {"infer", "arviz_compat"},
    "kernels": {"infer", "spike_slab", "diagnostics", "locals"},
    "results": {"infer", "spike_slab", "diagnostics", "version", "locals", "arviz_compat"},
    "datasets": {"kernels", "arviz_compat"},
    "tuning": {"infer", "diagnostics", "kernels", "results", "locals", "arviz_compat"},
    "cli": {"datasets", "kernels", "results", "diagnostics", "version", "__init__", "arviz_compat"},
    "__init__": None,  # anything
}
#: the most lines a module may have
MAX_MODULE_LINES = 400
#: the most lines a function may have unless its docstring says why ("Long because …")
MAX_FUNCTION_LINES = 60


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_part_imports_only_from_the_layers_below_it():
    unknown = sorted({_part(m) for m in MODULES} - set(LAYERS))
    assert not unknown, f"parts of the package with no layer in LAYERS: {unknown}"
    found = []
    for module, targets in sorted(_graph().items()):
        allowed = LAYERS[_part(module)]
        for target in sorted(targets):
            if allowed is not None and _part(target) != _part(module) and _part(target) not in allowed:
                found.append(f"{module} imports {target}")
    assert not found, "imports against the layering:\n" + "\n".join(found)


def test_modules_are_short():
    long = [f"{path.relative_to(ROOT.parent)}: {n} lines" for path, _ in SOURCES.values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_long_functions_say_why():
    found = []
    for path, tree in SOURCES.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and "Long because" not in (ast.get_docstring(node) or ""):
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}: {n} lines")
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines whose docstring does not say "
                       "why ('Long because …'):\n" + "\n".join(found))


def test_no_stack_walking_private_numpyro_api_or_prints():
    """Kernels never look for their MCMC on the call stack nor patch NumPyro's private methods,
    and the library never prints (the command line and plots aside)."""
    found = []
    for module, (path, tree) in sorted(SOURCES.items()):
        where = path.relative_to(ROOT.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("_getframe", "f_back", "f_locals"):
                found.append(f"{where}:{node.lineno}: {node.attr}")
            if (isinstance(node, ast.Attribute) and _is_private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id in ("mcmc", "MCMC")):
                found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
                    and _part(module) != "cli"):
                found.append(f"{where}:{node.lineno}: print")
    assert not found, "\n".join(found)


def test_user_facing_text_cites_no_internal_document():
    """Docstrings, docs, the README, the tests and the benchmarks cite papers by authors, year
    and title, never the project's internal documents (a design spec, numbered paper files,
    issue numbers)."""
    pattern = re.compile(r"SPEC|(?i:(paper|slides) 00\d)|(?i:issue #?\d)")
    files = [p for p in ROOT.rglob("*.py")]
    for folder in ("examples", "tests", "benchmarks"):
        files += [p for p in (ROOT.parent / folder).rglob("*.py") if p != Path(__file__).resolve()]
    files += list((ROOT.parent / "docs").glob("*.md")) + [ROOT.parent / "README.md"]
    found = [f"{p.relative_to(ROOT.parent)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_importing_the_package_starts_no_jax_backend():
    """Users (and the multi-device recipes) set XLA_FLAGS or jax.config after ``import
    numpyro_sg``: a module-level JAX computation would start the backend with one device."""
    import os
    import subprocess
    import sys

    code = ("import os, numpyro_sg, jax; "
            "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'; "
            "print(jax.local_device_count())")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT.parent, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "3"
