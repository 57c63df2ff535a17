//! Moving objects of a data store through presigned URLs (docs/objects.md): a mount PUTs
//! and GETs the objects of its files' data itself, with URLs the server signed for each
//! transfer, and the server's collector DELETEs with URLs it signs for itself. No keys
//! here: a URL is all a transfer needs.
//!
//! Every transfer retries what may pass — a connection that failed, a store answering
//! 5xx, 408 or 429 — with exponential backoff and jitter until its deadline, then fails
//! with the last error; what cannot pass (403: the URL expired or is not for this; 404)
//! fails at once. A PUT is sent with `If-None-Match: *` (signed into its URL): an object
//! is written once, so a retried PUT whose first attempt did land is answered 412,
//! which counts as done, while a first attempt answered 412 means the id was written
//! before — an error.

use std::time::{Duration, Instant};

/// Block size of the checksums (the file system's).
pub const BLOCK_BYTES: usize = 4096;
/// The largest object crest writes (`MAX_OBJECT_BLOCKS` blocks): the most a GET reads.
pub const MAX_OBJECT_BYTES: u64 = (1 << 14) * 4096;

/// Why a transfer failed.
#[derive(Debug)]
pub enum TransferError {
    /// The object does not exist (deleted since the URL was made, or never uploaded).
    NotFound,
    /// The store refused the request for good (status and the start of its answer): an
    /// expired or wrong URL (403), a PUT of an id written before (412).
    Refused(u16, String),
    /// Retried until the deadline; the last failure.
    Failed(String),
    /// The store's answer was not what was asked (a short range, say).
    Bad(String),
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransferError::NotFound => write!(f, "no such object"),
            TransferError::Refused(status, body) => write!(f, "refused by the data store ({status}): {body}"),
            TransferError::Failed(e) => write!(f, "data store unreachable: {e}"),
            TransferError::Bad(e) => write!(f, "bad answer from the data store: {e}"),
        }
    }
}

impl std::error::Error for TransferError {}

/// Transfers of one process (a pool of connections to the store).
#[derive(Clone)]
pub struct Transfers {
    agent: ureq::Agent,
    deadline: Duration,
}

impl Transfers {
    /// Transfers that give up after `deadline` (a mount's timeout) of retrying.
    pub fn new(deadline: Duration) -> Transfers {
        let crypto = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(crypto)
            .build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_recv_response(Some(Duration::from_secs(30)))
            .timeout_recv_body(Some(Duration::from_secs(60)))
            .timeout_send_body(Some(Duration::from_secs(60)))
            .max_idle_connections_per_host(32)
            .build()
            .new_agent();
        Transfers { agent, deadline }
    }

    /// PUTs `body` as a new object (see the module doc for `If-None-Match`).
    pub fn put_once(&self, url: &str, body: &[u8]) -> Result<(), TransferError> {
        let mut first = true;
        self.retrying("PUT", |left| {
            let r =
                self.agent.put(url).config().timeout_global(Some(left)).build().header("If-None-Match", "*").send(body);
            let tried_before = !std::mem::replace(&mut first, false);
            match answer(r)? {
                (200..=299, _) => Ok(()),
                (412, _) if tried_before => Ok(()),
                (status, text) => Err(Attempt::from_status(status, text)),
            }
        })
    }

