//! `Joiner`: a port of `pipeline.core.join.Joiner` (with `join_state`, `join_rules` and
//! `join_timers`), rule for rule and timer for timer: the same records, `Emitted`s,
//! counters, deadlines, offsets and resolved memory for the same calls
//! (`tests/unit/test_native_diff.py` compares them on hypothesis-generated streams).
//!
//! What the reference holds as a packed int (a request in flight) is a `Inflight` here;
//! what it holds as an int in the resolved memory is `RVal::Joined`. Records, `Emitted`s,
//! the `Received` copies in `Emitted.parts` and `JoinCounters` are the reference's own
//! Python classes (passed in at construction), built from here. The rare rules that
//! compare whole events (a repeat under another id, the conflict marks, which of two
//! conflicting events is worse) call the reference's functions.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

type Key = Arc<str>;

// ---------------------------------------------------------------------------
// a small, fast hasher and an insertion-ordered map (Python's dict order)
// ---------------------------------------------------------------------------

#[derive(Default, Clone, Copy)]
pub struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let mut tail = 0u64;
        for (i, b) in chunks.remainder().iter().enumerate() {
            tail |= (*b as u64) << (8 * i);
        }
        self.add(tail ^ (bytes.len() as u64) << 56);
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Fx {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A dict: insertion order, a key set again keeps its place, a deleted one loses it. The
/// order is a queue of (sequence number, key), an item left there when its key is deleted
/// (or set again after a deletion) and skipped (dropped once they are half the queue).
pub struct OrdMap<V> {
    map: FxMap<Key, (u64, V)>,
    order: VecDeque<(u64, Key)>,
    seq: u64,
}

impl<V> OrdMap<V> {
    fn new() -> Self {
        OrdMap {
            map: FxMap::default(),
            order: VecDeque::new(),
            seq: 0,
        }
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn get(&self, k: &str) -> Option<&V> {
        self.map.get(k).map(|(_, v)| v)
    }
    fn get_mut(&mut self, k: &str) -> Option<&mut V> {
        self.map.get_mut(k).map(|(_, v)| v)
    }
    fn contains(&self, k: &str) -> bool {
        self.map.contains_key(k)
    }
    fn live(&self, s: u64, k: &str) -> bool {
        self.map.get(k).is_some_and(|(at, _)| *at == s)
    }
    fn insert(&mut self, k: Key, v: V) {
        if let Some(slot) = self.map.get_mut(&*k) {
            slot.1 = v;
            return;
        }
        let s = self.seq;
        self.seq += 1;
        self.order.push_back((s, k.clone()));
        self.map.insert(k, (s, v));
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(s, k)| map.get(&**k).is_some_and(|(at, _)| at == s));
        }
    }
    fn remove(&mut self, k: &str) -> Option<V> {
        let (_, v) = self.map.remove(k)?;
        while let Some((s, front)) = self.order.front() {
            if self.live(*s, front) {
                break;
            }
            self.order.pop_front();
        }
        Some(v)
    }
    fn first_key(&self) -> Option<Key> {
        self.order
            .iter()
            .find(|(s, k)| self.live(*s, k))
            .map(|(_, k)| k.clone())
    }
    fn keys(&self) -> Vec<Key> {
        self.iter().map(|(k, _)| k.clone()).collect()
    }
    fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.order
            .iter()
            .filter_map(move |(s, k)| match self.map.get(&**k) {
                Some((at, v)) if at == s => Some((k, v)),
                _ => None,
            })
    }
}

// ---------------------------------------------------------------------------
// constants (pipeline/core/join_state.py, join_timers.py, join_rules.py)
// ---------------------------------------------------------------------------

const NS_PER_MS: i64 = 1_000_000;
const MAX_CONFLICTS: i64 = 65_535;
const MAX_STRINGS: usize = 1 << 12;
const MAX_PROMPT: i64 = (1 << 24) - 2;
const MAX_WALL: i64 = (1 << 44) - 2;
const RECENT_BITS: u32 = 12;
const GENERATIONS: i64 = 8;
const NEVER: i64 = 1 << 62;
const COMPACT_SLACK: usize = 1024;
const BUCKET_BITS: u32 = 14;
const TERMINAL_BITS: u32 = 12;
const ENGINE_FIT_SLACK_MS: f64 = 50.0;
const EPS_MS: f64 = 1e-6;
const ATTEMPT_SEP: char = '\x1f';
const INTERN_MAX: usize = 1 << 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Received,
    Completed,
    Finished,
}

fn attempt_key(rid: &str, n: i64) -> Key {
    if n == 1 {
        Arc::from(rid)
    } else {
        Arc::from(format!("{rid}{ATTEMPT_SEP}{n}"))
    }
}

fn rid_of(key: &str, attempt: i64) -> &str {
    if attempt == 1 {
        key
    } else {
        match key.rfind(ATTEMPT_SEP) {
            Some(i) => &key[..i],
            None => "",
        }
    }
}

fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> PyResult<PyObject> {
    v.into_py_any(py)
}

// ---------------------------------------------------------------------------
// what the join holds
// ---------------------------------------------------------------------------

/// A `gateway.received` as the join keeps it (the reference's `Received`, or the event
/// itself where the reference keeps the event: `event`).
struct Recv {
    id_hash: u64,
    ts_ns: i64,
    host: PyObject,
    model: PyObject,
    priority: i64,
    tenant: Option<PyObject>,
    prompt: Option<i64>,
    stream: bool,
    // the client's attempt (issue 47): never in the packed in-flight state
    client_attempt: i64,
    logical: Option<PyObject>,
    event: Option<PyObject>,
}

/// A pending request with more than its gateway.received (the reference's `Pending`).
struct Pending {
    first_offset: i64,
    attempt: i64,
    retried: bool,
    received: Option<Recv>,
    completed: Option<PyObject>,
    finished: Option<PyObject>,
    deadline_ms: i64,
    wall_deadline_ms: i64,
    terminal_ms: i64,
    conflicts: i64,
    seen: Vec<i64>,
}

impl Pending {
    fn new(first_offset: i64, attempt: i64) -> Pending {
        Pending {
            first_offset,
            attempt,
            retried: false,
            received: None,
            completed: None,
            finished: None,
            deadline_ms: 0,
            wall_deadline_ms: 0,
            terminal_ms: 0,
            conflicts: 0,
            seen: Vec::new(),
        }
    }
}

/// A request in flight (the reference's packed int, and what it packs: host, model and
/// tenant as ids in the codec's string table, 0 a tenant of None; -1 a wall time or
/// prompt of None). Only what fits the reference's int is held so (`Joiner::pack`).
struct Inflight {
    id_hash: u64,
    ts_ns: i64,
    offset: i64,
    wall_ms: i64,
    prompt: i64,
    host: u16,
    model: u16,
    tenant: u16,
    priority: u8,
    stream: bool,
}

enum PState {
    Packed(Inflight),
    Full(Box<Pending>),
}

/// A resolved request whose events are kept (the reference's `Resolved`).
struct Resolved {
    expires_ms: i64,
    received: Option<Recv>,
    completed: Option<PyObject>,
    finished: Option<PyObject>,
    partial: bool,
    attempt: i64,
    retried: bool,
    first_offset: i64,
    conflicts: i64,
    seen: Vec<i64>,
}

fn resolved_from(e: Pending, expires_ms: i64, partial: bool) -> Resolved {
    Resolved {
        expires_ms,
        received: e.received,
        completed: e.completed,
        finished: e.finished,
        partial,
        attempt: e.attempt,
        retried: e.retried,
        first_offset: e.first_offset,
        conflicts: e.conflicts,
        seen: e.seen,
    }
}

enum RVal {
    /// A fully joined request: its expiry and the short hash of its received (0: unknown).
    Joined {
        expires_ms: i64,
        short: u64,
    },
    Kept(Box<Resolved>),
}

impl RVal {
    fn expiry(&self) -> i64 {
        match self {
            RVal::Joined { expires_ms, .. } => *expires_ms & ((1i64 << 56) - 1),
            RVal::Kept(r) => r.expires_ms,
        }
    }
}

fn short_hash(id_hash: u64) -> u64 {
    (id_hash & 0xFFFF_FFFF) + 1
}

/// `ResolvedMemory`: generations by expiry, each dropped whole.
struct ResolvedMemory {
    span_ms: i64,
    max: usize,
    by_index: BTreeMap<i64, OrdMap<RVal>>,
    len: usize,
    now_ms: i64,
    drop_at_ms: i64,
}

impl ResolvedMemory {
    fn new(ttl_ms: i64, max_items: i64) -> Self {
        ResolvedMemory {
            span_ms: (ttl_ms / GENERATIONS).max(1),
            max: max_items.max(0) as usize,
            by_index: BTreeMap::new(),
            len: 0,
            now_ms: 0,
            drop_at_ms: NEVER,
        }
    }
    fn get(&self, key: &str) -> Option<&RVal> {
        for gen in self.by_index.values().rev() {
            if let Some(v) = gen.get(key) {
                return if v.expiry() > self.now_ms {
                    Some(v)
                } else {
                    None
                };
            }
        }
        None
    }
    fn get_mut(&mut self, key: &str) -> Option<&mut RVal> {
        let now = self.now_ms;
        for gen in self.by_index.values_mut().rev() {
            if gen.contains(key) {
                let v = gen.get_mut(key).unwrap();
                return if v.expiry() > now { Some(v) } else { None };
            }
        }
        None
    }
    fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
    fn put(&mut self, key: Key, value: RVal) {
        let index = value.expiry().div_euclid(self.span_ms);
        if !self.by_index.contains_key(&index) {
            self.by_index.insert(index, OrdMap::new());
            self.regenerate();
        }
        let gen = self.by_index.get_mut(&index).unwrap();
        let n = gen.len();
        gen.insert(key, value);
        self.len += gen.len() - n;
        if self.len > self.max {
            self.drop_oldest();
        }
    }
    fn expire(&mut self, now_ms: i64) {
        if now_ms > self.now_ms {
            self.now_ms = now_ms;
            if now_ms >= self.drop_at_ms {
                let span = self.span_ms;
                let gone: Vec<i64> = self
                    .by_index
                    .keys()
                    .copied()
                    .filter(|i| (i + 1) * span <= now_ms)
                    .collect();
                for i in gone {
                    self.len -= self.by_index.remove(&i).unwrap().len();
                }
                self.regenerate();
            }
        }
    }
    fn regenerate(&mut self) {
        self.drop_at_ms = match self.by_index.keys().next() {
            Some(i) => (i + 1) * self.span_ms,
            None => NEVER,
        };
    }
    fn drop_oldest(&mut self) {
        let oldest = *self.by_index.keys().next().unwrap();
        if self.by_index.len() > 1 {
            self.len -= self.by_index.remove(&oldest).unwrap().len();
            self.regenerate();
            return;
        }
        let gen = self.by_index.get_mut(&oldest).unwrap();
        while self.len > self.max {
            let k = gen.first_key().unwrap();
            gen.remove(&k);
            self.len -= 1;
        }
    }
    /// What `get` finds, key by key (the reference's `items`), as (key, expiry, kept).
    fn items(&self) -> Vec<(Key, i64, bool)> {
        let mut seen: FxMap<Key, ()> = FxMap::default();
        let mut out = Vec::new();
        for gen in self.by_index.values().rev() {
            for (k, v) in gen.iter() {
                if seen.insert(k.clone(), ()).is_none() && v.expiry() > self.now_ms {
                    out.push((k.clone(), v.expiry(), matches!(v, RVal::Kept(_))));
                }
            }
        }
        out
    }
}

