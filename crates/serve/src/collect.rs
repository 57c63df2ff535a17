//! The shell's side of an image that keeps file data in objects (docs/objects.md): the
//! server core gets access to the data store (`data_access`), the store a way to read an
//! object's bytes itself (`Reader`, for the partial blocks a write merges), and the
//! collector deletes what the gone list names, a batch at a time, beside the store's
//! thread: the store task hands it the batch with signed DELETE URLs, blocking threads
//! delete, and the ids deleted come back (`Ctrl::ObjectsDeleted`) to leave the list.
//! A batch that fails is left on the list and tried again at the next round.

use crate::{now, Ctrl};
use crest_objects::Transfers;
use crest_server::objects::{DataAccess, DataConfig};
use crest_server::Server;
use crest_store::fs::objects::ObjectSource;
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
}

impl Collector {
    pub(crate) fn new(ctrl: mpsc::WeakUnboundedSender<Ctrl>) -> Collector {
        Collector { transfers: Transfers::new(Duration::from_secs(60)), ctrl, busy: false, last: None }
    }

    /// Starts a batch of deletes if none runs and the last round was a while ago.
    pub(crate) fn tick(&mut self, server: &mut Server) {
        if self.busy || self.last.is_some_and(|t| t.elapsed() < EVERY) || server.data_access().is_none() {
            return;
        }
        self.last = Some(Instant::now());
        let batch = server.objects_to_delete(BATCH, now());
        if batch.is_empty() {
            return;
        }
        self.busy = true;
        let (transfers, ctrl) = (self.transfers.clone(), self.ctrl.clone());
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
