"""What a query on the port may read: ClickHouse's ``EXPLAIN AST`` of it, walked (no table
function, no function that reads files or other tables by name, only the store's own
tables; ``SHOW`` limited to the store's tables). Pure: the session supplies the AST."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Tables outside the store's database a query may name: what clickhouse-connect reads
# when it connects (the session's settings) and the one-row table.
ALLOWED_SYSTEM_TABLES = frozenset({"system.one", "system.settings"})
# Scalar functions that read files, or tables and dictionaries named by a string.
DENIED_FUNCTIONS = frozenset(
    {"file", "joinget", "joingetornull", "catboostevaluate", "hascolumnintable"}
)
DENIED_FUNCTION_PREFIXES = ("dictget", "dicthas", "dictis")
IN_FUNCTIONS = frozenset(
    {"in", "notin", "globalin", "globalnotin", "nullin", "notnullin", "globalnullin",
     "globalnotnullin"}
)  # fmt: skip
_SHOW_TABLES_RE = re.compile(
    r"^SHOW (?:FULL )?TABLES(?: FROM (?P<db>\S+))?(?: (?:NOT )?I?LIKE '(?:[^'\\]|\\.)*')?"
    r"(?: LIMIT \d+)?$",
    re.IGNORECASE,
)
_SHOW_COLUMNS_RE = re.compile(
    r"^SHOW (?:FULL )?COLUMNS FROM (?P<table>\S+)(?: FROM (?P<db>\S+))?"
    r"(?: (?:NOT )?I?LIKE '(?:[^'\\]|\\.)*')?(?: LIMIT \d+)?$",
    re.IGNORECASE,
)


@dataclass(slots=True)
class AstNode:
    """One line of ClickHouse's ``EXPLAIN AST``: ``Function file``, ``TableIdentifier db.t``."""

    kind: str
    arg: str
    children: list[AstNode]


_CHILDREN_RE = re.compile(r" \(children \d+\)$")
_ALIAS_RE = re.compile(r" \(alias [^)]*\)$")


def parse_ast(text: str) -> list[AstNode]:
    """The tree of ``EXPLAIN AST`` output (indentation = depth)."""
    roots: list[AstNode] = []
    stack: list[tuple[int, AstNode]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip(" "))
        body = _ALIAS_RE.sub("", _CHILDREN_RE.sub("", line.strip()))
        kind, _, arg = body.partition(" ")
        node = AstNode(kind, arg, [])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        (stack[-1][1].children if stack else roots).append(node)
        stack.append((depth, node))
    return roots


def _unquote(name: str) -> str:
    return name.replace("`", "").replace('"', "")


def _table_problem(name: str, database: str) -> str | None:
    name = _unquote(name.strip())
    if "." not in name:
        return None  # the session's database (the store's), or a WITH name
    db = name.split(".", 1)[0]
    if db == database or name.lower() in ALLOWED_SYSTEM_TABLES:
        return None
    return f"only the store's own tables (database {database}) can be read, not {name}"


def _db_problem(db: str, database: str) -> str | None:
    db = _unquote(db.strip())
    if not db or db == database:
        return None
    return f"only the store's own tables (database {database}) can be read, not database {db}"


_ROOT_KINDS = frozenset(
    {"SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "DescribeQuery",
     "Explain", "ShowTables", "ShowColumns", "ShowCreateTableQuery", "ShowCreateViewQuery",
     "ExistsTableQuery", "ExistsViewQuery", "ExistsDatabaseQuery"}
)  # fmt: skip


def audit_query(
    roots: list[AstNode], normalized: str, database: str, table_functions: frozenset[str]
) -> str | None:
    """Why the query port refuses a query (None: it may run).

    ``roots``: its ``EXPLAIN AST``; ``normalized``: ClickHouse's single-line form of it
    (for ``SHOW``, whose AST does not name what it shows); ``table_functions``: names
    (lower case) that only a table function has.
    """
    if len(roots) != 1:
        return "one statement at a time"
    root = roots[0]
    if root.kind not in _ROOT_KINDS:
        return (
            "the query port runs SELECT, DESCRIBE, EXPLAIN, EXISTS and SHOW TABLES / "
            f"SHOW COLUMNS / SHOW CREATE TABLE of the store's tables, not {normalized[:60]}"
        )
    if root.kind == "ShowTables":
        m = _SHOW_TABLES_RE.match(normalized)
        if m is None:
            return (
                "of SHOW statements only SHOW TABLES, SHOW COLUMNS and SHOW CREATE run "
                f"here, not {normalized[:60]}"
            )
        return _db_problem(m.group("db") or "", database)
    if root.kind == "ShowColumns":
        m = _SHOW_COLUMNS_RE.match(normalized)
        if m is None:
            return f"unsupported SHOW COLUMNS form: {normalized[:60]}"
        return _db_problem(m.group("db") or "", database) or _table_problem(
            m.group("table"), database
        )
    if root.kind.startswith(("ShowCreate", "Exists")):
        return _db_problem(root.arg.split(" ", 1)[0], database)

    def walk(node: AstNode, parent: str) -> str | None:
        if node.kind == "Function":
            name = node.arg.split(" ", 1)[0]
            low = name.lower()
            if parent == "TableExpression" or low in table_functions:
                return f"table functions are not allowed on the query port: {name}()"
            if low in DENIED_FUNCTIONS or low.startswith(DENIED_FUNCTION_PREFIXES):
                return f"function {name}() is not allowed on the query port"
            if low in IN_FUNCTIONS and node.children and len(node.children[0].children) == 2:
                rhs = node.children[0].children[1]
                if rhs.kind in ("Identifier", "TableIdentifier"):
                    problem = _table_problem(rhs.arg, database)
                    if problem is not None:
                        return problem
        elif node.kind == "TableIdentifier":
            problem = _table_problem(node.arg, database)
            if problem is not None:
                return problem
        for child in node.children:
            problem = walk(child, node.kind)
            if problem is not None:
                return problem
        return None

    return walk(root, "")
