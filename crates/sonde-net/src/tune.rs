//! Busy polling and CPU pinning (`sonde latency --busy-poll --cpu N`, `sonde server
//! --cpu-list`): the lowest round trip a host allows, at the price of a core at each end.
//!
//! * [`busy_poll_udp`] / [`busy_poll_tcp`] make a socket non-blocking, so that the latency loops
//!   and echoes ([`crate::latency`]) spin on `recv` instead of sleeping in it: no wake-up, no
//!   context switch per message. Every spin looks at the loop's stop flag and deadline at each
//!   `EAGAIN`, so it is bounded exactly as the blocking wait is. They also ask for
//!   `SO_BUSY_POLL` ([`BUSY_POLL_USECS`]) where the kernel offers it and permits it (raising it
//!   needs `CAP_NET_ADMIN`): the kernel then polls the device queue itself in the receive call
//!   (NICs with NAPI; loopback and veth have nothing to poll, so it changes nothing there).
//! * [`pin_current_thread`] restricts the calling thread to one CPU (`sched_setaffinity`) and
//!   restores its previous set when the guard drops, so a library caller's thread is left as
//!   it was.
//!
//! Linux only; elsewhere pinning fails with [`io::ErrorKind::Unsupported`] and `SO_BUSY_POLL`
//! is reported as not set (the spin itself works everywhere).
//!
//! ```
//! use sonde_net::tune;
//!
//! let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
//! let busy = tune::busy_poll_udp(&sock).unwrap();
//! // Non-blocking now: a receive with nothing queued returns at once.
//! assert_eq!(
//!     sock.recv(&mut [0u8; 8]).unwrap_err().kind(),
//!     std::io::ErrorKind::WouldBlock
//! );
//! // `SO_BUSY_POLL` is set only where the kernel permits it.
//! assert!(busy.so_busy_poll_us.is_none() || busy.so_busy_poll_us == Some(tune::BUSY_POLL_USECS));
//! ```

use std::io;
use std::net::{TcpStream, UdpSocket};

use crate::sys;

/// `SO_BUSY_POLL` asked for, µs: what the kernel documentation suggests for latency-sensitive
/// sockets (`net.core.busy_read`, 50).
pub const BUSY_POLL_USECS: u32 = 50;

/// What [`busy_poll_udp`] / [`busy_poll_tcp`] did to a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyPoll {
    /// `SO_BUSY_POLL` as set, µs; `None` when the kernel does not offer it or refused it
    /// (`EPERM` without `CAP_NET_ADMIN`).
    pub so_busy_poll_us: Option<u32>,
}

/// Makes a UDP socket non-blocking (the latency loops then spin) and asks for `SO_BUSY_POLL`.
///
/// # Errors
/// When the socket cannot be made non-blocking. A refused `SO_BUSY_POLL` is not an error: the
/// result says it is not set.
pub fn busy_poll_udp(sock: &UdpSocket) -> io::Result<BusyPoll> {
    sock.set_nonblocking(true)?;
    Ok(BusyPoll {
        so_busy_poll_us: sys::set_busy_poll(sys::sock_ref(sock), BUSY_POLL_USECS)
            .ok()
            .map(|()| BUSY_POLL_USECS),
    })
}

/// [`busy_poll_udp`] for a TCP stream.
///
/// # Errors
/// As [`busy_poll_udp`].
pub fn busy_poll_tcp(stream: &TcpStream) -> io::Result<BusyPoll> {
    stream.set_nonblocking(true)?;
    Ok(BusyPoll {
        so_busy_poll_us: sys::set_busy_poll(sys::sock_ref(stream), BUSY_POLL_USECS)
            .ok()
            .map(|()| BUSY_POLL_USECS),
    })
}

/// The CPUs this process's calling thread may run on, ascending.
///
/// # Errors
/// [`io::ErrorKind::Unsupported`] outside Linux; the kernel's error otherwise.
pub fn allowed_cpus() -> io::Result<Vec<u32>> {
    sys::allowed_cpus()
}

/// The calling thread, pinned to one CPU; its previous CPU set comes back when this drops.
#[derive(Debug)]
#[must_use = "the thread is unpinned when the guard drops"]
pub struct Pinned {
    cpu: u32,
    previous: Vec<u32>,
}

impl Pinned {
    /// The CPU the thread runs on.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Best effort: the set was the thread's own a moment ago.
        let _ = sys::set_thread_cpus(&self.previous);
    }
}

/// Pins the calling thread to `cpu`.
///
/// # Errors
/// `InvalidInput` when `cpu` is not among the CPUs the thread may run on (offline, outside the
/// process's cpuset, or past the last CPU), naming the ones it may; `Unsupported` outside
/// Linux.
pub fn pin_current_thread(cpu: u32) -> io::Result<Pinned> {
    let previous = sys::allowed_cpus()?;
    if !previous.contains(&cpu) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "CPU {cpu} is not one this process may run on (allowed: {})",
                cpu_list(&previous)
            ),
        ));
    }
    sys::set_thread_cpus(&[cpu])?;
    Ok(Pinned { cpu, previous })
}

/// A CPU set as `taskset -c` and `/sys/devices/system/cpu/online` write it: `0-3,6`.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// Parses a CPU list as `taskset -c` takes it: `0-3,6`; at most 4096 CPUs.
///
/// # Errors
/// A message naming the part that is not a CPU number or range.
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, String> {
    const MAX_CPU: u32 = 4095;
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let bad = || format!("`{part}` is not a CPU number or range (e.g. 0-3,6)");
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let a: u32 = a.parse().map_err(|_| bad())?;
        let b: u32 = b.parse().map_err(|_| bad())?;
        if a > b || b > MAX_CPU {
            return Err(bad());
        }
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_as_taskset_writes_them() {
        assert_eq!(parse_cpu_list("0-3,6").unwrap(), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list(" 5 , 1-2,2").unwrap(), vec![1, 2, 5]);
        assert_eq!(cpu_list(&[6, 0, 1, 2, 3]), "0-3,6");
        assert_eq!(cpu_list(&[1]), "1");
        for bad in ["", "a", "3-1", "1-", "-1", "4096", "0-9999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pinning_moves_the_thread_and_the_guard_gives_its_set_back() {
        let before = allowed_cpus().unwrap();
        let cpu = *before.last().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let pinned = pin_current_thread(cpu).unwrap();
                assert_eq!(pinned.cpu(), cpu);
                assert_eq!(allowed_cpus().unwrap(), vec![cpu]);
                drop(pinned);
                assert_eq!(allowed_cpus().unwrap(), before);
            });
        });
        let past = before.iter().max().unwrap() + 1;
        let e = pin_current_thread(past).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            allowed_cpus().unwrap(),
            before,
            "a refused pin changes nothing"
        );
    }
}