/// A fully joined request's events, as the reference's `RecentJoins` holds its `Emitted`.
struct JoinedParts {
    received: Recv,
    completed: PyObject,
    finished: PyObject,
    attempt: i64,
    first_offset: i64,
    conflicts: i64,
}

enum Held {
    Joined(JoinedParts),
    Kept(Box<Resolved>),
}

struct RecentJoins {
    keep_ms: i64,
    gens: BTreeMap<i64, FxMap<Key, (i64, Held)>>,
    now_ms: i64,
}

impl RecentJoins {
    fn get(&mut self, key: &str, attempts: &FxMap<Key, i64>) -> Option<&mut Resolved> {
        let now = self.now_ms;
        let keep = self.keep_ms;
        for gen in self.gens.values_mut().rev() {
            let Some(item) = gen.get_mut(key) else {
                continue;
            };
            let ts_ms = item.0;
            if ts_ms + keep <= now {
                return None;
            }
            if let Held::Joined(_) = &item.1 {
                let Held::Joined(p) = std::mem::replace(
                    &mut item.1,
                    Held::Kept(Box::new(Resolved {
                        expires_ms: 0,
                        received: None,
                        completed: None,
                        finished: None,
                        partial: false,
                        attempt: 1,
                        retried: false,
                        first_offset: -1,
                        conflicts: 0,
                        seen: Vec::new(),
                    })),
                ) else {
                    unreachable!()
                };
                let rid = rid_of(key, p.attempt);
                let retried = attempts.get(rid).copied().unwrap_or(1) > p.attempt;
                item.1 = Held::Kept(Box::new(Resolved {
                    expires_ms: ts_ms + keep,
                    received: Some(p.received),
                    completed: Some(p.completed),
                    finished: Some(p.finished),
                    partial: false,
                    attempt: p.attempt,
                    retried,
                    first_offset: p.first_offset,
                    conflicts: p.conflicts,
                    seen: Vec::new(),
                }));
            }
            if let Held::Kept(r) = &mut item.1 {
                return Some(r);
            }
        }
        None
    }
    fn expire(&mut self, now_ms: i64) {
        if self.gens.is_empty() || now_ms <= self.now_ms {
            return;
        }
        self.now_ms = now_ms;
        let horizon = now_ms - self.keep_ms;
        let gone: Vec<i64> = self
            .gens
            .keys()
            .copied()
            .filter(|at| ((at + 1) << RECENT_BITS) - 1 <= horizon)
            .collect();
        for at in gone {
            self.gens.remove(&at);
        }
    }
}

// ---------------------------------------------------------------------------
// timers (pipeline/core/join_timers.py)
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Buckets {
    by_key: FxMap<i64, Vec<Key>>,
    keys: BinaryHeap<Reverse<i64>>,
    items: usize,
    frontier: i64,
}

impl Buckets {
    fn new() -> Self {
        Buckets {
            frontier: -1,
            ..Default::default()
        }
    }
    fn put(&mut self, key: i64, rid: Key) {
        match self.by_key.get_mut(&key) {
            Some(b) => b.push(rid),
            None => {
                self.by_key.insert(key, vec![rid]);
                self.keys.push(Reverse(key));
            }
        }
        self.items += 1;
    }
    fn take(&mut self, frontier: i64) -> Vec<(i64, Vec<Key>)> {
        self.frontier = frontier;
        let mut out = Vec::new();
        while let Some(&Reverse(k)) = self.keys.peek() {
            if k > frontier {
                break;
            }
            self.keys.pop();
            let b = self.by_key.remove(&k).unwrap();
            self.items -= b.len();
            out.push((k, b));
        }
        out
    }
    fn compact(&mut self, pending: &OrdMap<PState>, key_of: impl Fn(&PState) -> Option<i64>) {
        let mut n = 0;
        let keys: Vec<i64> = self.by_key.keys().copied().collect();
        for key in keys {
            let bucket = self.by_key.get_mut(&key).unwrap();
            bucket.retain(|rid| pending.get(rid).is_some_and(|e| key_of(e) == Some(key)));
            if bucket.is_empty() {
                self.by_key.remove(&key);
            } else {
                n += bucket.len();
            }
        }
        self.keys = self.by_key.keys().map(|k| Reverse(*k)).collect();
        self.items = n;
    }
    fn clear(&mut self) {
        self.by_key.clear();
        self.keys.clear();
        self.items = 0;
    }
}

struct Timers {
    inflight_ttl_ms: i64,
    deadlines: BinaryHeap<Reverse<(i64, Key)>>,
    wall_waits: BinaryHeap<Reverse<(i64, i64, Key)>>,
    terminals: BinaryHeap<Reverse<(i64, Key)>>,
    inflight: Buckets,
    terminal: Buckets,
}

fn ts_ms_of(ts_ns: i64) -> i64 {
    ts_ns.div_euclid(NS_PER_MS)
}

impl Timers {
    fn deadline(&self, e: &PState) -> i64 {
        match e {
            PState::Packed(p) => ts_ms_of(p.ts_ns) + self.inflight_ttl_ms,
            PState::Full(p) => p.deadline_ms,
        }
    }
    fn wall_deadline(&self, e: &PState) -> i64 {
        match e {
            PState::Packed(p) if p.wall_ms >= 0 => p.wall_ms + self.inflight_ttl_ms,
            PState::Packed(_) => 0,
            PState::Full(p) => p.wall_deadline_ms,
        }
    }
    fn push_deadline(&mut self, pending: &OrdMap<PState>, deadline_ms: i64, rid: Key) {
        self.deadlines.push(Reverse((deadline_ms, rid)));
        if self.deadlines.len() > 2 * pending.len() + COMPACT_SLACK {
            self.compact(pending);
        }
    }
    fn push_terminal(&mut self, terminal_ms: i64, rid: Key) {
        self.terminals.push(Reverse((terminal_ms, rid)));
    }
    fn arm(
        &mut self,
        pending: &OrdMap<PState>,
        rid: Key,
        deadline_ms: i64,
        terminal_ms: Option<i64>,
    ) {
        let (key, is_terminal) = match terminal_ms {
            None => (deadline_ms >> BUCKET_BITS, false),
            Some(t) => (t >> TERMINAL_BITS, true),
        };
        let frontier = if is_terminal {
            self.terminal.frontier
        } else {
            self.inflight.frontier
        };
        if key <= frontier {
            if let Some(t) = terminal_ms {
                self.terminals.push(Reverse((t, rid.clone())));
            }
            self.push_deadline(pending, deadline_ms, rid);
            return;
        }
        let ttl = self.inflight_ttl_ms;
        let b = if is_terminal {
            &mut self.terminal
        } else {
            &mut self.inflight
        };
        b.put(key, rid);
        if b.items > 2 * pending.len() + COMPACT_SLACK {
            if is_terminal {
                b.compact(pending, |e| match e {
                    PState::Full(p) => Some(p.terminal_ms >> TERMINAL_BITS),
                    PState::Packed(_) => None,
                });
            } else {
                b.compact(pending, |e| match e {
                    PState::Packed(p) => Some((ts_ms_of(p.ts_ns) + ttl) >> BUCKET_BITS),
                    PState::Full(_) => None,
                });
            }
        }
    }
    fn move_inflight(&mut self, pending: &OrdMap<PState>, now_ms: i64) {
        let frontier = now_ms >> BUCKET_BITS;
        if frontier <= self.inflight.frontier {
            return;
        }
        for (key, bucket) in self.inflight.take(frontier) {
            for rid in bucket {
                if let Some(e @ PState::Packed(_)) = pending.get(&rid) {
                    let d = self.deadline(e);
                    if d >> BUCKET_BITS == key {
                        self.deadlines.push(Reverse((d, rid)));
                    }
                }
            }
        }
    }
    fn move_terminals(&mut self, pending: &OrdMap<PState>, frontier: i64) {
        if frontier <= self.terminal.frontier {
            return;
        }
        for (key, bucket) in self.terminal.take(frontier) {
            for rid in bucket {
                if let Some(PState::Full(e)) = pending.get(&rid) {
                    if e.terminal_ms >> TERMINAL_BITS == key {
                        self.terminals.push(Reverse((e.terminal_ms, rid.clone())));
                        self.deadlines.push(Reverse((e.deadline_ms, rid)));
                    }
                }
            }
        }
        if self.deadlines.len() > 2 * pending.len() + COMPACT_SLACK {
            self.compact(pending);
        }
    }
    fn clear(&mut self) {
        self.deadlines.clear();
        self.wall_waits.clear();
        self.terminals.clear();
        self.inflight.clear();
        self.terminal.clear();
    }
    fn oldest_moved(&mut self, pending: &OrdMap<PState>) -> Option<i64> {
        while let Some(Reverse((ts, rid))) = self.terminals.peek() {
            if let Some(PState::Full(e)) = pending.get(rid) {
                if e.terminal_ms == *ts {
                    return Some(*ts);
                }
            }
            self.terminals.pop();
        }
        None
    }
    fn oldest_terminal_ms(&mut self, pending: &OrdMap<PState>) -> Option<i64> {
        let oldest = self.oldest_moved(pending);
        let mut keys: Vec<i64> = self.terminal.by_key.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let times: Vec<i64> = self.terminal.by_key[&key]
                .iter()
                .filter_map(|rid| match pending.get(rid) {
                    Some(PState::Full(e)) if e.terminal_ms >> TERMINAL_BITS == key => {
                        Some(e.terminal_ms)
                    }
                    _ => None,
                })
                .collect();
            if let Some(m) = times.iter().min() {
                return Some(oldest.map_or(*m, |o| o.min(*m)));
            }
        }
        oldest
    }
    fn oldest_terminal_before(&mut self, pending: &OrdMap<PState>, bound_ms: i64) -> Option<i64> {
        self.move_terminals(pending, bound_ms >> TERMINAL_BITS);
        self.oldest_moved(pending).filter(|o| *o < bound_ms)
    }
    fn compact(&mut self, pending: &OrdMap<PState>) {
        let old = std::mem::take(&mut self.deadlines);
        self.deadlines = old
            .into_vec()
            .into_iter()
            .filter(|Reverse((d, rid))| pending.get(rid).is_some_and(|e| self.deadline(e) == *d))
            .collect();
        let old = std::mem::take(&mut self.terminals);
        self.terminals = old
            .into_vec()
            .into_iter()
            .filter(|Reverse((t, rid))| {
                matches!(pending.get(rid), Some(PState::Full(e)) if e.terminal_ms == *t)
            })
            .collect();
    }
}

