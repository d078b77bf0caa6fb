//! The agent's echoes: every TCP byte or UDP datagram back, stamped when a one-way request
//! asks.

use std::io::{self, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};

use sonde_wire::stamps;
use sonde_wire::{UdpJoin, UDP_JOIN_LEN};

use super::udp::send_transient_ok;
use super::{host_clock_ns, Timeouts, ECHO_POLL, TCP_ECHO_BUF, TCP_MAX_MSG, UDP_RECV_BUF};
use crate::{fault, Counters};

/// Agent side: echoes every byte back until EOF or `stop`.
///
/// A connection whose first bytes are a one-way request ([`stamps::tcp_request_size`]) is
/// echoed message by message instead, each reply stamped with the time the read that completed
/// its request returned (`t2`) and the time just before it is written (`t3`), on
/// [`host_clock_ns`].
///
/// # Errors
/// A failed read or write (a reset connection included); the loop ends there.
pub fn tcp_echo(stream: &TcpStream, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    let _restore = Timeouts::save_tcp(stream)?;
    stream.set_read_timeout(Some(ECHO_POLL))?;
    stream.set_write_timeout(Some(ECHO_POLL))?;
    // Room for a whole message of the largest size plus a read's worth behind it.
    let mut buf = vec![0u8; 2 * TCP_ECHO_BUF];
    let mut s = stream;
    // Bytes read before the echo knew which kind of connection this is.
    let mut have = 0;
    while !stop.load(Ordering::Relaxed) {
        let read = s.read(&mut buf[have..TCP_ECHO_BUF]);
        counters.syscall();
        let n = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if fault::again(&e) => continue,
            Err(e) => return Err(e),
        };
        let t2 = host_clock_ns();
        have += n;
        // A plain sonde message is zeros and a sockperf one never reaches this port: anything
        // but `S` first is echoed as bytes. A one-way request shows itself in 8 bytes.
        if buf[0] == stamps::TCP_STAMP_REQUEST[0] && have < 8 {
            continue;
        }
        if let Some(size) = stamps::tcp_request_size(&buf[..have], TCP_MAX_MSG) {
            return tcp_echo_stamped(stream, stop, counters, &mut buf, have, t2, size as usize);
        }
        if !write_echo(stream, stop, &buf[..have], counters)? {
            return Ok(());
        }
        counters.add(have as u64, 1);
        break;
    }
    // Plain from here on: every byte back as it comes.
    while !stop.load(Ordering::Relaxed) {
        let read = s.read(&mut buf[..TCP_ECHO_BUF]);
        counters.syscall();
        let n = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if fault::again(&e) => continue,
            Err(e) => return Err(e),
        };
        if !write_echo(stream, stop, &buf[..n], counters)? {
            return Ok(());
        }
        counters.add(n as u64, 1);
    }
    Ok(())
}

/// Writes all of `data`; `Ok(false)` when `stop` was raised while the peer would not take it.
/// Written by hand rather than `write_all` so that a peer that stopped reading cannot hold the
/// echo past `stop`.
fn write_echo(
    stream: &TcpStream,
    stop: &AtomicBool,
    data: &[u8],
    counters: &Counters,
) -> io::Result<bool> {
    let mut s = stream;
    let mut off = 0;
    while off < data.len() {
        let written = s.write(&data[off..]);
        counters.syscall();
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => off += k,
            Err(e) if fault::again(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The one-way TCP echo: frames the stream into `size`-byte messages, stamps each and writes it
/// back. `buf` holds `have` bytes already read (the last read returned at `t2`).
fn tcp_echo_stamped(
    stream: &TcpStream,
    stop: &AtomicBool,
    counters: &Counters,
    buf: &mut [u8],
    mut have: usize,
    mut t2: u64,
    size: usize,
) -> io::Result<()> {
    let mut s = stream;
    loop {
        // Every complete message in the buffer, stamped and written back in one write.
        let whole = have - have % size;
        if whole > 0 {
            let t3 = host_clock_ns();
            for m in buf[..whole].chunks_exact_mut(size) {
                stamps::write_agent_stamps(m, t2, t3);
            }
            if !write_echo(stream, stop, &buf[..whole], counters)? {
                return Ok(());
            }
            counters.add(whole as u64, (whole / size) as u64);
            buf.copy_within(whole..have, 0);
            have -= whole;
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Read at most up to the end of the message being assembled plus a read's worth; the
        // buffer holds two of the largest messages.
        let room = (size + TCP_ECHO_BUF).min(buf.len());
        let read = s.read(&mut buf[have..room]);
        counters.syscall();
        let n = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if fault::again(&e) => continue,
            Err(e) => return Err(e),
        };
        t2 = host_clock_ns();
        have += n;
    }
}

/// Agent side: echoes every datagram back on a connected flow socket until `stop`; answers join
/// requests with acknowledgements (not counted). A datagram that asks for one-way stamps
/// ([`stamps::udp_wants_stamps`]) goes back with the agent's receive and send times on
/// [`host_clock_ns`].
///
/// # Errors
/// A failed `recv` or `send`, except the transient ones: a timeout, a full send buffer, and
/// `ECONNREFUSED` (an ICMP error about an earlier echo), which are skipped.
pub fn udp_echo(sock: &UdpSocket, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    let _restore = Timeouts::save_udp(sock)?;
    sock.set_read_timeout(Some(ECHO_POLL))?;
    let mut buf = vec![0u8; UDP_RECV_BUF];
    while !stop.load(Ordering::Relaxed) {
        let received = sock.recv(&mut buf);
        counters.syscall();
        let n = match received {
            Ok(n) => n,
            // The client's port is closed (an ICMP error for an earlier echo): it may be gone
            // or about to rejoin; the agent's session decides, through `stop`.
            Err(e) if fault::again(&e) || fault::port_unreachable(&e) => continue,
            Err(e) => return Err(e),
        };
        if stamps::udp_wants_stamps(&buf[..n]) {
            let t2 = host_clock_ns();
            stamps::write_agent_stamps(&mut buf[..n], t2, t2);
            stamps::write_agent_send_stamp(&mut buf[..n], host_clock_ns());
        }
        let datagram = &buf[..n];
        if n == UDP_JOIN_LEN {
            if let Ok(join) = UdpJoin::decode(datagram) {
                // A repeated join: the client has not seen our first ack yet. A stray ack (never
                // sent to an agent) is dropped.
                if !join.ack {
                    send_transient_ok(sock, &UdpJoin { ack: true, ..join }.encode())?;
                    counters.syscall();
                }
                continue;
            }
        }
        send_transient_ok(sock, datagram)?;
        counters.syscall();
        counters.add(n as u64, 1);
    }
    Ok(())
}
