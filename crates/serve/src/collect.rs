//! The shell's side of an image that keeps file data in objects (docs/objects.md): the
//! server core gets access to the data store (`data_access`), the store a way to read an
//! object's bytes itself (`Reader`, for the partial blocks a write merges), and the
//! collector deletes what the gone list names, a batch at a time, beside the store's
//! thread: the store task hands it the batch as one signed DeleteObjects request (or, for
//! a store without it, signed DELETE URLs), a blocking thread sends it, and the ids
//! deleted come back (`Ctrl::ObjectsDeleted`) to leave the list.
//! A batch that fails is left on the list and tried again at the next round.

use crate::{now, Ctrl};
use crest_objects::{TransferError, Transfers};
use crest_server::objects::{not_deleted, DataAccess, DataConfig, DeleteBatch, MAX_DELETE_BATCH};
use crest_server::Server;
use crest_store::fs::objects::ObjectSource;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most objects one batch deletes.
const BATCH: usize = 256;
/// How often the collector looks at the list.
const EVERY: Duration = Duration::from_secs(1);
/// Deletes run at once in a batch.
const PARALLEL: usize = 8;
/// How long the store's own read of an object may retry.
const READ_DEADLINE: Duration = Duration::from_secs(30);

/// Gives `server` access to its image's data store, if the image keeps data in one:
/// refused when it does and `config` is missing.
pub(crate) fn data_access(server: &mut Server, config: Option<&DataConfig>) -> std::io::Result<bool> {
    let store = server.store_mut().data_store().map_err(std::io::Error::other)?;
    let Some(store) = store else { return Ok(false) };
    let Some(config) = config else {
        return Err(std::io::Error::other(format!(
            "the image keeps file data in {}: set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
             (or the config file's data-* keys) for the server",
            store.url
        )));
    };
    let access = DataAccess::new(config, &store).map_err(std::io::Error::other)?;
    let reader = Reader {
        access: DataAccess::new(config, &store).map_err(std::io::Error::other)?,
        transfers: Transfers::new(READ_DEADLINE),
    };
    tracing::info!(url = %store.url, endpoint = %config.endpoint, "file data in objects");
    server.set_data_access(access, Box::new(reader));
    Ok(true)
}

/// The store's own reads of objects (partial blocks merged by writes; send streams).
struct Reader {
    access: DataAccess,
    transfers: Transfers,
}

impl ObjectSource for Reader {
    fn read(&mut self, id: u64, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let url = self.access.get_url(id, now());
        self.transfers.get_range(&url, offset, len).map_err(|e| std::io::Error::other(format!("object {id}: {e}")))
    }
}

/// The collector's state on the store task.
pub(crate) struct Collector {
    transfers: Transfers,
    ctrl: mpsc::WeakUnboundedSender<Ctrl>,
    busy: bool,
    last: Option<Instant>,
    /// Whether the store takes DeleteObjects (until it refuses one).
    multi: Arc<AtomicBool>,
}

impl Collector {
    pub(crate) fn new(ctrl: mpsc::WeakUnboundedSender<Ctrl>) -> Collector {
        Collector {
            transfers: Transfers::new(Duration::from_secs(60)),
            ctrl,
            busy: false,
            last: None,
            multi: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Starts a batch of deletes if none runs and the last round was a while ago.
    pub(crate) fn tick(&mut self, server: &mut Server) {
        if self.busy || self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        let Some(access) = server.data_access().cloned() else { return };
        self.last = Some(Instant::now());
        let (transfers, ctrl) = (self.transfers.clone(), self.ctrl.clone());
        // One DeleteObjects request a batch, where the store has it (S3, RADOS Gateway,
        // MinIO); one DELETE per object where it refuses it.
        if self.multi.load(Ordering::Relaxed) {
            let Some(batch) = server.objects_to_delete_at_once(MAX_DELETE_BATCH, now()) else { return };
            self.busy = true;
            let multi = self.multi.clone();
            tokio::task::spawn_blocking(move || {
                let deleted = delete_batch(&transfers, &access, &batch, &multi);
                if let Some(ctrl) = ctrl.upgrade() {
                    let _ = ctrl.send(Ctrl::ObjectsDeleted(deleted));
                }
            });
            return;
        }
        let batch = server.objects_to_delete(BATCH, now());
        if batch.is_empty() {
            return;
        }
        self.busy = true;
        tokio::task::spawn_blocking(move || {
            let deleted = delete_all(&transfers, batch);
            if let Some(ctrl) = ctrl.upgrade() {
                let _ = ctrl.send(Ctrl::ObjectsDeleted(deleted));
            }
        });
    }

    /// A batch ended: `ids` were deleted.
    pub(crate) fn done(&mut self, server: &mut Server, ids: &[u64]) {
        self.busy = false;
        server.objects_deleted(ids);
    }
}

/// Sends one DeleteObjects request; the ids deleted. A store that refuses the request
/// itself (400, 405, 501: no multi-object delete) has the batch deleted one by one, and
/// every later one too.
fn delete_batch(transfers: &Transfers, access: &DataAccess, batch: &DeleteBatch, multi: &AtomicBool) -> Vec<u64> {
    let headers = [("Content-MD5", batch.content_md5.as_str()), ("Content-Type", "application/xml")];
    match transfers.post(&batch.url, batch.body.as_bytes(), &headers) {
        Ok(xml) => match not_deleted(access, batch, &xml) {
            Ok(failed) => {
                if !failed.is_empty() {
                    tracing::warn!("{} objects not deleted (tried again later)", failed.len());
                }
                batch.ids.iter().copied().filter(|id| !failed.contains(id)).collect()
            }
            Err(e) => {
                tracing::warn!("{e} (tried again later)");
                Vec::new()
            }
        },
        Err(TransferError::Refused(status @ (400 | 405 | 501), _)) => {
            tracing::info!(status, "the data store takes no DeleteObjects: objects are deleted one by one");
            multi.store(false, Ordering::Relaxed);
            let now = now();
            delete_all(transfers, batch.ids.iter().map(|&id| (id, access.delete_url(id, now))).collect())
        }
        Err(e) => {
            tracing::warn!("cannot delete {} objects: {e} (tried again later)", batch.ids.len());
            Vec::new()
        }
    }
}

/// Deletes the batch, `PARALLEL` at a time; the ids deleted.
fn delete_all(transfers: &Transfers, batch: Vec<(u64, String)>) -> Vec<u64> {
    let chunk = batch.len().div_ceil(PARALLEL).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = batch
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut done = Vec::new();
                    for (id, url) in part {
                        match transfers.delete(url) {
                            Ok(()) => done.push(*id),
                            Err(e) => tracing::warn!(id, "cannot delete object {id}: {e} (tried again later)"),
                        }
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
    })
}
