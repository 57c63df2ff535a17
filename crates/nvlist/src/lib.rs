//! Name-value lists, after ZFS's nvlists (seed 004): one typed, nestable list type that
//! carries dataset properties on disk and the arguments and per-item results of every
//! batch administrative call on the wire.
//!
//! Invariants:
//! - names are unique within one list: `add` refuses a name already there, and `decode`
//!   refuses a list that repeats one; add, lookup and remove by name cost O(1) through a
//!   hash index, and iteration keeps the order items were added in;
//! - `decode` is linear in its input, allocates no more than a constant times the input's
//!   length, refuses nesting deeper than `MAX_DEPTH`, and accepts exactly what `encode`
//!   writes (`decode(encode(l)) == l`, and any other input is an error, never a panic).
//!
//! Encoding (little-endian; docs/format.md §4.5 has it byte by byte):
//!
//! ```text
//! list  := u32 count, count × item
//! item  := u8 name length (1..=255), name (UTF-8), u8 type, payload
//! type 1 bool  : u8 0 or 1         type 2 u64   : u64       type 3 i64 : i64
//! type 4 str   : u32 len, UTF-8    type 5 bytes : u32 len, bytes
//! type 6 list  : list              type 7 strs  : u32 n, n × (u32 len, UTF-8)
//! type 8 lists : u32 n, n × list
//! ```

use std::collections::HashMap;

/// Deepest nesting `decode` accepts (a list at depth 0 holding lists down to this).
pub const MAX_DEPTH: usize = 16;

/// Longest name, in bytes.
pub const NAME_MAX: usize = 255;

/// One value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A flag.
    Bool(bool),
    /// An unsigned number.
    U64(u64),
    /// A signed number.
    I64(i64),
    /// Text.
    Str(String),
    /// Raw bytes.
    Bytes(Vec<u8>),
    /// A nested list.
    List(NvList),
    /// Several texts.
    Strs(Vec<String>),
    /// Several nested lists.
    Lists(Vec<NvList>),
}

impl Value {
    fn type_byte(&self) -> u8 {
        match self {
            Value::Bool(_) => 1,
            Value::U64(_) => 2,
            Value::I64(_) => 3,
            Value::Str(_) => 4,
            Value::Bytes(_) => 5,
            Value::List(_) => 6,
            Value::Strs(_) => 7,
            Value::Lists(_) => 8,
        }
    }
}

/// Why a name could not be added, or bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `add` of a name the list already has.
    #[error("name {0:?} is already in the list")]
    Exists(String),
    /// A name that is empty or longer than `NAME_MAX` bytes.
    #[error("a name must be 1 to {NAME_MAX} bytes, not {0}")]
    BadName(usize),
    /// Bytes that are not an encoded list.
    #[error("not a name-value list: {0}")]
    Decode(&'static str),
}

/// A list of uniquely named values, in the order they were added.
#[derive(Clone, Default)]
pub struct NvList {
    /// Items by position; a removed item leaves `None` until the next compaction.
    items: Vec<Option<(String, Value)>>,
    /// Name → position in `items`.
    index: HashMap<String, usize>,
}

impl PartialEq for NvList {
    /// Same names with the same values, in the same order.
    fn eq(&self, other: &NvList) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl Eq for NvList {}

impl std::fmt::Debug for NvList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl NvList {
    /// An empty list.
    pub fn new() -> NvList {
        NvList::default()
    }

    /// How many items it has.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Adds `name`, which must not be there yet.
    pub fn add(&mut self, name: impl Into<String>, value: Value) -> Result<(), Error> {
        let name = name.into();
        check_name(&name)?;
        if self.index.contains_key(&name) {
            return Err(Error::Exists(name));
        }
        self.index.insert(name.clone(), self.items.len());
        self.items.push(Some((name, value)));
        Ok(())
    }

    /// Sets `name` to `value`, replacing (in place) what it had; returns the old value.
    pub fn set(&mut self, name: impl Into<String>, value: Value) -> Result<Option<Value>, Error> {
        let name = name.into();
        check_name(&name)?;
        if let Some(&i) = self.index.get(&name) {
            if let Some((_, v)) = self.items.get_mut(i).and_then(Option::as_mut) {
                return Ok(Some(std::mem::replace(v, value)));
            }
        }
        self.add(name, value).map(|()| None)
    }

    /// The value named `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        let i = *self.index.get(name)?;
        self.items.get(i)?.as_ref().map(|(_, v)| v)
    }

