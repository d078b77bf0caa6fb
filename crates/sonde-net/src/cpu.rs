//! CPU cost of a test: user and system CPU time and context switches, from `getrusage`, for the
//! whole process or for one thread, and the share of one core that came to over the test's wall
//! time (netperf's "service demand", latte's CPU columns).
//!
//! A test runner starts a [`CpuMeter`] when the measured part begins and stops it at the end:
//!
//! ```
//! use sonde_net::cpu::{CpuMeter, CpuScope};
//!
//! let meter = CpuMeter::start(CpuScope::Process);
//! let _work: u64 = (0..100_000u64).map(|i| i * i).sum();
//! if let Some(cost) = meter.stop() {
//!     // On Linux (and wherever getrusage is offered) the figures are there...
//!     let _percent = cost.percent_of_one_core();
//! } // ...elsewhere the meter says it cannot tell, rather than reporting zero.
//! ```
//!
//! A test session that runs on several threads (control, data streams, interval reporter)
//! uses a [`ThreadsMeter`]: each thread counts its own `RUSAGE_THREAD` time from when it
//! joins to when it leaves, and the meter sums them. Sessions running at once in one process
//! (the agent serving several clients, `sonde quick` with its agent in-process) then do not
//! count each other's CPU, which `RUSAGE_SELF` would.
//!
//! ```
//! use sonde_net::cpu::ThreadsMeter;
//!
//! let meter = ThreadsMeter::start();
//! std::thread::scope(|s| {
//!     for _ in 0..2 {
//!         s.spawn(|| {
//!             let _counted = meter.track(); // this thread's CPU, until the guard drops
//!             let _work: u64 = (0..100_000u64).map(|i| i * i).sum();
//!         });
//!     }
//! });
//! if let Some(cost) = meter.cost() {
//!     let _ = cost.usage.total(); // both threads together
//! }
//! ```
//!
//! The kernel accounts CPU time in ticks or, with `CONFIG_VIRT_CPU_ACCOUNTING`, precisely; so
//! short intervals can read 0 and a test of a second or more is where the figures mean something.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use sonde_wire::{CpuReport, Protocol, TestKind, TestSpec};

use crate::{sys, Counters};

/// Whose CPU time is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuScope {
    /// The whole process, all threads (`RUSAGE_SELF`).
    Process,
    /// The calling thread only (`RUSAGE_THREAD`, Linux); a meter of this scope must be stopped
    /// on the thread that started it.
    Thread,
}

/// Cumulative CPU time and context switches at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSnapshot {
    /// CPU time in user mode.
    pub user: Duration,
    /// CPU time in the kernel on this process's (or thread's) behalf: system calls, and the
    /// network stack's work done in them.
    pub system: Duration,
    /// Times the process (or thread) gave up the CPU to wait (a blocking read, a sleep);
    /// `None` where the platform does not count them (Windows).
    pub voluntary_switches: Option<u64>,
    /// Times it was preempted: it wanted to run on and was made to wait; `None` as above.
    pub involuntary_switches: Option<u64>,
}

impl CpuSnapshot {
    /// Takes a snapshot now. Fails with [`io::ErrorKind::Unsupported`] where the platform cannot
    /// say (and for [`CpuScope::Thread`] outside Linux).
    pub fn take(scope: CpuScope) -> io::Result<Self> {
        sys::rusage(scope == CpuScope::Thread)
    }

    /// What was used between `earlier` and this snapshot. Each figure saturates at zero, so
    /// snapshots passed in the wrong order give zeros, not a wrapped number.
    pub fn since(&self, earlier: &Self) -> CpuUsage {
        CpuUsage {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            voluntary_switches: since(self.voluntary_switches, earlier.voluntary_switches),
            involuntary_switches: since(self.involuntary_switches, earlier.involuntary_switches),
        }
    }
}

/// `now - earlier`, saturating; unknown when either is.
fn since(now: Option<u64>, earlier: Option<u64>) -> Option<u64> {
    Some(now?.saturating_sub(earlier?))
}

