//! Server answers turned into kernel replies: the reply a call expects (`want_*`), errors
//! as errnos, and how long the kernel may keep what a reply tells it (`kernel_ttls`).

use super::*;

pub(super) fn unexpected(op: &'static str, r: &Reply) -> Error {
    let got = match r {
        Reply::Attr(_) => "Attr",
        Reply::Entry(_) => "Entry",
        Reply::Lookup { .. } => "Lookup",
        Reply::Dir { .. } => "Dir",
        Reply::Data(_) => "Data",
        Reply::Names(_) => "Names",
        Reply::StatFs(_) => "StatFs",
        Reply::Done => "Done",
        Reply::Inodes { .. } => "Inodes",
        Reply::Lock(_) => "Lock",
        Reply::AttrOnly(_) => "AttrOnly",
        Reply::Uploads(_) => "Uploads",
        Reply::Located(_) => "Located",
    };
    Error::Protocol { op, got: got.into() }
}

pub(super) fn want_attr(op: &'static str, r: Reply) -> Result<p::Attr, Error> {
    match r {
        Reply::Attr(a) | Reply::Entry(a) | Reply::Lookup { attr: Some(a), .. } | Reply::AttrOnly(a) => Ok(a),
        Reply::Lookup { attr: None, .. } => {
            Err(Error::Server { op, errno: libc::ENOENT, message: "no such name".into() })
        }
        r => Err(unexpected(op, &r)),
    }
}

pub(super) fn want_data(op: &'static str, r: Reply) -> Result<Vec<u8>, Error> {
    match r {
        Reply::Data(d) => Ok(d),
        r => Err(unexpected(op, &r)),
    }
}

pub(super) fn want_done(op: &'static str, r: Reply) -> Result<(), Error> {
    match r {
        Reply::Done => Ok(()),
        r => Err(unexpected(op, &r)),
    }
}

/// Takes result `i` of a compound call.
pub(super) fn nth(op: &'static str, results: &mut Results, i: usize) -> Result<Reply, Error> {
    match results.get_mut(i).map(|r| std::mem::replace(r, Ok(Reply::Done))) {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(Error::server(op, e)),
        None => Err(Error::Protocol { op, got: format!("{} results", results.len()) }),
    }
}

impl CrestFs {
    pub(super) fn fail(&self, e: &Error) -> Errno {
        if e.is_routine() {
            tracing::debug!("{e}");
        } else {
            tracing::warn!("{e}");
        }
        e.errno()
    }

    /// Kernel timeouts for the entry `name` in `parent` naming `ino` (0: absent): long
    /// for what this mount holds exclusively; under shared rights, as long as the daemon
    /// holds them where the kernel can drop names at once (entries) and always
    /// (attributes); none otherwise. (entry, attributes)
    pub(super) fn kernel_ttls(&self, parent: u64, name: &[u8], ino: u64) -> (Duration, Duration) {
        let mut c = lock(&self.names);
        let entry = if c.kernel_entry(parent, name, ino) {
            HELD_TTL
        } else if self.shared_kernel_names && self.kernel_epoch.enabled() {
            c.kernel_shared_entry(parent, name, Instant::now())
        } else {
            self.ttl
        };
        let attr = match ino {
            0 => self.ttl,
            _ if c.is_exclusive(ino) => HELD_TTL,
            _ => c.attr_valid_for(ino, Instant::now()).max(self.ttl),
        };
        (entry, attr)
    }

    /// Kernel timeout for the attributes of `ino`: long while held exclusively; while
    /// held shared, as long as this mount's cache keeps them (the recall thread drops them
    /// from the kernel, without taking any lock, before it answers a recall).
    pub(super) fn attr_ttl(&self, ino: u64) -> Duration {
        let c = lock(&self.names);
        if c.is_exclusive(ino) {
            HELD_TTL
        } else {
            c.attr_valid_for(ino, Instant::now()).max(self.ttl)
        }
    }

    pub(super) fn reply_entry(&self, reply: ReplyEntry, parent: u64, name: &[u8], r: Result<p::Attr, Error>) {
        match r {
            Ok(a) => {
                lock(&self.inodes).learn(parent, &a);
                let (entry_ttl, attr_ttl) = self.kernel_ttls(parent, name, a.ino);
                reply.entry_with_ttls(&attr_ttl, &entry_ttl, &convert::file_attr(&a), Generation(a.generation));
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    pub(super) fn reply_attr(&self, reply: ReplyAttr, r: Result<p::Attr, Error>) {
        match r {
            Ok(a) => reply.attr(&self.attr_ttl(a.ino), &convert::file_attr(&a)),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    pub(super) fn reply_empty(&self, reply: ReplyEmpty, r: Result<(), Error>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    pub(super) fn reply_xattr(&self, reply: ReplyXattr, size: u32, r: Result<Vec<u8>, Error>) {
        match r {
            Ok(v) => match convert::xattr_answer(v.len(), size) {
                XattrAnswer::Size(n) => reply.size(n),
                XattrAnswer::Data => reply.data(&v),
                XattrAnswer::TooSmall => reply.error(Errno::ERANGE),
            },
            Err(e) => reply.error(self.fail(&e)),
        }
    }
}
