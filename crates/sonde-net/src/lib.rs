//! sonde's sockets and the loops that move test data through them. The only crate with
//! `unsafe` (in `sys/`, for `sendmmsg`/`recvmmsg`, UDP GSO and `TCP_INFO`).
//!
//! * [`socket`]: how every socket is made: the agent's shared TCP+UDP port, per-flow connected
//!   UDP sockets on that same port, client sockets.
//! * [`bulk`]: throughput and packet-rate loops: TCP send/receive, paced UDP send (GSO batches
//!   when unlimited), UDP receive with `recvmmsg` and sequence accounting.
//! * [`control`]: control frames over a blocking TCP stream, with a deadline on every read.
//! * [`crr`]: connection rate: the client's connect-request-response-close loop and the agent's
//!   side of one exchange.
//! * [`latency`]: ping-pong (closed loop), open loop at a fixed rate, and the agent's echoes.
//! * [`mtu`]: `sonde mtu`'s probe loop: DF datagrams of the sizes the search asks for, and
//!   what became of each (echoed, a router's "too big" with the MTU it named, silence).
//! * [`cpu`]: CPU time and context switches of the process or a thread (`getrusage`).
//! * [`tcpinfo`]: a TCP connection's `TCP_INFO` (smoothed RTT, cwnd, retransmits, pacing).
//! * [`hostinfo`]: this host's configuration (CPU, memory, OS, NICs, TCP and buffer settings).
//! * [`samplelog`]: the opt-in full sample log, written as CSV by a thread of its own.
//!
//! Loops run on the calling thread until a deadline on the test [`Clock`], a stop flag, or the
//! peer closing. They update [`Counters`] (atomics read by the interval reporter) once per
//! system call; they never allocate, lock, format or log inside the loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub mod bulk;
pub mod control;
pub mod cpu;
pub mod crr;
mod deadline;
pub mod fault;
pub mod gso;
pub mod hostinfo;
pub mod latency;
pub mod mtu;
mod pace;
pub mod samplelog;
pub mod socket;
mod sys;
pub mod tcpinfo;
pub mod tune;

/// A test's monotonic time origin, shared by all its threads.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn start() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
    /// A clock with the given origin.
    pub fn from_origin(origin: Instant) -> Self {
        Self { origin }
    }
    /// The origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }
    /// Nanoseconds since the origin.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Live per-stream counters, written by one loop and read by the interval reporter.
#[derive(Debug, Default)]
pub struct Counters {
    /// Payload bytes so far.
    pub bytes: AtomicU64,
    /// Datagrams (or reads/writes) so far.
    pub packets: AtomicU64,
    /// System calls the loop made to move data (the send and receive family, failed and timed
    /// out ones included; not sleeps or yields). Counted by the [`bulk`] loops; 0 from loops
    /// that do not count them.
    pub syscalls: AtomicU64,
}

impl Counters {
    /// Adds one system call's worth.
    #[inline]
    pub fn add(&self, bytes: u64, packets: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.packets.fetch_add(packets, Ordering::Relaxed);
    }
    /// Counts one data-path system call.
    #[inline]
    pub fn syscall(&self) {
        self.syscalls.fetch_add(1, Ordering::Relaxed);
    }
    /// Counts `n` data-path system calls made elsewhere.
    pub fn add_syscalls(&self, n: u64) {
        self.syscalls.fetch_add(n, Ordering::Relaxed);
    }
    /// System calls counted so far.
    pub fn syscalls(&self) -> u64 {
        self.syscalls.load(Ordering::Relaxed)
    }
    /// `(bytes, packets)` now.
    pub fn load(&self) -> (u64, u64) {
        (
            self.bytes.load(Ordering::Relaxed),
            self.packets.load(Ordering::Relaxed),
        )
    }
}
