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
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection's reading half.
pub type Reader = Box<dyn AsyncRead + Unpin + Send>;
/// A connection's writing half.
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// The most either end reads from the socket at once (its read buffer), and the most
/// ciphertext rustls holds before it must write (a flush of up to this much plaintext
/// goes out in one system call, not one per 64 KiB).
pub const BUFFER_BYTES: usize = 256 * 1024;

/// The smallest read `Socket` makes.
pub const MIN_READ_BYTES: usize = 16 * 1024;

/// What TLS runs over: the socket, read through a buffer (rustls asks for 4 KiB at a
/// time), written straight through. The buffer is sized by the reads before, as
/// `crest_proto::FrameDecoder::read_room` sizes the decoder's: doubling while reads fill
/// it, up to `BUFFER_BYTES`, halving when they bring less than `MIN_READ_BYTES`, and
/// given back once empty at the smallest size: a connection moving big writes reads in big bites,
/// an idle one holds `MIN_READ_BYTES` (a buffer of `BUFFER_BYTES` each cost a thousand
/// idle sessions ~150 MiB of the server's memory).
pub struct Socket {
    stream: TcpStream,
    buf: Vec<u8>,
    /// `buf[pos..end]`: read from the socket, not yet taken.
    pos: usize,
    end: usize,
    /// The next read's size.
    size: usize,
}

/// `stream` with Nagle off (requests and replies are sent whole, each burst in one write),
/// read through a buffer, for a TLS handshake.
pub fn socket(stream: TcpStream) -> Socket {
    let _ = stream.set_nodelay(true);
    Socket { stream, buf: Vec::new(), pos: 0, end: 0, size: MIN_READ_BYTES }
}

impl Socket {
    /// The bytes of memory its buffer holds.
    pub fn buffer_bytes(&self) -> usize {
        self.buf.capacity()
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.pos == this.end {
            let want = this.size;
            if this.buf.len() < want {
                this.buf.resize(want, 0);
            }
            let mut room = ReadBuf::new(&mut this.buf[..want]);
            match Pin::new(&mut this.stream).poll_read(cx, &mut room) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            let n = room.filled().len();
            (this.pos, this.end) = (0, n);
            // (Halved only by a small read, not by a partial one: in a stream of big
            // writes a read takes what has arrived so far, often less than it asked.)
            if n == want {
                this.size = (want * 2).min(BUFFER_BYTES);
            } else if n < MIN_READ_BYTES {
                this.size = (want / 2).max(MIN_READ_BYTES);
            }
        }
        let n = out.remaining().min(this.end - this.pos);
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        if this.pos == this.end && this.size == MIN_READ_BYTES && this.buf.len() > MIN_READ_BYTES {
            this.buf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
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
    async fn a_socket_reads_big_bites_while_they_come_and_holds_little_once_idle() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut peer, mut sock) = (client.unwrap(), socket(accepted.unwrap().0));
        // A big write, read in small pieces (as rustls asks): it all comes, in order.
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn(async move {
            peer.write_all(&big).await.unwrap();
            peer
        });
        let mut got = Vec::new();
        let mut most = 0;
        let mut piece = [0u8; 4096];
        while got.len() < 3_000_000 {
            let n = sock.read(&mut piece).await.unwrap();
            assert!(n > 0, "the stream ended early");
            got.extend_from_slice(&piece[..n]);
            most = most.max(sock.buffer_bytes());
        }
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "bytes changed on the way");
        assert!(most > MIN_READ_BYTES, "a stream of big writes grows the buffer: {most}");
        assert!(most <= BUFFER_BYTES, "never past BUFFER_BYTES: {most}");
        // Then small messages only, one at a time: the buffer shrinks back and goes.
        let mut peer = writer.await.unwrap();
        for i in 0..12u8 {
            peer.write_all(&[i; 40]).await.unwrap();
            let mut small = [0u8; 40];
            sock.read_exact(&mut small).await.unwrap();
            assert_eq!(small, [i; 40]);
        }
        assert!(sock.buffer_bytes() <= MIN_READ_BYTES, "an idle socket holds {} bytes", sock.buffer_bytes());
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