    /// GETs `len` bytes from `offset` of the object `url` names: exactly that, or an error.
    pub fn get_range(&self, url: &str, offset: u64, len: usize) -> Result<Vec<u8>, TransferError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let range = format!("bytes={offset}-{}", offset + len as u64 - 1);
        self.retrying("GET", |left| {
            let req = self.agent.get(url).config().timeout_global(Some(left)).build();
            let mut resp = req.header("Range", &range).call().map_err(transport)?;
            let status = resp.status().as_u16();
            if !(200..=299).contains(&status) {
                let text = resp.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
                return Err(Attempt::from_status(status, text));
            }
            // (A store that ignores the range answers 200 with the whole object.)
            let limit = if status == 206 { len as u64 } else { MAX_OBJECT_BYTES };
            let body = resp.body_mut().with_config().limit(limit + 1).read_to_vec().map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(_) => {
                    Attempt::Fatal(TransferError::Bad(format!("an answer longer than {limit} bytes")))
                }
                e => transport(e),
            })?;
            let body = if status == 200 && body.len() > len {
                body.get(offset as usize..offset as usize + len).map(<[u8]>::to_vec).unwrap_or_default()
            } else {
                body
            };
            if body.len() != len {
                return Err(Attempt::Fatal(TransferError::Bad(format!("{} bytes of {len} asked", body.len()))));
            }
            Ok(body)
        })
    }

    /// DELETEs the object `url` names; one already gone counts as deleted.
    pub fn delete(&self, url: &str) -> Result<(), TransferError> {
        self.retrying("DELETE", |left| {
            match answer(self.agent.delete(url).config().timeout_global(Some(left)).build().call())? {
                (200..=299 | 404, _) => Ok(()),
                (status, text) => Err(Attempt::from_status(status, text)),
            }
        })
    }

    /// POSTs `body` with `headers`; the answer's text (up to 16 MiB).
    pub fn post(&self, url: &str, body: &[u8], headers: &[(&str, &str)]) -> Result<String, TransferError> {
        self.retrying("POST", |left| {
            let mut req = self.agent.post(url).config().timeout_global(Some(left)).build();
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let mut resp = req.send(body).map_err(transport)?;
            let status = resp.status().as_u16();
            let text = resp.body_mut().with_config().limit(16 << 20).read_to_string().map_err(transport)?;
            match status {
                200..=299 => Ok(text),
                _ => Err(Attempt::from_status(status, text)),
            }
        })
    }

    /// GETs a small text answer (an object listing), up to 16 MiB.
    pub fn get_text(&self, url: &str) -> Result<String, TransferError> {
        self.retrying("LIST", |left| {
            let mut resp = self.agent.get(url).config().timeout_global(Some(left)).build().call().map_err(transport)?;
            let status = resp.status().as_u16();
            let text = resp.body_mut().with_config().limit(16 << 20).read_to_string().map_err(transport)?;
            match status {
                200..=299 => Ok(text),
                _ => Err(Attempt::from_status(status, text)),
            }
        })
    }

    /// Runs `attempt` until it succeeds, fails for good, or the deadline passes.
    /// Each attempt may take what is left of the deadline.
    fn retrying<T>(
        &self,
        what: &str,
        mut attempt: impl FnMut(Duration) -> Result<T, Attempt>,
    ) -> Result<T, TransferError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let left = self.deadline.saturating_sub(start.elapsed()).max(Duration::from_millis(100));
            match attempt(left) {
                Ok(v) => return Ok(v),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Again(e)) => {
                    let spent = start.elapsed();
                    if spent + pause > self.deadline {
                        return Err(TransferError::Failed(format!("{what}: {e} (tried for {spent:.1?})")));
                    }
                    tracing::debug!("{what}: {e}; again in {pause:?}");
                    std::thread::sleep(jitter(pause));
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

/// One attempt's failure: worth another try, or not.
enum Attempt {
    Again(String),
    Fatal(TransferError),
}

impl Attempt {
    fn from_status(status: u16, text: String) -> Attempt {
        let text: String = text.chars().take(300).collect();
        match status {
            404 => Attempt::Fatal(TransferError::NotFound),
            408 | 429 | 500..=599 => Attempt::Again(format!("status {status}: {text}")),
            _ => Attempt::Fatal(TransferError::Refused(status, text)),
        }
    }
}

fn transport(e: ureq::Error) -> Attempt {
    Attempt::Again(e.to_string())
}

/// Status and (a short) text of an answer.
fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<(u16, String), Attempt> {
    let mut resp = r.map_err(transport)?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().with_config().limit(64 << 10).read_to_string().unwrap_or_default();
    Ok((status, text))
}

/// `d` scaled by a random factor in [0.5, 1.5).
fn jitter(d: Duration) -> Duration {
    let r = crest_rng::next_u64() % 1000;
    d.mul_f64(0.5 + r as f64 / 1000.0)
}

/// The CRC-32C of each 4 KiB block of `data` (whose length is a multiple of it).
pub fn block_sums(data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK_BYTES).map(crc_fast::crc32_iscsi).collect()
}

/// Checks `data` (blocks) against `csums`: the index of the first bad block, if any.
pub fn first_bad_block(data: &[u8], csums: &[u32]) -> Option<usize> {
    if data.len() != csums.len() * BLOCK_BYTES {
        return Some(0);
    }
    block_sums(data).iter().zip(csums).position(|(a, b)| a != b)
}
