//! Control frames over a blocking TCP stream. Every read has a deadline; a frame's length is
//! checked against [`sonde_wire::MAX_FRAME_LEN`] before its body is read.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sonde_wire::{ControlMsg, Preamble, PREAMBLE_LEN};

/// Why a control read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The peer closed the connection.
    #[error("the peer closed the control connection")]
    Closed,
    /// Nothing (or not enough) arrived in time.
    #[error("no message from the peer within {0:?}")]
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
    let mut got = 0;
    while got < buf.len() {
        let now = Instant::now();
        let Some(left) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return Err(ControlError::Timeout(Duration::ZERO));
        };
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(ControlError::Closed),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ControlError::Timeout(left));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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

/// Reads frames until the first error (the peer closing included) or `deadline`, handing each
/// result to `forward`; stops early when `forward` returns false. For a reader thread that feeds
/// a session's event loop.
pub fn forward_frames(
    mut stream: TcpStream,
    deadline: Instant,
    mut forward: impl FnMut(Result<ControlMsg, ControlError>) -> bool,
) {
    let mut body = Vec::new();
    loop {
        let msg = read_frame(&mut stream, &mut body, deadline);
        let end = msg.is_err();
        if !forward(msg) || end {
            break;
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
