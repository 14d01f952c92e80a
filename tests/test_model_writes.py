"""Each table is written by the app that owns it: Action rows only by the actions service, RevisionSample rows only by
the observability app, AutoscalingPolicy rows only by the autoscaling app, Delivery rows only by the alerting app
(rollouts and chaos queue theirs through alerting's channels_notify), Deployment rows only by the core's services.
Every other model of the control plane is written only by the app that defines it (owners_of_every_model).

The writes are read from the source (ast) of controlplane/ and dashboards/, as the import graph is. A write is a
call of an ORM writing method (save, delete, create, update, ...) on a chain that starts at the model
(`Action.objects.filter(...).update(...)`, `AutoscalingPolicy(...).save()`), at `type(row)` of a row of it, at a
related manager of it (`deployment.actions.update(...)`), or at a name bound to one of those in the same function or
an enclosing one (`policy = AutoscalingPolicy.objects.get(...)`, `for sample in RevisionSample.objects...`,
`policy: AutoscalingPolicy`, `row = action_create(...)`). Action rows are also known by the name the services give
them (`action.save()`). It is a reading of the code, not a proof: a row passed on under another name to another
function is not followed."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("controlplane", "dashboards")
WRITES = frozenset({"save", "save_base", "delete", "create", "bulk_create", "update", "bulk_update", "get_or_create",
                    "update_or_create"})


@dataclass(frozen=True, slots=True)
class Owner:
    writers: tuple[str, ...]  # files, or folders ending in "/", relative to the repository root
    related: tuple[str, ...] = ()  # related managers that reach the model's rows from another row
    names: tuple[str, ...] = ()  # what its rows are called wherever they are
    makers: tuple[str, ...] = ()  # functions that return its rows
    excluding: tuple[str, ...] = ()  # folders inside `writers` that are not the owner (other apps)


OWNERS = {
    "Action": Owner(writers=("controlplane/services/actions.py",), related=("actions",), names=("action",),
                    makers=("action_create", "action_once", "action_find", "action_get")),
    "RevisionSample": Owner(writers=("controlplane/observability/",)),
    "AutoscalingPolicy": Owner(writers=("controlplane/autoscaling/",), related=("autoscaling",)),
    "Delivery": Owner(writers=("controlplane/alerting/",), related=("deliveries",), names=("delivery",)),
    "Deployment": Owner(writers=("controlplane/services/",), names=("deployment",)),
}


def _chain(node: ast.AST) -> tuple[str | None, list[str]]:
    """The name a chain of calls, attributes and subscripts starts at (for `type(x)...`, x) and the attributes
    along it, first to last."""
    attributes: list[str] = []
    while True:
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 1:
                node = node.args[0]
                continue
            node = node.func
        elif isinstance(node, ast.Attribute):
            attributes.insert(0, node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id, attributes
        else:
            return None, attributes


def _model_of(node: ast.AST, bound: dict[str, str], owners: dict[str, Owner]) -> str | None:
    """The model whose rows an expression reaches, if any."""
    root, attributes = _chain(node)
    if root in owners:
        return root
    if root in bound:
        return bound[root]
    for model, owner in owners.items():
        if root in owner.names or (root in owner.makers and not attributes) or any(
                name in owner.related for name in attributes):
            return model
    return None


def _annotated_model(annotation: ast.AST | None, owners: dict[str, Owner]) -> str | None:
    if annotation is None:
        return None
    text = ast.unparse(annotation).strip("'\"")
    return next((model for model in owners if text == model or text.startswith(f"{model} |")), None)


def _targets(target: ast.AST) -> list[str]:
    """The names a row lands in: `x = ...`, and the first of `x, created = ....get_or_create(...)`."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
        return [target.elts[0].id]
    return []


def writes_in(source: str, owners: dict[str, Owner] = OWNERS) -> list[tuple[int, str, str]]:
    """(line, model, the call) of each write of an owned model in a module's source."""
    found: list[tuple[int, str, str]] = []

    def scope(body: list[ast.stmt], bound: dict[str, str], args: ast.arguments | None = None) -> None:
        bound = dict(bound)
        if args is not None:
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                model = _annotated_model(arg.annotation, owners)
                if model:
                    bound[arg.arg] = model
        nested: list[ast.AST] = []
        # Bindings first (a function's order of statements does not matter to who may write what).
        for statement in body:
            for node in ast.walk(statement):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node is not statement:
                    nested.append(node)
                if isinstance(node, ast.Assign):
                    model = _model_of(node.value, bound, owners)
                    for target in node.targets:
                        bound.update({name: model for name in _targets(target) if model})
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    model = _annotated_model(node.annotation, owners) or (
                        _model_of(node.value, bound, owners) if node.value is not None else None)
                    if model:
                        bound[node.target.id] = model
                elif isinstance(node, (ast.For, ast.comprehension)):
                    model = _model_of(node.iter, bound, owners)
                    bound.update({name: model for name in _targets(node.target) if model})
        for statement in body:
            for node in ast.walk(statement):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in WRITES):
                    model = _model_of(node.func.value, bound, owners)
                    if model:
                        found.append((node.lineno, model, ast.unparse(node)[:120]))
        for function in nested:
            if isinstance(function, ast.Lambda):
                continue
            scope(function.body, bound, function.args)

    tree = ast.parse(source)
    functions = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    scope([node for node in tree.body if node not in functions and node not in classes], {})
    for function in functions:
        scope(function.body, {}, function.args)
    for cls in classes:
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope(node.body, {}, node.args)
    return sorted(set(found))


