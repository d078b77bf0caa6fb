//! RFC 3550 section 6.4.1 interarrival jitter: J += (|D| - J) / 16, where D is the change in
//! transit time (receive time minus send time) between consecutive arrivals.

/// Jitter estimator. Clocks need not be synchronised: only differences of transit times count.
#[derive(Debug, Clone, Default)]
pub struct Jitter {
    _private: (),
}

impl Jitter {
    /// Accounts one arrival: the sender's `send_ns` from the header, the receiver's `recv_ns`.
    pub fn on_packet(&mut self, send_ns: u64, recv_ns: u64) {
        todo!("{send_ns} {recv_ns}")
    }
    /// Current jitter, ns.
    pub fn jitter_ns(&self) -> u64 {
        todo!()
    }
}
