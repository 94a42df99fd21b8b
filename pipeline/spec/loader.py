"""The one loader of tailguard/v1 files: YAML, issues with paths and lines, messages.

Every kind (``SLOSpec``, ``ControlPolicy``, ``BurnRules``, ``Contract``) is parsed
by :func:`parse_yaml_mapping` (safe YAML, duplicate keys refused), validated by its
pydantic model in :func:`load_document`, and every problem becomes a
:class:`SpecIssue` with the field path in the file's own names
(``slos[1].window.rolling``) and its line. Checks across entries (unique names,
references) run on the plain document next to the field errors, so one pass
reports everything. This module and the kind modules read files; the core takes
the parsed, validated values.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, Self, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, model_validator

API_VERSION: Final = "tailguard/v1"
# Validation context key: the model's own cross checks are skipped, because
# load_document runs them on the raw document (with lines) next to the field errors.
DEFER_CROSS_CHECKS: Final = "tailguard.spec.defer_cross_checks"
# The models whose field names a "did you mean" may suggest (when loaded).
_HINT_MODULES: Final = ("pipeline.spec.slo", "pipeline.spec.policy", "pipeline.spec.burn_rules")

Loc = tuple[int | str, ...]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class SpecIssue:
    """One problem in a spec: ``path`` in the YAML's own names (``slos[1].window.rolling``)."""

    path: str
    message: str
    line: int | None = None  # 1-based, when known
    column: int | None = None  # 1-based, for YAML syntax errors

    def render(self, source: str) -> str:
        where = f"{source}: {self.path}: " if self.path else f"{source}: "
        at = ""
        if self.line is not None:
            at = f" (line {self.line}" + (f", column {self.column})" if self.column else ")")
        return f"{where}{self.message}{at}"


class SpecError(ValueError):
    """A spec that does not load; ``str()`` lists every problem, one per line."""

    def __init__(self, source: str, errors: list[SpecIssue]) -> None:
        self.source = source
        self.errors = errors
        super().__init__("\n".join(e.render(source) for e in errors))


class SpecModel(BaseModel):
    """Base of every file model: frozen, no unknown fields, no type coercion.

    strict: YAML gives real types, so "400" (a string) or `true` for a number is a
    mistake. A document model overrides :meth:`cross_issues` (checks across entries);
    :func:`load_document` runs them on the raw document instead, next to the field
    errors and with their lines.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> Self:
        if isinstance(info.context, Mapping) and info.context.get(DEFER_CROSS_CHECKS):
            return self
        found = self.cross_issues()
        if found:
            raise ValueError("; ".join(f"{i.path}: {i.message}" for i in found))
        return self

    def cross_issues(self) -> list[SpecIssue]:
        """Problems across entries of this document (none by default)."""
        return []


# --------------------------------------------------------------------------- #
# YAML
# --------------------------------------------------------------------------- #


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML that rejects duplicate keys (silently last-wins otherwise)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable; SafeLoader reports it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml_mapping(text: str, source: str, what: str) -> tuple[dict[str, Any], yaml.Node]:
    """YAML text -> (mapping, node tree for error line numbers); problems raise SpecError.

    Shared by every tailguard/v1 file (SLO specs, control policies, burn rules, contracts).
    """
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = ": ".join(p for p in (e.context, e.problem) if p)
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise SpecError(source, [SpecIssue("", f"YAML error: {problem}", line, column)]) from None
    except yaml.YAMLError as e:
        raise SpecError(source, [SpecIssue("", f"YAML error: {e}")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict) or node is None:
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError(source, [SpecIssue("", f"{what} must be a YAML mapping, got {kind}")])
    return data, node


# --------------------------------------------------------------------------- #
# Paths and lines
# --------------------------------------------------------------------------- #


def issue_path(loc: Loc) -> str:
    """pydantic's ``("slos", 1, "window")`` -> ``"slos[1].window"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            continue  # a dict key failed; the path already ends in that key
        else:
            out += f".{part}" if out else part
    return out


