//! Writeback batching: consecutive writeback calls merged into one request (`Merger`), by
//! the rules of `crate::batch`.

use super::*;
use crate::batch::{caller_free, cancel_open, cancel_pair, join_setattr, join_write};
use crate::replay::op_bytes;

/// Most operations, and bytes of them, merged into one compound writeback request (well
/// inside `MAX_OPS_PER_REQUEST` and the frame limit).
pub(super) const MAX_MERGED_OPS: usize = 512;
pub(super) const MAX_MERGED_BYTES: usize = 2 << 20;

/// Consecutive writeback submissions taken from the queue in one burst, merged into one
/// compound request: the server applies it as one unit (one transaction, one session
/// record), and each part keeps the clock its caller was answered at (`Op::At`).
/// Only consecutive ones: merging across a waiting call would reorder them. A create
/// whose removal joins the same batch is cancelled with it (`cancel_pair`), and so is an
/// open whose release does (`cancel_open`).
pub(super) struct Merger<R> {
    pub(super) base: Option<Call<R>>,
    pub(super) parts: Vec<Part<R>>,
    pub(super) clock: Option<p::Time>,
    pub(super) bytes: usize,
}

impl<R> Merger<R> {
    pub(super) fn new() -> Merger<R> {
        Merger { base: None, parts: Vec::new(), clock: None, bytes: 0 }
    }

    /// Takes `c` into the batch, or hands it back when it cannot join (then `flush`).
    pub(super) fn offer(&mut self, c: Call<R>) -> Option<Call<R>> {
        let bytes = op_bytes(&c.ops);
        if !c.reply.is_writeback() || bytes > MAX_MERGED_BYTES / 2 {
            return Some(c);
        }
        let Some(base) = &mut self.base else {
            self.clock = c.time;
            self.bytes = bytes;
            self.base = Some(c);
            return None;
        };
        // A request runs for one caller, whose permissions the server checks; a release
        // (sent for nobody: the kernel's has no caller) needs none and joins any batch.
        if base.caller != c.caller {
            if caller_free(&base.ops) {
                base.caller = c.caller.clone();
            } else if !caller_free(&c.ops) {
                return Some(c);
            }
        }
        let prefix = usize::from(c.time != self.clock);
        if base.ops.len() + prefix + c.ops.len() > MAX_MERGED_OPS || self.bytes + bytes > MAX_MERGED_BYTES {
            return Some(c);
        }
        if self.parts.is_empty() {
            // The base becomes the first part.
            let reply = std::mem::replace(&mut base.reply, Answer::Batch(Vec::new()));
            self.parts.push(Part { answer: reply, skip: 0, len: base.ops.len() });
        }
        if join_write(&mut base.ops, &mut base.time, &mut self.clock, &c.ops, c.time)
            || join_setattr(&mut base.ops, &mut base.time, &mut self.clock, &c.ops, c.time)
        {
            // Its answer is the joined operation's, which the part that made it first gets.
            self.bytes += bytes;
            self.parts.push(Part { answer: c.reply, skip: 0, len: 0 });
            return None;
        }
        if let (1, Some(time)) = (prefix, c.time) {
            base.ops.push(p::Op::At { time });
            self.clock = c.time;
        }
        self.bytes += bytes;
        let len = c.ops.len();
        base.ops.extend(c.ops);
        self.parts.push(Part { answer: c.reply, skip: prefix, len });
        if cancel_pair(&mut base.ops, base.time) {
            tracing::trace!(id = base.id, "a create and its removal cancelled before sending");
        } else if cancel_open(&mut base.ops, base.time) {
            tracing::trace!(id = base.id, "an open and its release cancelled before sending");
        }
        None
    }

    /// The merged request, if any.
    pub(super) fn flush(&mut self) -> Option<Call<R>> {
        let mut base = self.base.take()?;
        if !self.parts.is_empty() {
            base.reply = Answer::Batch(std::mem::take(&mut self.parts));
        }
        self.bytes = 0;
        Some(base)
    }
}