/// The whole host's counts of interrupts, context switches and system calls (every CPU, every
/// process): the columns latte shows next to its CPU figures. Cumulative when taken with
/// [`SystemActivity::take`], a difference after [`SystemActivity::since`]. Each is `None` where
/// the platform does not count it: Linux keeps no system-wide system call count; a Windows
/// whose performance counters are missing or read 0 (wine has none of these) gives `None`,
/// never a 0 that was not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemActivity {
    /// Interrupts (Linux: `/proc/stat` `intr`, Windows: `\Processor(_Total)\Interrupts/sec`).
    pub interrupts: Option<u64>,
    /// Context switches (Linux: `/proc/stat` `ctxt`, Windows: `\System\Context Switches/sec`).
    pub context_switches: Option<u64>,
    /// System calls (Windows: `\System\System Calls/sec`; `None` on Linux).
    pub syscalls: Option<u64>,
    /// Time in software interrupts, every CPU together, ns (Linux: `/proc/stat` `cpu`'s
    /// `softirq`, in clock ticks; `None` elsewhere).
    pub softirq_ns: Option<u64>,
}

impl SystemActivity {
    /// The host's counts since boot, now.
    pub fn take() -> Self {
        sys::system_activity()
    }

    /// What the host counted between `earlier` and this snapshot, saturating at zero.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            interrupts: since(self.interrupts, earlier.interrupts),
            context_switches: since(self.context_switches, earlier.context_switches),
            syscalls: since(self.syscalls, earlier.syscalls),
            softirq_ns: since(self.softirq_ns, earlier.softirq_ns),
        }
    }
}

/// CPU time and context switches over an interval: the difference of two [`CpuSnapshot`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUsage {
    /// CPU time in user mode.
    pub user: Duration,
    /// CPU time in the kernel.
    pub system: Duration,
    /// Voluntary context switches (waits); `None` where the platform does not count them.
    pub voluntary_switches: Option<u64>,
    /// Involuntary context switches (preemptions); `None` as above.
    pub involuntary_switches: Option<u64>,
}

impl CpuUsage {
    /// User plus system time.
    pub fn total(&self) -> Duration {
        self.user.saturating_add(self.system)
    }
}

/// Measures the CPU cost of one stretch of work: [`CpuMeter::start`], then [`CpuMeter::stop`].
#[derive(Debug, Clone)]
pub struct CpuMeter {
    scope: CpuScope,
    /// `None` when the platform cannot say; `stop` then says so too.
    start: Option<CpuSnapshot>,
    system_start: SystemActivity,
    wall_start: Instant,
    thread: ThreadId,
}

impl CpuMeter {
    /// Starts measuring now.
    pub fn start(scope: CpuScope) -> Self {
        Self {
            scope,
            start: CpuSnapshot::take(scope).ok(),
            system_start: SystemActivity::take(),
            wall_start: Instant::now(),
            thread: thread::current().id(),
        }
    }

    /// The cost since [`CpuMeter::start`]; `None` when the platform cannot measure it, or when
    /// a [`CpuScope::Thread`] meter is stopped on another thread than the one that started it
    /// (the figures would belong to another thread). The meter can be stopped more than once,
    /// each time measuring from the start.
    pub fn stop(&self) -> Option<CpuCost> {
        let start = self.start?;
        if self.scope == CpuScope::Thread && thread::current().id() != self.thread {
            return None;
        }
        let end = CpuSnapshot::take(self.scope).ok()?;
        Some(CpuCost {
            usage: end.since(&start),
            wall: self.wall_start.elapsed(),
            system: SystemActivity::take().since(&self.system_start),
        })
    }

    /// The scope the meter counts.
    pub fn scope(&self) -> CpuScope {
        self.scope
    }
}

/// The CPU used over a stretch of wall-clock time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCost {
    /// CPU time and context switches.
    pub usage: CpuUsage,
    /// The wall-clock time they were counted over.
    pub wall: Duration,
    /// What the whole host counted over that wall time (not this test's alone).
    pub system: SystemActivity,
}

