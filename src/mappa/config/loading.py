"""Reading a run config: a YAML file, its preset merged in, ``key=value`` overrides applied
to the raw YAML before validation (so they are checked the same way); errors name the file
and the dotted key, or the override that set it, and an unknown key the closest valid one."""

from __future__ import annotations

import copy
import difflib
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from mappa.config.schema import ConfigError, RunConfig, WorkflowConfig

TOP_LEVEL = "(top level)"
"""Where a problem with the document as a whole is, in a list of problems' keys."""


class OverrideError(ConfigError):
    """A ``key=value`` override that cannot be applied: it names the override, not the
    config file, which is not at fault."""


def _list_key(node: list[Any], part: str, dotted: str) -> int:
    """A list element by index, or by its ``name`` (``agents.verifier.max_actions``)."""
    if part.isdigit() and int(part) < len(node):
        return int(part)
    names = [item.get("name") if isinstance(item, dict) else None for item in node]
    if part in names:
        return names.index(part)
    named = [str(n) for n in names if n is not None]
    near = difflib.get_close_matches(part, named, n=1)
    fix = f"did you mean {near[0]!r}?" if near else f"give an index below {len(node)} or {named}"
    raise OverrideError(f"override {dotted!r}: no list index or name {part!r}; {fix}")


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.0.c`` in a nested dict/list tree, creating dicts where absent."""
    parts = dotted.split(".")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            key: Any = _list_key(node, part, dotted)
        else:
            key = part
        if not isinstance(node, dict | list):
            raise OverrideError(f"override {dotted!r}: {'.'.join(parts[:i])} is not a section")
        if last:
            node[key] = value
        else:
            if isinstance(node, dict) and key not in node:
                node[key] = {}
            node = node[key]


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` strings; values are parsed as YAML scalars (``1e-5``, ``true``)."""
    for item in overrides:
        if "=" not in item:
            raise OverrideError(f"override {item!r} is not of the form key=value")
        text = item.split("=", 1)[1]
        _set_dotted(raw, _key(item), yaml.safe_load(text) if text else "")
    return raw


