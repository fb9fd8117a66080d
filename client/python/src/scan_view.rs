//! `Client.scan(..., lazy=True)`'s answer, [`ScanView`]: the matching entries as a read-only
//! mapping from key to Entry, kept as the bytes the daemon streamed. Receiving it costs the
//! transfer and one index of the entries' key bytes (built without the GIL); an entry is
//! decoded into its Entry object when it is first read, and that object is kept. A rank that
//! reads a fraction of the shared entries pays for that fraction, not for building all of them.
//!
//! The index compares encoded keys: the daemon sends each key as prost encodes it, and a key
//! asked for is encoded the same way, so equal keys are equal bytes.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};
use prost::bytes::Bytes;
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tunecache_client::proto as v1;

use crate::entry::Entry;
use crate::messages::Key;

/// Where one entry's bytes lie: its `Entry` body in a chunk, and its `Key` body within that.
#[derive(Clone, Copy)]
struct Place {
    chunk: u32,
    start: u32,
    len: u32,
    key_start: u32,
    key_len: u32,
}

/// The entries of a Scan, chunk by chunk as they arrived, found by their key's bytes.
#[derive(Default)]
pub struct ScanIndex {
    chunks: Vec<Bytes>,
    places: Vec<Place>,
    by_key: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

/// Takes a length-delimited field's bytes, as (offset, length) within `whole`.
fn take_delimited(whole: &[u8], buf: &mut &[u8]) -> Option<(usize, usize)> {
    let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
    if buf.len() < len {
        return None;
    }
    let start = whole.len() - buf.len();
    *buf = &buf[len..];
    Some((start, len))
}

impl ScanIndex {
    /// Indexes one `ScanResponse` chunk; `None` when it is not one (it is then refused whole).
    pub fn add_chunk(&mut self, chunk: Bytes) -> Option<()> {
        let chunk_at = u32::try_from(self.chunks.len()).ok()?;
        let mut rest: &[u8] = &chunk;
        let mut places = Vec::new();
        while !rest.is_empty() {
            let (field, wire_type) = decode_key(&mut rest).ok()?;
            if (field, wire_type) != (1, WireType::LengthDelimited) {
                return None;
            }
            let (start, len) = take_delimited(&chunk, &mut rest)?;
            let body = &chunk[start..start + len];
            let (key_start, key_len) = key_of(body)?;
            places.push(Place {
                chunk: chunk_at,
                start: u32::try_from(start).ok()?,
                len: u32::try_from(len).ok()?,
                key_start: u32::try_from(start + key_start).ok()?,
                key_len: u32::try_from(key_len).ok()?,
            });
        }
        self.chunks.push(chunk);
        for place in places {
            let at = u32::try_from(self.places.len()).ok()?;
            let key = self.key_bytes(&place);
            let hash = self.hasher.hash_one(key);
            // A key the daemon sent twice (never: a Scan lists each key once) keeps its first.
            if self.find(key, hash).is_none() {
                self.places.push(place);
                let (chunks, places, hasher) = (&self.chunks, &self.places, &self.hasher);
                self.by_key.insert_unique(hash, at, |i| {
                    hasher.hash_one(bytes_of(chunks, &places[*i as usize]))
                });
            }
        }
        Some(())
    }

    fn key_bytes(&self, place: &Place) -> &[u8] {
        bytes_of(&self.chunks, place)
    }

    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        self.by_key
            .find(hash, |i| self.key_bytes(&self.places[*i as usize]) == key)
            .map(|i| *i as usize)
    }

    /// The position of `key`'s entry, if the Scan holds it.
    fn position(&self, key: &v1::Key) -> Option<usize> {
        let key = key.encode_to_vec();
        self.find(&key, self.hasher.hash_one(&key))
    }

    fn len(&self) -> usize {
        self.places.len()
    }

    fn entry(&self, at: usize) -> Option<v1::Entry> {
        let place = &self.places[at];
        let chunk = &self.chunks[place.chunk as usize];
        let body = &chunk[place.start as usize..(place.start + place.len) as usize];
        v1::Entry::decode(body).ok()
    }

    fn key(&self, at: usize) -> Option<v1::Key> {
        v1::Key::decode(self.key_bytes(&self.places[at])).ok()
    }
}

fn bytes_of<'a>(chunks: &'a [Bytes], place: &Place) -> &'a [u8] {
    let chunk = &chunks[place.chunk as usize];
    &chunk[place.key_start as usize..(place.key_start + place.key_len) as usize]
}

