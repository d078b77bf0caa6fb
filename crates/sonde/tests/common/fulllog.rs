//! `--full-log` files in tests: a temporary file that is removed however the test ends, and the
//! log's CSV read back line by line (the format docs/guide/latency.md documents).

use std::path::PathBuf;

/// A file in the temp directory (visible from every network namespace), removed when dropped.
pub(crate) struct TempFile(PathBuf);

impl TempFile {
    /// `sonde-<name>-<pid>.csv` in the temp directory.
    pub(crate) fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("sonde-{name}-{}.csv", std::process::id())))
    }

    pub(crate) fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One line of a full log.
#[derive(Debug)]
pub(crate) struct LogLine {
    pub(crate) seq: u64,
    pub(crate) send_ns: u64,
    pub(crate) receive_ns: Option<u64>,
    pub(crate) rtt_ns: Option<u64>,
    pub(crate) socket_rtt_ns: Option<u64>,
    pub(crate) send_to_socket_rx_ns: Option<u64>,
    pub(crate) warmup: bool,
    pub(crate) outcome: String,
}

impl LogLine {
    /// A reply that counts in the statistics: received (or late) after the warm-up.
    pub(crate) fn measured(&self) -> bool {
        !self.warmup && self.outcome != "lost"
    }
}

/// Every line of the log at `file`, after checking its header.
pub(crate) fn read_log(file: &TempFile) -> Vec<LogLine> {
    let text = std::fs::read_to_string(&file.0).expect("the full log");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("seq,send_ns,receive_ns,rtt_ns,socket_rtt_ns,send_to_socket_rx_ns,warmup,outcome")
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 8, "{l}");
            let n = |s: &str| (!s.is_empty()).then(|| s.parse::<u64>().expect(l));
            LogLine {
                seq: f[0].parse().expect(l),
                send_ns: f[1].parse().expect(l),
                receive_ns: n(f[2]),
                rtt_ns: n(f[3]),
                socket_rtt_ns: n(f[4]),
                send_to_socket_rx_ns: n(f[5]),
                warmup: f[6].parse().expect(l),
                outcome: f[7].to_owned(),
            }
        })
        .collect()
}
