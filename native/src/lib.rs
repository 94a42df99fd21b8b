//! tailguard_native: the native (Rust) hot path of tailguard's pure core.
//!
//! Ports of pure-Python references that stay in the tree (and run where this extension is
//! not built); `tests/unit/test_native_diff.py` feeds both the same hypothesis-generated
//! inputs and requires identical results:
//!
//! * `Joiner` (`join.rs`): `pipeline.core.join.Joiner`, the join per request id, rule for
//!   rule and timer for timer, building the reference's own record classes;
//! * `PartitionClock`: `pipeline.core.eventtime.PartitionClock` (the per-partition event
//!   clock the processor calls on every event), operation for operation;
//! * `sketch_bump`: the bin update of `pipeline.core.sketch.QuantileSketch.add_many` /
//!   `remove_many` (validation, `LogarithmicMapping.key` of each value with the C
//!   library's `log` as `math.log(v, 2)` uses it, counts per bin, the zero bucket, and
//!   the sum as a left fold in input order);
//! * `boundary_table`: `pipeline.core.slo.boundary_table`.
//!
//! And one encoder for the store adapter (`rowbinary.rs`: records as ClickHouse RowBinary,
//! checked against the column-wise insert by `tests/integration/test_store_json_requests.py`).
//!
//! Pure: no I/O; time is passed in.

mod join;
mod rowbinary;

use std::collections::HashMap;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PySequence, PyString};

// ---------------------------------------------------------------------------
// partition clock
// ---------------------------------------------------------------------------

/// No limit on event times before the clock is established (`_NO_LIMIT`).
const NO_LIMIT: i64 = 1 << 62;

/// Python's `bisect_left` on an ascending slice.
fn bisect_left(a: &[i64], x: i64) -> usize {
    a.partition_point(|&m| m < x)
}

/// Python's `bisect_right` on an ascending slice.
fn bisect_right(a: &[i64], x: i64) -> usize {
    a.partition_point(|&m| m <= x)
}

/// Event time of one partition (see `pipeline/core/eventtime.py` for the design).
///
/// Each host keeps its `quorum` largest event times as an ascending vector (the
/// reference keeps a min-heap of the same multiset: its `heap[0]` is `tops[0]` here,
/// its `max(heap)` is `tops[last]`). Hosts are kept in first-seen order, as the
/// reference's dict keeps them.
#[pyclass(module = "tailguard_native")]
pub struct PartitionClock {
    #[pyo3(get)]
    config: PyObject,
    max_ahead_ms: i64,
    quorum: usize,
    host_idle_ms: i64,
    #[pyo3(get, set)]
    watermark_ms: i64,
    #[pyo3(get, set)]
    wall_at_advance_ms: i64,
    #[pyo3(get, set)]
    events: i64,
    hosts: Vec<(String, Vec<i64>)>,
    index: HashMap<String, usize>,
    settled_ms: Option<i64>,
    active: i64,
    below: i64,
}

impl PartitionClock {
    fn grow(&mut self, slot: Option<usize>, host: &str, ts_ms: i64, wall_ms: i64) -> i64 {
        match slot {
            None => {
                self.index.insert(host.to_owned(), self.hosts.len());
                self.hosts.push((host.to_owned(), vec![ts_ms]));
                self.moved(None, ts_ms, wall_ms)
            }
            Some(i) => {
                let top = &mut self.hosts[i].1;
                let old = top[0];
                let at = bisect_right(top, ts_ms);
                top.insert(at, ts_ms);
                let new = top[0];
                self.moved(Some(old), new, wall_ms)
            }
        }
    }

    fn moved(&mut self, old: Option<i64>, new: i64, wall_ms: i64) -> i64 {
        let wm = self.watermark_ms;
        let boot = self.events < self.quorum as i64 && wm == 0;
        if self.settled_ms != Some(wm) {
            if !boot {
                self.recompute(wall_ms, false);
            }
            return self.watermark_ms;
        }
        let floor = wm - self.host_idle_ms;
        if let Some(old) = old {
            if old >= floor {
                self.active -= 1;
                if old <= wm {
                    self.below -= 1;
                }
            }
        }
        if new >= floor {
            self.active += 1;
            if new <= wm {
                self.below += 1;
            }
        }
        if self.active != 0 && self.below <= (self.active - 1).div_euclid(2) {
            if boot {
                self.settled_ms = None;
            } else {
                self.recompute(wall_ms, false);
            }
        }
        self.watermark_ms
    }