/// The (offset, length) of the `key` field's body in an `Entry` body. An entry without one is
/// refused (the daemon sends every entry with its key).
fn key_of(body: &[u8]) -> Option<(usize, usize)> {
    let mut rest = body;
    let mut key = None;
    while !rest.is_empty() {
        let (field, wire_type) = decode_key(&mut rest).ok()?;
        match (field, wire_type) {
            (1, WireType::LengthDelimited) => key = Some(take_delimited(body, &mut rest)?),
            (_, WireType::LengthDelimited) => {
                take_delimited(body, &mut rest)?;
            }
            _ => return None,
        }
    }
    key
}

/// The Key of `(namespace, op, device, problem[, rank])`.
fn key_of_tuple(fields: &Bound<'_, PyTuple>) -> PyResult<v1::Key> {
    if !(4..=5).contains(&fields.len()) {
        return Err(PyTypeError::new_err(
            "a key tuple is (namespace, op, device, problem[, rank])",
        ));
    }
    let rank = match fields.len() {
        5 => fields.get_item(4)?.extract::<Option<u32>>()?,
        _ => None,
    };
    Ok(v1::Key {
        namespace: fields.get_item(0)?.extract()?,
        op: fields.get_item(1)?.extract()?,
        device: fields.get_item(2)?.extract()?,
        problem: fields.get_item(3)?.extract()?,
        rank,
    })
}

/// A Scan's entries, as a read-only mapping from key (a Key, or anything `as_key` takes) to
/// Entry; an entry is decoded when first read.
#[pyclass(module = "tunecache._native", name = "ScanView", mapping)]
pub struct ScanView {
    index: ScanIndex,
    /// Entries already read, by position: the same object every time.
    made: Vec<Option<Py<Entry>>>,
}

impl ScanView {
    pub fn new(index: ScanIndex) -> ScanView {
        let made = (0..index.len()).map(|_| None).collect();
        ScanView { index, made }
    }

    fn entry_at(&mut self, py: Python<'_>, at: usize) -> PyResult<Py<Entry>> {
        if let Some(made) = &self.made[at] {
            return Ok(made.clone_ref(py));
        }
        let entry = self
            .index
            .entry(at)
            .ok_or_else(|| PyRuntimeError::new_err("tunecache: a Scan entry does not decode"))?;
        let made = Entry::from_proto(py, entry)?;
        self.made[at] = Some(made.clone_ref(py));
        Ok(made)
    }

    fn key_at(&self, py: Python<'_>, at: usize) -> PyResult<Py<Key>> {
        let key = self
            .index
            .key(at)
            .ok_or_else(|| PyRuntimeError::new_err("tunecache: a Scan key does not decode"))?;
        Py::new(py, Key::from_proto(key))
    }

    /// Where `key`'s entry is: a Key (or anything `as_key` takes), or the tuple
    /// `(namespace, op, device, problem[, rank])` a rank indexes its own cache by.
    fn position(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let key = match key.cast::<PyTuple>() {
            Ok(fields) => key_of_tuple(fields)?,
            Err(_) => Key::extract_any(key)?,
        };
        Ok(self.index.position(&key))
    }
}

#[pymethods]
impl ScanView {
    fn __len__(&self) -> usize {
        self.index.len()
    }

    /// False for anything that is not a key, as a dict answers for a key it cannot hold.
    fn __contains__(&self, key: &Bound<'_, PyAny>) -> bool {
        self.position(key).is_ok_and(|at| at.is_some())
    }

    fn __getitem__(&mut self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<Entry>> {
        match self.position(key)? {
            Some(at) => self.entry_at(py, at),
            None => Err(PyKeyError::new_err(key.clone().unbind())),
        }
    }

    /// The entry of `key`, or `default`.
    #[pyo3(signature = (key, default=None))]
    fn get(
        &mut self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        default: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        match self.position(key)? {
            Some(at) => Ok(self.entry_at(py, at)?.into_any()),
            None => Ok(default.unwrap_or_else(|| py.None())),
        }
    }

    /// The keys, in the order the daemon sent them.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = (0..self.index.len())
            .map(|at| self.key_at(py, at))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, keys)
    }

    /// Every entry, decoded (what an eager Scan returns), in the order the daemon sent them.
    fn values<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let entries = (0..self.index.len())
            .map(|at| self.entry_at(py, at))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, entries)
    }

    /// (key, entry) pairs, every entry decoded.
    fn items<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let pairs = (0..self.index.len())
            .map(|at| Ok((self.key_at(py, at)?, self.entry_at(py, at)?)))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, pairs)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.keys(py)?.as_any().try_iter().map(Bound::into_any)
    }

    /// How many entries were decoded so far (what reading them cost).
    #[getter]
    fn decoded(&self) -> usize {
        self.made.iter().filter(|made| made.is_some()).count()
    }
}