    /// Removes `name`; returns its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        let i = self.index.remove(name)?;
        let (_, v) = self.items.get_mut(i)?.take()?;
        // Compacts once the holes outnumber the items, so removal stays O(1) amortised
        // and the vector no larger than twice the list.
        if self.items.len() > 2 * self.index.len() + 8 {
            self.items.retain(Option::is_some);
            for (pos, item) in self.items.iter().enumerate() {
                if let Some((n, _)) = item {
                    self.index.insert(n.clone(), pos);
                }
            }
        }
        Some(v)
    }

    /// Items in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.items.iter().flatten().map(|(n, v)| (n.as_str(), v))
    }

    /// `name`'s number, if it is a `U64`.
    pub fn get_u64(&self, name: &str) -> Option<u64> {
        match self.get(name)? {
            Value::U64(n) => Some(*n),
            _ => None,
        }
    }

    /// `name`'s text, if it is a `Str`.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// `name`'s flag, if it is a `Bool`.
    pub fn get_bool(&self, name: &str) -> Option<bool> {
        match self.get(name)? {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// `name`'s nested list, if it is a `List`.
    pub fn get_list(&self, name: &str) -> Option<&NvList> {
        match self.get(name)? {
            Value::List(l) => Some(l),
            _ => None,
        }
    }

    /// The encoded bytes (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&len_u32(self.len()).to_le_bytes());
        for (name, value) in self.iter() {
            // (`add` keeps names within NAME_MAX bytes.)
            out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
            out.extend_from_slice(name.as_bytes());
            out.push(value.type_byte());
            match value {
                Value::Bool(b) => out.push(u8::from(*b)),
                Value::U64(n) => out.extend_from_slice(&n.to_le_bytes()),
                Value::I64(n) => out.extend_from_slice(&n.to_le_bytes()),
                Value::Str(s) => put_bytes(out, s.as_bytes()),
                Value::Bytes(b) => put_bytes(out, b),
                Value::List(l) => l.encode_into(out),
                Value::Strs(v) => {
                    out.extend_from_slice(&len_u32(v.len()).to_le_bytes());
                    for s in v {
                        put_bytes(out, s.as_bytes());
                    }
                }
                Value::Lists(v) => {
                    out.extend_from_slice(&len_u32(v.len()).to_le_bytes());
                    for l in v {
                        l.encode_into(out);
                    }
                }
            }
        }
    }

    /// Decodes exactly one list filling all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<NvList, Error> {
        let mut r = Reader { b: bytes };
        let l = r.list(0)?;
        if !r.b.is_empty() {
            return Err(Error::Decode("bytes after the list"));
        }
        Ok(l)
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Error::BadName(name.len()));
    }
    Ok(())
}

fn len_u32(n: usize) -> u32 {
    // (Nothing crest encodes comes near 4 GiB: frames and items are far smaller.)
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&len_u32(b.len()).to_le_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.b.len() {
            return Err(Error::Decode("truncated"));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<usize, Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn u64(&mut self) -> Result<u64, Error> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A count of things at least `min_bytes` long each: never more than what is left
    /// could hold, so a forged count cannot make a large allocation.
    fn count(&mut self, min_bytes: usize) -> Result<usize, Error> {
        let n = self.u32()?;
        if n > self.b.len() / min_bytes {
            return Err(Error::Decode("a count larger than the bytes left"));
        }
        Ok(n)
    }

    fn text(&mut self) -> Result<String, Error> {
        let n = self.u32()?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Decode("text that is not UTF-8"))
    }

    fn list(&mut self, depth: usize) -> Result<NvList, Error> {
        if depth > MAX_DEPTH {
            return Err(Error::Decode("nested too deeply"));
        }
        // (An item is at least a name byte, one name byte, a type and one payload byte.)
        let n = self.count(4)?;
        let mut l = NvList { items: Vec::with_capacity(n), index: HashMap::with_capacity(n) };
        for _ in 0..n {
            let len = usize::from(self.u8()?);
            let name = std::str::from_utf8(self.take(len)?).map_err(|_| Error::Decode("a name that is not UTF-8"))?;
            let value = match self.u8()? {
                1 => match self.u8()? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    _ => return Err(Error::Decode("a flag that is neither 0 nor 1")),
                },
                2 => Value::U64(self.u64()?),
                3 => Value::I64(self.u64()? as i64),
                4 => Value::Str(self.text()?),
                5 => {
                    let n = self.u32()?;
                    Value::Bytes(self.take(n)?.to_vec())
                }
                6 => Value::List(self.list(depth + 1)?),
                7 => {
                    let n = self.count(4)?;
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(self.text()?);
                    }
                    Value::Strs(v)
                }
                8 => {
                    let n = self.count(4)?;
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(self.list(depth + 1)?);
                    }
                    Value::Lists(v)
                }
                _ => return Err(Error::Decode("an unknown type")),
            };
            l.add(name, value).map_err(|e| match e {
                Error::Exists(_) => Error::Decode("a name given twice"),
                _ => Error::Decode("an empty name"),
            })?;
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests;