impl CpuCost {
    /// User plus system CPU time as a percentage of one core over the wall time: 100 is one
    /// core busy the whole time; a process with several busy threads can pass 100. `None` when
    /// no wall time passed.
    pub fn percent_of_one_core(&self) -> Option<f64> {
        self.percent(self.usage.total())
    }

    /// User CPU time as a percentage of one core over the wall time.
    pub fn user_percent_of_one_core(&self) -> Option<f64> {
        self.percent(self.usage.user)
    }

    /// System CPU time as a percentage of one core over the wall time.
    pub fn system_percent_of_one_core(&self) -> Option<f64> {
        self.percent(self.usage.system)
    }

    fn percent(&self, cpu: Duration) -> Option<f64> {
        (!self.wall.is_zero()).then(|| cpu.as_secs_f64() * 100.0 / self.wall.as_secs_f64())
    }

    /// The cost as it travels in a report (`Report.cpu`, and the client's own before it goes
    /// into the result), with what the data loops moved: `syscalls` where they were counted,
    /// `messages` and `bytes`.
    pub fn report(
        &self,
        syscalls: Option<u64>,
        messages: Option<u64>,
        bytes: Option<u64>,
    ) -> CpuReport {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        CpuReport {
            wall_ns: ns(self.wall),
            user_ns: ns(self.usage.user),
            system_ns: ns(self.usage.system),
            voluntary_switches: self.usage.voluntary_switches,
            involuntary_switches: self.usage.involuntary_switches,
            syscalls,
            messages,
            bytes,
            system_interrupts: self.system.interrupts,
            system_context_switches: self.system.context_switches,
            system_syscalls: self.system.syscalls,
            system_softirq_ns: self.system.softirq_ns,
        }
    }
}

/// The report of a test's data loops, either end: what they moved from their `counters`, with
/// a message being a UDP datagram, a latency message, or `msg_size` bytes of a TCP stream (TCP
/// counts calls, not messages), and their system calls when `syscalls_counted`.
pub fn loops_report(
    cost: &CpuCost,
    spec: &TestSpec,
    counters: &[Counters],
    syscalls_counted: bool,
) -> CpuReport {
    let (bytes, packets) = counters
        .iter()
        .map(Counters::load)
        .fold((0u64, 0u64), |(b, p), (cb, cp)| {
            (b.saturating_add(cb), p.saturating_add(cp))
        });
    let messages = match spec.protocol {
        Protocol::Tcp if spec.kind != TestKind::Latency => bytes / u64::from(spec.msg_size.max(1)),
        _ => packets,
    };
    let syscalls = syscalls_counted.then(|| counters.iter().map(Counters::syscalls).sum());
    cost.report(syscalls, Some(messages), Some(bytes))
}

/// The CPU used by a group of threads (one session's), each counted with `RUSAGE_THREAD` from
/// [`ThreadsMeter::track`] until its guard drops, over the wall time since
/// [`ThreadsMeter::start`].
#[derive(Debug)]
pub struct ThreadsMeter {
    wall_start: Instant,
    system_start: SystemActivity,
    user_ns: AtomicU64,
    system_ns: AtomicU64,
    voluntary_switches: AtomicU64,
    involuntary_switches: AtomicU64,
    /// Set when a thread's context switches were not counted (Windows): the sums are unknown.
    switches_unknown: AtomicBool,
    /// Set when a thread could not be measured: the sum would be short, so there is none.
    unmeasured: AtomicBool,
}

impl ThreadsMeter {
    /// Starts the wall clock; no thread is counted until it calls [`ThreadsMeter::track`].
    pub fn start() -> Self {
        Self {
            wall_start: Instant::now(),
            system_start: SystemActivity::take(),
            user_ns: AtomicU64::new(0),
            system_ns: AtomicU64::new(0),
            voluntary_switches: AtomicU64::new(0),
            involuntary_switches: AtomicU64::new(0),
            switches_unknown: AtomicBool::new(false),
            unmeasured: AtomicBool::new(false),
        }
    }

