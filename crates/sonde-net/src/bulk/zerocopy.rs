//! `-Z`: a TCP sender's `MSG_ZEROCOPY` sends (Linux 4.14; the kernel's
//! `Documentation/networking/msg_zerocopy.rst`).
//!
//! With `MSG_ZEROCOPY` the kernel sends from the sender's own pages and holds them until the
//! data is acknowledged; it then puts a completion on the socket's error queue naming a range
//! of send calls (numbered from 0 per socket), with `SO_EE_CODE_ZEROCOPY_COPIED` when it had
//! to copy after all (loopback and veth always do: the receiver's socket cannot take the
//! sender's pages). A buffer is written again only once every send from it has completed, so
//! the sender keeps a ring of message buffers ([`BUFFER_BYTES`] in all) and at most
//! [`WINDOW`] send calls in flight, and reads completions when it needs a buffer back.

use std::io;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sonde_wire::ZerocopyStats;

use crate::{sys, Counters};

/// Most send calls in flight (sent, not yet completed): the width of [`Completions`]' bitmap.
const WINDOW: u64 = 1024;
/// The ring of message buffers: about this many bytes (2 to 256 messages). The kernel holds a
/// buffer until the data in it is acknowledged, so the ring bounds the data in flight: 8 MiB
/// covers 10 Gbit/s at 6 ms of round trip.
const BUFFER_BYTES: usize = 8 << 20;
const MIN_SLOTS: usize = 2;
const MAX_SLOTS: usize = 256;

/// Which send calls have completed: the calls from `base` on are tracked in a bitmap of
/// [`WINDOW`] bits (call `id` at bit `id % WINDOW`); every call below `base` has completed.
#[derive(Debug)]
struct Completions {
    /// The next send call's number (the kernel's counter, widened to 64 bits).
    next: u64,
    /// Every call below this has completed.
    base: u64,
    done: [u64; (WINDOW / 64) as usize],
    stats: ZerocopyStats,
}

impl Completions {
    fn new() -> Self {
        Self {
            next: 0,
            base: 0,
            done: [0; (WINDOW / 64) as usize],
            stats: ZerocopyStats::default(),
        }
    }

    /// Numbers a send call that moved data.
    fn issue(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        self.stats.sends += 1;
        id
    }

    /// Whether another call may be issued without exceeding [`WINDOW`] in flight.
    fn room(&self) -> bool {
        self.next - self.base < WINDOW
    }

    /// Whether call `id` (issued) has completed.
    fn is_done(&self, id: u64) -> bool {
        id < self.base || self.bit(id)
    }

    /// Whether every call issued has completed.
    fn all_done(&self) -> bool {
        self.base == self.next
    }

    fn bit(&self, id: u64) -> bool {
        let i = id % WINDOW;
        self.done[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, id: u64, on: bool) {
        let i = id % WINDOW;
        let word = &mut self.done[(i / 64) as usize];
        if on {
            *word |= 1 << (i % 64);
        } else {
            *word &= !(1 << (i % 64));
        }
    }

    /// Marks the calls `first..=last` (the kernel's 32-bit numbers) completed, counting each
    /// one once; numbers outside what is in flight are ignored.
    fn complete(&mut self, first: u32, last: u32, copied: bool) {
        // The kernel numbers calls mod 2^32; what is in flight lies in base..next.
        let span = u64::from(last.wrapping_sub(first)) + 1;
        let base32 = self.base as u32;
        let in_flight = self.next - self.base;
        let ahead = u64::from(first.wrapping_sub(base32));
        let (from, to) = if ahead < in_flight {
            (ahead, ahead.saturating_add(span).min(in_flight))
        } else {
            // The range may start below base (calls already counted) and reach into it.
            let behind = u64::from(base32.wrapping_sub(first));
            if behind >= span {
                return;
            }
            (0, (span - behind).min(in_flight))
        };
        for off in from..to {
            let id = self.base + off;
            if !self.bit(id) {
                self.set(id, true);
                self.stats.completed += 1;
                if copied {
                    self.stats.copied += 1;
                }
            }
        }
        while self.base < self.next && self.bit(self.base) {
            self.set(self.base, false);
            self.base += 1;
        }
    }
}

/// A TCP sender's zero-copy state: the ring of message buffers, which send call last used each,
/// and the completions read so far.
pub(super) struct ZerocopySender<'a> {
    stream: &'a TcpStream,
    counters: &'a Counters,
    msg_len: usize,
    /// `slots` buffers of `msg_len` bytes, end to end.
    ring: Vec<u8>,
    /// The last send call made from each buffer, if any.
    last_use: Vec<Option<u64>>,
    /// The buffer the current message is sent from.
    slot: usize,
    /// Whether the current message has its buffer (it is free, and this message writes it).
    claimed: bool,
    completions: Completions,
}

impl<'a> ZerocopySender<'a> {
    /// Sets `SO_ZEROCOPY` on `stream` (without it the kernel ignores `MSG_ZEROCOPY` and never
    /// completes) and allocates the ring for `msg_len`-byte messages.
    pub(super) fn new(
        stream: &'a TcpStream,
        msg_len: usize,
        counters: &'a Counters,
    ) -> io::Result<Self> {
        sys::set_zerocopy(&socket2::SockRef::from(stream))?;
        let slots = (BUFFER_BYTES / msg_len.max(1)).clamp(MIN_SLOTS, MAX_SLOTS);
        Ok(Self {
            stream,
            counters,
            msg_len,
            ring: vec![0u8; slots * msg_len],
            last_use: vec![None; slots],
            slot: 0,
            claimed: false,
            completions: Completions::new(),
        })
    }

