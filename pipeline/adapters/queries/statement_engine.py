"""What a statement (version 4 on) reads of ``requests``: the tenant's period counted in
the engine, not handed over (:class:`EngineSource`, a
:class:`~pipeline.core.statement.StatementSource`).

Why: a tenant-month of a month store is 15 M rows. Counting them in the engine takes
about a second; handing their columns to this process takes 15-23 s in any format
(issue 53, ``docs/performance.md``). So the engine answers what the statement asks, and
only the rows a statement names come back:

* **the final rows** (each key's last version, as ``FINAL`` would give them, without
  it): the rows of the tenant's period, less the versions that another row of their
  key replaces (:class:`~pipeline.adapters.queries.statement_rows._Read`: found by their
  key's hash, rare);
* **special rows**, handed over as rows: those ending in a maintenance window of the
  contract or with a cold start, which the exemptions read;
* **groups** of the rows: rows alike in every field the SLOs read, in the interval of
  each cut their values fall in (:class:`~pipeline.core.statement.Cuts`) and in the
  exemption they could have (a maintenance window, a cold start) are alike for every
  SLO of the contract and for the exemptions; the core judges each group on one row
  standing for it (``SLOMatcher.classify_many``: the rule is not restated here);
* for the masks over the groups the core gives back: each day's nearest-rank
  percentile, the bad rows before a budget exhaustion (as rows); and the minutes the
  tenant had traffic in;
* **the digest** (``requests_digest``, version 4): the rows' count and the sum, modulo
  2**64, of each row's ``cityHash64`` over the statement's columns (a missing value
  hashed as missing). Any order of the rows gives it; a changed value changes it but
  for a chance of about 2**-64. It names what was read; it is not a signature.

``tests/integration/test_statement_engine.py`` holds every statement equal to version 3's
(the rows handed over) on stores made messy on purpose.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Sequence
from decimal import Decimal
from typing import Any, Final

import numpy as np
import pyarrow as pa

from pipeline.adapters.queries.statement_rows import (
    _HASH_ORDER,
    _KEY_HASH,
    _NONE_IF_EMPTY,
    STATEMENT_COLUMNS,
    _hash_order,
    _Read,
    few_values,
    statement_rows,
)
from pipeline.adapters.store import REQUEST_COLUMNS, Store
from pipeline.contract.boundaries import BOUNDARIES
from pipeline.core.slo import BoolArray, IntArray, RecordColumns
from pipeline.core.statement import (
    MAX_SPAN_MS,
    TRAFFIC_SLOT_MS,
    Cuts,
    DayValue,
    StatementRows,
    maintenance_windows,
    slots_of,
    traffic_of_slots,
)
from pipeline.spec.contract import Contract
from pipeline.spec.slo import SLOSpec

# The fields the groups keep as they are (what classify_many reads besides the
# boundaries and the prompt's size).
_GROUPED: Final = (
    "source", "outcome", "superseded", "model", "priority", "ctx_bucket", "tenant", "stream",
)  # fmt: skip
# Each row's first and last minute of traffic (core.statement.traffic_intervals' rule:
# from its start, its end only when the two are more than MAX_SPAN_MS apart)
_SLOTS_SQL: Final = (
    "intDiv(if(intDiv(end_unix_ns, 1000000) - least(intDiv(ts_unix_ns, 1000000), "
    "intDiv(end_unix_ns, 1000000)) > {span:Int64}, intDiv(end_unix_ns, 1000000), "
    "least(intDiv(ts_unix_ns, 1000000), intDiv(end_unix_ns, 1000000))), {slot:Int64}) AS _a, "
    "intDiv(intDiv(end_unix_ns, 1000000), {slot:Int64}) AS _b"
)
# A row's exemption class (EngineSource.special_sql): its maintenance window, cold start.
_CLASS: Final = ("_window", "_cold", "_cold_host", "_cold_at")


class StoreChangedError(RuntimeError):
    """The tenant's rows of the period changed between the reads of one statement (a
    live store written meanwhile: :meth:`EngineSource.check_unchanged`), or two reads
    saw different rows (a group's id read differently: a bug). The statement is read
    again (``pipeline.app.statement.build_statement``)."""


def _interval_sql(column: str, cuts: Sequence[float]) -> str:
    """:meth:`Cuts.interval` in the engine's terms."""
    terms = " + ".join(f"({column} > {t!r}) * 2 + ({column} = {t!r})" for t in cuts)
    return f"ifNull(toInt16({terms}), -1)"


def _prompt_sql(cuts: Sequence[int]) -> str:
    """How many of the cuts the prompt's size is above (-1: unknown)."""
    if not cuts:
        return "toInt16(-1)"
    terms = " + ".join(f"(prompt_tokens > {int(t)})" for t in cuts)
    return f"ifNull(toInt16({terms}), -1)"


def _hash_sql(values: Sequence[str], nullable: Collection[str]) -> str:
    """``cityHash64`` of the values, a missing one hashed as missing (``cityHash64`` of a
    NULL is NULL): each value that may be missing (``nullable``) as (whether it is
    missing, the value or its type's default), each other as it is."""
    args = (f"isNull({v}), assumeNotNull({v})" if v in nullable else v for v in values)
    return f"cityHash64({', '.join(args)})"


def _levels(percentile: float) -> tuple[str, str]:
    """Two ``quantileExact`` levels (SQL literals) for the nearest rank of ``percentile``
    on values negated: ``1 - p/100`` from the percentile as written (decimal), and as the
    core computes ``p/100`` in floating point. Where ``p/100 * n`` is a whole number in one
    and not in the other, one of the two floors is the core's ``n - ceil(p/100 * n)``."""
    written = float((100 - Decimal(repr(float(percentile)))) / 100)
    return repr(written), repr(1.0 - float(percentile) / 100.0)


# The requests columns that may be NULL (how a group's key is hashed).
_NULLABLE: Final = frozenset(n for n, t in REQUEST_COLUMNS if t.startswith("Nullable"))
# Part of the version 4 digest's definition (a statement issued verifies against it for
# good): the statement's columns hashed as (missing, value). The schema's nullable columns
# today; were one to change, the digest would need a version of its own
# (tests/unit/test_statement_cuts.py holds the two equal).
DIGEST_NULLABLE: Final = frozenset({
    "cold_start_unix_ns", "priority", "stream", "prompt_tokens", "gateway_total_ms",
    "gateway_ttfb_ms", "engine_e2e_ms", "queue_ms", "prefill_ms", "decode_ms",
    "inference_ms", "ttft_engine_ms", "tpot_ms", "gateway_overhead_ms",
})  # fmt: skip


class EngineSource:
    """A tenant's period as the engine counts it (module docstring). Reads on
    construction the other versions of its keys, the groups (with the digest and the
    minutes of traffic) and the special rows; the percentiles are one read, each
    incident's bad rows one."""

    def __init__(
        self,
        store: Store,
        contract: Contract,
        spec: SLOSpec,
        *,
        tenant: str,
        from_unix_ns: int,
        until_unix_ns: int,
    ) -> None:
        self.store = store
        read = self._read = _Read(store, tenant, from_unix_ns, until_unix_ns)
        self.params: dict[str, Any] = dict(read.bound)
        self.rows_sql = self._final_rows(read)
        self.cuts = Cuts.of(contract, spec)
        # which exemption a row could have: the first maintenance window it ends in
        # (-1: none), and whether it has a cold start, which (host, start; "" and 0: none)
        window = " ".join(
            f"end_unix_ns >= {a} AND end_unix_ns < {b}, {j},"
            for j, (a, b, _) in enumerate(maintenance_windows(contract))
        )
        special = [
            f"{f'multiIf({window} -1)' if window else 'toInt64(-1)'} AS _window",
            "isNotNull(cold_start_unix_ns) AS _cold",
            "if(isNull(cold_start_unix_ns), '', engine_host) AS _cold_host",
            "ifNull(cold_start_unix_ns, 0) AS _cold_at",
        ]
        self.special_sql = ", ".join(special)
        keys = [f"{f} AS {f}" for f in _GROUPED]
        keys.append(f"{_prompt_sql(self.cuts.prompt_tokens)} AS _pt")
        keys += [f"{_interval_sql(b, c)} AS _b_{b}" for b, c in self.cuts.boundaries.items()]
        keys += special
        self.key_sql = ", ".join(keys)
        self.key_names = [k.rsplit(" AS ", 1)[1] for k in keys]
        self.gid_sql = _hash_sql([k.rsplit(" AS ", 1)[0] for k in keys], _NULLABLE)
        self.day_sql = (
            f"toInt32(toDate(toDateTime(intDiv(end_unix_ns, 1000000000), "
            f"'{contract.billing.timezone}')))"
        )
        # the period's rows, every version, before the groups' read (without other
        # versions: as many as the groups hold)
        self._stored = read.stored() if "shared" in self.params else None
        self._read_groups()
        self._read_special()

    @property
    def judged_sql(self) -> str:
        """The final rows with their group (``_gid``)."""
        return f"SELECT *, {self.gid_sql} AS _gid FROM ({self.rows_sql})"

    def check_unchanged(self) -> None:
        """Raise :class:`StoreChangedError` when the tenant's rows of the period (every
        version) are not as many as before the first read: a row written between the
        reads (a live store; or two versions merged into one, read again all the same)."""
        before = self._requests if self._stored is None else self._stored
        now = self._read.stored(fresh=True)
        if now != before:
            raise StoreChangedError(f"the period's rows went from {before} to {now}")

    # ----------------------------------------------------------------- reading
    def _final_rows(self, read: _Read) -> str:
        """The SQL of the tenant's final rows of the period (a subquery)."""
        rows = f"SELECT * FROM {read.db}.requests WHERE {read.match}"
        shared = read.shared()
        if not len(shared):
            return rows
        kh = read.key_hash
        self.params["shared"] = shared.to_pylist()
        self.params["tops"] = read.highest(shared)
        return (
            f"{rows} AND {kh} NOT IN {{shared:Array(UInt64)}} UNION ALL "
            f"SELECT * FROM ({rows} AND {kh} IN {{shared:Array(UInt64)}} AND "
            "(request_id, attempt, revision) IN {tops:Array(Tuple(String, UInt16, UInt8))} "
            "LIMIT 1 BY request_id, attempt)"
        )

    def _read_groups(self) -> None:
        """The groups (their rows, digest and ends) and the minutes of traffic, in one
        read (two grouping sets; a group's id hashed from its key as grouped, the same
        value as from each row's)."""
        digest = _hash_sql(STATEMENT_COLUMNS, DIGEST_NULLABLE)
        keys = ", ".join(self.key_names)
        table = self.store.query_arrow(
            f"SELECT *, {_hash_sql(self.key_names, _NULLABLE)} AS _gid FROM ("
            f"SELECT {self.key_sql}, {_SLOTS_SQL}, grouping(_a) AS _group, count() AS _n, "
            f"sum({digest}) AS _digest, min(end_unix_ns) AS _first, "
            f"max(end_unix_ns) AS _last FROM ({self.rows_sql}) "
            f"GROUP BY GROUPING SETS (({keys}), (model, _a, _b)))",
            {**self.params, "slot": TRAFFIC_SLOT_MS, "span": MAX_SPAN_MS},
        )
        # (grouping(_a) is 1 on the rows of the grouping set without it: the groups')
        of_groups = table.column("_group").to_numpy(zero_copy_only=False).astype(np.bool_)
        slots = table.filter(pa.array(~of_groups))
        table = table.filter(pa.array(of_groups))
        self._weights = table.column("_n").to_numpy(zero_copy_only=False).astype(np.int64)
        self._requests = int(self._weights.sum())
        total = sum(int(x) for x in table.column("_digest").to_pylist()) % 2**64
        self.digest = f"cityhash64-sum:{self._requests}:{total:016x}"
        firsts, lasts = table.column("_first").to_pylist(), table.column("_last").to_pylist()
        self.first_end_ns = min(firsts) if firsts else None
        self.last_end_ns = max(lasts) if lasts else None
        self._gids = table.column("_gid").to_numpy(zero_copy_only=False).astype(np.uint64)
        self._groups = table
        codes, models = few_values(slots.column("model"))
        first = slots.column("_a").to_numpy(zero_copy_only=False).astype(np.int64)
        last = slots.column("_b").to_numpy(zero_copy_only=False).astype(np.int64)
        self._slots = {
            str(m): slots_of(first[codes == j], last[codes == j])
            for j, m in enumerate(models)
            if (codes == j).any()
        }

    def _read_special(self) -> None:
        """The rows that could be exempted, with their exemption class."""
        table = self.store.query_arrow(
            f"SELECT {', '.join(STATEMENT_COLUMNS)}, {_KEY_HASH} AS _key_hash, "
            f"{self.special_sql} FROM ({self.rows_sql}) "
            "WHERE _window >= 0 OR isNotNull(cold_start_unix_ns)",
            self.params,
        )
        order = _hash_order(table)
        self._special = statement_rows(table, order)
        self._special_class = list(
            zip(*(table.column(c).take(pa.array(order)).to_pylist() for c in _CLASS), strict=True)
        )

    # ------------------------------------------------------------ the source
    @property
    def requests(self) -> int:
        return self._requests

    @property
    def special(self) -> StatementRows:
        return self._special

    def counted(self, exempt: Sequence[int]) -> tuple[RecordColumns, IntArray, BoolArray]:
        """The groups (exempted: those whose rows the exemptions took, every one of
        them, for the maintenance window or cold start the group is of)."""
        kept = np.ones(len(self._weights), dtype=np.bool_)
        classes = self._exempt_classes(exempt)
        group_class = zip(*(self._groups.column(c).to_pylist() for c in _CLASS), strict=True)
        rows: dict[tuple[Any, ...], int] = dict.fromkeys(classes, 0)
        for g, c in enumerate(group_class):
            if c in classes:
                kept[g] = not classes[c]
                rows[c] += int(self._weights[g])
        special = collections.Counter(self._special_class)
        if any(rows[c] != special[c] for c in classes):
            raise StoreChangedError("the special rows are not the groups' (a write between)")
        fields: dict[str, list[Any]] = {}
        for name in _GROUPED:
            column = self._groups.column(name)
            codes, values = few_values(column, none_if_empty=name in _NONE_IF_EMPTY)
            fields[name] = [values[c] for c in codes.tolist()]
        pt = self._groups.column("_pt").to_pylist()
        fields["prompt_tokens"] = [self.cuts.prompt_stand_in(c) for c in pt]
        stand_ins = np.full((len(self._weights), len(BOUNDARIES)), np.nan, dtype=np.float64)
        for b, cuts in self.cuts.boundaries.items():
            at = self._groups.column(f"_b_{b}").to_pylist()
            stand_ins[:, BOUNDARIES.index(b)] = [Cuts.stand_in(c, cuts) for c in at]
        return RecordColumns.of_fields(fields, stand_ins), self._weights, kept

    def _exempt_classes(self, exempt: Sequence[int]) -> dict[tuple[Any, ...], bool]:
        """Each exemption class of the special rows: whether its rows are exempted (all
        of them: a class the exemptions split is a reader that no longer follows the
        core's rule, and fails)."""
        out = set(exempt)
        seen: dict[tuple[Any, ...], set[bool]] = {}
        for i, c in enumerate(self._special_class):
            seen.setdefault(c, set()).add(i in out)
        split = [c for c, v in seen.items() if len(v) > 1]
        if split:
            raise RuntimeError(f"exemptions split the rows of {split[:3]} (statement_engine)")
        return {c: v.pop() for c, v in seen.items()}

    def _selected(self, rows: BoolArray) -> tuple[str, dict[str, Any]]:
        """The rows of the groups in the mask: a condition and its parameter."""
        return "_gid IN {gids:Array(UInt64)}", {"gids": self._gids[rows].tolist()}

    def percentiles(
        self, asked: Sequence[tuple[str, BoolArray]], percentile: float
    ) -> list[tuple[DayValue | None, list[DayValue]]]:
        """One read for every boundary asked: per day and over the period, each mask's
        values, their count and their ``k``-th smallest (the ``ceil(p/100 * n)``-th, the
        core's ``nearest_rank``). Which masks a group is in: one lookup per row
        (``transform`` of its group to a bit mask).

        The ``k``-th smallest is the ``(n - k)``-th (from 0) of the values negated, which
        ``quantileExact`` selects without a sort at ``floor(level * n)``: at two levels
        (:func:`_levels`), one of which gives that rank for every ``n`` up to a million
        at the usual percentiles. The read says whether one did; where neither does (or a
        value is NaN) it is read again with partial sorts of the values (exact by
        construction, ~0.5 s more for the largest tenant-month)."""
        if not asked:
            return []
        bits = np.zeros(len(self._weights), dtype=np.uint64)
        for j, (_, rows) in enumerate(asked):
            bits |= rows.astype(np.uint64) << np.uint64(j)
        on = np.flatnonzero(bits)
        params: dict[str, Any] = {
            **self.params,
            "p": float(percentile),
            "gids": self._gids[on].tolist(),
            "bits": bits[on].tolist(),
        }
        read = self._percentile_rows(asked, params, sort=False)
        if not all(r[f"ok{j}"] for r in read for j in range(len(asked))):
            read = self._percentile_rows(asked, params, sort=True)
        out: list[tuple[DayValue | None, list[DayValue]]] = []
        for j in range(len(asked)):
            whole: DayValue | None = None
            days: list[DayValue] = []
            # (grouping(day) is 1 on the row of the grouping set without the day)
            for r in read:
                n = int(r[f"n{j}"])
                if not n:
                    continue
                if r["_whole"]:
                    whole = (-1, float(r[f"v{j}"]), n)
                else:
                    days.append((int(r["day"]), float(r[f"v{j}"]), n))
            out.append((whole, days))
            self._check(asked[j], 0 if whole is None else whole[2])
        return out

    def _percentile_rows(
        self, asked: Sequence[tuple[str, BoolArray]], params: dict[str, Any], *, sort: bool
    ) -> list[dict[str, Any]]:
        """The read of :meth:`percentiles`: by selection (``ok{j}``: whether it selected
        the ``k``-th), or (``sort``) by a partial sort from the nearer end."""
        written, core = _levels(params["p"])
        picks, conds = [], []
        for j, (boundary, _) in enumerate(asked):
            conds.append(f"isNotNull({boundary}) AND bitTest(_bits, {j}) AS _in{j}")
            value = f"assumeNotNull({boundary})"
            rank = (
                f"countIf(_in{j}) AS n{j}, "
                f"toUInt64(greatest(1, ceil({{p:Float64}} / 100.0 * n{j}))) AS k{j}"
            )
            if sort:
                values = f"groupArrayIf({value}, _in{j})"
                picks.append(
                    f"{rank}, 1 AS ok{j}, if(k{j} <= n{j} - k{j}, "
                    f"arrayPartialSort(k{j}, {values})[k{j}], "
                    f"arrayPartialReverseSort(n{j} - k{j} + 1, {values})[n{j} - k{j} + 1]) AS v{j}"
                )
            else:
                at = f"toUInt64({written} * n{j}) = n{j} - k{j}"
                picks.append(
                    f"{rank}, quantilesExactIf({written}, {core})(-{value}, _in{j}) AS _q{j}, "
                    f"-if({at}, _q{j}[1], _q{j}[2]) AS v{j}, "
                    f"(n{j} = 0 OR {at} OR toUInt64({core} * n{j}) = n{j} - k{j}) "
                    f"AND countIf(_in{j} AND isNaN({value})) = 0 AS ok{j}"
                )
        columns = sorted({b for b, _ in asked})
        table = self.store.query_arrow(
            f"SELECT {self.day_sql} AS day, grouping(day) AS _whole, {', '.join(picks)} "
            f"FROM (SELECT end_unix_ns, {', '.join(columns)}, {', '.join(conds)} FROM ("
            "SELECT *, transform(_gid, {gids:Array(UInt64)}, {bits:Array(UInt64)}, "
            f"toUInt64(0)) AS _bits FROM ({self.judged_sql})) WHERE _bits != 0) "
            "GROUP BY GROUPING SETS ((day), ()) ORDER BY _whole, day",
            params,
        )
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    def _check(self, asked: tuple[str, BoolArray], selected: int) -> None:
        """The engine selected the rows of the groups asked that have a value: a group's
        id that no longer names its rows (a key read differently by two queries) would
        select others, silently."""
        boundary, rows = asked
        codes = self._groups.column(f"_b_{boundary}").to_numpy(zero_copy_only=False)
        want = int(self._weights[rows & (codes >= 0)].sum())
        if selected != want:
            raise StoreChangedError(
                f"{selected} rows with a {boundary} selected, the groups asked for hold "
                f"{want} (a write between the reads, or a group's id read differently)"
            )

    def bad_rows(self, rows: BoolArray, from_ns: int, to_ns: int) -> StatementRows:
        where, bound = self._selected(rows)
        params = {**self.params, **bound}
        table = self.store.query_arrow(
            f"SELECT request_id, attempt, engine_host, {', '.join(BOUNDARIES)}, "
            f"{_KEY_HASH} AS _key_hash FROM ({self.judged_sql}) WHERE {where} "
            "AND end_unix_ns >= {lo:Int64} AND end_unix_ns <= {hi:Int64} "
            f"ORDER BY {', '.join(_HASH_ORDER)}",
            {**params, "lo": from_ns, "hi": to_ns},
        )
        host_codes, hosts = few_values(table.column("engine_host"), none_if_empty=True)
        fields = {
            "request_id": table.column("request_id").to_pylist(),
            "attempt": table.column("attempt").to_numpy(zero_copy_only=False),
            "engine_host": [hosts[c] for c in host_codes.tolist()],
        }
        values = np.empty((table.num_rows, len(BOUNDARIES)), dtype=np.float64, order="F")
        for j, b in enumerate(BOUNDARIES):
            values[:, j] = table.column(b).to_numpy(zero_copy_only=False)
        return StatementRows(fields, values)

    def traffic(
        self, scopes: Sequence[str], models: list[str] | None, start_ms: int, end_ms: int
    ) -> dict[str, list[tuple[int, int]]]:
        return traffic_of_slots(
            self._slots, scopes, models, start_ms, end_ms, slot_ms=TRAFFIC_SLOT_MS
        )