    fn recompute(&mut self, wall_ms: i64, force: bool) {
        let mut wm = self.watermark_ms;
        let idle = self.host_idle_ms;
        let mut all: Vec<i64> = self.hosts.iter().map(|(_, t)| t[0]).collect();
        all.sort_unstable();
        let mut marks: &[i64] = &all[bisect_left(&all, wm - idle)..];
        if !marks.is_empty() {
            let median = marks[(marks.len() - 1) / 2];
            if median > wm || (force && wm == 0) {
                wm = median;
                self.watermark_ms = wm;
                self.wall_at_advance_ms = wall_ms;
                marks = &marks[bisect_left(marks, wm - idle)..];
            }
        }
        let below = bisect_right(marks, wm) as i64;
        let n = marks.len() as i64;
        self.active = n;
        self.below = below;
        self.settled_ms = if n > 0 && below <= (n - 1).div_euclid(2) {
            None
        } else {
            Some(wm)
        };
    }
}

#[pymethods]
impl PartitionClock {
    /// `config`: a `pipeline.core.eventtime.ClockConfig` (read once).
    #[new]
    fn new(config: Bound<'_, PyAny>) -> PyResult<Self> {
        let quorum: i64 = config.getattr("quorum")?.extract()?;
        if quorum < 1 {
            return Err(PyValueError::new_err(format!(
                "clock.quorum must be >= 1, got {quorum}"
            )));
        }
        Ok(PartitionClock {
            max_ahead_ms: config.getattr("max_ahead_ms")?.extract()?,
            quorum: quorum as usize,
            host_idle_ms: config.getattr("host_idle_ms")?.extract()?,
            config: config.unbind(),
            watermark_ms: 0,
            wall_at_advance_ms: 0,
            events: 0,
            hosts: Vec::new(),
            index: HashMap::new(),
            settled_ms: None,
            active: 0,
            below: 0,
        })
    }

    #[getter]
    fn bootstrapping(&self) -> bool {
        self.events < self.quorum as i64 && self.watermark_ms == 0
    }

    #[getter]
    fn newest_ms<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (h, t) in &self.hosts {
            d.set_item(h, t[t.len() - 1])?;
        }
        Ok(d)
    }

    #[pyo3(signature = (ts_ms, now_ms = 0))]
    fn in_range(&self, ts_ms: i64, now_ms: i64) -> bool {
        ts_ms <= self.ahead_limit_ms(now_ms)
    }

    #[pyo3(signature = (now_ms = 0))]
    fn ahead_limit_ms(&self, now_ms: i64) -> i64 {
        let wm = self.watermark_ms;
        if wm == 0 {
            return NO_LIMIT;
        }
        wm.max(now_ms) + self.max_ahead_ms
    }

    #[pyo3(signature = (to_ms, wall_ms = 0))]
    fn jump(&mut self, to_ms: i64, wall_ms: i64) {
        if to_ms > self.watermark_ms {
            self.watermark_ms = to_ms;
            self.wall_at_advance_ms = wall_ms;
        }
    }

    #[pyo3(signature = (host, ts_ms, wall_ms = 0))]
    fn observe(&mut self, host: &str, ts_ms: i64, wall_ms: i64) -> i64 {
        self.events += 1;
        let slot = self.index.get(host).copied();
        let i = match slot {
            Some(i) if self.hosts[i].1.len() >= self.quorum => i,
            _ => return self.grow(slot, host, ts_ms, wall_ms),
        };
        let top = &mut self.hosts[i].1;
        let old = top[0];
        if ts_ms <= old {
            return self.watermark_ms;
        }
        // heapreplace: the smallest goes, the new time comes in
        top.remove(0);
        let at = bisect_right(top, ts_ms);
        top.insert(at, ts_ms);
        let new = top[0];
        let wm = self.watermark_ms;
        if self.settled_ms == Some(wm) && (old > wm || (new <= wm && old >= wm - self.host_idle_ms))
        {
            return wm;
        }
        self.moved(Some(old), new, wall_ms)
    }

    #[pyo3(signature = (wall_ms = 0))]
    fn establish(&mut self, wall_ms: i64) {
        if !self.hosts.is_empty() {
            self.recompute(wall_ms, true);
        }
    }

    #[pyo3(signature = (wall_ms, caught_up = true))]
    fn now(&mut self, wall_ms: Option<i64>, caught_up: bool) -> i64 {
        if self.watermark_ms == 0 {
            return 0;
        }
        let Some(wall_ms) = wall_ms else {
            return self.watermark_ms;
        };
        if !caught_up {
            self.wall_at_advance_ms = self.wall_at_advance_ms.max(wall_ms);
            return self.watermark_ms;
        }
        self.watermark_ms + (wall_ms - self.wall_at_advance_ms).max(0)
    }

    fn host_marks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (h, t) in &self.hosts {
            d.set_item(h, t[0])?;
        }
        Ok(d)
    }
}

// ---------------------------------------------------------------------------
// sketch kernel
// ---------------------------------------------------------------------------