def loc_of(path: str) -> Loc:
    """``"slos[1].window"`` -> ``("slos", 1, "window")`` (the inverse of :func:`issue_path`)."""
    return tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path))


def node_line(node: yaml.Node | None, loc: Loc) -> int | None:
    """1-based line of the deepest YAML node on ``loc`` (best effort)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == part:
                    child = v
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


# --------------------------------------------------------------------------- #
# Messages
# --------------------------------------------------------------------------- #


_UNIT_RE: Final = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(ms|s|sec|m|min|h)\s*$", re.IGNORECASE)
_UNIT_MS: Final = {
    "ms": 1.0,
    "s": 1000.0,
    "sec": 1000.0,
    "m": 60_000.0,
    "min": 60_000.0,
    "h": 3_600_000.0,
}
_NUMBER_RE: Final = re.compile(r"^\s*-?[0-9]+(\.[0-9]+)?\s*$")


def _known_fields() -> set[str]:
    """Every field name (and alias) of the tailguard/v1 file models loaded in this process."""
    names: set[str] = set()
    for mod_name in _HINT_MODULES:
        mod = sys.modules.get(mod_name)
        for obj in vars(mod).values() if mod is not None else ():
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj is not BaseModel:
                for fname, info in obj.model_fields.items():
                    names.add(info.alias or fname)
    return names


def _did_you_mean(name: str) -> str:
    match = difflib.get_close_matches(name, sorted(_known_fields()), n=1, cutoff=0.75)
    return f"; did you mean {match[0]!r}?" if match else " (not part of tailguard/v1; a typo?)"


def _unit_hint(field: str, value: Any) -> str | None:
    """``threshold_ms: 400ms`` -> the number the field wants, in the unit its name says."""
    if not isinstance(value, str):
        return None
    m = _UNIT_RE.match(value)
    unit = "ms" if field.endswith("_ms") else ("s" if field.endswith("_s") else None)
    if m is None or unit is None:
        return None
    ms = float(m.group(1)) * _UNIT_MS[m.group(2).lower()]
    n = ms if unit == "ms" else ms / 1000.0
    return (
        f"expected a number: the unit is in the field's name ({field} is in {unit}), "
        f"so write {n:g} instead of {value!r}"
    )


def error_message(err: Mapping[str, Any]) -> str:
    """An operator's message for one pydantic error: no internal class names, a
    "did you mean" for a misspelt field, a unit hint for ``threshold_ms: 400ms``."""
    loc = tuple(err.get("loc", ()))
    field = next((str(p) for p in reversed(loc) if isinstance(p, str) and p != "[key]"), "")
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    if err["type"] == "extra_forbidden":
        return f"unknown field {field!r}{_did_you_mean(field)}"
    hint = _unit_hint(field, err.get("input"))
    if hint is not None:
        return hint
    msg = re.sub(r" or (an )?instance of \w+", "", str(err["msg"]))
    msg = msg.replace("a valid dictionary", "a mapping (key: value)")
    value = err.get("input")
    if str(err["type"]).endswith(("_type", "_parsing")) and isinstance(
        value, str | int | float | bool
    ):
        msg += f", got {value!r}"
        if isinstance(value, str) and _NUMBER_RE.match(value) and "number" in msg:
            msg += " (quoted, so text: write it without quotes)"
    if field == "window" and "mapping" in msg:
        msg += " (write {rolling: 30d} or {calendar: month})"
    return msg


def _same_loc(loc: Loc, err_type: str) -> Loc:
    return loc


# --------------------------------------------------------------------------- #
# Loading
# --------------------------------------------------------------------------- #


def load_document(
    model: type[M],
    text: str,
    source: str,
    what: str,
    cross_issues: Callable[[dict[str, Any]], list[SpecIssue]],
    *,
    fix_loc: Callable[[Loc, str], Loc] = _same_loc,
    message: Callable[[Mapping[str, Any]], str] = error_message,
) -> M:
    """Parse ``text`` (``what``: "a spec", "a policy", ... for the messages), validate it
    with ``model`` and run ``cross_issues`` on the plain document; raises
    :class:`SpecError` listing every problem, ordered by line.

    ``fix_loc`` adjusts pydantic's error location (e.g. drops a union's tag),
    ``message`` words an error (default :func:`error_message`).
    """
    data, node = parse_yaml_mapping(text, source, what)
    issues: list[SpecIssue] = []
    result: M | None = None
    try:
        result = model.model_validate(data, context={DEFER_CROSS_CHECKS: True})
    except ValidationError as e:
        for err in e.errors():
            loc = fix_loc(tuple(err["loc"]), err["type"])
            issues.append(SpecIssue(issue_path(loc), message(err), node_line(node, loc)))
    for issue in cross_issues(data):
        issues.append(SpecIssue(issue.path, issue.message, node_line(node, loc_of(issue.path))))
    if issues or result is None:
        raise SpecError(source, sorted(issues, key=lambda i: i.line or 0))
    return result


def read_bytes(path: str | Path, what: str) -> bytes:
    """A file's bytes, checked to be UTF-8; unreadable -> SpecError ``cannot read <what>``."""
    try:
        raw = Path(path).read_bytes()
        raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), [SpecIssue("", f"cannot read {what}: {e}")]) from None
    return raw


