"""No import loops between files of bench/, controlplane/, dashboards/ or inference/, nor between their folders at any
depth; every module imports only its own layer and those below it (LAYERS); inference/ never imports Django, and the
control plane's core never imports a feature app (rollouts, capacity, autoscaling, alerting).

The graph is read from the source (ast), so an import hidden inside a function counts like one at the top: a loop
is a design smell to remove, not to hide. A package's __init__ is a node of its own (importing a package imports
its __init__)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "controlplane", "dashboards", "inference")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """module → the modules of PACKAGES it imports (anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(_resolve(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    deps.add(full if full in modules else _resolve(source, modules))
        deps.discard(None)
        deps.discard(module)
        graph[module] = deps
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; returns the components of more than one module (the loops)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    loops.append(sorted(component))
    return loops


def test_there_is_no_import_loop_between_files():
    graph = import_graph()
    loops = strongly_connected(graph)
    described = ["\n".join(f"  {m} -> {sorted(graph[m] & set(loop))}" for m in loop) for loop in loops]
    assert not loops, "import loops:\n" + "\n\n".join(described)


def test_the_loop_finder_finds_a_loop_and_accepts_a_tree():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def _folder(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth])


def folder_graph(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph with each module collapsed into its folder `depth` names deep: at depth 2
    controlplane.tenants.usage_api and controlplane.tenants.api are both controlplane.tenants, and an import between
    two modules is one between their folders. A module no deeper than `depth` stays itself, so a folder is also
    checked against the modules beside it (controlplane.selectors beside controlplane.tenants)."""
    collapsed: dict[str, set[str]] = {}
    for module, deps in graph.items():
        collapsed.setdefault(_folder(module, depth), set()).update(_folder(dep, depth) for dep in deps)
        for dep in deps:
            collapsed.setdefault(_folder(dep, depth), set())
    for node, deps in collapsed.items():
        deps.discard(node)
    return collapsed


def folder_loops(graph: dict[str, set[str]]) -> list[str]:
    """Each loop between folders, at every depth, with one file import that makes each of its arrows."""
    found = []
    for depth in range(1, max(module.count(".") for module in graph) + 1):
        for loop in strongly_connected(folder_graph(graph, depth)):
            witness: dict[tuple[str, str], str] = {}
            for module, dep in sorted((module, dep) for module, deps in graph.items() for dep in deps):
                arrow = (_folder(module, depth), _folder(dep, depth))
                if arrow[0] != arrow[1] and set(arrow) <= set(loop):
                    witness.setdefault(arrow, f"{module} -> {dep}")
            found.append(f"depth {depth}: {loop}\n" + "\n".join(f"  {a} -> {b}  ({why})"
                                                             for (a, b), why in sorted(witness.items())))
    return found


def test_there_is_no_import_loop_between_folders():
    """Two folders that import each other through different files (tenants/usage_api.py → observability,
    observability/store.py → tenants) are the smell of a file loop a level up: neither can be read, tested or moved
    without the other. Every depth: apps of the control plane, the folders inside an app, sim/ inside the worker."""
    loops = folder_loops(import_graph())
    assert not loops, "import loops between folders:\n" + "\n\n".join(loops)


def test_the_folder_check_finds_a_loop_that_no_two_files_make():
    # p/a/x.py → p/b/y.py and p/b/z.py → p/a/w.py: no file loop, but p/a and p/b import each other.
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": set(), "p.b.z": {"p.a.w"}, "p.a.w": set(), "p.c": {"p.a.x"}}
    assert strongly_connected(graph) == []
    assert folder_graph(graph, 2) == {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}
    assert strongly_connected(folder_graph(graph, 2)) == [["p.a", "p.b"]]
    assert folder_loops(graph) == ["depth 2: ['p.a', 'p.b']\n  p.a -> p.b  (p.a.x -> p.b.y)\n"
                                   "  p.b -> p.a  (p.b.z -> p.a.w)"]
    # A folder and a module beside it (p/f.py ↔ p/a/), and a tree, which has none.
    assert strongly_connected(folder_graph({"p.f": {"p.a.x"}, "p.a.y": {"p.f"}}, 2)) == [["p.a", "p.f"]]
    assert folder_loops({"p.a.x": {"p.b.y", "p.f"}, "p.b.y": {"p.f"}, "p.f": set()}) == []


def test_inference_never_imports_django():
    for path in (ROOT / "inference").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("django", "rest_framework", "controlplane", "dashboards", "celery")), \
                    f"{path.relative_to(ROOT)} imports {name}"


def _imported_names(path: Path, root: Path = ROOT) -> list[str]:
    """The absolute module names a file imports, anywhere in it (relative imports resolved against its package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]  # a package's __init__ and its modules resolve "." alike
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            names.append(".".join(base + ([node.module] if node.module else [])))
    return names


PURE_PACKAGE = "controlplane.capacity.sizing"
NOT_PURE = ("django", "rest_framework", "celery", "controlplane", "dashboards", "inference")
# Pure modules of the data plane the capacity model shares: the one stage-cost format, and the checks it uses.
PURE_SHARED = ("inference.stage_costs", "inference.checks")


def _impure_imports(root: Path) -> list[str]:
    """'file imports name' for each import of PURE_PACKAGE's files that leaves it for Django or the project."""
    found = []
    for path in sorted((root / PURE_PACKAGE.replace(".", "/")).rglob("*.py")):
        for name in _imported_names(path, root):
            if name != PURE_PACKAGE and not name.startswith(PURE_PACKAGE + ".") and name.startswith(NOT_PURE) \
                    and name not in PURE_SHARED:
                found.append(f"{path.relative_to(root)} imports {name}")
    return found


def test_the_capacity_model_imports_neither_django_nor_the_rest_of_the_control_plane():
    """controlplane/capacity/sizing/ is the pure half of capacity: values in, values out; rows, series and settings
    belong to the capacity selectors and services."""
    modules = {p.stem for p in (ROOT / PURE_PACKAGE.replace(".", "/")).glob("*.py")}
    assert modules >= {"curves", "calibration", "simulation", "search", "windows"}
    assert _impure_imports(ROOT) == []


def test_the_purity_check_sees_relative_and_hidden_imports(tmp_path):
    package = tmp_path / PURE_PACKAGE.replace(".", "/")
    package.mkdir(parents=True)
    (package / "ok.py").write_text("import math\nfrom . import curves\nfrom .simulation import simulate\n")
    (package / "bad.py").write_text("from ..models import Profile\n\ndef f():\n    import django.db\n")
    assert _impure_imports(tmp_path) == ["controlplane/capacity/sizing/bad.py imports controlplane.capacity.models",
                                         "controlplane/capacity/sizing/bad.py imports django.db"]


# The core of the control plane, and the feature apps built on it: the core exposes what a feature needs to plug in
# (e.g. controlplane.rollout_provider, filled in by the rollouts app) and never imports one.
CORE = ("controlplane.models", "controlplane.services", "controlplane.selectors", "controlplane.supervision",
        "controlplane.api", "controlplane.agent", "controlplane.run")
FEATURES = ("controlplane.rollouts", "controlplane.capacity", "controlplane.autoscaling", "controlplane.alerting",
            "controlplane.tenants", "controlplane.chaos")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def test_the_core_never_imports_a_feature_app():
    graph = import_graph()
    assert {"controlplane.selectors", "controlplane.supervision.reconcile"} <= set(graph)
    upward = [f"  {module} -> {dep}" for module in sorted(graph) if _within(module, CORE)
              for dep in sorted(graph[module]) if _within(dep, FEATURES)]
    assert not upward, "the core imports a feature app:\n" + "\n".join(upward)


# The layers, lowest first: a module imports its own layer and those below it, never one above. Each says why it sits
# where it does. A module belongs to the longest entry that names it or a package above it.
LAYERS = (
    (("inference",), "the data plane: a GPU host runs it without the control plane"),
    (("controlplane.lib", "controlplane.errors", "controlplane.settings", "controlplane.settings_fleet",
      "controlplane.celery"), "what every app builds on: helpers of no app, the one domain error, settings, Celery"),
    (("controlplane.models", "controlplane.rollout_provider", "controlplane.tenant_provider",
      "controlplane.change_gate"),
     "the core's state, and the seams through which feature apps answer the core's questions"),
    (("controlplane.selectors", "controlplane.services", "controlplane.auth", "controlplane.revision_diff"),
     "every read and write of the core's state (one service per verb), roles and tokens"),
    (("controlplane.api",), "the REST plumbing every app's API builds on, and the core's own thin views"),
    (("controlplane.agent", "controlplane.run"), "the node agent and `make run`: carry out starts and stops"),
    (("controlplane.tenants",), "tenants, their keys and usage rows, which the scrape writes through this app"),
    (("controlplane.observability",), "scrape, series, the control plane's own /metrics and /healthz: what all read"),
    (("controlplane.supervision",), "decides restarts from the health it probes; records its passes' durations"),
    (("controlplane.capacity",), "profiles, the planner, schedules and predictive floors: the autoscaler's bounds"),
    (("controlplane.autoscaling",), "the per-pool autoscaler, within capacity's bounds, on the series"),
    (("controlplane.alerting",), "rules on the series, acting through the services; notification channels"),
    (("controlplane.rollouts",), "canary and A/B rollouts judged on the series, notifying through alerting"),
    (("controlplane.chaos",), "faults through the agent, judged as rollouts judge a revision"),
    (("controlplane.replay",), "replays recorded traffic through a simulation of the fleet before a change"),
    (("controlplane", "controlplane.apps", "controlplane.admin", "controlplane.urls", "controlplane.wsgi",
      "controlplane.management"), "the wiring that names every app: app configs, URLs, admin, commands"),
    (("dashboards",), "the operator pages, over every app"),
    (("bench",), "measures all of the above"),
)


def layer_of(module: str, layers=LAYERS) -> tuple[int, str]:
    """(the layer's index, the entry that placed the module there)."""
    found = [(len(entry), index, entry) for index, (entries, _) in enumerate(layers) for entry in entries
             if module == entry or module.startswith(f"{entry}.")]
    assert found, f"{module} is in no layer: add it to LAYERS"
    _, index, entry = max(found)
    return index, entry


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    return [f"  {module} -> {dep}" for module in sorted(graph) for dep in sorted(graph[module])
            if layer_of(module, layers)[0] < layer_of(dep, layers)[0]]


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    # Each app of the control plane is named: a new one must be given its place, not fall into the wiring layer.
    unplaced = sorted({module for module in graph if module.startswith("controlplane.")
                       and layer_of(module)[1] == "controlplane"})
    assert not unplaced, f"not in LAYERS: {unplaced}"
    upward = upward_imports(graph)
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_the_layer_check_finds_an_import_upward():
    layers = ((("p.low",), ""), (("p.mid", "p.mid.x"), ""), (("p.high",), ""))
    assert layer_of("p.mid.x.y", layers) == (1, "p.mid.x")
    graph = {"p.high.a": {"p.mid.x", "p.low"}, "p.mid.x": {"p.low.b"}, "p.low.b": {"p.high.a"}}
    assert upward_imports(graph, layers) == ["  p.low.b -> p.high.a"]
