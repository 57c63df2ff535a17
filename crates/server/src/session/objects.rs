//! File data in objects (docs/objects.md): ids granted to a session with the URLs to
//! upload them, uploaded objects mapped into files under the file's rights like any
//! write, reads of them located (the client fetches the bytes), grants ended with their
//! session, and the gone list handed to the shell's collector.

use super::dispatch::Failure;
use super::*;
use crate::objects::DataAccess;

impl Server {
    /// Gives the server access to the image's data store: it signs transfers and, through
    /// `source`, reads object bytes itself when a write must merge a partial block.
    pub fn set_data_access(&mut self, access: DataAccess, source: Box<dyn s::fs::objects::ObjectSource>) {
        self.data = Some(access);
        self.store.set_object_source(source);
        self.end_orphan_grants();
    }

    /// The image's data store access, if the server has one.
    pub fn data_access(&self) -> Option<&DataAccess> {
        self.data.as_ref()
    }

    /// Whether reads of `session` that meet objects are answered `Located`.
    pub(super) fn locates_objects(&self, session: SessionId) -> bool {
        self.data.is_some() && self.sessions.get(&session).is_some_and(|s| s.protocol >= p::PROTOCOL_OBJECTS)
    }

    /// `Op::Uploads`: ids durable before the reply (the request's unit commits), so that
    /// no id is granted twice, whatever crashes.
    pub(super) fn uploads(&mut self, session: SessionId, count: u32, now: p::Time) -> Result<Reply, Failure> {
        if self.data.is_none() {
            return Err(Failure::Wire(errno(95, "this server keeps no file data in an object store")));
        }
        if count == 0 || count > p::MAX_UPLOADS {
            return Err(Failure::Wire(errno(22, format!("{count} uploads asked (1 to {})", p::MAX_UPLOADS))));
        }
        let ids = self.store.grant_objects(session, count)?;
        self.store.fsync(0)?;
        let Some(data) = &self.data else { return Err(Failure::Wire(errno(95, "no data store"))) };
        Ok(Reply::Uploads(ids.into_iter().map(|id| p::Upload { id, url: data.put_url(id, now) }).collect()))
    }

    /// `Op::MapObject`: a write. One that fails gives its id up (on the gone list): the
    /// object may have been uploaded and is never mapped.
    pub(super) fn map_object(
        &mut self,
        session: SessionId,
        (ino, offset, len): (u64, u64, u64),
        id: u64,
        csums: &[u32],
        now_s: s::Timespec,
    ) -> Result<Reply, Failure> {
        if self.data.is_none() {
            return Err(Failure::Wire(errno(95, "this server keeps no file data in an object store")));
        }
        if csums.len() as u64 > p::MAX_OBJECT_BLOCKS {
            return Err(Failure::Wire(errno(22, format!("an object of {} blocks", csums.len()))));
        }
        match self.store.map_object(session, ino, offset, len, id, csums, now_s) {
            Ok(inode) => {
                self.activity.objects_mapped += 1;
                Ok(Reply::Attr(attr_out(&inode)))
            }
            Err(e) => {
                if !matches!(e, s::Error::NotPermitted(_)) {
                    if let Err(g) = self.store.release_grant(session, id) {
                        tracing::warn!(session, id, "cannot give up object {id}: {g}");
                    }
                }
                Err(e.into())
            }
        }
    }

    /// A located read's reply: a GET URL for each object part.
    pub(super) fn located_reply(&mut self, l: s::Located, now: p::Time) -> Reply {
        self.activity.reads_located += 1;
        let Some(data) = &self.data else { return Reply::Data(Vec::new()) };
        let parts = l
            .parts
            .into_iter()
            .map(|part| match part {
                s::Part::Bytes { at, data } => p::LocatedPart::Bytes { at, data },
                s::Part::Object { file_at, id, block, csums } => {
                    p::LocatedPart::Object { file_at, block, csums, url: data.get_url(id, now) }
                }
            })
            .collect();
        Reply::Located(p::Located { offset: l.offset, len: l.len, parts })
    }

    /// Ends `session`'s grants (its end, or its fencing): ids it never mapped are gone.
    pub(super) fn end_grants(&mut self, session: SessionId) {
        match self.store.release_grants(session) {
            Ok(0) => {}
            Ok(n) => tracing::info!(session, "{n} object ids it never mapped are to be deleted"),
            Err(e) => tracing::warn!(session, "cannot end its object grants: {e}"),
        }
    }

    /// Grants of sessions that no longer exist (a record dropped at a restart) end.
    fn end_orphan_grants(&mut self) {
        let grants = match self.store.all_grants() {
            Ok(g) => g,
            Err(e) => return tracing::warn!("cannot list object grants: {e}"),
        };
        let mut gone: Vec<SessionId> =
            grants.into_iter().map(|(_, s)| s).filter(|s| !self.sessions.contains_key(s)).collect();
        gone.sort_unstable();
        gone.dedup();
        for s in gone {
            self.end_grants(s);
        }
    }

    /// Up to `limit` objects to delete, each with the URL to DELETE it with: referenced no
    /// more in a durable transaction. The shell deletes them and says so
    /// (`objects_deleted`); deleting one twice is harmless.
    pub fn objects_to_delete(&mut self, limit: usize, now: p::Time) -> Vec<(u64, String)> {
        let Some(data) = &self.data else { return Vec::new() };
        match self.store.gone_objects(limit) {
            Ok(ids) => ids.into_iter().map(|id| (id, data.delete_url(id, now))).collect(),
            Err(e) => {
                tracing::warn!("cannot read the list of objects to delete: {e}");
                Vec::new()
            }
        }
    }

    /// `objects_to_delete`, as one DeleteObjects request (at most `MAX_DELETE_BATCH`).
    pub fn objects_to_delete_at_once(&mut self, limit: usize, now: p::Time) -> Option<crate::objects::DeleteBatch> {
        let data = self.data.as_ref()?;
        match self.store.gone_objects(limit.min(crate::objects::MAX_DELETE_BATCH)) {
            Ok(ids) if !ids.is_empty() => Some(data.delete_many(&ids, now)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("cannot read the list of objects to delete: {e}");
                None
            }
        }
    }

    /// Objects the shell deleted: off the gone list (durable with the next commit).
    pub fn objects_deleted(&mut self, ids: &[u64]) {
        match self.store.objects_deleted(ids) {
            Ok(()) => self.activity.objects_deleted += ids.len() as u64,
            Err(e) => tracing::warn!("cannot take deleted objects off the list: {e}"),
        }
    }
}
