//! The opt-in full sample log (`--full-log FILE`): every sample as one CSV line, written by a
//! thread of its own so that the measurement loop never waits for a disk.
//!
//! The loop hands each [`Sample`] to a [`SampleSender`], which puts it in a bounded channel with
//! `try_send`: no blocking, no allocation, no lock held while waiting. When the writer falls
//! behind and the channel is full the sample is dropped and counted, and
//! [`SampleLog::finish`] reports how many, so a log with holes says so.
//!
//! The file is CSV with a header line ([`HEADER`]):
//!
//! ```text
//! seq,send_ns,receive_ns,rtt_ns,socket_rtt_ns,send_to_socket_rx_ns,warmup,outcome
//! 0,1000000,1052000,52000,,,true,received
//! 1,2000000,,,,,false,lost
//! 2,3000000,3041000,41000,37500,39900,false,received
//! 3,4000000,4900000,900000,,,false,late
//! ```
//!
//! * `seq`: the message's sequence number, from 0.
//! * `send_ns`, `receive_ns`: ns since the test's clock origin; `receive_ns` is on the
//!   receiver's clock (the same as `send_ns` for round trips). An open loop's `send_ns` is the
//!   *scheduled* send time, as its RTT counts from there.
//! * `rtt_ns`: the RTT as the application saw it (empty for one-way samples).
//! * `socket_rtt_ns`: `--timestamps`: the reply's kernel receive time minus the request's
//!   kernel transmit time; empty where the kernel gave either no stamp.
//! * `send_to_socket_rx_ns`: `--timestamps`: the reply's kernel receive time minus the
//!   application's send (the fallback where transmit stamps are missing, e.g. TCP).
//! * `warmup`: `true` for a message sent during the warm-up (left out of the statistics).
//! * `outcome`: `received`; `late`, a reply that came after the loop had stopped waiting for
//!   it (a UDP closed loop's reply timeout), still counted in the RTTs; `lost`, no reply by the
//!   end of the run (its other fields are empty).
//!
//! ```
//! use sonde_net::samplelog::{Outcome, Reply, Sample, SampleLog};
//!
//! let path = std::env::temp_dir().join(format!("sonde-doc-{}.csv", std::process::id()));
//! let mut log = SampleLog::create(&path, 4096).unwrap();
//! log.record(Sample { seq: 0, send_ns: 10, warmup: false, outcome: Outcome::Received(Reply::app(60, Some(50))) });
//! log.record(Sample { seq: 1, send_ns: 20, warmup: false, outcome: Outcome::Lost });
//! let summary = log.finish();
//! assert_eq!((summary.written, summary.dropped), (2, 0));
//! assert!(summary.error.is_none());
//! assert_eq!(
//!     std::fs::read_to_string(&path).unwrap(),
//!     "seq,send_ns,receive_ns,rtt_ns,socket_rtt_ns,send_to_socket_rx_ns,warmup,outcome\n\
//!      0,10,60,50,,,false,received\n1,20,,,,,false,lost\n"
//! );
//! # std::fs::remove_file(&path).unwrap();
//! ```

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The CSV header line.
pub const HEADER: &str =
    "seq,send_ns,receive_ns,rtt_ns,socket_rtt_ns,send_to_socket_rx_ns,warmup,outcome\n";

/// How often the writer, idle, looks whether it has been told to finish.
const POLL: Duration = Duration::from_millis(50);

/// The writer's buffer: large writes, few system calls.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// One message's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The message's sequence number.
    pub seq: u64,
    /// When it was sent (or scheduled to be, for open loop), ns since the test's origin.
    pub send_ns: u64,
    /// It was sent during the warm-up (and left out of the statistics).
    pub warmup: bool,
    /// What became of it.
    pub outcome: Outcome,
}

/// Whether a message arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It arrived (its reply, for round trips).
    Received(Reply),
    /// Its reply arrived after the loop had stopped waiting for it; it still counts.
    Late(Reply),
    /// It never arrived (or its reply never did).
    Lost,
}

/// What is known of an arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// When it arrived, ns since the receiving side's origin.
    pub receive_ns: u64,
    /// Its round-trip time, for round trips; `None` for one-way samples.
    pub rtt_ns: Option<u64>,
    /// The reply's kernel receive time minus the request's kernel transmit time, ns.
    pub socket_rtt_ns: Option<u64>,
    /// The reply's kernel receive time minus the application's send, ns.
    pub send_to_socket_rx_ns: Option<u64>,
}