// ---------------------------------------------------------------------------
// the Python classes the join builds, and the strings it interns
// ---------------------------------------------------------------------------

struct Helpers {
    record_cls: PyObject,
    emitted_cls: PyObject,
    received_cls: PyObject,
    counters_cls: PyObject,
    repeats: PyObject,
    marks: PyObject,
    worse: PyObject,
    s_joined: PyObject,
    s_gateway_only: PyObject,
    s_engine_only: PyObject,
    s_ok: PyObject,
    s_client_abort: PyObject,
    s_error: PyObject,
    buckets: Vec<PyObject>, // "<512", "512-4k", "4k-8k", "8k-16k", ">16k", "unknown"
    flags: Vec<PyObject>,   // FLAGS' names, in order
    empty: PyObject,
    astuple: PyObject,
    types: Mutex<Vec<TypeInfo>>,
}

/// Host, model and tenant strings, each held once (up to `INTERN_MAX`), and the
/// reference's codec table (`InflightCodec`: ids of the strings a packed int holds, up to
/// `MAX_STRINGS` with the "" of a None tenant; its size decides whether a received fits).
struct Interner {
    ids: FxMap<Box<str>, PyObject>,
    codec: FxMap<Box<str>, u16>,
    codec_objs: Vec<PyObject>,
}

impl Interner {
    /// The string to hold (the one held already when it is equal).
    fn get(&mut self, py: Python<'_>, s: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let text = s.downcast::<PyString>()?.to_str()?;
        if let Some(o) = self.ids.get(text) {
            return Ok(o.clone_ref(py));
        }
        if self.ids.len() < INTERN_MAX {
            self.ids.insert(Box::from(text), s.clone().unbind());
        }
        Ok(s.clone().unbind())
    }

    /// `InflightCodec.string_id`: the codec's id of a string (a new one while the table
    /// has room), None when it is full.
    fn codec_id(&mut self, py: Python<'_>, s: &Bound<'_, PyAny>) -> PyResult<Option<u16>> {
        let text = s.downcast::<PyString>()?.to_str()?;
        if let Some(i) = self.codec.get(text) {
            return Ok(Some(*i));
        }
        let i = self.codec_objs.len();
        if i >= MAX_STRINGS {
            return Ok(None);
        }
        let o = self.get(py, s)?;
        self.codec.insert(Box::from(text), i as u16);
        self.codec_objs.push(o);
        Ok(Some(i as u16))
    }
}

#[derive(Default, Clone, Copy)]
struct Counters {
    events: i64,
    duplicates: i64,
    conflicts: i64,
    conflicts_corrected: i64,
    joined: i64,
    gateway_only: i64,
    engine_only: i64,
    upgraded: i64,
    orphaned_received: i64,
    evicted: i64,
    late_after_resolved: i64,
    attempts: i64,
    superseded: i64,
}

/// A record built, with what the join decides by.
struct Rec {
    obj: PyObject,
    ok: bool,
    superseded: bool,
}

/// The event fields the join reads, by id (`FIELD_NAMES`): a msgspec Struct's are read
/// from one `msgspec.structs.astuple` of it (one C call instead of one attribute lookup
/// each), any other event's by name.
#[derive(Clone, Copy)]
enum F {
    EventId,
    TsUnixNs,
    Host,
    Model,
    Priority,
    Tenant,
    PromptTokens,
    Stream,
    ClientAttempt,
    LogicalRequestId,
    Outcome,
    TotalMs,
    TtfbMs,
    HttpStatus,
    SloTtftMs,
    SloTpotMs,
    ControlMode,
    ControlVerdict,
    OutputTokens,
    E2eMs,
    QueueMs,
    PrefillMs,
    DecodeMs,
    InferenceMs,
    FinishReason,
    ArrivalUnixNs,
    CachedTokens,
    Preemptions,
    ColdStartUnixNs,
}

const N_FIELDS: usize = 29;

const FIELD_NAMES: [&str; N_FIELDS] = [
    "event_id",
    "ts_unix_ns",
    "host",
    "model",
    "priority",
    "tenant",
    "prompt_tokens",
    "stream",
    "client_attempt",
    "logical_request_id",
    "outcome",
    "total_ms",
    "ttfb_ms",
    "http_status",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "control_mode",
    "control_verdict",
    "output_tokens",
    "e2e_ms",
    "queue_ms",
    "prefill_ms",
    "decode_ms",
    "inference_ms",
    "finish_reason",
    "arrival_unix_ns",
    "cached_tokens",
    "preemptions",
    "cold_start_unix_ns",
];

/// What the join knows of an event type: its kind (when all its instances have one) and,
/// for a msgspec Struct, where each field is in its `astuple`.
struct TypeInfo {
    ty: PyObject,
    kind: Option<Kind>,
    idx: Option<[i16; N_FIELDS]>,
}

/// An event being read (see `F`).
struct Ev<'py> {
    obj: Bound<'py, PyAny>,
    tup: Option<(Bound<'py, PyTuple>, [i16; N_FIELDS])>,
}

impl<'py> Ev<'py> {
    fn get(&self, f: F) -> PyResult<Bound<'py, PyAny>> {
        if let Some((t, idx)) = &self.tup {
            let i = idx[f as usize];
            if i >= 0 {
                return t.get_item(i as usize);
            }
        }
        self.obj.getattr(FIELD_NAMES[f as usize])
    }
}

fn type_info<'a>(
    py: Python<'_>,
    types: &'a mut Vec<TypeInfo>,
    ev: &Bound<'_, PyAny>,
) -> PyResult<Option<&'a TypeInfo>> {
    let t = ev.get_type();
    if let Some(i) = types.iter().position(|ti| ti.ty.as_ptr() == t.as_ptr()) {
        return Ok(Some(&types[i]));
    }
    if types.len() >= 8 {
        return Ok(None);
    }
    let class_kind = t
        .getattr(intern!(py, "kind"))
        .ok()
        .filter(|v| v.is_instance_of::<PyString>());
    let kind = match class_kind {
        Some(v) if v.eq(ev.getattr(intern!(py, "kind"))?)? => Some(kind_by_name(py, ev)?),
        _ => None,
    };
    let idx = match t.getattr(intern!(py, "__struct_fields__")) {
        Ok(fields) => {
            let names: Vec<String> = fields.extract()?;
            let mut idx = [-1i16; N_FIELDS];
            for (j, name) in FIELD_NAMES.iter().enumerate() {
                if let Some(i) = names.iter().position(|n| n == name) {
                    idx[j] = i as i16;
                }
            }
            Some(idx)
        }
        Err(_) => None,
    };
    types.push(TypeInfo {
        ty: t.into_any().unbind(),
        kind,
        idx,
    });
    Ok(types.last())
}

/// An event to read fields of (`astuple` once when it is a msgspec Struct).
fn ev_of<'py>(
    py: Python<'py>,
    types: &mut Vec<TypeInfo>,
    astuple: &PyObject,
    ev: &Bound<'py, PyAny>,
) -> PyResult<Ev<'py>> {
    let idx = type_info(py, types, ev)?.and_then(|ti| ti.idx);
    let tup = match idx {
        Some(idx) => Some((
            astuple.bind(py).call1((ev,))?.downcast_into::<PyTuple>()?,
            idx,
        )),
        None => None,
    };
    Ok(Ev {
        obj: ev.clone(),
        tup,
    })
}

/// The kind of an event, by its type once seen (`kinds`: a type's kind, the few types met).
fn kind_of(py: Python<'_>, types: &mut Vec<TypeInfo>, ev: &Bound<'_, PyAny>) -> PyResult<Kind> {
    if let Some(TypeInfo { kind: Some(k), .. }) = type_info(py, types, ev)? {
        return Ok(*k);
    }
    kind_by_name(py, ev)
}

fn kind_by_name(py: Python<'_>, ev: &Bound<'_, PyAny>) -> PyResult<Kind> {
    let k = ev.getattr(intern!(py, "kind"))?;
    let k = k.downcast::<PyString>()?.to_str()?;
    match k {
        "gateway.received" => Ok(Kind::Received),
        "gateway.completed" => Ok(Kind::Completed),
        "engine.finished" => Ok(Kind::Finished),
        other => Err(PyValueError::new_err(format!(
            "not a lifecycle event: {other}"
        ))),
    }
}

fn id_hash(py: Python<'_>, ev: &Bound<'_, PyAny>) -> PyResult<u64> {
    Ok(ev.getattr(intern!(py, "event_id"))?.hash()? as i64 as u64)
}

fn f64_of(v: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    if v.is_none() {
        Ok(None)
    } else {
        Ok(Some(v.extract::<f64>()?))
    }
}

fn ctx_index(prompt: Option<i64>) -> usize {
    match prompt {
        None => 5,
        Some(p) if p < 512 => 0,
        Some(p) if p < 4096 => 1,
        Some(p) if p < 8192 => 2,
        Some(p) if p <= 16384 => 3,
        Some(_) => 4,
    }
}

impl Helpers {
    fn ev<'py>(&self, py: Python<'py>, ev: &Bound<'py, PyAny>) -> PyResult<Ev<'py>> {
        ev_of(py, &mut self.types.lock().unwrap(), &self.astuple, ev)
    }

    fn received_obj(&self, py: Python<'_>, r: &Recv) -> PyResult<PyObject> {
        if let Some(e) = &r.event {
            return Ok(e.clone_ref(py));
        }
        let args = PyTuple::new(
            py,
            [
                obj(py, r.id_hash)?,
                obj(py, r.ts_ns)?,
                r.host.clone_ref(py),
                r.model.clone_ref(py),
                obj(py, r.priority)?,
                r.tenant
                    .as_ref()
                    .map_or_else(|| py.None(), |t| t.clone_ref(py)),
                obj(py, r.prompt)?,
                obj(py, r.stream)?,
                obj(py, r.client_attempt)?,
                r.logical
                    .as_ref()
                    .map_or_else(|| py.None(), |t| t.clone_ref(py)),
            ],
        )?;
        Ok(self.received_cls.bind(py).call1(args)?.unbind())
    }

