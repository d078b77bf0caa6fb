//! The agent's echoes: every TCP byte or UDP datagram back, stamped when a one-way request
//! asks. One loop over the [`Transport`]'s [`EchoState`]: TCP's (bytes, or whole stamped
//! messages) is in `tcp.rs`, UDP's (datagrams, joins answered) in `udp.rs`.

use std::io;
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};

use super::transport::{EchoState, Transport};
use crate::Counters;

/// Agent side: echoes every byte back until EOF or `stop`.
///
/// A connection whose first bytes are a one-way request
/// ([`stamps::tcp_request_size`](sonde_wire::stamps::tcp_request_size)) is echoed message by
/// message instead, each reply stamped with the time the read that completed its request
/// returned (`t2`) and the time just before it is written (`t3`), on
/// [`host_clock_ns`](super::host_clock_ns).
///
/// # Errors
/// A failed read or write (a reset connection included); the loop ends there.
pub fn tcp_echo(stream: &TcpStream, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    echo(stream, stop, counters)
}

/// Agent side: echoes every datagram back on a connected flow socket until `stop`; answers join
/// requests with acknowledgements (not counted). A datagram that asks for one-way stamps
/// ([`stamps::udp_wants_stamps`](sonde_wire::stamps::udp_wants_stamps)) goes back with the
/// agent's receive and send times on [`host_clock_ns`](super::host_clock_ns).
///
/// # Errors
/// A failed `recv` or `send`, except the transient ones: a timeout, a full send buffer, and
/// `ECONNREFUSED` (an ICMP error about an earlier echo), which are skipped.
pub fn udp_echo(sock: &UdpSocket, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    echo(sock, stop, counters)
}

/// The echo loop: one receive and what it brought sent back, until EOF or `stop`. Every call
/// is counted in `counters`.
pub(super) fn echo<T: Transport>(
    sock: &T,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<()> {
    let _restore = T::Echo::timeouts(sock)?;
    let mut st = T::Echo::new();
    while !stop.load(Ordering::Relaxed) {
        let received = st.recv(sock);
        counters.syscall();
        let n = match received {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(()),
            Err(e) if T::Echo::transient(&e) => continue,
            Err(e) => return Err(e),
        };
        if !st.back(sock, n, stop, counters)? {
            return Ok(());
        }
    }
    Ok(())
}