impl Reply {
    /// An arrival seen by the application only (no kernel timestamps).
    pub fn app(receive_ns: u64, rtt_ns: Option<u64>) -> Self {
        Self {
            receive_ns,
            rtt_ns,
            socket_rtt_ns: None,
            send_to_socket_rx_ns: None,
        }
    }
}

/// A [`SampleLogSummary`] as a result carries it: cloneable, the error as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSummary {
    /// Where the log went.
    pub path: String,
    /// Lines written.
    pub written: u64,
    /// Samples not written (the writer fell behind, or writing failed).
    pub dropped: u64,
    /// The write error that stopped the log, if any.
    pub error: Option<String>,
}

impl SampleLogSummary {
    /// This summary for a log at `path`, with the error as text.
    pub fn into_summary(self, path: &Path) -> LogSummary {
        LogSummary {
            path: path.display().to_string(),
            written: self.written,
            dropped: self.dropped,
            error: self.error.map(|e| e.to_string()),
        }
    }
}

/// What [`SampleLog::finish`] found.
#[derive(Debug)]
pub struct SampleLogSummary {
    /// Lines handed to the file. If `error` is set, the file may hold fewer.
    pub written: u64,
    /// Samples recorded but not written: the channel was full (the writer fell behind), or
    /// writing had failed.
    pub dropped: u64,
    /// The first write error, after which nothing more was written.
    pub error: Option<io::Error>,
}

/// The hot loop's end of the log. Cheap to clone, one per thread; counts its own drops without
/// atomics and hands the count over when dropped.
#[derive(Debug)]
pub struct SampleSender {
    tx: SyncSender<Sample>,
    dropped: u64,
    shared_dropped: Arc<AtomicU64>,
}

impl SampleSender {
    /// Queues `sample` for the writer, or drops and counts it when the queue is full. Never
    /// blocks and never allocates. Returns whether the sample was queued.
    #[inline]
    pub fn record(&mut self, sample: Sample) -> bool {
        match self.tx.try_send(sample) {
            Ok(()) => true,
            Err(_) => {
                self.dropped += 1;
                false
            }
        }
    }
}

impl Clone for SampleSender {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            dropped: 0,
            shared_dropped: Arc::clone(&self.shared_dropped),
        }
    }
}

impl Drop for SampleSender {
    fn drop(&mut self) {
        self.shared_dropped
            .fetch_add(self.dropped, Ordering::Relaxed);
    }
}

/// The full sample log: a writer thread and the channel to it.
#[derive(Debug)]
pub struct SampleLog {
    sender: SampleSender,
    stop: Arc<AtomicBool>,
    writer: JoinHandle<(u64, u64, Option<io::Error>)>,
}

impl SampleLog {
    /// Creates (or truncates) the file at `path` and starts the writer. `capacity` is how many
    /// samples may wait for the writer (at least 1); a few seconds' worth of samples rides out
    /// a slow disk.
    pub fn create(path: &Path, capacity: usize) -> io::Result<Self> {
        Self::with_writer(File::create(path)?, capacity)
    }

    /// Starts the writer on any byte sink (buffered here; pass it unbuffered).
    pub fn with_writer<W: Write + Send + 'static>(out: W, capacity: usize) -> io::Result<Self> {
        // A capacity of 0 would make a rendezvous channel, where nearly every try_send fails.
        let (tx, rx) = mpsc::sync_channel(capacity.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("sonde-sample-log".into())
                .spawn(move || write_all(out, &rx, &stop))?
        };
        Ok(Self {
            sender: SampleSender {
                tx,
                dropped: 0,
                shared_dropped: Arc::new(AtomicU64::new(0)),
            },
            stop,
            writer,
        })
    }

    /// A sender for another thread's loop.
    pub fn sender(&self) -> SampleSender {
        self.sender.clone()
    }

    /// Records through the log's own sender (see [`SampleSender::record`]).
    #[inline]
    pub fn record(&mut self, sample: Sample) -> bool {
        self.sender.record(sample)
    }

    /// Writes what is queued, flushes, stops the writer and says how it went.
    ///
    /// Drop every [`SampleSender`] first: their drops are counted when they are dropped, and
    /// the writer takes every sample queued until the last one goes. A sender still alive is
    /// not waited for beyond what it has queued; its later samples, and its drops, are not in
    /// the summary.
    pub fn finish(self) -> SampleLogSummary {
        let Self {
            sender,
            stop,
            writer,
        } = self;
        let shared_dropped = Arc::clone(&sender.shared_dropped);
        drop(sender);
        stop.store(true, Ordering::Relaxed);
        let (written, discarded, error) = writer.join().unwrap_or_else(|_| {
            (
                0,
                0,
                Some(io::Error::other("the sample log writer panicked")),
            )
        });
        SampleLogSummary {
            written,
            dropped: shared_dropped.load(Ordering::Relaxed) + discarded,
            error,
        }
    }
}

