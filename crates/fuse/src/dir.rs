//! Directory streams: one per open directory handle, turning the kernel's offset-addressed
//! `readdir` calls into paged `ReadDir` operations.
//!
//! Invariants:
//! - the kernel sees "." (offset 1), ".." (offset 2), then every entry at
//!   `entry_offset(index)`; offsets depend only on the server's per-directory index, so
//!   they stay valid across pages, seekdir and concurrent changes;
//! - `items` holds entries fetched but not yet handed to the kernel, all with
//!   `index >= from`, in index order; they are used only when the kernel asks for exactly
//!   `from` again (the usual sequential read), otherwise they are dropped and refetched;
//! - offset 0 (opendir or rewinddir) always refetches, so a rewound stream sees the
//!   directory as it is now;
//! - a stream stops at the directory's next index as the first page after a (re)start
//!   found it (`cap`): a rename gives its entry a new index, so without the cap a listing
//!   read while names move (or that renames what it reads) would meet the same entries
//!   again under new names and never end. Entries present throughout keep their index
//!   and appear exactly once;
//! - at most `READDIR_BATCH` entries are buffered per stream.

use std::collections::VecDeque;

use crest_proto as p;

use crate::convert::{from_index, DOT_OFFSET};

/// Entries asked of the server per `ReadDir` (what does not fit in the kernel's buffer
/// waits in the stream for the next call).
pub const READDIR_BATCH: u32 = 256;

/// One thing to hand to the kernel.
#[derive(Debug)]
pub enum Entry<'a> {
    /// "." (offset 1).
    Dot,
    /// ".." (offset 2).
    DotDot,
    /// A real entry (offset `entry_offset(index)`).
    Item(&'a p::DirItem),
}

/// The state of one open directory.
#[derive(Debug, Default)]
pub struct DirStream {
    /// Server index the buffered entries start at.
    from: u64,
    /// Fetched, not yet returned.
    items: VecDeque<p::DirItem>,
    /// The server said nothing follows `items`.
    end: bool,
    /// Entries at or above this index were made after the stream (re)started.
    cap: Option<u64>,
}

impl DirStream {
    fn restart(&mut self, from: u64) {
        self.from = from;
        self.items.clear();
        self.end = false;
        self.cap = None;
    }

