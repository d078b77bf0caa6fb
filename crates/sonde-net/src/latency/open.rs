//! The open loop's parts that do not depend on the transport: the schedule, the paced sender
//! and what the sender shares with the reader. The reader's loop is written over the
//! transport, with the other loops, in `transport.rs`.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use sonde_engine::pace::Schedule;

use super::{duration_ns, ping_syscalls, ring_slot, LATE_SEND, SEND_RING};
use crate::cpu::ThreadsMeter;
use crate::pace::Pacing;
use crate::Clock;

/// Runs `send` on a thread an open loop starts: its CPU counted in the caller's meter (if any),
/// its system calls returned so that the loop's thread can add them to its own count.
pub(super) fn sender_thread<T>(cpu: Option<&ThreadsMeter>, send: impl FnOnce() -> T) -> (T, u64) {
    let _counted = cpu.map(ThreadsMeter::track);
    let before = ping_syscalls();
    let out = send();
    (out, ping_syscalls().wrapping_sub(before))
}

/// What an open-loop reader shares with its sender.
pub(super) struct OpenReader<'a> {
    pub(super) plan: &'a OpenLoop,
    pub(super) clock: &'a Clock,
    pub(super) stop: &'a AtomicBool,
    pub(super) progress: &'a Progress,
    /// `--timestamps`: the wall clock at each actual send.
    pub(super) send_times: Option<&'a SendTimes>,
}
/// The wall clock at each open-loop send (`--timestamps`), written by the sender and read by
/// the reader: a ring of slots tagged with their message, so that a slot the sender has
/// already reused for a later message reads as unknown.
pub(super) struct SendTimes {
    pub(super) slots: Vec<(AtomicU64, AtomicU64)>,
}

impl SendTimes {
    pub(super) fn new() -> Self {
        Self {
            slots: (0..SEND_RING)
                .map(|_| (AtomicU64::new(u64::MAX), AtomicU64::new(0)))
                .collect(),
        }
    }

    pub(super) fn store(&self, seq: u64, real_ns: u64) {
        let (tag, value) = &self.slots[ring_slot(seq)];
        tag.store(u64::MAX, Ordering::Release);
        value.store(real_ns, Ordering::Release);
        tag.store(seq, Ordering::Release);
    }

    pub(super) fn load(&self, seq: u64) -> Option<u64> {
        let (tag, value) = &self.slots[ring_slot(seq)];
        let before = tag.load(Ordering::Acquire);
        let v = value.load(Ordering::Acquire);
        (before == seq && tag.load(Ordering::Acquire) == seq).then_some(v)
    }
}
/// An open-loop schedule placed on the test clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenLoop {
    pub(super) sched: Schedule,
    /// Test-clock time of the schedule's origin.
    pub(super) start_ns: u64,
    pub(super) until_ns: u64,
}

impl OpenLoop {
    pub(super) fn new(rate: f64, start_ns: u64, until_ns: u64) -> Self {
        Self {
            sched: Schedule::per_second(rate),
            start_ns,
            until_ns,
        }
    }
    /// When message `i` is due, on the test clock.
    pub(super) fn due(&self, i: u64) -> u64 {
        self.start_ns.saturating_add(self.sched.due_ns(i))
    }
    /// How many messages are due by `now_ns` on the test clock.
    pub(super) fn due_by(&self, now_ns: u64) -> u64 {
        match now_ns.checked_sub(self.start_ns) {
            Some(since) => self.sched.due_by(since),
            None => 0,
        }
    }
}

/// Shared between the open-loop sender and reader.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Messages sent so far.
    pub(super) sent: AtomicU64,
    /// Sends later than [`LATE_SEND`].
    pub(super) late: AtomicU64,
    /// The sender has ended.
    pub(super) done: AtomicBool,
    /// One side failed; the other ends.
    pub(super) abort: AtomicBool,
}

impl Progress {
    pub(super) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }
    /// When the reader first saw the sender done (`None` while it runs).
    pub(super) fn done_at(&self, seen: &mut Option<u64>, clock: &Clock) -> Option<u64> {
        if seen.is_none() && self.done.load(Ordering::Acquire) {
            *seen = Some(clock.now_ns());
        }
        *seen
    }
}

/// Sends message `i` at `plan.due(i)` for every `i` due before `plan.until_ns`, sleeping until
/// each is due. A message is never skipped: one that cannot leave on time leaves late (and is
/// counted late beyond [`LATE_SEND`]). The sender also ends at `until_ns` on the clock, so a
/// sender running behind does not overrun the test; messages still due then are not sent.
pub(super) fn paced_sender(
    plan: &OpenLoop,
    clock: &Clock,
    stop: &AtomicBool,
    progress: &Progress,
    mut send: impl FnMut(u64) -> io::Result<()>,
) -> io::Result<()> {
    let late_ns = duration_ns(LATE_SEND);
    let result = (|| {
        let mut i = 0u64;
        loop {
            let due = plan.due(i);
            if due >= plan.until_ns {
                return Ok(());
            }
            let mut now = clock.now_ns();
            while now < due {
                if stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
                    return Ok(());
                }
                Pacing::SLEEP.wait(now, due);
                now = clock.now_ns();
            }
            if now >= plan.until_ns
                || stop.load(Ordering::Relaxed)
                || progress.abort.load(Ordering::Relaxed)
            {
                return Ok(());
            }
            if now - due > late_ns {
                progress.late.fetch_add(1, Ordering::Relaxed);
            }
            send(i)?;
            i += 1;
            progress.sent.store(i, Ordering::Release);
        }
    })();
    if result.is_err() {
        progress.abort.store(true, Ordering::Relaxed);
    }
    progress.done.store(true, Ordering::Release);
    result
}

pub(super) fn join<T>(handle: thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