/// The writer thread: header, then one line per sample until every sender is gone (or, told to
/// stop, until the queue is empty). Returns (written, discarded after an error, the error).
fn write_all<W: Write>(
    out: W,
    rx: &Receiver<Sample>,
    stop: &AtomicBool,
) -> (u64, u64, Option<io::Error>) {
    let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, out);
    let mut written = 0u64;
    let mut discarded = 0u64;
    // The header is flushed at once, so even a log cut short is a valid CSV file.
    let mut error = out
        .write_all(HEADER.as_bytes())
        .and_then(|()| out.flush())
        .err();
    loop {
        let sample = match rx.recv_timeout(POLL) {
            Ok(sample) => sample,
            Err(RecvTimeoutError::Timeout) => {
                if !stop.load(Ordering::Relaxed) {
                    continue;
                }
                match rx.try_recv() {
                    Ok(sample) => sample,
                    Err(_) => break,
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if error.is_some() {
            // Keep taking samples, so each one is either written or counted.
            discarded += 1;
            continue;
        }
        match write_line(&mut out, &sample) {
            Ok(()) => written += 1,
            Err(e) => {
                discarded += 1;
                error = Some(e);
            }
        }
    }
    if error.is_none() {
        error = out.flush().err();
    }
    (written, discarded, error)
}

fn write_line<W: Write>(out: &mut W, s: &Sample) -> io::Result<()> {
    let (reply, outcome) = match s.outcome {
        Outcome::Received(r) => (Some(r), "received"),
        Outcome::Late(r) => (Some(r), "late"),
        Outcome::Lost => (None, "lost"),
    };
    write!(out, "{},{},", s.seq, s.send_ns)?;
    if let Some(r) = reply {
        write!(out, "{}", r.receive_ns)?;
        for v in [r.rtt_ns, r.socket_rtt_ns, r.send_to_socket_rx_ns] {
            match v {
                Some(v) => write!(out, ",{v}")?,
                None => out.write_all(b",")?,
            }
        }
    } else {
        out.write_all(b",,,")?;
    }
    writeln!(out, ",{},{outcome}", s.warmup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::{Condvar, Mutex};

    /// A file in the temp directory, removed when the test ends however it ends.
    struct TempFile(PathBuf);
    impl TempFile {
        fn new(name: &str) -> Self {
            Self(
                std::env::temp_dir()
                    .join(format!("sonde-samplelog-{name}-{}.csv", std::process::id())),
            )
        }
    }
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Sample `i` of the test pattern: every 7th lost, every 5th one-way, every 11th late,
    /// every 3rd with kernel times, the first 20 in the warm-up.
    fn sample(i: u64) -> Sample {
        let reply = Reply {
            receive_ns: i * 1_000 + 500 + i % 13,
            rtt_ns: (!i.is_multiple_of(5)).then_some(500 + i % 13),
            socket_rtt_ns: i.is_multiple_of(3).then_some(400 + i % 7),
            send_to_socket_rx_ns: i.is_multiple_of(3).then_some(450 + i % 7),
        };
        let outcome = if i % 7 == 3 {
            Outcome::Lost
        } else if i % 11 == 4 {
            Outcome::Late(reply)
        } else {
            Outcome::Received(reply)
        };
        Sample {
            seq: i,
            send_ns: i * 1_000,
            warmup: i < 20,
            outcome,
        }
    }

    /// Parses one CSV line back into a sample.
    fn parse(line: &str) -> Sample {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 8, "{line}");
        let num = |s: &str| (!s.is_empty()).then(|| s.parse::<u64>().unwrap());
        let reply = || Reply {
            receive_ns: f[2].parse().unwrap(),
            rtt_ns: num(f[3]),
            socket_rtt_ns: num(f[4]),
            send_to_socket_rx_ns: num(f[5]),
        };
        let outcome = match f[7] {
            "lost" => {
                assert_eq!(f[2..6], ["", "", "", ""], "{line}");
                Outcome::Lost
            }
            "received" => Outcome::Received(reply()),
            "late" => Outcome::Late(reply()),
            other => panic!("outcome {other:?} in {line}"),
        };
        Sample {
            seq: f[0].parse().unwrap(),
            send_ns: f[1].parse().unwrap(),
            warmup: f[6].parse().unwrap(),
            outcome,
        }
    }

    #[test]
    fn a_hundred_thousand_samples_come_back_line_by_line() {
        const N: u64 = 100_000;
        let file = TempFile::new("100k");
        let mut log = SampleLog::create(&file.0, N as usize).unwrap();
        for i in 0..N {
            assert!(log.record(sample(i)));
        }
        let summary = log.finish();
        assert!(summary.error.is_none(), "{:?}", summary.error);
        assert_eq!((summary.written, summary.dropped), (N, 0));

        let text = std::fs::read_to_string(&file.0).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(HEADER.trim_end()));
        let mut count = 0;
        for (i, line) in lines.enumerate() {
            assert_eq!(parse(line), sample(i as u64));
            count += 1;
        }
        assert_eq!(count, N);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn several_threads_log_through_their_own_senders() {
        const PER_THREAD: u64 = 10_000;
        let file = TempFile::new("threads");
        let log = SampleLog::create(&file.0, 4 * PER_THREAD as usize).unwrap();
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let mut tx = log.sender();
                thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        tx.record(sample(t * PER_THREAD + i));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let summary = log.finish();
        assert_eq!((summary.written, summary.dropped), (4 * PER_THREAD, 0));
        let text = std::fs::read_to_string(&file.0).unwrap();
        let mut seqs: Vec<u64> = text
            .lines()
            .skip(1)
            .map(|line| {
                let s = parse(line);
                assert_eq!(s, sample(s.seq));
                s.seq
            })
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..4 * PER_THREAD).collect::<Vec<_>>());
    }

    /// A sink that blocks every write until opened.
    #[derive(Clone, Default)]
    struct Gated {
        open: Arc<(Mutex<bool>, Condvar)>,
        out: Arc<Mutex<Vec<u8>>>,
    }
    impl Gated {
        fn open(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
    }
    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cvar) = &*self.open;
            let _open = cvar
                .wait_while(lock.lock().unwrap(), |open| !*open)
                .unwrap();
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let sink = Gated::default();
        // The writer is stuck flushing the header, so exactly 4 samples fit.
        let mut log = SampleLog::with_writer(sink.clone(), 4).unwrap();
        let mut other = log.sender();
        let queued: Vec<bool> = (0..10).map(|i| log.record(sample(i))).collect();
        assert_eq!(
            queued,
            [true, true, true, true, false, false, false, false, false, false]
        );
        assert!(!other.record(sample(10)));
        drop(other);
        sink.open();
        let summary = log.finish();
        assert!(summary.error.is_none());
        assert_eq!((summary.written, summary.dropped), (4, 7));
        let text = String::from_utf8(sink.out.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], HEADER.trim_end());
        let samples: Vec<Sample> = lines[1..].iter().map(|l| parse(l)).collect();
        assert_eq!(samples, (0..4).map(sample).collect::<Vec<_>>());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_write_error_is_reported_and_every_sample_accounted_for() {
        const N: u64 = 50_000;
        // /dev/full takes the open and fails every write with ENOSPC.
        let mut log = SampleLog::create(Path::new("/dev/full"), N as usize).unwrap();
        for i in 0..N {
            log.record(sample(i));
        }
        let summary = log.finish();
        let error = summary.error.expect("writing to /dev/full must fail");
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(summary.written + summary.dropped, N);
        assert!(summary.dropped > 0);
    }

    #[test]
    fn a_file_that_cannot_be_created_is_an_error_at_once() {
        let dir = TempFile::new("no-such-dir");
        let err = SampleLog::create(&dir.0.join("log.csv"), 16).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn lines_have_empty_fields_for_what_is_unknown() {
        let mut buf = Vec::new();
        for s in [sample(0), sample(1), sample(3), sample(4)] {
            write_line(&mut buf, &s).unwrap();
        }
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "0,0,500,,400,450,true,received\n\
             1,1000,1501,501,,,true,received\n\
             3,3000,,,,,true,lost\n\
             4,4000,4504,504,,,true,late\n"
        );
    }

    #[test]
    fn a_summary_carries_the_error_as_text() {
        let summary = SampleLogSummary {
            written: 3,
            dropped: 1,
            error: Some(io::Error::other("no space left on device")),
        };
        let s = summary.into_summary(Path::new("/tmp/x.csv"));
        assert_eq!(
            (s.path.as_str(), s.written, s.dropped),
            ("/tmp/x.csv", 3, 1)
        );
        assert!(s.error.unwrap().contains("space"));
    }
}
