//! `rowbinary`: objects' attributes as ClickHouse `RowBinary` rows, for the embedded
//! engine's file inserts (`pipeline/adapters/store/requests.py`): the engine copies the
//! values instead of parsing JSON text (numbers formatted, then parsed again).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PySequence, PyString};

#[derive(Clone, Copy)]
enum Scalar {
    Str,
    I64,
    U8,
    U16,
    U32,
    F64,
    Bool,
}

#[derive(Clone, Copy)]
enum Col {
    Plain(Scalar),
    Nullable(Scalar),
    Strings, // Array(String) (LowCardinality or not)
}

fn scalar(t: &str) -> Option<Scalar> {
    let t = t
        .strip_prefix("LowCardinality(")
        .and_then(|x| x.strip_suffix(')'))
        .unwrap_or(t);
    Some(match t {
        "String" => Scalar::Str,
        "Int64" => Scalar::I64,
        "UInt8" => Scalar::U8,
        "UInt16" => Scalar::U16,
        "UInt32" => Scalar::U32,
        "Float64" => Scalar::F64,
        "Bool" => Scalar::Bool,
        _ => return None,
    })
}

fn col(t: &str) -> Option<Col> {
    let inner = t
        .strip_prefix("LowCardinality(")
        .and_then(|x| x.strip_suffix(')'))
        .unwrap_or(t);
    if let Some(x) = inner
        .strip_prefix("Nullable(")
        .and_then(|x| x.strip_suffix(')'))
    {
        return scalar(x).map(Col::Nullable);
    }
    if let Some(x) = inner
        .strip_prefix("Array(")
        .and_then(|x| x.strip_suffix(')'))
    {
        return match scalar(x) {
            Some(Scalar::Str) => Some(Col::Strings),
            _ => None,
        };
    }
    scalar(inner).map(Col::Plain)
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn string(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> PyResult<()> {
    let s = v.downcast::<PyString>()?.to_str()?;
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put(out: &mut Vec<u8>, t: Scalar, v: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    let range = || PyValueError::new_err(format!("rowbinary: {name} out of range"));
    match t {
        Scalar::Str => string(out, v)?,
        Scalar::I64 => out.extend_from_slice(&v.extract::<i64>()?.to_le_bytes()),
        Scalar::U8 => out.push(u8::try_from(v.extract::<i64>()?).map_err(|_| range())?),
        Scalar::U16 => out.extend_from_slice(
            &u16::try_from(v.extract::<i64>()?)
                .map_err(|_| range())?
                .to_le_bytes(),
        ),
        Scalar::U32 => out.extend_from_slice(
            &u32::try_from(v.extract::<i64>()?)
                .map_err(|_| range())?
                .to_le_bytes(),
        ),
        Scalar::F64 => out.extend_from_slice(&v.extract::<f64>()?.to_le_bytes()),
        Scalar::Bool => out.push(u8::from(v.extract::<bool>()?)),
    }
    Ok(())
}

/// The RowBinary rows of ``rows``: attribute ``name`` of each, as ClickHouse type ``type``
/// (``columns``: (name, type) in the structure's order; String, Int64, UInt8/16/32,
/// Float64, Bool, Nullable and LowCardinality of them, Array of String). A value a type
/// cannot hold (out of range, the wrong Python type) raises ValueError or TypeError: the
/// caller writes those rows another way.
#[pyfunction]
pub fn rowbinary<'py>(
    py: Python<'py>,
    rows: &Bound<'py, PyAny>,
    columns: Vec<(Bound<'py, PyString>, String)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let cols: Vec<(Bound<'py, PyString>, String, Col)> = columns
        .into_iter()
        .map(|(n, t)| {
            let c = col(&t)
                .ok_or_else(|| PyValueError::new_err(format!("rowbinary: no encoding for {t}")))?;
            Ok((n, t, c))
        })
        .collect::<PyResult<_>>()?;
    let seq = rows.downcast::<PySequence>()?;
    let n = seq.len()?;
    let mut out: Vec<u8> = Vec::with_capacity(n * 256);
    for i in 0..n {
        let row = seq.get_item(i)?;
        for (name, _, c) in &cols {
            let v = row.getattr(name)?;
            match c {
                Col::Plain(t) => put(&mut out, *t, &v, name.to_str()?)?,
                Col::Nullable(t) => {
                    if v.is_none() {
                        out.push(1);
                    } else {
                        out.push(0);
                        put(&mut out, *t, &v, name.to_str()?)?;
                    }
                }
                Col::Strings => {
                    let items = v.downcast::<PySequence>()?;
                    let k = items.len()?;
                    varint(&mut out, k as u64);
                    for j in 0..k {
                        string(&mut out, &items.get_item(j)?)?;
                    }
                }
            }
        }
    }
    Ok(PyBytes::new(py, &out))
}