    /// Counts the calling thread's CPU from now until the returned guard is dropped, which must
    /// happen on this thread (it is not `Send`).
    pub fn track(&self) -> TrackedThread<'_> {
        self.track_from(CpuSnapshot::take(CpuScope::Thread).ok())
    }

    /// Counts the calling thread's CPU from `start`, a snapshot of this thread taken earlier
    /// (before it knew which meter the work belongs to: an agent thread serving connections of
    /// several sessions learns the session from the connection's first bytes), until the
    /// returned guard drops, on this thread. `None` (no snapshot could be taken) leaves the
    /// meter without figures, as [`ThreadsMeter::track`] does when it cannot measure.
    pub fn track_from(&self, start: Option<CpuSnapshot>) -> TrackedThread<'_> {
        if start.is_none() {
            self.unmeasured.store(true, Ordering::Relaxed);
        }
        TrackedThread {
            meter: self,
            start,
            _not_send: std::marker::PhantomData,
        }
    }

    /// What the tracked threads used so far (those still running count from their guard's
    /// drop, so call this after they ended), over the wall time since the start. `None` when
    /// a thread could not be measured (no `RUSAGE_THREAD`: not Linux).
    pub fn cost(&self) -> Option<CpuCost> {
        if self.unmeasured.load(Ordering::Relaxed) {
            return None;
        }
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        let switches = |a: &AtomicU64| {
            (!self.switches_unknown.load(Ordering::Relaxed)).then(|| a.load(Ordering::Relaxed))
        };
        Some(CpuCost {
            usage: CpuUsage {
                user: ns(&self.user_ns),
                system: ns(&self.system_ns),
                voluntary_switches: switches(&self.voluntary_switches),
                involuntary_switches: switches(&self.involuntary_switches),
            },
            wall: self.wall_start.elapsed(),
            system: SystemActivity::take().since(&self.system_start),
        })
    }

    fn add(&self, used: &CpuUsage) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.user_ns.fetch_add(ns(used.user), Ordering::Relaxed);
        self.system_ns.fetch_add(ns(used.system), Ordering::Relaxed);
        match (used.voluntary_switches, used.involuntary_switches) {
            (Some(v), Some(i)) => {
                self.voluntary_switches.fetch_add(v, Ordering::Relaxed);
                self.involuntary_switches.fetch_add(i, Ordering::Relaxed);
            }
            _ => self.switches_unknown.store(true, Ordering::Relaxed),
        }
    }
}