def _section(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds: a model, a list of them, or an optional one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        section = _section(arg)
        if section is not None:
            return section
    return None


def _schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``model`` (a list's elements as ``<name>``: ``agents.<name>.x``)."""
    keys = []
    for name, field in model.model_fields.items():
        keys.append(f"{prefix}{name}")
        section = _section(field.annotation)
        if section is not None:
            inner = ".<name>." if typing.get_origin(field.annotation) is list else "."
            keys.extend(_schema_keys(section, f"{prefix}{name}{inner}"))
    return keys


def named(loc: tuple[Any, ...], tree: Any) -> tuple[Any, ...]:
    """``loc`` with each list index replaced by the name of the element of ``tree`` there,
    where it has one that can be part of a dotted key: ``agents.2.role`` ->
    ``agents.verifier.role``, as a config and its overrides spell it.

    >>> named(("agents", 1, "role"), {"agents": [{"name": "a"}, {"name": "b"}]})
    ('agents', 'b', 'role')
    """
    out: list[Any] = []
    node = tree
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            node = node[part]
            name = node.get("name") if isinstance(node, dict) else None
            usable = isinstance(name, str) and re.fullmatch(r"[\w-]+", name)  # a dotted key's part
            out.append(name if usable else part)
        else:
            out.append(part)
            node = node.get(part) if isinstance(node, dict) else None
    return tuple(out)


def closest_key(
    loc: tuple[str | int, ...], root: type[BaseModel] = RunConfig, tree: Any = None
) -> str | None:
    """The valid key an unknown key ``loc`` of a ``root`` file (a run config, or another
    schema such as an experiment file's) most likely means: a close name in its own
    section; else, when the section itself is misspelt, a close dotted key anywhere
    (``trian.steps`` -> ``train.steps``); else a key anywhere with a close last name
    (``lr`` -> ``rl.lr``); None when nothing is close (``difflib``'s default cutoff). A
    list element (an index in ``loc``) is compared as ``<name>``, as the keys spell it, and
    shown by its name in ``tree`` (the config read) where it has one."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is not None and not isinstance(part, int):
            field = model.model_fields.get(part)
            model = None if field is None else _section(field.annotation)
    leaf, parent = str(loc[-1]), [str(p) for p in named(loc, tree)[:-1]]
    keys = _schema_keys(root)
    if model is not None:
        near = difflib.get_close_matches(leaf, list(model.model_fields), n=1)
        if near:
            return ".".join([*parent, near[0]])
    else:
        dotted = ".".join("<name>" if isinstance(p, int) else str(p) for p in loc)
        near = difflib.get_close_matches(dotted, keys, n=1)
        if near:
            return near[0]
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    near = difflib.get_close_matches(leaf, leaves, n=1)
    return keys[leaves.index(near[0])] if near else None


def _override_loc(tree: dict[str, Any], override: str) -> tuple[Any, ...] | None:
    """The override's key as the location a validation error gives (a list element named by
    ``name`` resolved to its index); None when a later override renamed or replaced it."""
    node: Any = tree
    loc: list[Any] = []
    for part in _key(override).split("."):
        if isinstance(node, list):
            try:
                key: Any = _list_key(node, part, override)
            except ConfigError:
                return None
        elif isinstance(node, dict):
            key = part
        else:
            return None
        loc.append(key)
        node = node.get(key) if isinstance(node, dict) else node[key]
    return tuple(loc)


def format_errors(
    err: ValidationError,
    source: str,
    overrides: dict[tuple[Any, ...], str] | None = None,
    root: type[BaseModel] = RunConfig,
    kind: str = "configuration",
    tree: Any = None,
) -> str:
    """One line per problem, naming where it came from: the override that set the key
    (``overrides``, by location), else the key in the file ``source`` (a ``root`` file: a
    run config, or an experiment file); an unknown key gets the closest valid one, and the
    missing key it most likely means is not reported again (``seed:`` for ``seeds:`` is one
    typo, not two problems). One problem is one line; several follow a header naming the
    file (``invalid <kind>``), or the overrides, when they are all the overrides'. ``tree``:
    the document validated, to name list elements (``agents.verifier``, not ``agents.2``)."""
    overrides = overrides or {}
    errors = err.errors()
    meant = {
        i: closest_key(tuple(e["loc"]), root, tree)
        for i, e in enumerate(errors)
        if e["type"] == "extra_forbidden"
    }
    problems = []
    for i, e in enumerate(errors):
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in named(loc, tree)) or TOP_LEVEL
        if e["type"] == "missing" and key in meant.values():
            continue
        setter = _setter(loc, overrides)
        if i in meant:  # an override's own key is the typo to correct: trian.steps -> train.steps
            near = closest_key(setter[0], root, tree) if setter else meant[i]
            keys = "docs/config.md" if root is RunConfig else "docs/experiments.md"
            msg = "unknown key; " + (f"did you mean {near}?" if near else f"{keys} lists the keys")
        else:
            msg = _message(e, key)
        if setter is None:
            problems.append((key, msg, False))
        else:  # the override set this key, a section holding it, or a key inside it
            at = "" if len(setter[0]) >= len(loc) else f": {key}"
            problems.append((f"override {setter[1]}{at}", msg, True))
    if len(problems) == 1:
        where, msg, overridden = problems[0]
        if overridden:
            return f"{where}: {msg}"
        return f"{source}: {msg}" if where == TOP_LEVEL else f"{source}: {where}: {msg}"
    in_file = not all(overridden for *_, overridden in problems)
    header = f"{source}: invalid {kind}" if in_file else "invalid overrides"
    return "\n".join([header, *(f"  {where}: {msg}" for where, msg, _ in problems)])


def _setter(
    loc: tuple[Any, ...], overrides: dict[tuple[Any, ...], str]
) -> tuple[tuple[Any, ...], str] | None:
    """The override behind a problem at ``loc``, with its own location: the one that set
    ``loc`` or the closest section holding it, else one that set a key inside it (the
    override ``trian.steps=1`` made the unknown key ``trian``, which the file lacks)."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in overrides:
            return loc[:n], overrides[loc[:n]]
    inside = [(at, o) for at, o in overrides.items() if loc and at[: len(loc)] == loc]
    return inside[-1] if inside else None


def _message(error: Any, key: str) -> str:
    """Pydantic's message for one problem, in a config's words: a value outside a fixed set
    with the closest one, a section given a value, a value YAML read as a mapping or list
    (an unquoted ``hf:...`` or ``a: b``); a validator's own message without its
    ``Value error,`` prefix."""
    kind, value = error["type"], error.get("input")
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{value!r} is not one of {', '.join(map(repr, allowed))}{hint}"
    if kind in ("model_type", "dict_type") and key == TOP_LEVEL:
        read = "a list" if isinstance(value, list) else repr(value)
        return f"the top level must be a mapping of keys (key: value lines), not {read}"
    if kind in ("model_type", "dict_type") and not isinstance(value, dict):
        return f"a section, not a value; set its keys ({key}.<key>=..., docs/config.md)"
    if kind == "string_type" and isinstance(value, dict | list):
        read = "a mapping" if isinstance(value, dict) else "a list"
        return f"YAML read {value!r} as {read}, not text; quote the value, e.g. {key}='...'"
    return str(error["msg"]).removeprefix("Value error, ")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping. PyYAML keeps the
    last one without a word (as the YAML spec leaves to the loader), so a setting written
    twice, e.g. a second ``lr:`` further down a section, silently undoes the first. Keys a
    ``<<:`` merge brings in may still be overridden: that is what a merge is for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise DuplicateKeyError(
                    f"{key!r} is given twice in one section (first at {_at(seen[key])})",
                    node.start_mark,
                    "a key may be given once",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> Any:
    """The YAML document in ``path``; a syntax error is a ``ConfigError`` in one line (the
    file, line and column, PyYAML's problem), where PyYAML's own message spans several,
    quoting the source under a caret. A key given twice in one mapping is refused
    (``UniqueKeyLoader``)."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # noqa: S506
    except DuplicateKeyError as err:
        assert err.problem_mark is not None
        raise ConfigError(
            f"{path}: {_at(err.problem_mark)}: {err.context}; keep one (YAML would take the "
            "last without a word)"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(
            f"{path}: not valid YAML: {_yaml_problem(err)}; fix the YAML syntax"
        ) from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """Where and what: ``line 3, column 1: expected ',' or ']', but got '<stream end>'
    (while parsing a flow sequence at line 2, column 7)``."""
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return " ".join(str(err).split())
    text = f"{_at(err.problem_mark)}: {err.problem}"
    if err.context and err.context_mark is not None:
        text += f" ({err.context} at {_at(err.context_mark)})"
    return " ".join(text.split())


def _at(mark: yaml.Mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


PRESETS_DIR = Path(__file__).parents[1] / "presets"
"""Shipped pipeline presets: ``<name>.yaml`` holds agents, workflow and coach defaults."""


def load_preset(name_or_path: str) -> dict[str, Any]:
    """The raw mapping of a shipped preset (by name) or of a preset YAML file (by path)."""
    path = PRESETS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        path = Path(name_or_path)
    if not path.is_file():
        shipped = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        near = difflib.get_close_matches(name_or_path, shipped, n=1)
        fix = f"did you mean {near[0]!r}?" if near else "give a preset's name or YAML file"
        raise ConfigError(f"{name_or_path!r} is no shipped preset {shipped} nor a file; {fix}")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a mapping")
    return data


def _merge(base: Any, over: Any, where: str) -> Any:
    """``over`` on top of ``base``: mappings merge key by key, anything else replaces.

    ``agents`` given as a mapping updates the base's agents by name (an unknown name is an
    error: a typo must not silently add nothing).
    """
    if where == "agents" and isinstance(over, dict) and isinstance(base, list):
        by_name = {a.get("name"): a for a in base if isinstance(a, dict)}
        unknown = sorted(set(over) - set(by_name))
        if unknown:
            raise ConfigError(f"agents: {unknown} not in the preset's agents {list(by_name)}")
        return [_merge(a, over.get(a.get("name"), {}), "agent") for a in base]
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], v, k) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


def with_preset(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The config's raw mapping on top of its workflow preset (if any), then the overrides.

    The preset is looked up after the overrides are applied (so ``workflow.preset=dsbench``
    on the command line works); the overrides are applied last so that they may address
    the preset's agents by index or by name. A config with a workflow ``function`` has no
    preset unless it names one.
    """
    probe = apply_overrides(copy.deepcopy(raw), overrides)
    given = [o for o in overrides if _key(o) in ("workflow", "workflow.preset")]
    workflow = probe.get("workflow", {})
    if not isinstance(workflow, dict):
        raise _refusal(given, "workflow", "must be a mapping")
    default = None if workflow.get("function") else WorkflowConfig.model_fields["preset"].default
    preset = workflow.get("preset", default)
    if preset is not None and not isinstance(preset, str):
        problem = f"must be a preset name or a file path, not {preset!r}"
        raise _refusal(given, "workflow.preset", problem)
    try:
        merged = _merge(load_preset(preset), raw, "") if preset else raw
    except ConfigError as err:
        raise _refusal(given, "workflow.preset", str(err)) from None
    merged.setdefault("workflow", {})["preset"] = preset
    return apply_overrides(merged, overrides)


def _refusal(given: list[str], key: str, problem: str) -> ConfigError:
    """The problem with ``key``, named as the last override in ``given`` (those that set
    it) if any, since the config file is then not at fault; else as the file's key."""
    if given:
        return OverrideError(f"override {given[-1]}: {problem}")
    return ConfigError(f"{key}: {problem}")


def _key(override: str) -> str:
    """The dotted key of a ``key=value`` override."""
    return override.split("=", 1)[0].strip()


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override and validate a run config. Raises ConfigError naming file and key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    raw = read_yaml(path)
    if raw is None:  # no keys, or only comments: a run of every default, not what was meant
        raise ConfigError(
            f"{path}: the file is empty; write the keys that differ from the defaults "
            "(docs/config.md), or omit --config for the demo config"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    try:
        raw = with_preset(raw, overrides or [])
    except OverrideError:
        raise
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    workflow = raw.get("workflow")
    if isinstance(workflow, dict) and isinstance(workflow.get("function"), str):
        workflow["function"] = resolve_function(workflow["function"], path.parent)
    coach = raw.get("coach")
    if isinstance(coach, dict) and isinstance(coach.get("template"), str):
        coach["template"] = resolve_beside(coach["template"], path.parent)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        locs = {at: o for o in overrides or [] if (at := _override_loc(raw, o)) is not None}
        raise ConfigError(format_errors(err, str(path), locs, tree=raw)) from None


def resolve_beside(file: str, config_dir: Path) -> str:
    """A relative ``.yaml`` path that names a file beside the config file, as that file's
    absolute path (a workflow's coach template travels with its config); anything else
    (a shipped template's name, a path from the working directory) unchanged.

    >>> resolve_beside("mathchat", Path("/nowhere"))
    'mathchat'
    """
    beside = config_dir / file
    if file.endswith((".yaml", ".yml")) and not Path(file).is_absolute() and beside.is_file():
        return str(beside.resolve())
    return file


def resolve_function(spec: str, config_dir: Path) -> str:
    """``workflow.function`` with its module found from the config file's directory: a
    relative ``file.py`` path, or a module name with a ``<name>.py`` there, becomes that
    file's absolute path (so the run's saved config, a resume, and a run started from
    another directory all load the same file); anything else is left to ``sys.path``.

    >>> resolve_function("my_team:solve", Path("/nowhere"))
    'my_team:solve'
    """
    module, sep, attr = spec.partition(":")
    if not sep:
        return spec  # malformed: the workflow loader names the problem
    if module.endswith(".py"):
        file = Path(module).expanduser()
        return f"{file if file.is_absolute() else (config_dir / file).resolve()}:{attr}"
    beside = config_dir / f"{module.replace('.', '/')}.py"
    return f"{beside.resolve()}:{attr}" if beside.is_file() else spec