def owners_of_every_model() -> dict[str, Owner]:
    """OWNERS, and for every other model of the control plane its default owner: the app that defines it. An app
    with models of its own is its folder (controlplane/alerting/); the core's models (controlplane/models/) belong
    to the core: controlplane/ less the folders of those apps."""
    from django.apps import apps

    models = {model.__name__: model.__module__.split(".")[1] for model in apps.get_models()
              if model.__module__.startswith("controlplane.")}
    app_folders = tuple(sorted({f"controlplane/{app}/" for app in models.values() if app != "models"}))
    core = Owner(writers=("controlplane/",), excluding=app_folders)
    return {name: OWNERS.get(name) or (core if app == "models" else Owner(writers=(f"controlplane/{app}/",)))
            for name, app in models.items()}


def _writes_by_file(owners: dict[str, Owner] = OWNERS) -> dict[str, list[tuple[int, str, str]]]:
    writes = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            found = writes_in(path.read_text(), owners)
            if found:
                writes[path.relative_to(ROOT).as_posix()] = found
    return writes


def _owns(owner: Owner, path: str) -> bool:
    return any(path == writer or (writer.endswith("/") and path.startswith(writer)) for writer in owner.writers) \
        and not any(path.startswith(folder) for folder in owner.excluding)


def _where(owner: Owner) -> str:
    return ", ".join(owner.writers) + (f" (less {', '.join(owner.excluding)})" if owner.excluding else "")


def test_each_model_is_written_only_by_the_app_that_owns_it():
    owners = owners_of_every_model()
    strays = [f"{path}:{line}: {model} written outside {_where(owners[model])}: {call}"
              for path, found in _writes_by_file(owners).items() for line, model, call in found
              if not _owns(owners[model], path)]
    assert not strays, "\n".join(strays)


def test_every_model_of_the_control_plane_has_an_owner():
    """Each model is checked (an explicit entry of OWNERS, or the app that defines it), and each entry of OWNERS
    names a model, known by one name only."""
    from django.apps import apps

    names = [model.__name__ for model in apps.get_models() if model.__module__.startswith("controlplane.")]
    assert len(names) == len(set(names)), "two models share a name: the finder cannot tell them apart"
    assert set(OWNERS) <= set(names)
    owners = owners_of_every_model()
    assert set(owners) == set(names)
    assert _owns(owners["Worker"], "controlplane/supervision/reconcile.py")
    assert not _owns(owners["Worker"], "controlplane/chaos/services.py")
    assert not _owns(owners["Worker"], "dashboards/views/controls.py")
    assert _owns(owners["Rollout"], "controlplane/rollouts/services.py")
    assert not _owns(owners["Rollout"], "controlplane/chaos/services.py")


def test_each_owner_is_found_writing_its_model():
    """So that a renamed model or a moved owner cannot leave the check above with nothing to look at."""
    written = {model for path, found in _writes_by_file().items() for _, model, _ in found
               if _owns(OWNERS[model], path)}
    assert written == set(OWNERS)


def test_the_finder_sees_each_way_of_writing_and_not_a_read():
    source = '''
def abort(rollout):
    action = _event(rollout)
    action.result = {"deliveries": []}
    action.save(update_fields=["result"])

def record(deployment):
    row = action_create(kind="autoscale")
    type(row).objects.filter(pk=row.pk).update(finished_at=None)
    deployment.actions.filter(status="pending").update(status="failed")
    Action.objects.filter(pk=1).first()

def evaluate(pool, policy: AutoscalingPolicy, other: PredictiveScaling):
    rows = AutoscalingPolicy.objects.filter(pool=pool)
    rows.update(enabled=False)
    other.save()

    def write():
        policy.save()

def prune(cutoff):
    RevisionSample.objects.filter(ts__lt=cutoff).delete()
    for sample in RevisionSample.objects.all():
        sample.delete()
'''
    found = [(line, model) for line, model, _ in writes_in(source)]
    assert found == [(5, "Action"), (9, "Action"), (10, "Action"), (15, "AutoscalingPolicy"),
                     (19, "AutoscalingPolicy"), (22, "RevisionSample"), (24, "RevisionSample")]
