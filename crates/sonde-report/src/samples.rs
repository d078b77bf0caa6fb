//! Every sample of a latency run's `--full-log` file, binned over time for the report's RTT over
//! time chart: a few million samples are too many to draw one by one, so the run is cut into
//! [`BINS`] bins of equal length and each keeps the smallest and largest RTT that arrived in it
//! and how many did. Reading the file is the caller's (this crate does no I/O): it hands each
//! line to [`SampleBins::line`].
//!
//! ```
//! use sonde_report::samples::SampleBins;
//!
//! let mut bins = SampleBins::new(0, 1_000_000_000);
//! bins.line("seq,send_ns,receive_ns,rtt_ns,socket_rtt_ns,send_to_socket_rx_ns,warmup,outcome");
//! bins.line("0,1000000,1052000,52000,,,false,received");
//! bins.line("1,2000000,,,,,false,lost");
//! assert_eq!(bins.samples(), 1);
//! ```

/// The bins a run is cut into (the chart is about 1,100 px wide: about one per pixel).
pub const BINS: u64 = 1_000;

/// One bin: the RTTs that arrived in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bin {
    /// Smallest, ns.
    pub min_ns: u64,
    /// Largest, ns.
    pub max_ns: u64,
    /// How many.
    pub samples: u64,
}

/// A full log binned over `[start_ns, end_ns)` of the run's clock (the intervals' span).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleBins {
    /// Where the first bin starts, ns since the test started.
    pub start_ns: u64,
    /// Each bin's length, ns.
    pub bin_ns: u64,
    /// The bins, `None` where no reply arrived.
    pub bins: Vec<Option<Bin>>,
    /// Lines that were not a sample (not the header, not eight fields of numbers).
    pub unreadable_lines: u64,
    /// Where the span ends (the last bin holds a reply that arrived exactly then).
    end_ns: u64,
}

impl SampleBins {
    /// Empty bins over `[start_ns, end_ns)`.
    pub fn new(start_ns: u64, end_ns: u64) -> Self {
        let bin_ns = end_ns.saturating_sub(start_ns).div_ceil(BINS).max(1);
        let count = end_ns.saturating_sub(start_ns).div_ceil(bin_ns);
        Self {
            start_ns,
            bin_ns,
            bins: vec![None; usize::try_from(count).unwrap_or(0)],
            unreadable_lines: 0,
            end_ns,
        }
    }

    /// One line of the log (`sonde_net::samplelog` writes them): a reply that arrived after the
    /// warm-up (`received` or `late`) counts in the bin its `receive_ns` falls in, as in the
    /// intervals; lost messages, warm-up ones and replies outside the span are left out.
    pub fn line(&mut self, line: &str) {
        let f: Vec<&str> = line.trim_end().split(',').collect();
        if f.first() == Some(&"seq") {
            return;
        }
        let [_, _, receive, rtt, _, _, warmup, outcome] = f[..] else {
            self.unreadable_lines += 1;
            return;
        };
        if warmup != "false" || !matches!(outcome, "received" | "late") {
            return;
        }
        let (Ok(receive_ns), Ok(rtt_ns)) = (receive.parse::<u64>(), rtt.parse::<u64>()) else {
            self.unreadable_lines += 1;
            return;
        };
        if receive_ns > self.end_ns {
            return;
        }
        let Some(offset) = receive_ns.checked_sub(self.start_ns) else {
            return;
        };
        let last = self.bins.len().saturating_sub(1);
        let Some(bin) = usize::try_from(offset / self.bin_ns)
            .ok()
            .and_then(|i| self.bins.get_mut(i.min(last)))
        else {
            return;
        };
        let b = bin.get_or_insert(Bin {
            min_ns: rtt_ns,
            max_ns: rtt_ns,
            samples: 0,
        });
        b.min_ns = b.min_ns.min(rtt_ns);
        b.max_ns = b.max_ns.max(rtt_ns);
        b.samples += 1;
    }

    /// The samples binned.
    pub fn samples(&self) -> u64 {
        self.bins.iter().flatten().map(|b| b.samples).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_count_where_they_arrived_after_the_warm_up() {
        let mut b = SampleBins::new(500_000_000, 1_500_000_000);
        assert_eq!((b.bin_ns, b.bins.len()), (1_000_000, 1_000));
        for line in [
            "seq,send_ns,receive_ns,rtt_ns,socket_rtt_ns,send_to_socket_rx_ns,warmup,outcome",
            // warm-up, lost, before the span: left out.
            "0,400000000,400050000,50000,,,true,received",
            "1,400000000,,,,,false,lost",
            "2,499000000,499900000,900000,,,false,received",
            // bin 0 twice, bin 999 twice (late still counts, and the span's end is in it);
            // after the span: left out.
            "3,500000000,500040000,40000,,,false,received",
            "4,500040000,500100000,60000,,,false,received",
            "5,1498000000,1499999999,1999999,,,false,late",
            "6,1499000000,1500000000,1000000,,,false,received",
            "7,1499000000,1500000001,1000001,,,false,received",
            "not a sample",
        ] {
            b.line(line);
        }
        assert_eq!(
            b.bins[0],
            Some(Bin {
                min_ns: 40_000,
                max_ns: 60_000,
                samples: 2
            })
        );
        assert_eq!(b.bins[999].map(|x| x.samples), Some(2));
        assert_eq!(b.bins.iter().flatten().count(), 2);
        assert_eq!((b.samples(), b.unreadable_lines), (4, 1));
    }
}