    fn parts(
        &self,
        py: Python<'_>,
        r: Option<&Recv>,
        c: Option<&PyObject>,
        f: Option<&PyObject>,
    ) -> PyResult<PyObject> {
        let rcv = match r {
            Some(r) => self.received_obj(py, r)?,
            None => py.None(),
        };
        let c = c.map_or_else(|| py.None(), |x| x.clone_ref(py));
        let f = f.map_or_else(|| py.None(), |x| x.clone_ref(py));
        Ok(PyTuple::new(py, [rcv, c, f])?.into_any().unbind())
    }

    fn emitted(
        &self,
        py: Python<'_>,
        rec: PyObject,
        first_offset: i64,
        upgrade: bool,
        previous: Option<PyObject>,
        parts: PyObject,
    ) -> PyResult<PyObject> {
        let args = PyTuple::new(
            py,
            [
                rec,
                obj(py, first_offset)?,
                obj(py, upgrade)?,
                previous.unwrap_or_else(|| py.None()),
                parts,
            ],
        )?;
        Ok(self.emitted_cls.bind(py).call1(args)?.unbind())
    }

    /// `pipeline.core.record.record_of`, built positionally.
    #[allow(clippy::too_many_arguments)]
    fn record_of(
        &self,
        py: Python<'_>,
        request_id: &str,
        received: Option<&Recv>,
        completed: Option<&PyObject>,
        finished: Option<&PyObject>,
        attempt: i64,
        retried: bool,
        conflicts: i64,
    ) -> PyResult<Rec> {
        let c = match completed {
            Some(o) => Some(self.ev(py, o.bind(py))?),
            None => None,
        };
        let f = match finished {
            Some(o) => Some(self.ev(py, o.bind(py))?),
            None => None,
        };
        let (c, f) = (c.as_ref(), f.as_ref());
        if c.is_none() && f.is_none() {
            return Err(PyValueError::new_err(
                "a record needs gateway.completed or engine.finished",
            ));
        }
        let none = || py.None();
        let mut revision: i64 = if received.is_some() { 1 } else { 0 };
        let outcome: PyObject;
        let ok: bool;
        let (mut total, mut ttfb): (Option<f64>, Option<f64>) = (None, None);
        let (mut total_o, mut ttfb_o, mut http_status, mut slo_ttft, mut slo_tpot) =
            (none(), none(), none(), none(), none());
        let (mut control_mode, mut control_verdict) = (none(), none());
        if let Some(c) = c {
            let o = c.get(F::Outcome)?;
            ok = o.downcast::<PyString>()?.to_str()? == "ok";
            outcome = o.unbind();
            let t = c.get(F::TotalMs)?;
            total = f64_of(&t)?;
            total_o = t.unbind();
            let t = c.get(F::TtfbMs)?;
            ttfb = f64_of(&t)?;
            ttfb_o = t.unbind();
            http_status = c.get(F::HttpStatus)?.unbind();
            slo_ttft = c.get(F::SloTtftMs)?.unbind();
            slo_tpot = c.get(F::SloTpotMs)?.unbind();
            control_mode = c.get(F::ControlMode)?.unbind();
            control_verdict = c.get(F::ControlVerdict)?.unbind();
        } else {
            let f = f.unwrap();
            let r = f.get(F::FinishReason)?;
            let (o, is_ok) = match r.downcast::<PyString>()?.to_str()? {
                "stop" | "length" => (&self.s_ok, true),
                "abort" => (&self.s_client_abort, false),
                "error" => (&self.s_error, false),
                other => {
                    return Err(pyo3::exceptions::PyKeyError::new_err(other.to_owned()));
                }
            };
            outcome = o.clone_ref(py);
            ok = is_ok;
        }
        let source: &PyObject;
        let (mut e2e, mut queue, mut inference): (Option<f64>, Option<f64>, Option<f64>) =
            (None, None, None);
        let (mut e2e_o, mut queue_o, mut prefill_o, mut decode_o, mut inference_o) =
            (none(), none(), none(), none(), none());
        let mut prompt_o: PyObject;
        let output_o: PyObject;
        let end_o: PyObject;
        let mut tpot: Option<f64> = None;
        let mut ttft: Option<f64> = None;
        let (
            mut finish_reason,
            mut engine_host,
            mut arrival,
            mut cached,
            mut preemptions,
            mut cold,
        ) = (none(), none(), none(), none(), none(), none());
        if let Some(f) = f {
            source = if c.is_some() {
                &self.s_joined
            } else {
                &self.s_engine_only
            };
            if c.is_some() {
                revision += 2;
            }
            let v = f.get(F::E2eMs)?;
            e2e = f64_of(&v)?;
            e2e_o = v.unbind();
            let v = f.get(F::QueueMs)?;
            queue = f64_of(&v)?;
            queue_o = v.unbind();
            let v = f.get(F::PrefillMs)?;
            let prefill = f64_of(&v)?;
            prefill_o = v.unbind();
            let v = f.get(F::DecodeMs)?;
            let decode = f64_of(&v)?;
            decode_o = v.unbind();
            let v = f.get(F::InferenceMs)?;
            inference = f64_of(&v)?;
            inference_o = v.unbind();
            prompt_o = f.get(F::PromptTokens)?.unbind();
            let out = f.get(F::OutputTokens)?;
            let out_n: i64 = out.extract()?;
            output_o = out.unbind();
            end_o = f.get(F::TsUnixNs)?.unbind();
            if out_n >= 2 {
                tpot = Some(decode.unwrap() / ((out_n - 1) as f64));
            }
            ttft = Some(queue.unwrap() + prefill.unwrap());
            finish_reason = f.get(F::FinishReason)?.unbind();
            engine_host = f.get(F::Host)?.unbind();
            arrival = f.get(F::ArrivalUnixNs)?.unbind();
            cached = f.get(F::CachedTokens)?.unbind();
            preemptions = f.get(F::Preemptions)?.unbind();
            cold = f.get(F::ColdStartUnixNs)?.unbind();
        } else {
            let c = c.unwrap();
            source = &self.s_gateway_only;
            prompt_o = match received {
                Some(r) => obj(py, r.prompt)?,
                None => none(),
            };
            let out = c.get(F::OutputTokens)?;
            let out_n: Option<i64> = if out.is_none() {
                None
            } else {
                Some(out.extract()?)
            };
            output_o = out.unbind();
            end_o = c.get(F::TsUnixNs)?.unbind();
            if let (Some(r), Some(tf)) = (received, ttfb) {
                let n = out_n.unwrap_or(0);
                if r.stream && n >= 2 {
                    let d = total.unwrap() - tf;
                    tpot = Some((if d > 0.0 { d } else { 0.0 }) / ((n - 1) as f64));
                }
            }
        }
        if prompt_o.is_none(py) {
            if let Some(c) = c {
                prompt_o = c.get(F::PromptTokens)?.unbind();
            }
        }
        let prompt_n: Option<i64> = if prompt_o.is_none(py) {
            None
        } else {
            Some(prompt_o.extract(py)?)
        };
        let (model, ts_o, priority, tenant, stream, received_ns, client_attempt, logical);
        if let Some(r) = received {
            client_attempt = obj(py, r.client_attempt)?;
            logical = r.logical.as_ref().map_or_else(none, |t| t.clone_ref(py));
            model = r.model.clone_ref(py);
            ts_o = obj(py, r.ts_ns)?;
            priority = obj(py, r.priority)?;
            tenant = r.tenant.as_ref().map_or_else(none, |t| t.clone_ref(py));
            stream = obj(py, r.stream)?;
            received_ns = obj(py, r.ts_ns)?;
        } else {
            model = c.or(f).unwrap().get(F::Model)?.unbind();
            ts_o = if let Some(c) = c {
                let ts: i64 = c.get(F::TsUnixNs)?.extract()?;
                obj(py, ts - (total.unwrap() * 1e6) as i64)?
            } else {
                arrival.clone_ref(py)
            };
            priority = match f {
                Some(f) => f.get(F::Priority)?.unbind(),
                None => none(),
            };
            tenant = none();
            stream = none();
            received_ns = none();
            client_attempt = obj(py, 0i64)?;
            logical = none();
        }
        let gateway_host = match (c, received) {
            (Some(c), _) => c.get(F::Host)?.unbind(),
            (None, Some(r)) => r.host.clone_ref(py),
            (None, None) => none(),
        };
        let overhead = match (total, e2e) {
            (Some(t), Some(e)) => Some(t - e),
            _ => None,
        };
        let flags = self.flags_of(py, total, ttfb, e2e, inference, queue)?;
        let superseded = retried && !ok;
        let args = PyTuple::new(
            py,
            [
                PyString::new(py, request_id).into_any().unbind(),
                source.clone_ref(py),
                obj(py, revision)?,
                ts_o,
                end_o,
                model,
                priority,
                tenant,
                self.buckets[ctx_index(prompt_n)].clone_ref(py),
                outcome,
                http_status,
                finish_reason,
                stream,
                gateway_host,
                engine_host,
                received_ns,
                arrival,
                prompt_o,
                output_o,
                cached,
                preemptions,
                total_o,
                ttfb_o,
                e2e_o,
                queue_o,
                prefill_o,
                decode_o,
                inference_o,
                obj(py, ttft)?,
                obj(py, tpot)?,
                obj(py, overhead)?,
                flags,
                obj(py, attempt)?,
                obj(py, superseded)?,
                slo_ttft,
                slo_tpot,
                cold,
                obj(py, conflicts)?,
                control_mode,
                control_verdict,
                client_attempt,
                logical,
            ],
        )?;
        let rec = self.record_cls.bind(py).call1(args)?.unbind();
        Ok(Rec {
            obj: rec,
            ok,
            superseded,
        })
    }

    fn flags_of(
        &self,
        py: Python<'_>,
        total: Option<f64>,
        ttfb: Option<f64>,
        e2e: Option<f64>,
        inference: Option<f64>,
        queue: Option<f64>,
    ) -> PyResult<PyObject> {
        let mut out: Vec<PyObject> = Vec::new();
        if let (Some(t), Some(f)) = (total, ttfb) {
            if f > t + EPS_MS {
                out.push(self.flags[0].clone_ref(py));
            }
        }
        if let (Some(e), Some(i)) = (e2e, inference) {
            if e + EPS_MS < i {
                out.push(self.flags[1].clone_ref(py));
            }
        }
        if let (Some(e), Some(q)) = (e2e, queue) {
            if e + EPS_MS < q {
                out.push(self.flags[2].clone_ref(py));
            }
        }
        if let (Some(t), Some(e)) = (total, e2e) {
            if t + EPS_MS < e {
                out.push(self.flags[3].clone_ref(py));
            }
        }
        if out.is_empty() {
            return Ok(self.empty.clone_ref(py));
        }
        Ok(PyTuple::new(py, out)?.into_any().unbind())
    }
}

// ---------------------------------------------------------------------------
// the join
// ---------------------------------------------------------------------------

enum ReceivedKind {
    Same,
    Duplicate,
    Retry,
}