    /// Answers one kernel `readdir` at `offset`: hands entries to `add` until it reports a
    /// full buffer (returns true, the entry was not taken) or the directory ends. `fetch`
    /// asks the server for a page starting at an index and returns it with its end flag
    /// and the directory's next index.
    ///
    /// A fetch error after some entries were taken ends the reply early without error (the
    /// kernel asks again from there); before any, it is returned.
    pub fn fill<E>(
        &mut self,
        offset: u64,
        mut fetch: impl FnMut(u64) -> Result<(Vec<p::DirItem>, bool, u64), E>,
        mut add: impl FnMut(Entry<'_>) -> bool,
    ) -> Result<(), E> {
        if offset == 0 {
            self.restart(0);
            if add(Entry::Dot) {
                return Ok(());
            }
        }
        if offset <= DOT_OFFSET && add(Entry::DotDot) {
            return Ok(());
        }
        let from = from_index(offset);
        if from != self.from {
            self.restart(from);
        }
        let mut taken = offset <= DOT_OFFSET;
        loop {
            let Some(item) = self.items.front() else {
                if self.end {
                    return Ok(());
                }
                match fetch(self.from) {
                    Ok((items, end, next_index)) => {
                        let from = self.from;
                        let cap = *self.cap.get_or_insert(next_index);
                        let fetched = items.len();
                        self.items = items.into_iter().filter(|i| i.index >= from && i.index < cap).collect();
                        // Pages come in index order: one that reached the cap ends the
                        // stream; one that is empty yet "not the end" would loop for ever.
                        self.end = end || self.items.len() < fetched || self.items.is_empty();
                        continue;
                    }
                    Err(e) if !taken => return Err(e),
                    Err(_) => return Ok(()),
                }
            };
            if add(Entry::Item(item)) {
                return Ok(());
            }
            taken = true;
            self.from = item.index.saturating_add(1);
            self.items.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{entry_offset, DOTDOT_OFFSET};

    fn item(index: u64) -> p::DirItem {
        p::DirItem {
            name: format!("f{index}").into_bytes(),
            index,
            attr: p::Attr {
                ino: 100 + index,
                generation: 1,
                kind: p::FileType::Regular,
                mode: 0o644,
                nlink: 1,
                uid: 0,
                gid: 0,
                size_bytes: 0,
                blocks_4k: 0,
                rdev: 0,
                atime: p::Time::default(),
                mtime: p::Time::default(),
                ctime: p::Time::default(),
                crtime: p::Time::default(),
                flags: 0,
            },
        }
    }

    /// A directory with entries at `indexes` (sparse, as after deletions), served in pages
    /// of `page`; counts fetches.
    struct Server {
        indexes: Vec<u64>,
        page: usize,
        fetches: usize,
    }

    impl Server {
        fn fetch(&mut self, from: u64) -> Result<(Vec<p::DirItem>, bool, u64), ()> {
            self.fetches += 1;
            let rest: Vec<_> = self.indexes.iter().filter(|&&i| i >= from).copied().collect();
            let end = rest.len() <= self.page;
            let next = self.indexes.iter().max().map_or(0, |m| m + 1);
            Ok((rest.into_iter().take(self.page).map(item).collect(), end, next))
        }

        /// A rename: the entry at `index` moves to a new one, as the store does it.
        fn rename(&mut self, index: u64) {
            let next = self.indexes.iter().max().map_or(0, |m| m + 1);
            self.indexes.retain(|&i| i != index);
            self.indexes.push(next);
        }
    }

    /// One kernel call with room for `room` entries: (name, offset) pairs.
    fn call(s: &mut DirStream, srv: &mut Server, offset: u64, room: usize) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        s.fill(
            offset,
            |from| srv.fetch(from),
            |e| {
                if out.len() == room {
                    return true;
                }
                out.push(match e {
                    Entry::Dot => (".".into(), DOT_OFFSET),
                    Entry::DotDot => ("..".into(), DOTDOT_OFFSET),
                    Entry::Item(i) => (String::from_utf8_lossy(&i.name).into_owned(), entry_offset(i.index)),
                });
                false
            },
        )
        .expect("fetch");
        out
    }

    /// Reads a whole directory like getdents does: each call continues at the last offset.
    fn list(s: &mut DirStream, srv: &mut Server, room: usize) -> Vec<String> {
        let mut names = Vec::new();
        let mut offset = 0;
        loop {
            let got = call(s, srv, offset, room);
            let Some(last) = got.last() else { return names };
            offset = last.1;
            names.extend(got.into_iter().map(|(n, _)| n));
        }
    }

    #[test]
    fn whole_listing_in_small_kernel_buffers() {
        let mut srv = Server { indexes: vec![0, 1, 4, 5, 9, 10, 11], page: 3, fetches: 0 };
        let mut s = DirStream::default();
        let names = list(&mut s, &mut srv, 2);
        assert_eq!(names, [".", "..", "f0", "f1", "f4", "f5", "f9", "f10", "f11"]);
        // Pages of 3 for 7 entries: 3 fetches, the last one says "end"; the final empty
        // kernel call is answered from the stream.
        assert_eq!(srv.fetches, 3);
    }

    #[test]
    fn large_kernel_buffer_takes_several_pages_in_one_call() {
        let mut srv = Server { indexes: (0..10).collect(), page: 4, fetches: 0 };
        let mut s = DirStream::default();
        let got = call(&mut s, &mut srv, 0, 100);
        assert_eq!(got.len(), 12);
        assert_eq!(got[2], ("f0".into(), 3));
        assert_eq!(got[11], ("f9".into(), 12));
    }

    #[test]
    fn seek_to_any_returned_offset_resumes_after_that_entry() {
        let mut srv = Server { indexes: vec![2, 3, 7, 8], page: 10, fetches: 0 };
        let mut s = DirStream::default();
        let all = call(&mut s, &mut srv, 0, 100);
        for (k, (_, off)) in all.iter().enumerate() {
            let mut fresh = DirStream::default();
            let rest = call(&mut fresh, &mut srv, *off, 100);
            assert_eq!(rest, all[k + 1..].to_vec(), "after offset {off}");
        }
    }

    #[test]
    fn offsets_survive_concurrent_deletion() {
        let mut srv = Server { indexes: (0..6).collect(), page: 2, fetches: 0 };
        let mut s = DirStream::default();
        let first = call(&mut s, &mut srv, 0, 4); // ., .., f0, f1
        let off = first.last().map(|x| x.1).unwrap_or_default();
        srv.indexes.retain(|&i| i != 1 && i != 2); // f1 (already seen) and f2 go away
        let mut fresh = DirStream::default(); // even without the buffer
        let rest: Vec<_> = call(&mut fresh, &mut srv, off, 100).into_iter().map(|x| x.0).collect();
        assert_eq!(rest, ["f3", "f4", "f5"]);
    }

    #[test]
    fn renaming_each_entry_as_it_is_read_ends_the_listing() {
        // fstests generic/736: every entry read is renamed (a new, higher index) before
        // the next kernel call, in pages of every size.
        for page in [1, 2, 3, 7, 64] {
            for room in [1, 2, 5, 100] {
                let mut srv = Server { indexes: (0..20).collect(), page, fetches: 0 };
                let mut s = DirStream::default();
                let mut offset = 0;
                let mut seen = Vec::new();
                while seen.len() <= 40 {
                    let got = call(&mut s, &mut srv, offset, room);
                    let Some(last) = got.last() else { break };
                    offset = last.1;
                    for (name, off) in got {
                        if off > DOTDOT_OFFSET {
                            srv.rename(crate::convert::from_index(off) - 1);
                            seen.push(name);
                        }
                    }
                }
                assert_eq!(seen.len(), 20, "page {page}, room {room}: {seen:?}");
            }
        }
    }

    #[test]
    fn rewind_refetches() {
        let mut srv = Server { indexes: vec![0, 1], page: 10, fetches: 0 };
        let mut s = DirStream::default();
        assert_eq!(list(&mut s, &mut srv, 10).len(), 4);
        srv.indexes.push(2);
        assert_eq!(list(&mut s, &mut srv, 10).len(), 5);
    }

    #[test]
    fn empty_page_without_end_terminates() {
        let mut s = DirStream::default();
        let mut calls = 0;
        let r: Result<(), ()> = s.fill(
            2,
            |_| {
                calls += 1;
                Ok((Vec::new(), false, 0))
            },
            |_| false,
        );
        assert!(r.is_ok());
        assert_eq!(calls, 1);
    }

    #[test]
    fn fetch_error_before_any_entry_is_returned_after_is_swallowed() {
        let mut s = DirStream::default();
        assert_eq!(s.fill(5, |_| Err::<(Vec<p::DirItem>, bool, u64), _>("down"), |_| false), Err("down"));
        let mut s = DirStream::default();
        let mut n = 0;
        assert_eq!(
            s.fill(
                0,
                |_| Err::<(Vec<p::DirItem>, bool, u64), _>("down"),
                |_| {
                    n += 1;
                    false
                }
            ),
            Ok(())
        );
        assert_eq!(n, 2); // "." and ".."
    }
}
