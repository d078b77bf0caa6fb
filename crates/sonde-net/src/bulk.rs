//! Throughput and packet-rate loops.

use std::io;
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64};

use sonde_engine::jitter::Jitter;
use sonde_engine::seq::SeqTracker;

use crate::{Clock, Counters};

/// What a sender sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOutcome {
    /// Payload bytes handed to the kernel.
    pub bytes: u64,
    /// Datagrams (UDP) or write calls (TCP).
    pub packets: u64,
    /// First to last send, ns.
    pub active_ns: u64,
    /// TCP only: retransmitted segments, from `TCP_INFO`.
    pub retransmits: Option<u64>,
    /// How the data was sent, for the report (`"write"`, `"sendmsg+UDP_SEGMENT"`, `"sendmmsg"`...).
    pub method: &'static str,
}

/// What a TCP receiver received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpRecvOutcome {
    /// Payload bytes read.
    pub bytes: u64,
    /// Read calls that returned data.
    pub reads: u64,
    /// First byte, ns on the test clock (0 when nothing arrived).
    pub first_ns: u64,
    /// Last byte, ns on the test clock.
    pub last_ns: u64,
}

/// What a UDP receiver received.
#[derive(Debug, Clone)]
pub struct UdpRecvOutcome {
    /// Payload bytes of data datagrams (duplicates included).
    pub bytes: u64,
    /// Data datagrams (duplicates included).
    pub packets: u64,
    /// First data datagram, ns on the test clock.
    pub first_ns: u64,
    /// Last data datagram, ns on the test clock.
    pub last_ns: u64,
    /// Datagrams too short to carry a header, ignored.
    pub malformed: u64,
    /// Sequence accounting.
    pub seq: SeqTracker,
    /// RFC 3550 jitter.
    pub jitter: Jitter,
}

/// Writes `msg_size`-byte messages from a static buffer until `until_ns` on `clock` or `stop`,
/// then shuts down the write side so the receiver sees the end. Reads `TCP_INFO` retransmits at
/// the end.
pub fn tcp_send(
    stream: &TcpStream,
    msg_size: u32,
    clock: &Clock,
    until_ns: u64,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<SendOutcome> {
    todo!("{stream:?} {msg_size} {clock:?} {until_ns} {stop:?} {counters:?}")
}

/// Reads until the peer closes (EOF) or `stop`, counting bytes. Uses a short read timeout so
/// `stop` is noticed within 100 ms.
pub fn tcp_recv(
    stream: &TcpStream,
    clock: &Clock,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<TcpRecvOutcome> {
    todo!("{stream:?} {clock:?} {stop:?} {counters:?}")
}

/// Sends `msg_size`-byte datagrams (a [`sonde_wire::DataHeader`], then filler) on a connected
/// socket until `until_ns` or `stop`. With `bits_per_second > 0` the sends follow a
/// [`sonde_engine::pace::Schedule`] (no bursts beyond what is due); with 0 the loop sends as fast
/// as the kernel takes them, in UDP GSO batches where the kernel supports them (`sendmmsg`
/// otherwise). Every datagram carries its own sequence number.
pub fn udp_send(
    sock: &UdpSocket,
    msg_size: u32,
    bits_per_second: u64,
    clock: &Clock,
    until_ns: u64,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<SendOutcome> {
    todo!("{sock:?} {msg_size} {bits_per_second} {clock:?} {until_ns} {stop:?} {counters:?}")
}

/// Receives datagrams on a connected socket with `recvmmsg` until `stop`, or until the number of
/// unique datagrams reaches `expect` (`u64::MAX` while the sender's count is unknown). Answers
/// any [`sonde_wire::UdpJoin`] request that still arrives with its acknowledgement, and ignores
/// join acknowledgements; neither is counted as data.
pub fn udp_recv(
    sock: &UdpSocket,
    msg_size: u32,
    clock: &Clock,
    stop: &AtomicBool,
    expect: &AtomicU64,
    counters: &Counters,
) -> io::Result<UdpRecvOutcome> {
    todo!("{sock:?} {msg_size} {clock:?} {stop:?} {expect:?} {counters:?}")
}