/// `pipeline.core.join.Joiner`, in Rust (see the module doc).
#[pyclass(module = "tailguard_native")]
pub struct Joiner {
    #[pyo3(get)]
    config: PyObject,
    timeout_ms: i64,
    inflight_ttl_ms: i64,
    resolved_ttl_ms: i64,
    max_pending: usize,
    conflict_ms: i64,
    c: Counters,
    pending: OrdMap<PState>,
    resolved: ResolvedMemory,
    recent: RecentJoins,
    timers: Timers,
    evicted: Vec<PyObject>,
    attempts: FxMap<Key, i64>,
    strings: Interner,
    h: Helpers,
}

fn same_id(
    py: Python<'_>,
    slot_recv: Option<&Recv>,
    slot_ev: Option<&PyObject>,
    ev: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    if let Some(r) = slot_recv {
        return match &r.event {
            None => Ok(r.id_hash == id_hash(py, ev)?),
            Some(e) => e
                .bind(py)
                .getattr(intern!(py, "event_id"))?
                .eq(ev.getattr(intern!(py, "event_id"))?),
        };
    }
    let e = slot_ev.unwrap();
    e.bind(py)
        .getattr(intern!(py, "event_id"))?
        .eq(ev.getattr(intern!(py, "event_id"))?)
}

/// `count_repeat`: a repeat of what the request holds (a duplicate) or not (a conflict).
fn count_repeat(
    py: Python<'_>,
    c: &mut Counters,
    ev: &Bound<'_, PyAny>,
    slot_recv: Option<&Recv>,
    slot_ev: Option<&PyObject>,
) -> PyResult<()> {
    if (slot_recv.is_none() && slot_ev.is_none()) || same_id(py, slot_recv, slot_ev, ev)? {
        c.duplicates += 1;
    } else {
        c.conflicts += 1;
    }
    Ok(())
}

fn marks(py: Python<'_>, h: &Helpers, ev: &Bound<'_, PyAny>) -> PyResult<(i64, i64)> {
    h.marks.bind(py).call1((ev,))?.extract()
}

/// `set_aside`: a terminal event of a kind the request has (`field`): a repeat (False) or
/// a conflict (True: counted, the worse one kept).
fn set_aside(
    py: Python<'_>,
    h: &Helpers,
    c: &mut Counters,
    field: &mut Option<PyObject>,
    conflicts: &mut i64,
    seen: &mut Vec<i64>,
    ev: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    let slot = field.as_ref().unwrap().clone_ref(py);
    if h.repeats.bind(py).call1((&slot, ev))?.is_truthy()? {
        c.duplicates += 1;
        return Ok(false);
    }
    let m = marks(py, h, ev)?;
    if !seen.is_empty() && (seen.contains(&m.0) || seen.contains(&m.1)) {
        c.duplicates += 1;
        return Ok(false);
    }
    c.conflicts += 1;
    let held = marks(py, h, slot.bind(py))?;
    if !seen.contains(&held.0) {
        seen.push(held.0);
        seen.push(held.1);
    }
    seen.push(m.0);
    seen.push(m.1);
    *conflicts = (*conflicts + 1).min(MAX_CONFLICTS);
    if h.worse.bind(py).call1((ev, &slot))?.is_truthy()? {
        *field = Some(ev.clone().unbind());
    }
    Ok(true)
}

fn build_resolved(
    py: Python<'_>,
    h: &Helpers,
    key: &str,
    d: &Resolved,
    retried: bool,
) -> PyResult<Rec> {
    h.record_of(
        py,
        rid_of(key, d.attempt),
        d.received.as_ref(),
        d.completed.as_ref(),
        d.finished.as_ref(),
        d.attempt,
        retried,
        d.conflicts,
    )
}

/// `upgrade`: the record of a resolved request whose events changed.
fn upgrade(
    py: Python<'_>,
    h: &Helpers,
    c: &mut Counters,
    key: &str,
    d: &Resolved,
    previous: Rec,
) -> PyResult<PyObject> {
    let rec = build_resolved(py, h, key, d, d.retried)?;
    if rec.superseded && !previous.superseded {
        c.superseded += 1;
    }
    emit_upgrade(py, h, d, rec.obj, previous.obj)
}

/// The `Emitted` of an upgrade: a resolved request's new record beside the one it replaces.
fn emit_upgrade(
    py: Python<'_>,
    h: &Helpers,
    d: &Resolved,
    record: PyObject,
    previous: PyObject,
) -> PyResult<PyObject> {
    let parts = h.parts(
        py,
        d.received.as_ref(),
        d.completed.as_ref(),
        d.finished.as_ref(),
    )?;
    h.emitted(py, record, d.first_offset, true, Some(previous), parts)
}

/// `after_resolved`: an event of a request whose record was emitted and events kept.
fn after_resolved(
    py: Python<'_>,
    h: &Helpers,
    c: &mut Counters,
    d: &mut Resolved,
    key: &str,
    ev: &Bound<'_, PyAny>,
    kind: Kind,
) -> PyResult<Option<PyObject>> {
    if kind == Kind::Completed && d.completed.is_some() {
        let previous = build_resolved(py, h, key, d, d.retried)?;
        if !set_aside(
            py,
            h,
            c,
            &mut d.completed,
            &mut d.conflicts,
            &mut d.seen,
            ev,
        )? {
            return Ok(None);
        }
        c.conflicts_corrected += 1;
        return upgrade(py, h, c, key, d, previous).map(Some);
    }
    if kind == Kind::Finished && d.finished.is_some() {
        let previous = build_resolved(py, h, key, d, d.retried)?;
        if !set_aside(py, h, c, &mut d.finished, &mut d.conflicts, &mut d.seen, ev)? {
            return Ok(None);
        }
        c.conflicts_corrected += 1;
        return upgrade(py, h, c, key, d, previous).map(Some);
    }
    if !d.partial {
        if kind == Kind::Received && d.completed.is_some() {
            if d.received.is_none() {
                let previous = build_resolved(py, h, key, d, d.retried)?;
                d.received = Some(recv_event(py, ev)?);
                c.upgraded += 1;
                return upgrade(py, h, c, key, d, previous).map(Some);
            }
            count_repeat(py, c, ev, d.received.as_ref(), None)?;
            return Ok(None);
        }
        count_repeat(py, c, ev, None, None)?;
        return Ok(None);
    }
    let held = match kind {
        Kind::Received => d.received.is_some(),
        Kind::Completed => d.completed.is_some(),
        Kind::Finished => d.finished.is_some(),
    };
    if held {
        match kind {
            Kind::Received => count_repeat(py, c, ev, d.received.as_ref(), None)?,
            Kind::Completed => count_repeat(py, c, ev, None, d.completed.as_ref())?,
            Kind::Finished => count_repeat(py, c, ev, None, d.finished.as_ref())?,
        }
        return Ok(None);
    }
    let previous = build_resolved(py, h, key, d, d.retried)?;
    match kind {
        Kind::Received => d.received = Some(recv_event(py, ev)?),
        Kind::Completed => {
            d.completed = Some(ev.clone().unbind());
            d.partial = false;
        }
        Kind::Finished => {
            d.finished = Some(ev.clone().unbind());
            d.partial = false;
        }
    }
    c.upgraded += 1;
    upgrade(py, h, c, key, d, previous).map(Some)
}

/// The received the reference keeps as the event itself (a late one, after the record).
fn recv_event(py: Python<'_>, ev: &Bound<'_, PyAny>) -> PyResult<Recv> {
    let tenant = ev.getattr(intern!(py, "tenant"))?;
    let prompt = ev.getattr(intern!(py, "prompt_tokens"))?;
    Ok(Recv {
        id_hash: id_hash(py, ev)?,
        ts_ns: ev.getattr(intern!(py, "ts_unix_ns"))?.extract()?,
        host: ev.getattr(intern!(py, "host"))?.unbind(),
        model: ev.getattr(intern!(py, "model"))?.unbind(),
        priority: ev.getattr(intern!(py, "priority"))?.extract()?,
        tenant: if tenant.is_none() {
            None
        } else {
            Some(tenant.unbind())
        },
        prompt: if prompt.is_none() {
            None
        } else {
            Some(prompt.extract()?)
        },
        stream: ev.getattr(intern!(py, "stream"))?.extract()?,
        client_attempt: ev.getattr(intern!(py, "client_attempt"))?.extract()?,
        logical: {
            let l = ev.getattr(intern!(py, "logical_request_id"))?;
            if l.is_none() { None } else { Some(l.unbind()) }
        },
        event: Some(ev.clone().unbind()),
    })
}

fn supersede_resolved(
    py: Python<'_>,
    h: &Helpers,
    c: &mut Counters,
    d: &mut Resolved,
    key: &str,
) -> PyResult<Option<PyObject>> {
    if d.retried {
        return Ok(None);
    }
    d.retried = true;
    let before = build_resolved(py, h, key, d, false)?;
    if before.ok {
        return Ok(None);
    }
    c.superseded += 1;
    let after = build_resolved(py, h, key, d, true)?;
    emit_upgrade(py, h, d, after.obj, before.obj).map(Some)
}

impl Joiner {
    /// A received as the reference's `Received`.
    fn recv_of(&mut self, py: Python<'_>, ev: &Bound<'_, PyAny>) -> PyResult<Recv> {
        let e = self.h.ev(py, ev)?;
        let host = self.strings.get(py, &e.get(F::Host)?)?;
        let model = self.strings.get(py, &e.get(F::Model)?)?;
        let t = e.get(F::Tenant)?;
        let tenant = if t.is_none() {
            None
        } else {
            Some(self.strings.get(py, &t)?)
        };
        let prompt = e.get(F::PromptTokens)?;
        Ok(Recv {
            id_hash: e.get(F::EventId)?.hash()? as i64 as u64,
            ts_ns: e.get(F::TsUnixNs)?.extract()?,
            host,
            model,
            priority: e.get(F::Priority)?.extract()?,
            tenant,
            prompt: if prompt.is_none() {
                None
            } else {
                Some(prompt.extract()?)
            },
            stream: e.get(F::Stream)?.extract()?,
            client_attempt: e.get(F::ClientAttempt)?.extract()?,
            logical: {
                let l = e.get(F::LogicalRequestId)?;
                if l.is_none() { None } else { Some(l.unbind()) }
            },
            event: None,
        })
    }