def read_text(path: str | Path, what: str) -> str:
    """A file's text; unreadable -> SpecError ``cannot read <what>: ...``."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), [SpecIssue("", f"cannot read {what}: {e}")]) from None


def validation_report(
    path: str | Path, load: Callable[[str | Path], Any], describe: Callable[[Any], str]
) -> tuple[bool, str]:
    """For ``tailguard validate``: ``(True, "ok: <describe> (FILE)")`` or
    ``(False, every problem and "N problems in FILE")``."""
    try:
        loaded = load(path)
    except SpecError as e:
        n = len(e.errors)
        return False, f"{e}\n{n} problem{'' if n == 1 else 's'} in {path}"
    return True, f"ok: {describe(loaded)} ({path})"


@dataclass(frozen=True, slots=True)
class SpecFormat(Generic[M]):
    """How one kind is read: its model, its cross checks and its wording.

    ``load`` (text), ``load_file`` (a path) and ``validate`` (for ``tailguard
    validate``) are what each kind module exports under its own names; a kind
    module's ``SPEC_KIND`` is its format (:mod:`pipeline.spec.registry`).
    """

    name: str  # the kind: "SLOSpec"
    model: type[M]
    what: str  # in "<what> must be a YAML mapping": "a spec", "a policy", ...
    noun: str  # in "cannot read <noun>: ...": "spec", "policy", "rules"
    default_source: str  # the source named in messages when text has none: "<spec>"
    cross_issues: Callable[[dict[str, Any]], list[SpecIssue]]
    describe: Callable[[M], str]  # "ok: <describe> (FILE)"
    fix_loc: Callable[[Loc, str], Loc] = _same_loc
    message: Callable[[Mapping[str, Any]], str] = error_message

    def load(self, text: str, source: str | None = None) -> M:
        """Parse and validate; raises :class:`SpecError` listing every problem."""
        return load_document(
            self.model,
            text,
            self.default_source if source is None else source,
            self.what,
            self.cross_issues,
            fix_loc=self.fix_loc,
            message=self.message,
        )

    def load_file(self, path: str | Path) -> M:
        """:meth:`load` on a file; an unreadable file is a :class:`SpecError` too."""
        return self.load(read_text(path, self.noun), str(path))

    def validate(self, path: str | Path) -> tuple[bool, str]:
        """``(True, "ok: ... (FILE)")`` or ``(False, every problem, "N problems in FILE")``."""
        return validation_report(path, self.load_file, self.describe)
