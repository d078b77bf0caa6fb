//! RFC 3550 section 6.4.1 interarrival jitter: J += (|D| - J) / 16, where D is the change in
//! transit time (receive time minus send time) between consecutive arrivals.

/// Jitter estimator. Clocks need not be synchronised: only differences of transit times count.
///
/// The first arrival sets the baseline transit time (jitter stays 0). Transit times are taken
/// modulo 2^64, so an offset between the clocks (receive time before send time) is harmless as
/// long as consecutive transit times differ by less than 2^63 ns.
#[derive(Debug, Clone, Default)]
pub struct Jitter {
    /// Transit time of the previous arrival, `recv - send` modulo 2^64.
    last_transit: Option<u64>,
    /// J, ns. Kept as a float so the 1/16 gain does not lose small deltas to truncation.
    jitter: f64,
}

impl Jitter {
    /// Accounts one arrival: the sender's `send_ns` from the header, the receiver's `recv_ns`.
    pub fn on_packet(&mut self, send_ns: u64, recv_ns: u64) {
        let transit = recv_ns.wrapping_sub(send_ns);
        if let Some(last) = self.last_transit {
            // |D| from the two's-complement difference of the transits.
            let d = (transit.wrapping_sub(last) as i64).unsigned_abs();
            self.jitter += (d as f64 - self.jitter) / 16.0;
        }
        self.last_transit = Some(transit);
    }

    /// Current jitter, ns.
    pub fn jitter_ns(&self) -> u64 {
        // A float-to-int cast saturates; J is never negative.
        self.jitter.round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_packet_is_the_baseline() {
        let mut j = Jitter::default();
        assert_eq!(j.jitter_ns(), 0);
        j.on_packet(1_000, 50_000);
        assert_eq!(j.jitter_ns(), 0);
    }

    #[test]
    fn constant_transit_has_no_jitter() {
        let mut j = Jitter::default();
        for i in 0..1_000u64 {
            // Receiver clock 5 s behind the sender's: transit is "negative", still constant.
            j.on_packet(5_000_000_000 + i * 1_000_000, i * 1_000_000 + 40_000);
        }
        assert_eq!(j.jitter_ns(), 0);
    }

    #[test]
    fn one_step_is_a_sixteenth() {
        let mut j = Jitter::default();
        j.on_packet(0, 100);
        j.on_packet(1_000, 1_100 + 1_600);
        assert_eq!(j.jitter_ns(), 100);
    }

    #[test]
    fn alternating_transit_converges_to_the_delta() {
        const D: u64 = 10_000;
        let mut j = Jitter::default();
        let mut previous = 0;
        for i in 0..300u64 {
            let send = i * 1_000_000;
            let transit = 50_000 + if i % 2 == 0 { 0 } else { D };
            j.on_packet(send, send + transit);
            let now = j.jitter_ns();
            assert!(
                now >= previous && now <= D,
                "rises monotonically toward D: {now}"
            );
            previous = now;
        }
        assert_eq!(j.jitter_ns(), D);
    }

    #[test]
    fn wrapping_clocks_and_extreme_values_do_not_panic() {
        let mut j = Jitter::default();
        j.on_packet(u64::MAX, 0);
        j.on_packet(0, u64::MAX);
        j.on_packet(u64::MAX / 2, 3);
        assert!(j.jitter_ns() > 0);
    }
}