/// One thread counted by a [`ThreadsMeter`]; its CPU is added to the meter when this drops.
#[derive(Debug)]
#[must_use = "the thread is counted until this guard drops"]
pub struct TrackedThread<'a> {
    meter: &'a ThreadsMeter,
    start: Option<CpuSnapshot>,
    /// `RUSAGE_THREAD` reads the calling thread: the guard must drop where it was made.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for TrackedThread<'_> {
    fn drop(&mut self) {
        let Some(start) = self.start else { return };
        match CpuSnapshot::take(CpuScope::Thread) {
            Ok(end) => self.meter.add(&end.since(&start)),
            Err(_) => self.meter.unmeasured.store(true, Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_os = "linux")]
    use std::hint::black_box;

    /// A thread whose context switches were not counted (Windows) makes the meter's sums
    /// unknown, not a short count and not 0, while its CPU time still counts.
    #[test]
    #[cfg(any(target_os = "linux", windows))]
    fn a_thread_without_switch_counts_makes_the_sums_unknown() {
        let meter = ThreadsMeter::start();
        drop(meter.track());
        let counted = meter.cost().unwrap();
        assert!(counted.usage.voluntary_switches.is_some() || cfg!(windows));
        drop(meter.track_from(Some(CpuSnapshot {
            voluntary_switches: None,
            involuntary_switches: None,
            ..CpuSnapshot::take(CpuScope::Thread).unwrap()
        })));
        let cost = meter.cost().expect("CPU time is still measured");
        assert_eq!(cost.usage.voluntary_switches, None);
        assert_eq!(cost.usage.involuntary_switches, None);
        let report = cost.report(None, None, None);
        assert_eq!(report.voluntary_switches, None);
    }

    /// Spins until the calling thread's user time has grown past `from`, for at most a bounded
    /// number of rounds. Returns whether it grew.
    #[cfg(target_os = "linux")]
    fn burn_until_user_time_grows(scope: CpuScope, from: Duration) -> bool {
        let mut x = 1u64;
        for _ in 0..20_000 {
            for i in 0..100_000u64 {
                x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
            }
            if CpuSnapshot::take(scope).unwrap().user > from {
                return true;
            }
        }
        false
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn burning_cpu_shows_as_user_time_for_the_thread_and_the_process() {
        let process = CpuSnapshot::take(CpuScope::Process).unwrap();
        let thread = CpuSnapshot::take(CpuScope::Thread).unwrap();
        assert!(burn_until_user_time_grows(CpuScope::Thread, thread.user));
        let thread_used = CpuSnapshot::take(CpuScope::Thread).unwrap().since(&thread);
        let process_used = CpuSnapshot::take(CpuScope::Process)
            .unwrap()
            .since(&process);
        assert!(thread_used.user > Duration::ZERO);
        // The process's time includes this thread's. (Only the sum: the kernel splits each
        // one's runtime into user and system by its own tick samples, so the parts can
        // differ; and each figure is cut to whole microseconds.)
        assert!(
            process_used.total() + Duration::from_micros(2) >= thread_used.total(),
            "{process_used:?} {thread_used:?}"
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn sleeping_is_a_voluntary_context_switch() {
        let meter = CpuMeter::start(CpuScope::Thread);
        let process = CpuSnapshot::take(CpuScope::Process).unwrap();
        for _ in 0..3 {
            thread::sleep(Duration::from_millis(2));
        }
        let cost = meter.stop().unwrap();
        assert!(cost.usage.voluntary_switches >= Some(3), "{cost:?}");
        let process_used = CpuSnapshot::take(CpuScope::Process)
            .unwrap()
            .since(&process);
        assert!(
            process_used.voluntary_switches >= Some(3),
            "{process_used:?}"
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_meter_reports_a_share_of_one_core() {
        let meter = CpuMeter::start(CpuScope::Thread);
        let start = CpuSnapshot::take(CpuScope::Thread).unwrap();
        assert!(burn_until_user_time_grows(CpuScope::Thread, start.user));
        let cost = meter.stop().unwrap();
        assert!(cost.usage.user > Duration::ZERO);
        assert!(cost.wall > Duration::ZERO);
        assert!(cost.percent_of_one_core().unwrap() > 0.0);
        assert!(cost.user_percent_of_one_core().unwrap() > 0.0);
    }

    /// Work done before the meter was known is counted from the snapshot, and only once.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_thread_counted_from_an_earlier_snapshot_includes_the_work_before() {
        let start = CpuSnapshot::take(CpuScope::Thread).unwrap();
        assert!(burn_until_user_time_grows(CpuScope::Thread, start.user));
        let burnt = CpuSnapshot::take(CpuScope::Thread).unwrap().since(&start);
        let meter = ThreadsMeter::start();
        drop(meter.track_from(Some(start)));
        let counted = meter.cost().unwrap().usage;
        assert!(counted.total() >= burnt.total(), "{counted:?} < {burnt:?}");
        // A snapshot that could not be taken: no figures rather than a short sum.
        let meter = ThreadsMeter::start();
        drop(meter.track_from(None));
        assert!(meter.cost().is_none());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_thread_meter_stopped_on_another_thread_says_it_cannot_tell() {
        let meter = CpuMeter::start(CpuScope::Thread);
        assert!(meter.stop().is_some());
        let elsewhere = thread::spawn(move || meter.stop()).join().unwrap();
        assert_eq!(elsewhere, None);
        // A process meter may be read from anywhere.
        let meter = CpuMeter::start(CpuScope::Process);
        assert!(thread::spawn(move || meter.stop())
            .join()
            .unwrap()
            .is_some());
    }

    #[test]
    #[cfg(not(any(target_os = "linux", windows)))]
    fn without_getrusage_the_meter_says_it_cannot_tell() {
        assert!(CpuMeter::start(CpuScope::Process).stop().is_none());
    }

    #[test]
    fn differences_saturate_and_percentages_are_of_one_core() {
        let earlier = CpuSnapshot {
            user: Duration::from_millis(500),
            system: Duration::from_millis(200),
            voluntary_switches: Some(10),
            involuntary_switches: Some(5),
        };
        let later = CpuSnapshot {
            user: Duration::from_millis(1_500),
            system: Duration::from_millis(700),
            voluntary_switches: Some(30),
            involuntary_switches: Some(5),
        };
        let used = later.since(&earlier);
        assert_eq!(used.user, Duration::from_secs(1));
        assert_eq!(used.system, Duration::from_millis(500));
        assert_eq!(used.total(), Duration::from_millis(1_500));
        assert_eq!(
            (used.voluntary_switches, used.involuntary_switches),
            (Some(20), Some(0))
        );
        assert_eq!(
            earlier.since(&later),
            CpuUsage {
                voluntary_switches: Some(0),
                involuntary_switches: Some(0),
                ..CpuUsage::default()
            }
        );

        // Two threads busy for one second of wall time: 150 % of one core.
        let cost = CpuCost {
            usage: used,
            wall: Duration::from_secs(1),
            system: SystemActivity::default(),
        };
        assert_eq!(cost.percent_of_one_core(), Some(150.0));
        assert_eq!(cost.user_percent_of_one_core(), Some(100.0));
        assert_eq!(cost.system_percent_of_one_core(), Some(50.0));
        let instant = CpuCost {
            wall: Duration::ZERO,
            ..cost
        };
        assert_eq!(instant.percent_of_one_core(), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_threads_meter_sums_its_threads_and_not_the_others() {
        let meter = ThreadsMeter::start();
        let (idle_meter, outsider) = (ThreadsMeter::start(), ThreadsMeter::start());
        let used: Vec<CpuUsage> = thread::scope(|s| {
            // A busy thread that is not tracked by `meter` must not show in it.
            let other = s.spawn(|| {
                let _t = outsider.track();
                let start = CpuSnapshot::take(CpuScope::Thread).unwrap();
                assert!(burn_until_user_time_grows(CpuScope::Thread, start.user));
            });
            let tracked: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let before = CpuSnapshot::take(CpuScope::Thread).unwrap();
                        let t = meter.track();
                        assert!(burn_until_user_time_grows(CpuScope::Thread, before.user));
                        thread::sleep(Duration::from_millis(2));
                        let used = CpuSnapshot::take(CpuScope::Thread).unwrap().since(&before);
                        drop(t);
                        used
                    })
                })
                .collect();
            let _idle = idle_meter.track();
            other.join().unwrap();
            tracked.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let cost = meter.cost().unwrap();
        let own: Duration = used.iter().map(CpuUsage::total).sum();
        // Each thread's own reading bounds what the meter added for it (the guard was made
        // after the first reading and dropped after the second: at most a few µs apart).
        assert!(cost.usage.total() > Duration::ZERO);
        assert!(
            cost.usage.total() <= own + Duration::from_micros(100),
            "{cost:?} {used:?}"
        );
        assert!(cost.usage.voluntary_switches >= Some(2), "{cost:?}");
        assert!(cost.wall > Duration::ZERO);
        // The outsider's burn is in its own meter only; the idle thread used next to nothing.
        assert!(outsider.cost().unwrap().usage.user > Duration::ZERO);
        assert!(
            idle_meter.cost().unwrap().usage.total() < cost.usage.total(),
            "{:?}",
            idle_meter.cost()
        );
    }

    #[test]
    #[cfg(not(any(target_os = "linux", windows)))]
    fn without_rusage_thread_a_threads_meter_says_it_cannot_tell() {
        let meter = ThreadsMeter::start();
        drop(meter.track());
        assert!(meter.cost().is_none());
    }
}