    /// Sends bytes `offset..end` of the current message with `MSG_ZEROCOPY`. When a message
    /// starts (`offset` 0) it first takes the next buffer of the ring, reading completions for
    /// up to `wait` until the kernel has let go of it; if it has not by then, fails with
    /// `WouldBlock` (the caller looks at its deadline and calls again). A message's last bytes
    /// hand its buffer back to the ring.
    pub(super) fn write(&mut self, offset: usize, end: usize, wait: Duration) -> io::Result<usize> {
        if !self.claimed {
            self.claim(wait)?;
        } else if !self.completions.room() {
            self.reap_until(wait, Completions::room)?;
        }
        let start = self.slot * self.msg_len;
        let n = match sys::send_zerocopy(self.stream, &self.ring[start + offset..start + end]) {
            Ok(n) => n,
            // The socket's option memory (net.core.optmem_max) holds the notifications still
            // to come: read some, and let the caller try again.
            Err(e) if sys::no_buffer_space(&e) => {
                let before = self.completions.base;
                let _ = self.reap_until(wait, |c| c.base > before || c.all_done());
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Err(e) => return Err(e),
        };
        if n > 0 {
            self.last_use[self.slot] = Some(self.completions.issue());
            if offset + n == self.msg_len {
                self.claimed = false;
                self.slot = (self.slot + 1) % self.last_use.len();
            }
        }
        Ok(n)
    }

    /// Takes the current buffer once the kernel is done with it and a call may be issued.
    fn claim(&mut self, wait: Duration) -> io::Result<()> {
        let last = self.last_use[self.slot];
        self.reap_until(wait, |c| c.room() && last.is_none_or(|id| c.is_done(id)))?;
        self.claimed = true;
        Ok(())
    }

    /// Reads completions until `ready` holds, waiting on the error queue for at most `wait`;
    /// `WouldBlock` if it still does not.
    fn reap_until(
        &mut self,
        wait: Duration,
        ready: impl Fn(&Completions) -> bool,
    ) -> io::Result<()> {
        let deadline = Instant::now() + wait;
        loop {
            let got = self.reap()?;
            if ready(&self.completions) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.counters.add_syscalls(1);
            let readable = sys::wait_error_queue(self.stream, left)?;
            if readable && got == 0 && self.completions.all_done() {
                // POLLERR without a completion: the connection failed. Its error is the send's.
                if let Some(e) = self.stream.take_error()? {
                    return Err(e);
                }
            }
        }
    }

    /// Reads every completion the error queue holds, without waiting; how many it read.
    fn reap(&mut self) -> io::Result<usize> {
        let mut got = 0;
        loop {
            self.counters.add_syscalls(1);
            match sys::read_zerocopy_done(self.stream)? {
                Some(done) => {
                    got += 1;
                    self.completions
                        .complete(done.first, done.last, done.copied);
                }
                None => return Ok(got),
            }
        }
    }

    /// Reads the completions still to come, for at most `wait`, and returns the counts. The
    /// ring may be freed whether or not all came: the kernel keeps its own reference to the
    /// pages it still sends from.
    pub(super) fn finish(mut self, wait: Duration) -> ZerocopyStats {
        let _ = self.reap_until(wait, Completions::all_done);
        self.completions.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(n: u64) -> Completions {
        let mut c = Completions::new();
        for _ in 0..n {
            c.issue();
        }
        c
    }

    #[test]
    fn ranges_complete_in_order_and_out_of_order_each_call_once() {
        let mut c = issued(10);
        c.complete(0, 2, false);
        assert_eq!(c.base, 3);
        // Out of order: 5..=6 first; base waits for 3 and 4.
        c.complete(5, 6, true);
        assert_eq!(c.base, 3);
        assert!(c.is_done(5) && !c.is_done(4));
        c.complete(3, 4, false);
        assert_eq!(c.base, 7);
        // A range reaching back over calls already counted counts only the new ones.
        c.complete(6, 9, true);
        assert!(c.all_done());
        assert_eq!(
            c.stats,
            ZerocopyStats {
                sends: 10,
                completed: 10,
                copied: 5,
            }
        );
        // Calls never issued are not counted.
        c.complete(10, 20, false);
        assert_eq!(c.stats.completed, 10);
    }

    #[test]
    fn the_window_bounds_calls_in_flight_and_numbers_wrap_at_32_bits() {
        let mut c = Completions::new();
        // Start just below the kernel's wrap.
        c.next = u64::from(u32::MAX) - 1;
        c.base = c.next;
        for _ in 0..WINDOW {
            assert!(c.room());
            c.issue();
        }
        assert!(!c.room());
        // The kernel's numbers wrap: u32::MAX - 1, u32::MAX, 0, 1, ...
        c.complete(u32::MAX - 1, 1, false);
        assert_eq!(c.stats.completed, 4);
        assert!(c.room());
        c.complete(2, (WINDOW - 3) as u32, true);
        assert!(c.all_done());
        assert_eq!(c.stats.copied, WINDOW - 4);
    }
}
