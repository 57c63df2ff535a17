//! The byte stream both shells speak over (`crest-net`'s connection, `crest-serve`'s
//! listener): TCP with Nagle off, either plain (`--insecure`) or mutual TLS 1.3 over it,
//! read and written the same way, so TLS adds its cryptography and rustls's record
//! handling, not system calls or wake-ups.
//!
//! Without care TLS costs much more than that (issue 14): rustls pulls ciphertext off the
//! socket 4 KiB per `read` (a 30 KiB reply took eight system calls instead of one, and the
//! small reads sent the peer a window update each, which woke it), and `tokio-rustls`
//! hands over one record (16 KiB) per read, so the connection loops ran once per record
//! instead of once per burst. Here TLS reads the socket through a buffer as large as the
//! plain path's reads (`socket`), `read_burst` takes all that is ready whichever the
//! stream, and rustls may hold as much outgoing ciphertext as one flush writes.
//!
//! Invariants:
//! - TLS runs over `Socket` only, and both halves come from here (`plain`, `tls`);
//! - a read never waits once it has bytes (`read_burst`).

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;

/// A connection's reading half.
pub type Reader = Box<dyn AsyncRead + Unpin + Send>;
/// A connection's writing half.
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// The most either end reads from the socket at once (its read buffer), and the most
/// ciphertext rustls holds before it must write (a flush of up to this much plaintext
/// goes out in one system call, not one per 64 KiB).
pub const BUFFER_BYTES: usize = 256 * 1024;

/// What TLS runs over: the socket, read through a buffer of `BUFFER_BYTES` (rustls asks
/// for 4 KiB at a time), written straight through.
pub type Socket = BufReader<TcpStream>;

/// `stream` with Nagle off (requests and replies are sent whole, each burst in one write),
/// read through a buffer, for a TLS handshake.
pub fn socket(stream: TcpStream) -> Socket {
    let _ = stream.set_nodelay(true);
    BufReader::with_capacity(BUFFER_BYTES, stream)
}

/// A plaintext connection's halves (Nagle off, as `socket`).
pub fn plain(stream: TcpStream) -> (Reader, Writer) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    (Box::new(rd), Box::new(wr))
}

/// A TLS connection's halves, once its handshake is done (a client's or a server's).
pub fn tls(stream: impl Into<tokio_rustls::TlsStream<Socket>>) -> (Reader, Writer) {
    let mut stream = stream.into();
    match &mut stream {
        tokio_rustls::TlsStream::Client(s) => s.get_mut().1.set_buffer_limit(Some(BUFFER_BYTES)),
        tokio_rustls::TlsStream::Server(s) => s.get_mut().1.set_buffer_limit(Some(BUFFER_BYTES)),
    }
    let (rd, wr) = tokio::io::split(stream);
    (Box::new(rd), Box::new(wr))
}

/// Reads what has arrived: waits for the first bytes, then takes whatever else is ready
/// without waiting, until `buf` is full. 0 is the end of the stream. (TLS yields one
/// record per read; a burst of replies is many.) An error after some bytes is left for
/// the next read, which meets it again (a socket's error, like rustls's, stays).
pub async fn read_burst<R: AsyncRead + Unpin + ?Sized>(rd: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = rd.read(buf).await?;
    if n == 0 {
        return Ok(0);
    }
    poll_fn(|cx| {
        while n < buf.len() {
            let mut more = ReadBuf::new(&mut buf[n..]);
            match Pin::new(&mut *rd).poll_read(cx, &mut more) {
                Poll::Ready(Ok(())) if !more.filled().is_empty() => n += more.filled().len(),
                _ => break,
            }
        }
        Poll::Ready(Ok(n))
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_burst_read_takes_everything_ready_and_no_more_than_fits() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        a.write_all(&[7; 100_000]).await.unwrap();
        let mut buf = vec![0; 60_000];
        assert_eq!(read_burst(&mut b, &mut buf).await.unwrap(), 60_000);
        assert_eq!(read_burst(&mut b, &mut buf).await.unwrap(), 40_000);
        drop(a);
        assert_eq!(read_burst(&mut b, &mut buf).await.unwrap(), 0, "the end of the stream");
    }

    #[tokio::test]
    async fn a_burst_read_returns_what_it_has_without_waiting_for_more() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        a.write_all(b"hello").await.unwrap();
        let mut buf = vec![0; 1024];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), read_burst(&mut b, &mut buf)).await;
        assert_eq!(n.unwrap().unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
    }
}
