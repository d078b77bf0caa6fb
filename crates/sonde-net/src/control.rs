//! Control frames over a blocking TCP stream. Every read has a deadline; a frame's length is
//! checked against [`sonde_wire::MAX_FRAME_LEN`] before its body is read.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sonde_wire::{ControlMsg, Preamble, PREAMBLE_LEN};

use crate::deadline::{read_full, Fill};

/// Why a control read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The peer closed the connection.
    #[error("the peer closed the control connection")]
    Closed,
    /// Nothing (or not enough) arrived in time: within the wait the last read had, or (zero)
    /// by a deadline that had passed before it could wait, or a wait the reader did not time.
    #[error("{}", timeout_text(*.0))]
    Timeout(Duration),
    /// The bytes were not a sonde control frame.
    #[error(transparent)]
    Wire(#[from] sonde_wire::Error),
    /// The socket failed.
    #[error("control connection: {0}")]
    Io(io::Error),
}

impl From<io::Error> for ControlError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Reads exactly `buf.len()` bytes before `deadline`.
pub fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), ControlError> {
    let stream: &TcpStream = stream;
    let mut policy = ControlRead {
        stream,
        deadline,
        left: Duration::ZERO,
    };
    let mut s = stream;
    read_full(buf, |b| s.read(b), &mut policy)
}

/// A control read's policy: each read may wait only for the time left before the deadline
/// (set as the socket's read timeout); a timeout is [`ControlError::Timeout`].
struct ControlRead<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
    /// The time left when the last read started.
    left: Duration,
}

impl Fill for ControlRead<'_> {
    type Error = ControlError;

    fn before_read(&mut self) -> Result<(), ControlError> {
        let now = Instant::now();
        let Some(left) = self
            .deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return Err(ControlError::Timeout(Duration::ZERO));
        };
        self.stream.set_read_timeout(Some(left))?;
        self.left = left;
        Ok(())
    }

    fn failed(&mut self, e: io::Error) -> Result<(), ControlError> {
        if e.kind() == io::ErrorKind::Interrupted {
            Ok(())
        } else if crate::fault::timed_out(&e) {
            Err(ControlError::Timeout(self.left))
        } else {
            Err(e.into())
        }
    }

    fn closed(&mut self) -> ControlError {
        ControlError::Closed
    }
}

/// A timeout's text: never "within 0ns", which names no cause.
fn timeout_text(waited: Duration) -> String {
    if waited.is_zero() {
        "no message from the peer in the time allowed".into()
    } else {
        format!("no message from the peer within {waited:?}")
    }
}

/// Reads a connection's [`Preamble`] before `deadline`.
pub fn read_preamble(stream: &mut TcpStream, deadline: Instant) -> Result<Preamble, ControlError> {
    let mut b = [0u8; PREAMBLE_LEN];
    read_exact_by(stream, &mut b, deadline)?;
    Ok(Preamble::decode(&b)?)
}

/// Reads one control frame before `deadline`. `body` is a reusable buffer.
pub fn read_frame(
    stream: &mut TcpStream,
    body: &mut Vec<u8>,
    deadline: Instant,
) -> Result<ControlMsg, ControlError> {
    let mut header = [0u8; 4];
    read_exact_by(stream, &mut header, deadline)?;
    let len = sonde_wire::frame_len(header)?;
    body.clear();
    body.resize(len, 0);
    read_exact_by(stream, body, deadline)?;
    Ok(sonde_wire::decode_body(body)?)
}

/// How often [`forward_frames`] looks at its stop flag while no frame is arriving.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Reads frames until the first error (the peer closing included), `deadline`, or `stop`,
/// handing each result to `forward`; stops early when `forward` returns false. For a reader
/// thread that feeds a session's event loop.
///
/// The thread that owns the session ends the reader by raising `stop`: it is seen within
/// 50 ms between frames (a frame being read is read whole). Shutting the socket's read
/// side does not do this portably: on Windows `shutdown(SD_RECEIVE)` does not wake a blocked
/// `recv`, and resets the connection if the peer sends anything more.
pub fn forward_frames(
    mut stream: TcpStream,
    deadline: Instant,
    stop: &AtomicBool,
    mut forward: impl FnMut(Result<ControlMsg, ControlError>) -> bool,
) {
    let mut body = Vec::new();
    loop {
        let msg = match wait_readable(&stream, deadline, stop) {
            Ok(true) => read_frame(&mut stream, &mut body, deadline),
            Ok(false) => return,
            Err(e) => Err(e),
        };
        let end = msg.is_err();
        if !forward(msg) || end {
            break;
        }
    }
}

/// Waits until `stream` has a byte to read or has been closed (`Ok(true)`), `stop` is raised
/// (`Ok(false)`) or `deadline` passes. Consumes nothing: it peeks.
fn wait_readable(
    stream: &TcpStream,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<bool, ControlError> {
    let mut b = [0u8; 1];
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let Some(left) = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Err(ControlError::Timeout(Duration::ZERO));
        };
        stream.set_read_timeout(Some(left.min(STOP_POLL)))?;
        match stream.peek(&mut b) {
            Ok(_) => return Ok(true),
            Err(e) if read_again(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes one control frame (whole, or an error). A write timeout bounds a peer that does not
/// read.
pub fn write_frame(stream: &mut TcpStream, msg: &ControlMsg) -> Result<(), ControlError> {
    let mut buf = Vec::with_capacity(256);
    sonde_wire::encode_frame(msg, &mut buf)?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(&buf)?;
    Ok(())
}

/// Whether a failed read on a socket with a read timeout only means "nothing yet": the timeout
/// passed (`WouldBlock` on Unix, `TimedOut` on Windows) or a signal interrupted it. The loops
/// that poll a socket between checks of a stop flag or a deadline read again on these.
/// ([`crate::fault::again`], under the name the control loops have used.)
pub fn read_again(e: &io::Error) -> bool {
    crate::fault::again(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// The reader forwards what arrives, then ends when its owner raises `stop`, with the peer
    /// still connected and silent and the deadline an hour away: the session does not wait for
    /// its client to close (on Windows, shutting the read side does not wake the reader).
    #[test]
    fn a_reader_forwards_frames_and_ends_when_stopped() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        write_frame(&mut client, &ControlMsg::Go).unwrap();
        let stop = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut got = Vec::new();
                forward_frames(
                    server,
                    Instant::now() + Duration::from_secs(3600),
                    &stop,
                    |m| {
                        got.push(m.map_err(|e| e.to_string()));
                        true
                    },
                );
                tx.send(()).unwrap();
                got
            });
            // Nothing more arrives; the reader must still be waiting.
            assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
            stop.store(true, Ordering::Relaxed);
            rx.recv_timeout(Duration::from_secs(60))
                .expect("the reader did not end after stop was raised");
            let got = reader.join().unwrap();
            assert!(
                matches!(got.as_slice(), [Ok(ControlMsg::Go)]),
                "forwarded {got:?}"
            );
        });
        drop(client);
    }
}
