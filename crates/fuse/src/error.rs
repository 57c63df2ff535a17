//! Why a kernel request failed. This is the one place in crest where an error becomes an
//! errno: every variant knows the errno the system call should see.

use crest_net::ClientError;
use crest_proto as p;
use fuser::Errno;

/// A failed kernel request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server (or the client on its behalf, e.g. a timeout) refused the operation.
    #[error("{op}: {message} (errno {errno})")]
    Server {
        /// The operation.
        op: &'static str,
        /// The errno it carries.
        errno: i32,
        /// The server's detail.
        message: String,
    },
    /// The request as a whole did not get through.
    #[error("{op}: {source}")]
    Client {
        /// The operation.
        op: &'static str,
        /// Why.
        source: ClientError,
    },
    /// The server answered with something this operation never returns.
    #[error("{op}: unexpected reply {got}")]
    Protocol {
        /// The operation.
        op: &'static str,
        /// What came back, for the log.
        got: String,
    },
    /// The kernel asked for something crest does not do (EINVAL).
    #[error("{op}: {why}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// Why it is refused.
        why: String,
    },
}

impl Error {
    /// From one operation's result.
    pub fn server(op: &'static str, e: p::OpError) -> Error {
        Error::Server { op, errno: e.errno, message: e.message }
    }

    /// The errno the kernel should return.
    pub fn errno(&self) -> Errno {
        match self {
            Error::Server { errno, .. } => Errno::from_i32(*errno),
            Error::Client { source, .. } => Errno::from_i32(source.errno()),
            Error::Protocol { .. } => Errno::EIO,
            Error::Invalid { .. } => Errno::EINVAL,
        }
    }

    /// True for the errors a working file system returns all day (ENOENT, EEXIST…): these
    /// are logged at debug level, the rest as warnings.
    pub fn is_routine(&self) -> bool {
        match self {
            Error::Server { errno, .. } => !matches!(*errno, libc::EIO | libc::ETIMEDOUT | libc::ENOTCONN),
            Error::Invalid { .. } => true,
            Error::Client { .. } | Error::Protocol { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos() {
        let e = Error::server("lookup", p::OpError { errno: libc::ENOENT, message: "x".into() });
        assert_eq!(e.errno(), Errno::ENOENT);
        assert!(e.is_routine());
        let e = Error::server("read", p::OpError { errno: 0, message: "nonsense".into() });
        assert_eq!(e.errno(), Errno::EIO);
        let e = Error::Client { op: "read", source: ClientError::Closed };
        assert_eq!(e.errno().code(), libc::ENOTCONN);
        assert!(!e.is_routine());
        assert_eq!(Error::Protocol { op: "read", got: "Done".into() }.errno(), Errno::EIO);
        assert_eq!(Error::Invalid { op: "rename", why: "whiteout".into() }.errno(), Errno::EINVAL);
    }
}