/// Add `sign * 1` per value of `values` to the bins of a `QuantileSketch`.
///
/// `pos` / `neg`: the sketch's bin dicts (key -> count; a bin that reaches 0 is
/// dropped). Keys are `int(ceil(log(|v|) / ln2 * multiplier) + offset)`, what
/// `LogarithmicMapping.key` computes (`math.log(v, 2)` is `log(v) / log(2)` with the C
/// library's `log`, as `f64::ln` here). Returns `(bad, zero, sum)`: `bad` is the index of
/// the first value that is NaN, infinite or beyond `max_possible` (then nothing is
/// changed; -1 otherwise), `zero` the number of values in the zero bucket, and `sum`
/// `sum0` plus each value (`sign` 1) or minus each (`sign` -1), left to right.
#[pyfunction]
#[pyo3(signature = (pos, neg, values, sign, multiplier, offset, ln2, min_possible, max_possible, sum0))]
#[allow(clippy::too_many_arguments)]
fn sketch_bump(
    py: Python<'_>,
    pos: &Bound<'_, PyDict>,
    neg: &Bound<'_, PyDict>,
    values: PyBuffer<f64>,
    sign: i64,
    multiplier: f64,
    offset: f64,
    ln2: f64,
    min_possible: f64,
    max_possible: f64,
    sum0: f64,
) -> PyResult<(i64, i64, f64)> {
    if sign != 1 && sign != -1 {
        return Err(PyValueError::new_err(format!(
            "sign must be 1 or -1, got {sign}"
        )));
    }
    let vals: Vec<f64> = values.to_vec(py)?;
    for (i, v) in vals.iter().enumerate() {
        // negated on purpose: NaN fails it too, as in the reference
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(v.abs() <= max_possible) {
            return Ok((i as i64, 0, sum0));
        }
    }
    let mut pos_keys: Vec<i64> = Vec::with_capacity(vals.len());
    let mut neg_keys: Vec<i64> = Vec::new();
    let mut zero: i64 = 0;
    let mut sum = sum0;
    for &v in &vals {
        if v > min_possible {
            pos_keys.push(key(v, multiplier, offset, ln2));
        } else if v < -min_possible {
            neg_keys.push(key(-v, multiplier, offset, ln2));
        } else {
            zero += 1;
        }
        sum += if sign > 0 { v } else { -v };
    }
    bump(pos, &mut pos_keys, sign)?;
    bump(neg, &mut neg_keys, sign)?;
    Ok((-1, zero, sum))
}

#[inline]
fn key(v: f64, multiplier: f64, offset: f64, ln2: f64) -> i64 {
    ((v.ln() / ln2 * multiplier).ceil() + offset) as i64
}

/// Count each key into `store` (ascending distinct keys, as the reference's `_bump`).
fn bump(store: &Bound<'_, PyDict>, keys: &mut [i64], sign: i64) -> PyResult<()> {
    if keys.is_empty() {
        return Ok(());
    }
    keys.sort_unstable();
    let mut i = 0;
    while i < keys.len() {
        let k = keys[i];
        let mut j = i + 1;
        while j < keys.len() && keys[j] == k {
            j += 1;
        }
        let c = (j - i) as i64;
        let have: i64 = match store.get_item(k)? {
            Some(x) => x.extract()?,
            None => 0,
        };
        let n = have + sign * c;
        if n != 0 {
            store.set_item(k, n)?;
        } else if have != 0 {
            store.del_item(k)?;
        }
        i = j;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// boundary table
// ---------------------------------------------------------------------------

/// The records' boundary values as one row-major `(n, len(names))` float64 buffer:
/// `getattr(record, name)` for each record and name, None as NaN, a number as
/// `float(v)` (what `pipeline.core.slo.boundary_table` builds with `np.fromiter`).
/// Returned as a bytearray (a writable buffer for `np.frombuffer`).
#[pyfunction]
fn boundary_table<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    names: Vec<Bound<'py, PyString>>,
) -> PyResult<Bound<'py, PyByteArray>> {
    let seq = records.downcast::<PySequence>()?;
    let n = seq.len()?;
    let mut out: Vec<f64> = Vec::with_capacity(n * names.len());
    for i in 0..n {
        let rec = seq.get_item(i)?;
        for name in &names {
            let v = rec.getattr(name)?;
            out.push(if v.is_none() {
                f64::NAN
            } else {
                v.extract::<f64>()?
            });
        }
    }
    let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_ne_bytes()).collect();
    Ok(PyByteArray::new(py, &bytes))
}

#[pymodule]
fn tailguard_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PartitionClock>()?;
    m.add_class::<join::Joiner>()?;
    m.add_function(wrap_pyfunction!(rowbinary::rowbinary, m)?)?;
    m.add_function(wrap_pyfunction!(sketch_bump, m)?)?;
    m.add_function(wrap_pyfunction!(boundary_table, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