    /// `InflightCodec.pack`: the in-flight state of a received, None where the reference's
    /// packed int would not hold it (its strings are taken into the codec's table first,
    /// host, model then tenant, as the reference's are).
    fn pack(
        &mut self,
        py: Python<'_>,
        ev: &Bound<'_, PyAny>,
        offset: i64,
        wall_ms: Option<i64>,
    ) -> PyResult<Option<Inflight>> {
        let e = self.h.ev(py, ev)?;
        let host = self.strings.codec_id(py, &e.get(F::Host)?)?;
        let model = self.strings.codec_id(py, &e.get(F::Model)?)?;
        let t = e.get(F::Tenant)?;
        let tenant = if t.is_none() {
            Some(0)
        } else {
            self.strings.codec_id(py, &t)?
        };
        let priority: i64 = e.get(F::Priority)?.extract()?;
        let ts_ns: i64 = e.get(F::TsUnixNs)?.extract()?;
        let p = e.get(F::PromptTokens)?;
        let prompt: Option<i64> = if p.is_none() {
            None
        } else {
            Some(p.extract()?)
        };
        let (Some(host), Some(model), Some(tenant)) = (host, model, tenant) else {
            return Ok(None);
        };
        // a retry or a request with a logical id: not in the packed int (the reference's)
        let client_attempt: i64 = e.get(F::ClientAttempt)?.extract()?;
        if client_attempt != 0 || !e.get(F::LogicalRequestId)?.is_none() {
            return Ok(None);
        }
        let fits = (0..=15).contains(&priority)
            && ts_ns >= 0
            && offset >= 0
            && prompt.is_none_or(|p| (0..=MAX_PROMPT).contains(&p))
            && wall_ms.is_none_or(|w| (0..=MAX_WALL).contains(&w));
        if !fits {
            return Ok(None);
        }
        Ok(Some(Inflight {
            id_hash: e.get(F::EventId)?.hash()? as i64 as u64,
            ts_ns,
            offset,
            wall_ms: wall_ms.unwrap_or(-1),
            prompt: prompt.unwrap_or(-1),
            host,
            model,
            tenant,
            priority: priority as u8,
            stream: e.get(F::Stream)?.extract()?,
        }))
    }

    /// `InflightCodec.unpack`: the received of an in-flight request.
    fn unpacked_recv(&self, py: Python<'_>, p: &Inflight) -> Recv {
        let objs = &self.strings.codec_objs;
        Recv {
            id_hash: p.id_hash,
            ts_ns: p.ts_ns,
            host: objs[p.host as usize].clone_ref(py),
            model: objs[p.model as usize].clone_ref(py),
            priority: p.priority as i64,
            tenant: (p.tenant != 0).then(|| objs[p.tenant as usize].clone_ref(py)),
            prompt: (p.prompt >= 0).then_some(p.prompt),
            stream: p.stream,
            client_attempt: 0,
            logical: None,
            event: None,
        }
    }

    /// Turn a packed pending entry into a full one in place (its place in the order kept).
    fn unpack_in_place(&mut self, py: Python<'_>, key: &str, with_deadlines: bool) -> &mut Pending {
        let slot = self.pending.get_mut(key).unwrap();
        if let PState::Packed(_) = slot {
            let PState::Packed(p) =
                std::mem::replace(slot, PState::Full(Box::new(Pending::new(0, 1))))
            else {
                unreachable!()
            };
            let full = {
                let mut e = Pending::new(p.offset, 1);
                if with_deadlines {
                    e.deadline_ms = ts_ms_of(p.ts_ns) + self.inflight_ttl_ms;
                    e.wall_deadline_ms = if p.wall_ms >= 0 {
                        p.wall_ms + self.inflight_ttl_ms
                    } else {
                        0
                    };
                }
                e.received = Some(self.unpacked_recv(py, &p));
                e
            };
            let slot = self.pending.get_mut(key).unwrap();
            *slot = PState::Full(Box::new(full));
        }
        match self.pending.get_mut(key).unwrap() {
            PState::Full(p) => p,
            PState::Packed(_) => unreachable!(),
        }
    }

    fn add_impl(
        &mut self,
        py: Python<'_>,
        ev: &Bound<'_, PyAny>,
        offset: i64,
        wall_ms: Option<i64>,
        now_ms: i64,
    ) -> PyResult<Option<PyObject>> {
        self.c.events += 1;
        let rid_o = ev.getattr(intern!(py, "request_id"))?;
        let rid: &str = rid_o.downcast::<PyString>()?.to_str()?;
        let kind = kind_of(py, &mut self.h.types.lock().unwrap(), ev)?;
        if !self.attempts.contains_key(rid) {
            // the reference's fast path (the same results as the general path below, with
            // its cheaper timers: buckets)
            match (kind, self.pending.get(rid)) {
                (Kind::Received, None) => {
                    if self.resolved.get(rid).is_none() {
                        if self.pending.len() >= self.max_pending {
                            self.evict_oldest(py)?;
                        }
                        if let Some(p) = self.pack(py, ev, offset, wall_ms)? {
                            let deadline = ts_ms_of(p.ts_ns) + self.inflight_ttl_ms;
                            let key: Key = Arc::from(rid);
                            self.pending.insert(key.clone(), PState::Packed(p));
                            self.timers.arm(&self.pending, key, deadline, None);
                            return Ok(None);
                        }
                    }
                }
                (Kind::Received, Some(_)) => {}
                (_, Some(PState::Packed(_))) => {
                    let timeout = self.timeout_ms;
                    let e = self.unpack_in_place(py, rid, false);
                    if kind == Kind::Completed {
                        e.completed = Some(ev.clone().unbind());
                    } else {
                        e.finished = Some(ev.clone().unbind());
                    }
                    let ts: i64 = ev.getattr(intern!(py, "ts_unix_ns"))?.extract()?;
                    let ts_ms = ts_ms_of(ts).max(now_ms);
                    e.terminal_ms = ts_ms;
                    e.deadline_ms = ts_ms + timeout;
                    e.wall_deadline_ms = wall_ms.map_or(0, |w| w + timeout);
                    let deadline = e.deadline_ms;
                    self.timers
                        .arm(&self.pending, Arc::from(rid), deadline, Some(ts_ms));
                    return Ok(None);
                }
                (_, Some(PState::Full(e))) => {
                    let joins = if kind == Kind::Completed {
                        e.completed.is_none() && e.finished.is_some()
                    } else {
                        e.finished.is_none() && e.completed.is_some()
                    };
                    if joins {
                        let Some(PState::Full(mut e)) = self.pending.remove(rid) else {
                            unreachable!()
                        };
                        if kind == Kind::Completed {
                            e.completed = Some(ev.clone().unbind());
                        } else {
                            e.finished = Some(ev.clone().unbind());
                        }
                        let ts: i64 = ev.getattr(intern!(py, "ts_unix_ns"))?.extract()?;
                        return self
                            .join(py, Arc::from(rid), *e, ts_ms_of(ts).max(now_ms))
                            .map(Some);
                    }
                }
                (_, None) => {}
            }
        }
        let (key, attempt): (Key, i64);
        if kind == Kind::Received {
            let which = self.received_kind(py, rid, ev)?;
            let n = self.attempts.get(rid).copied().unwrap_or(1);
            match which {
                ReceivedKind::Duplicate => {
                    self.c.duplicates += 1;
                    return Ok(None);
                }
                ReceivedKind::Retry => return self.start_attempt(py, rid, n, ev, offset, wall_ms),
                ReceivedKind::Same => {
                    key = attempt_key(rid, n);
                    attempt = n;
                }
            }
        } else if let Some(&n) = self.attempts.get(rid) {
            (key, attempt) = self.route(py, rid, n, ev, kind)?;
        } else {
            key = Arc::from(rid);
            attempt = 1;
        }
        // resolved already
        let h = &self.h;
        let c = &mut self.c;
        match self.resolved.get_mut(&key) {
            Some(RVal::Joined { .. }) => {
                if kind != Kind::Received {
                    if let Some(d) = self.recent.get(&key, &self.attempts) {
                        return after_resolved(py, h, c, d, &key, ev, kind);
                    }
                }
                count_repeat(py, c, ev, None, None)?;
                return Ok(None);
            }
            Some(RVal::Kept(d)) => return after_resolved(py, h, c, d, &key, ev, kind),
            None => {}
        }
        match self.pending.get(&key) {
            None => {
                if self.pending.len() >= self.max_pending {
                    self.evict_oldest(py)?;
                }
                if kind == Kind::Received && attempt == 1 {
                    if let Some(p) = self.pack(py, ev, offset, wall_ms)? {
                        let deadline = ts_ms_of(p.ts_ns) + self.inflight_ttl_ms;
                        self.pending.insert(key.clone(), PState::Packed(p));
                        self.timers.arm(&self.pending, key, deadline, None);
                        return Ok(None);
                    }
                }
                self.pending.insert(
                    key.clone(),
                    PState::Full(Box::new(Pending::new(offset, attempt))),
                );
            }
            Some(PState::Packed(_)) => {
                if kind == Kind::Received {
                    self.c.duplicates += 1;
                    return Ok(None);
                }
                self.unpack_in_place(py, &key, true);
            }
            Some(PState::Full(_)) => {}
        }
        if !self.store_event(py, &key, ev, kind)? {
            return Ok(None);
        }
        let ts: i64 = ev.getattr(intern!(py, "ts_unix_ns"))?.extract()?;
        let ts_ms = ts_ms_of(ts).max(now_ms);
        let Some(PState::Full(e)) = self.pending.get_mut(&key) else {
            unreachable!()
        };
        if e.completed.is_some() && e.finished.is_some() {
            let Some(PState::Full(e)) = self.pending.remove(&key) else {
                unreachable!()
            };
            return self.join(py, key, *e, ts_ms).map(Some);
        }
        let wait;
        if kind == Kind::Received {
            if e.completed.is_some() || e.finished.is_some() {
                return Ok(None);
            }
            wait = self.inflight_ttl_ms;
        } else {
            wait = self.timeout_ms;
            e.terminal_ms = ts_ms;
        }
        e.deadline_ms = ts_ms + wait;
        e.wall_deadline_ms = wall_ms.map_or(0, |w| w + wait);
        let deadline = e.deadline_ms;
        if kind != Kind::Received {
            self.timers.push_terminal(ts_ms, key.clone());
        }
        self.timers.push_deadline(&self.pending, deadline, key);
        Ok(None)
    }

    /// `store_event` on the pending (full) entry of `key`.
    fn store_event(
        &mut self,
        py: Python<'_>,
        key: &str,
        ev: &Bound<'_, PyAny>,
        kind: Kind,
    ) -> PyResult<bool> {
        let has = match self.pending.get(key) {
            Some(PState::Full(e)) => match kind {
                Kind::Received => e.received.is_some(),
                Kind::Completed => e.completed.is_some(),
                Kind::Finished => e.finished.is_some(),
            },
            _ => unreachable!(),
        };
        if !has && kind == Kind::Received {
            let r = self.recv_of(py, ev)?;
            let Some(PState::Full(e)) = self.pending.get_mut(key) else {
                unreachable!()
            };
            e.received = Some(r);
            return Ok(true);
        }
        let h = &self.h;
        let c = &mut self.c;
        let Some(PState::Full(e)) = self.pending.get_mut(key) else {
            unreachable!()
        };
        match kind {
            Kind::Received => {
                if same_id(py, e.received.as_ref(), None, ev)? {
                    c.duplicates += 1;
                } else {
                    c.conflicts += 1;
                }
                Ok(false)
            }
            Kind::Completed | Kind::Finished => {
                let e = &mut **e;
                let field = if kind == Kind::Completed {
                    &mut e.completed
                } else {
                    &mut e.finished
                };
                if field.is_none() {
                    *field = Some(ev.clone().unbind());
                    return Ok(true);
                }
                if same_id(py, None, field.as_ref(), ev)? {
                    c.duplicates += 1;
                } else {
                    set_aside(py, h, c, field, &mut e.conflicts, &mut e.seen, ev)?;
                }
                Ok(false)
            }
        }
    }

