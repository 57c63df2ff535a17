//! Reads answered from data read ahead with a file's directory (`crate::prefetch`).

use super::*;
use crate::prefetch::Version;

impl CrestFs {
    /// A read answered from kept data, if the file is still the version it was read at.
    pub(super) fn read_kept(&self, ino: u64, offset: u64, size: u32) -> Option<Vec<u8>> {
        if !lock(&self.prefetch).has(ino) {
            return None;
        }
        let now = lock(&self.names).attr(ino, Instant::now()).map(|a| Version::of(&a));
        lock(&self.prefetch).read(ino, now, offset, size)
    }

    /// Runs `read` (of `ino`) at the server, with the small files of its directory read
    /// ahead in the same request when it has not been yet: each as `GetAttr` + `Read`,
    /// kept with its version, its attributes held as a getattr's are.
    pub(super) fn read_at_server(&self, ino: u64, read: Op) -> Result<Vec<u8>, Error> {
        let batch = lock(&self.prefetch).batch_for(ino);
        if batch.is_empty() {
            return self.one("read", read).and_then(|r| want_data("read", r));
        }
        let epoch = lock(&self.names).epoch();
        let mut ops = Vec::with_capacity(1 + 2 * batch.len());
        ops.push(read);
        for &f in &batch {
            ops.push(Op::GetAttr { ino: f });
            ops.push(Op::Read { ino: f, offset: 0, len: crate::prefetch::MAX_FILE_BYTES as u32 });
        }
        let mut results = self.many("read", ops)?.into_iter();
        let first = results.next().ok_or_else(|| Error::Protocol { op: "read", got: "no result".into() })?;
        let now = Instant::now();
        for f in batch {
            if let (Some(Ok(Reply::Attr(a))), Some(Ok(Reply::Data(d)))) = (results.next(), results.next()) {
                if a.ino == f && a.kind == p::FileType::Regular {
                    lock(&self.names).hold_attr(&a, epoch, now);
                    lock(&self.prefetch).keep(f, Version::of(&a), d);
                }
            }
        }
        first.map_err(|e| Error::server("read", e)).and_then(|r| want_data("read", r))
    }
}
