//! Why a call failed as a whole (per-operation errors are in its results).

/// Why a call failed as a whole (per-operation errors are in the results).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// No response within the operation timeout (server away too long).
    #[error("no answer from {addr} within {secs} s")]
    Timeout {
        /// Server address.
        addr: String,
        /// Timeout.
        secs: u64,
    },
    /// The server refused the handshake.
    #[error("server {addr} refused the connection: {reason}")]
    Refused {
        /// Server address.
        addr: String,
        /// Its reason.
        reason: String,
    },
    /// Something answers at the address but it is not a crest server (its answer to the
    /// first handshake was no crest frame, or none came).
    #[error("{addr} is not a crest server: {detail}")]
    NotCrest {
        /// Server address.
        addr: String,
        /// What it did instead.
        detail: String,
    },
    /// The TLS handshake failed over the certificates: the server does not chain to the
    /// CA this client pins for it, or it does not accept this client's certificate.
    #[error("{addr} and this client do not trust each other: {detail}")]
    Untrusted {
        /// Server address.
        addr: String,
        /// What TLS said, and what to do.
        detail: String,
    },
    /// Could not connect at all.
    #[error("cannot connect to {addr}: {detail}")]
    Connect {
        /// Server address.
        addr: String,
        /// The last error.
        detail: String,
    },
    /// The client was shut down.
    #[error("client is shut down")]
    Closed,
    /// The caller gave up waiting (its process has a signal to take: Ctrl-C, kill). The
    /// request may still run, as a call interrupted on an NFS `intr` mount may.
    #[error("interrupted while waiting for {addr}")]
    Interrupted {
        /// Server address.
        addr: String,
    },
    /// The server fenced this client's session (it was silent or away past its lease):
    /// the request was not applied, and will not be.
    #[error("{addr} fenced this client's session (its lease lapsed); the change was not applied")]
    Fenced {
        /// Server address.
        addr: String,
    },
    /// The server applied the change, made it durable and restarted before its answer
    /// went out: the change stands, its result is lost.
    #[error("{addr} restarted after applying the change, before answering; its result is lost")]
    ReplyLost {
        /// Server address.
        addr: String,
    },
}

impl ClientError {
    /// The errno a system call should see.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Timeout { .. } => 110, // ETIMEDOUT
            ClientError::Refused { .. }
            | ClientError::NotCrest { .. }
            | ClientError::Untrusted { .. }
            | ClientError::Connect { .. }
            | ClientError::Closed => 107, // ENOTCONN
            ClientError::Fenced { .. } | ClientError::ReplyLost { .. } => 5, // EIO
            ClientError::Interrupted { .. } => 4, // EINTR
        }
    }
}