    /// The record of a pending request and its `Emitted` (`_join` and `_resolve_partial`
    /// alike); also whether the record is ok.
    fn emit_record(
        &mut self,
        py: Python<'_>,
        key: &Key,
        e: &Pending,
    ) -> PyResult<(PyObject, bool)> {
        let rec = self.h.record_of(
            py,
            rid_of(key, e.attempt),
            e.received.as_ref(),
            e.completed.as_ref(),
            e.finished.as_ref(),
            e.attempt,
            e.retried,
            e.conflicts,
        )?;
        if rec.superseded {
            self.c.superseded += 1;
        }
        let parts = self.h.parts(
            py,
            e.received.as_ref(),
            e.completed.as_ref(),
            e.finished.as_ref(),
        )?;
        let out = self
            .h
            .emitted(py, rec.obj, e.first_offset, false, None, parts)?;
        Ok((out, rec.ok))
    }

    /// `_join`: both terminal events are in (the entry already out of `pending`).
    fn join(&mut self, py: Python<'_>, key: Key, e: Pending, ts_ms: i64) -> PyResult<PyObject> {
        self.c.joined += 1;
        let attempt = e.attempt;
        let first_offset = e.first_offset;
        let (out, ok) = self.emit_record(py, &key, &e)?;
        if e.received.is_none() || !ok {
            let expires = ts_ms + self.resolved_ttl_ms;
            self.resolved
                .put(key, RVal::Kept(Box::new(resolved_from(e, expires, false))));
        } else {
            let short = short_hash(e.received.as_ref().unwrap().id_hash);
            self.resolved.put(
                key.clone(),
                RVal::Joined {
                    expires_ms: ts_ms + self.resolved_ttl_ms,
                    short,
                },
            );
            if self.conflict_ms != 0 {
                let held = if e.seen.is_empty() {
                    Held::Joined(JoinedParts {
                        received: e.received.unwrap(),
                        completed: e.completed.unwrap(),
                        finished: e.finished.unwrap(),
                        attempt,
                        first_offset,
                        conflicts: e.conflicts,
                    })
                } else {
                    let exp = ts_ms + self.conflict_ms;
                    Held::Kept(Box::new(resolved_from(e, exp, false)))
                };
                self.recent
                    .gens
                    .entry(ts_ms >> RECENT_BITS)
                    .or_default()
                    .insert(key, (ts_ms, held));
            }
        }
        Ok(out)
    }

    fn start_attempt(
        &mut self,
        py: Python<'_>,
        rid: &str,
        n: i64,
        ev: &Bound<'_, PyAny>,
        offset: i64,
        wall_ms: Option<i64>,
    ) -> PyResult<Option<PyObject>> {
        self.attempts.insert(Arc::from(rid), n + 1);
        self.c.attempts += 1;
        if self.pending.len() >= self.max_pending {
            self.evict_oldest(py)?;
        }
        let key = attempt_key(rid, n + 1);
        let r = self.recv_of(py, ev)?;
        let mut e = Pending::new(offset, n + 1);
        e.deadline_ms = ts_ms_of(r.ts_ns) + self.inflight_ttl_ms;
        e.wall_deadline_ms = wall_ms.map_or(0, |w| w + self.inflight_ttl_ms);
        e.received = Some(r);
        let deadline = e.deadline_ms;
        self.pending.insert(key.clone(), PState::Full(Box::new(e)));
        self.timers.push_deadline(&self.pending, deadline, key);
        self.supersede(py, &attempt_key(rid, n))
    }

    fn supersede(&mut self, py: Python<'_>, key: &str) -> PyResult<Option<PyObject>> {
        if self.pending.contains(key) {
            if let Some(PState::Packed(_)) = self.pending.get(key) {
                let d = self.unpack_in_place(py, key, true).deadline_ms;
                self.timers.push_deadline(&self.pending, d, Arc::from(key));
            }
            if let Some(PState::Full(e)) = self.pending.get_mut(key) {
                e.retried = true;
            }
            return Ok(None);
        }
        let h = &self.h;
        let c = &mut self.c;
        match self.resolved.get_mut(key) {
            Some(RVal::Kept(d)) => supersede_resolved(py, h, c, d, key),
            _ => Ok(None),
        }
    }

    fn holds_received(&self, key: &str, h: u64) -> Option<bool> {
        if let Some(p) = self.pending.get(key) {
            return match p {
                PState::Packed(p) => Some(p.id_hash == h),
                PState::Full(e) => e.received.as_ref().map(|r| r.id_hash == h),
            };
        }
        match self.resolved.get(key)? {
            RVal::Joined { short, .. } => {
                if *short == 0 {
                    None
                } else {
                    Some(*short == short_hash(h))
                }
            }
            RVal::Kept(r) => r.received.as_ref().map(|r| r.id_hash == h),
        }
    }

    fn received_kind(
        &mut self,
        py: Python<'_>,
        rid: &str,
        ev: &Bound<'_, PyAny>,
    ) -> PyResult<ReceivedKind> {
        let n = self.attempts.get(rid).copied().unwrap_or(1);
        let latest = attempt_key(rid, n);
        let is_int = match self.pending.get(&latest) {
            Some(PState::Packed(_)) => Some(true),
            Some(PState::Full(_)) => Some(false),
            None => match self.resolved.get(&latest) {
                Some(RVal::Joined { .. }) => Some(true),
                Some(RVal::Kept(_)) => Some(false),
                None => None,
            },
        };
        let Some(is_int) = is_int else {
            if n > 1 {
                self.attempts.remove(rid);
            }
            return Ok(ReceivedKind::Same);
        };
        let h = id_hash(py, ev)?;
        match self.holds_received(&latest, h) {
            None => Ok(if is_int {
                ReceivedKind::Duplicate
            } else {
                ReceivedKind::Same
            }),
            Some(true) => Ok(ReceivedKind::Duplicate),
            Some(false) => {
                for k in 1..n {
                    if self.holds_received(&attempt_key(rid, k), h) == Some(true) {
                        return Ok(ReceivedKind::Duplicate);
                    }
                }
                Ok(ReceivedKind::Retry)
            }
        }
    }

    fn route(
        &self,
        py: Python<'_>,
        rid: &str,
        n: i64,
        ev: &Bound<'_, PyAny>,
        kind: Kind,
    ) -> PyResult<(Key, i64)> {
        for k in 1..=n {
            let key = attempt_key(rid, k);
            let (completed, finished) = match self.pending.get(&key) {
                Some(PState::Packed(_)) => {
                    if self.resolved.contains(&key) {
                        continue;
                    }
                    return Ok((key, k));
                }
                Some(PState::Full(e)) => (e.completed.as_ref(), e.finished.as_ref()),
                None => match self.resolved.get(&key) {
                    None | Some(RVal::Joined { .. }) => continue,
                    Some(RVal::Kept(r)) => (r.completed.as_ref(), r.finished.as_ref()),
                },
            };
            if kind == Kind::Completed {
                if completed.is_none() {
                    return Ok((key, k));
                }
            } else if finished.is_none() {
                let fits = match completed {
                    None => true,
                    Some(c) => {
                        let total: f64 = c.bind(py).getattr(intern!(py, "total_ms"))?.extract()?;
                        let e2e: f64 = ev.getattr(intern!(py, "e2e_ms"))?.extract()?;
                        total + ENGINE_FIT_SLACK_MS >= e2e
                    }
                };
                if fits {
                    return Ok((key, k));
                }
            }
        }
        Ok((attempt_key(rid, n), n))
    }

    /// `_resolve_partial` of an entry taken out of `pending`.
    fn resolve_partial(
        &mut self,
        py: Python<'_>,
        key: Key,
        entry: PState,
        now_ms: i64,
    ) -> PyResult<Option<PyObject>> {
        let e = match entry {
            PState::Packed(_) => {
                self.c.orphaned_received += 1;
                return Ok(None);
            }
            PState::Full(e) => e,
        };
        if e.completed.is_none() && e.finished.is_none() {
            self.c.orphaned_received += 1;
            return Ok(None);
        }
        if e.completed.is_some() {
            self.c.gateway_only += 1;
        } else {
            self.c.engine_only += 1;
        }
        let (out, _) = self.emit_record(py, &key, &e)?;
        let expires = now_ms + self.resolved_ttl_ms;
        self.resolved
            .put(key, RVal::Kept(Box::new(resolved_from(*e, expires, true))));
        Ok(Some(out))
    }

    fn evict_oldest(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(rid) = self.pending.first_key() else {
            return Ok(());
        };
        let entry = self.pending.remove(&rid).unwrap();
        self.c.evicted += 1;
        let at = self.timers.deadline(&entry);
        if let Some(rec) = self.resolve_partial(py, rid, entry, at)? {
            self.evicted.push(rec);
        }
        Ok(())
    }

    fn advance_impl(
        &mut self,
        py: Python<'_>,
        now_ms: i64,
        wall_ms: Option<i64>,
    ) -> PyResult<Vec<PyObject>> {
        let mut out = std::mem::take(&mut self.evicted);
        self.timers.move_inflight(&self.pending, now_ms);
        self.timers
            .move_terminals(&self.pending, (now_ms - self.timeout_ms) >> TERMINAL_BITS);
        while let Some(Reverse((deadline, _))) = self.timers.deadlines.peek() {
            if *deadline > now_ms {
                break;
            }
            let Reverse((deadline, rid)) = self.timers.deadlines.pop().unwrap();
            let Some(entry) = self.pending.get(&rid) else {
                continue;
            };
            if self.timers.deadline(entry) != deadline {
                continue;
            }
            if let Some(w) = wall_ms {
                let wd = self.timers.wall_deadline(entry);
                if wd > w {
                    self.timers.wall_waits.push(Reverse((wd, deadline, rid)));
                    continue;
                }
            }
            let entry = self.pending.remove(&rid).unwrap();
            if let Some(rec) = self.resolve_partial(py, rid, entry, now_ms)? {
                out.push(rec);
            }
        }
        while let Some(Reverse((wd, _, _))) = self.timers.wall_waits.peek() {
            if let Some(w) = wall_ms {
                if *wd > w {
                    break;
                }
            }
            let Reverse((_, deadline, rid)) = self.timers.wall_waits.pop().unwrap();
            let Some(entry) = self.pending.get(&rid) else {
                continue;
            };
            if self.timers.deadline(entry) != deadline {
                continue;
            }
            let entry = self.pending.remove(&rid).unwrap();
            if let Some(rec) = self.resolve_partial(py, rid, entry, now_ms)? {
                out.push(rec);
            }
        }
        self.resolved.expire(now_ms);
        self.recent.expire(now_ms);
        Ok(out)
    }

    fn drain_impl(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        let mut out = std::mem::take(&mut self.evicted);
        for rid in self.pending.keys() {
            let entry = self.pending.remove(&rid).unwrap();
            let at = self.timers.deadline(&entry);
            if let Some(rec) = self.resolve_partial(py, rid, entry, at)? {
                out.push(rec);
            }
        }
        self.timers.clear();
        Ok(out)
    }
}

fn records_of(py: Python<'_>, emitted: Vec<PyObject>) -> PyResult<Vec<PyObject>> {
    emitted
        .into_iter()
        .map(|e| Ok(e.bind(py).getattr(intern!(py, "record"))?.unbind()))
        .collect()
}

#[pymethods]
impl Joiner {
    /// `Joiner(config, helpers)`: ``config`` a `JoinConfig`; ``helpers`` the reference's
    /// (RequestRecord, Emitted, Received, JoinCounters, _repeats, _marks, worse_terminal,
    /// msgspec.structs.astuple).
    #[new]
    fn new(
        py: Python<'_>,
        config: Bound<'_, PyAny>,
        helpers: Bound<'_, PyTuple>,
    ) -> PyResult<Self> {
        let g = |n: &str| -> PyResult<i64> { config.getattr(n)?.extract() };
        let timeout_ms = g("timeout_ms")?;
        let inflight_ttl_ms = g("inflight_ttl_ms")?;
        let resolved_ttl_ms = g("resolved_ttl_ms")?;
        let conflict_ms: i64 = config.getattr("conflict_keep_ms")?.extract()?;
        let it = |i: usize| -> PyResult<PyObject> { Ok(helpers.get_item(i)?.unbind()) };
        let s = |t: &str| -> PyObject { PyString::intern(py, t).into_any().unbind() };
        let h = Helpers {
            record_cls: it(0)?,
            emitted_cls: it(1)?,
            received_cls: it(2)?,
            counters_cls: it(3)?,
            repeats: it(4)?,
            marks: it(5)?,
            worse: it(6)?,
            s_joined: s("joined"),
            s_gateway_only: s("gateway_only"),
            s_engine_only: s("engine_only"),
            s_ok: s("ok"),
            s_client_abort: s("client_abort"),
            s_error: s("error"),
            buckets: ["<512", "512-4k", "4k-8k", "8k-16k", ">16k", "unknown"]
                .iter()
                .map(|t| s(t))
                .collect(),
            flags: [
                "ttfb_gt_total",
                "e2e_lt_inference",
                "e2e_lt_queue",
                "negative_gateway_overhead",
            ]
            .iter()
            .map(|t| s(t))
            .collect(),
            empty: PyTuple::empty(py).into_any().unbind(),
            astuple: it(7)?,
            types: Mutex::new(Vec::new()),
        };
        Ok(Joiner {
            config: config.clone().unbind(),
            timeout_ms,
            inflight_ttl_ms,
            resolved_ttl_ms,
            max_pending: g("max_pending")?.max(0) as usize,
            conflict_ms,
            c: Counters::default(),
            pending: OrdMap::new(),
            resolved: ResolvedMemory::new(resolved_ttl_ms, g("max_resolved")?),
            recent: RecentJoins {
                keep_ms: conflict_ms,
                gens: BTreeMap::new(),
                now_ms: 0,
            },
            timers: Timers {
                inflight_ttl_ms,
                deadlines: BinaryHeap::new(),
                wall_waits: BinaryHeap::new(),
                terminals: BinaryHeap::new(),
                inflight: Buckets::new(),
                terminal: Buckets::new(),
            },
            evicted: Vec::new(),
            attempts: FxMap::default(),
            strings: Interner {
                ids: FxMap::default(),
                codec: FxMap::default(),
                codec_objs: vec![py.None()],
            },
            h,
        })
    }

    #[getter]
    fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// The counters, as the reference's `JoinCounters` (a copy).
    #[getter]
    fn counters(&self, py: Python<'_>) -> PyResult<PyObject> {
        let c = self.c;
        let args = PyTuple::new(
            py,
            [
                c.events,
                c.duplicates,
                c.conflicts,
                c.conflicts_corrected,
                c.joined,
                c.gateway_only,
                c.engine_only,
                c.upgraded,
                c.orphaned_received,
                c.evicted,
                c.late_after_resolved,
                c.attempts,
                c.superseded,
            ],
        )?;
        Ok(self.h.counters_cls.bind(py).call1(args)?.unbind())
    }

    #[pyo3(signature = (event, offset, wall_ms = None))]
    fn add(
        &mut self,
        py: Python<'_>,
        event: Bound<'_, PyAny>,
        offset: i64,
        wall_ms: Option<i64>,
    ) -> PyResult<PyObject> {
        match self.add_impl(py, &event, offset, wall_ms, 0)? {
            Some(e) => Ok(e.bind(py).getattr(intern!(py, "record"))?.unbind()),
            None => Ok(py.None()),
        }
    }

    #[pyo3(signature = (event, offset, wall_ms = None, now_ms = 0))]
    fn add_emitted(
        &mut self,
        py: Python<'_>,
        event: Bound<'_, PyAny>,
        offset: i64,
        wall_ms: Option<i64>,
        now_ms: i64,
    ) -> PyResult<Option<PyObject>> {
        self.add_impl(py, &event, offset, wall_ms, now_ms)
    }

    fn seed_resolved(&mut self, key: &str, expires_ms: i64) {
        if self.resolved.contains(key) {
            return;
        }
        if let Some(i) = key.rfind(ATTEMPT_SEP) {
            let (rid, n) = (&key[..i], &key[i + 1..]);
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(n) = n.parse::<i64>() {
                    if n > self.attempts.get(rid).copied().unwrap_or(1) {
                        self.attempts.insert(Arc::from(rid), n);
                    }
                }
            }
        }
        self.resolved.put(
            Arc::from(key),
            RVal::Joined {
                expires_ms,
                short: 0,
            },
        );
    }

    fn evict(&mut self, py: Python<'_>, n: i64) -> PyResult<()> {
        let n = n.max(0).min(self.pending.len() as i64);
        for _ in 0..n {
            self.evict_oldest(py)?;
        }
        Ok(())
    }

    #[pyo3(signature = (now_ms, wall_ms = None))]
    fn advance(
        &mut self,
        py: Python<'_>,
        now_ms: i64,
        wall_ms: Option<i64>,
    ) -> PyResult<Vec<PyObject>> {
        let out = self.advance_impl(py, now_ms, wall_ms)?;
        records_of(py, out)
    }

    #[pyo3(signature = (now_ms, wall_ms = None))]
    fn advance_emitted(
        &mut self,
        py: Python<'_>,
        now_ms: i64,
        wall_ms: Option<i64>,
    ) -> PyResult<Vec<PyObject>> {
        self.advance_impl(py, now_ms, wall_ms)
    }

    fn drain(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        let out = self.drain_impl(py)?;
        records_of(py, out)
    }

    fn drain_emitted(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        self.drain_impl(py)
    }

    fn oldest_terminal_ms(&mut self) -> Option<i64> {
        self.timers.oldest_terminal_ms(&self.pending)
    }

    fn oldest_terminal_before(&mut self, bound_ms: i64) -> Option<i64> {
        self.timers.oldest_terminal_before(&self.pending, bound_ms)
    }

    #[pyo3(signature = (next_offset, *, lone_received_durable = false))]
    fn safe_offset(&self, next_offset: i64, lone_received_durable: bool) -> i64 {
        for (_, e) in self.pending.iter() {
            match e {
                PState::Packed(p) => {
                    if lone_received_durable {
                        continue;
                    }
                    return p.offset.min(next_offset);
                }
                PState::Full(e) => {
                    if lone_received_durable && e.completed.is_none() && e.finished.is_none() {
                        continue;
                    }
                    return e.first_offset.min(next_offset);
                }
            }
        }
        next_offset
    }

    /// Lengths of the join's structures (``bench/memory_probe.py``): pending requests,
    /// resolved memory, heap items (deadlines, wall waits, terminals), bucket items and
    /// buckets (in flight), request ids with attempts, strings held.
    fn sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("pending", self.pending.len())?;
        d.set_item("resolved", self.resolved.len)?;
        d.set_item("resolved_generations", self.resolved.by_index.len())?;
        d.set_item("deadlines", self.timers.deadlines.len())?;
        d.set_item("wall_waits", self.timers.wall_waits.len())?;
        d.set_item("terminals", self.timers.terminals.len())?;
        d.set_item("bucket_items", self.timers.inflight.items)?;
        d.set_item("buckets", self.timers.inflight.by_key.len())?;
        d.set_item("attempts", self.attempts.len())?;
        d.set_item("strings", self.strings.ids.len())?;
        Ok(d)
    }

    /// What the join holds, for the differential tests (`pipeline.core.native.join_view`
    /// gives the reference's): pending requests in order as (key, in flight, first
    /// offset, deadline, wall deadline, first terminal ms, attempt, retried, conflicts),
    /// the resolved memory as key -> (expiry, events kept), and each request id's latest
    /// attempt (when more than one).
    fn view<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let pend = PyList::empty(py);
        for (k, e) in self.pending.iter() {
            let row = match e {
                PState::Packed(p) => (
                    k.as_ref(),
                    true,
                    p.offset,
                    self.timers.deadline(e),
                    self.timers.wall_deadline(e),
                    0i64,
                    1i64,
                    false,
                    0i64,
                ),
                PState::Full(p) => (
                    k.as_ref(),
                    false,
                    p.first_offset,
                    p.deadline_ms,
                    p.wall_deadline_ms,
                    p.terminal_ms,
                    p.attempt,
                    p.retried,
                    p.conflicts,
                ),
            };
            pend.append(row)?;
        }
        let res = pyo3::types::PyDict::new(py);
        for (k, exp, kept) in self.resolved.items() {
            res.set_item(k.as_ref(), (exp, kept))?;
        }
        let att = pyo3::types::PyDict::new(py);
        for (k, n) in &self.attempts {
            att.set_item(k.as_ref(), *n)?;
        }
        PyTuple::new(py, [pend.into_any(), res.into_any(), att.into_any()])
    }
}
