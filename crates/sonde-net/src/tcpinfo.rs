//! The kernel's view of one TCP connection (`TCP_INFO`, `tcp(7)`): smoothed RTT and its
//! variance, congestion window, retransmits, pacing and delivery rate, sampled per stream and
//! interval.
//!
//! The kernel's `struct tcp_info` has grown over the years (pacing rate in Linux 3.15, delivery
//! rate in 4.9, bytes sent in 4.19, windows in 5.4...) and `getsockopt` returns only as much as
//! the running kernel has. So the struct is read as bytes and each field is decoded only if the
//! kernel's answer reaches it: a field the kernel did not fill is `None`, never 0.
//!
//! ```no_run
//! use std::net::TcpStream;
//! use sonde_net::tcpinfo::TcpInfoSample;
//!
//! let stream = TcpStream::connect("127.0.0.1:5300")?;
//! let info = TcpInfoSample::read(&stream)?;
//! if let Some(srtt_ns) = info.srtt_ns {
//!     println!("smoothed RTT {srtt_ns} ns, cwnd {:?} segments", info.snd_cwnd_segments);
//! }
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::net::TcpStream;

use crate::sys;

/// Room for `struct tcp_info` as of Linux 6.x (248 bytes) and some growth; the kernel copies
/// at most this much.
const BUF_LEN: usize = 320;

/// Byte offsets into `struct tcp_info` (`include/uapi/linux/tcp.h`). Fields are native-endian.
mod off {
    pub(super) const CA_STATE: usize = 1;
    /// `tcpi_delivery_rate_app_limited` is bit 0 of this byte (Linux 4.9).
    pub(super) const APP_LIMITED_BYTE: usize = 7;
    pub(super) const RTO: usize = 8;
    pub(super) const SND_MSS: usize = 16;
    pub(super) const RCV_MSS: usize = 20;
    pub(super) const UNACKED: usize = 24;
    pub(super) const LOST: usize = 32;
    pub(super) const RETRANS: usize = 36;
    pub(super) const PMTU: usize = 60;
    pub(super) const RTT: usize = 68;
    pub(super) const RTTVAR: usize = 72;
    pub(super) const SND_SSTHRESH: usize = 76;
    pub(super) const SND_CWND: usize = 80;
    pub(super) const REORDERING: usize = 88;
    pub(super) const RCV_RTT: usize = 92;
    pub(super) const RCV_SPACE: usize = 96;
    pub(super) const TOTAL_RETRANS: usize = 100;
    pub(super) const PACING_RATE: usize = 104;
    pub(super) const BYTES_ACKED: usize = 120;
    pub(super) const BYTES_RECEIVED: usize = 128;
    pub(super) const SEGS_OUT: usize = 136;
    pub(super) const SEGS_IN: usize = 140;
    pub(super) const NOTSENT_BYTES: usize = 144;
    pub(super) const MIN_RTT: usize = 148;
    pub(super) const DELIVERY_RATE: usize = 160;
    pub(super) const BUSY_TIME: usize = 168;
    pub(super) const RWND_LIMITED: usize = 176;
    pub(super) const SNDBUF_LIMITED: usize = 184;
    pub(super) const DELIVERED: usize = 192;
    pub(super) const DELIVERED_CE: usize = 196;
    pub(super) const BYTES_SENT: usize = 200;
    pub(super) const BYTES_RETRANS: usize = 208;
    pub(super) const DSACK_DUPS: usize = 216;
    pub(super) const REORD_SEEN: usize = 220;
    pub(super) const SND_WND: usize = 228;
    pub(super) const RCV_WND: usize = 232;
    /// The end of `tcpi_delivery_rate`: the app-limited bit came with it.
    pub(super) const DELIVERY_RATE_END: usize = DELIVERY_RATE + 8;
}

/// The kernel's "no value" for `tcpi_snd_ssthresh` (`TCP_INFINITE_SSTHRESH`): slow start has not
/// ended yet.
const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;

/// One reading of `TCP_INFO`. Times are converted from the kernel's microseconds to ns.
///
/// Every field is `None` when the running kernel's `tcp_info` is too short to hold it, and a few
/// also when the kernel has no value yet (each says so).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfoSample {
    /// The kernel's smoothed RTT (`tcpi_rtt`).
    pub srtt_ns: Option<u64>,
    /// The RTT's mean deviation (`tcpi_rttvar`).
    pub rttvar_ns: Option<u64>,
    /// The smallest RTT seen in the kernel's window (`tcpi_min_rtt`, Linux 4.6); `None` too
    /// before the first RTT sample.
    pub min_rtt_ns: Option<u64>,
    /// The retransmission timeout (`tcpi_rto`).
    pub rto_ns: Option<u64>,
    /// The receiver's RTT estimate (`tcpi_rcv_rtt`); `None` too before the receiver has one.
    pub rcv_rtt_ns: Option<u64>,
    /// Congestion window (`tcpi_snd_cwnd`).
    pub snd_cwnd_segments: Option<u32>,
    /// Slow-start threshold (`tcpi_snd_ssthresh`); `None` too while it is still infinite (the
    /// connection has not left slow start).
    pub snd_ssthresh_segments: Option<u32>,
    /// Sender's maximum segment size (`tcpi_snd_mss`).
    pub snd_mss_bytes: Option<u32>,
    /// Receiver's maximum segment size (`tcpi_rcv_mss`).
    pub rcv_mss_bytes: Option<u32>,
    /// Path MTU (`tcpi_pmtu`).
    pub pmtu_bytes: Option<u32>,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked_segments: Option<u32>,
    /// Segments the sender currently takes to be lost (`tcpi_lost`).
    pub lost_segments: Option<u32>,
    /// Segments retransmitted and not yet acknowledged (`tcpi_retrans`).
    pub retrans_segments: Option<u32>,
    /// Retransmitted segments over the connection's life (`tcpi_total_retrans`).
    pub total_retrans_segments: Option<u32>,
    /// Reordering the sender allows for, in segments (`tcpi_reordering`).
    pub reordering_segments: Option<u32>,
    /// Reordering events seen (`tcpi_reord_seen`, Linux 4.19).
    pub reorder_events: Option<u32>,
    /// Duplicate segments the receiver reported with D-SACK (`tcpi_dsack_dups`, Linux 4.19).
    pub dsack_dups_segments: Option<u32>,
    /// Congestion-avoidance state (`tcpi_ca_state`: 0 open, 1 disorder, 2 CWR, 3 recovery,
    /// 4 loss).
    pub ca_state: Option<u8>,
    /// Pacing rate (`tcpi_pacing_rate`, Linux 3.15); `None` too when unlimited.
    pub pacing_rate_bytes_per_second: Option<u64>,
    /// Most recent delivery rate (`tcpi_delivery_rate`, Linux 4.9).
    pub delivery_rate_bytes_per_second: Option<u64>,
    /// Whether that delivery rate was limited by the application rather than the network
    /// (`tcpi_delivery_rate_app_limited`, Linux 4.9).
    pub delivery_rate_app_limited: Option<bool>,
    /// Bytes acknowledged by the peer (`tcpi_bytes_acked`, Linux 4.1).
    pub bytes_acked: Option<u64>,
    /// Bytes received (`tcpi_bytes_received`, Linux 4.1).
    pub bytes_received: Option<u64>,
    /// Bytes sent, retransmissions included (`tcpi_bytes_sent`, Linux 4.19).
    pub bytes_sent: Option<u64>,
    /// Bytes retransmitted (`tcpi_bytes_retrans`, Linux 4.19).
    pub bytes_retrans: Option<u64>,
    /// Segments sent (`tcpi_segs_out`, Linux 4.2).
    pub segs_out: Option<u32>,
    /// Segments received (`tcpi_segs_in`, Linux 4.2).
    pub segs_in: Option<u32>,
    /// Segments delivered, retransmissions included (`tcpi_delivered`, Linux 4.18).
    pub delivered_segments: Option<u32>,
    /// Of those, the ones the peer said arrived CE-marked (`tcpi_delivered_ce`, Linux 4.18).
    pub delivered_ce_segments: Option<u32>,
    /// Bytes written by the application and not yet sent (`tcpi_notsent_bytes`, Linux 4.6).
    pub notsent_bytes: Option<u32>,
    /// Receive-buffer space the receiver is tuned for (`tcpi_rcv_space`).
    pub rcv_space_bytes: Option<u32>,
    /// Time the connection had data to send (`tcpi_busy_time`, Linux 4.10).
    pub busy_ns: Option<u64>,
    /// Of that, time limited by the peer's receive window (`tcpi_rwnd_limited`, Linux 4.10).
    pub rwnd_limited_ns: Option<u64>,
    /// Of that, time limited by this side's send buffer (`tcpi_sndbuf_limited`, Linux 4.10).
    pub sndbuf_limited_ns: Option<u64>,
    /// The peer's advertised receive window (`tcpi_snd_wnd`, Linux 5.4).
    pub snd_wnd_bytes: Option<u32>,
    /// This side's advertised receive window (`tcpi_rcv_wnd`, Linux 6.2).
    pub rcv_wnd_bytes: Option<u32>,
}

impl TcpInfoSample {
    /// Reads `TCP_INFO` of `stream`. Fails where the platform has no `TCP_INFO`
    /// ([`io::ErrorKind::Unsupported`]) or the socket is not TCP.
    pub fn read(stream: &TcpStream) -> io::Result<Self> {
        let mut buf = [0u8; BUF_LEN];
        let len = sys::tcp_info_bytes(stream, &mut buf)?;
        Ok(Self::from_kernel_bytes(&buf[..len.min(BUF_LEN)]))
    }

    /// The figures that travel in a session's `Interval`, `SenderDone` and `Report` messages,
    /// for stream `stream`.
    pub fn stats(&self, stream: u32) -> sonde_wire::TcpInfoStats {
        sonde_wire::TcpInfoStats {
            stream,
            srtt_ns: self.srtt_ns,
            rttvar_ns: self.rttvar_ns,
            min_rtt_ns: self.min_rtt_ns,
            cwnd: self.snd_cwnd_segments,
            ssthresh: self.snd_ssthresh_segments,
            mss: self.snd_mss_bytes,
            retrans: self.total_retrans_segments.map(u64::from),
            unacked: self.unacked_segments,
            pacing_rate: self.pacing_rate_bytes_per_second,
            delivery_rate: self.delivery_rate_bytes_per_second,
            app_limited: self.delivery_rate_app_limited,
            notsent_bytes: self.notsent_bytes,
            busy_ns: self.busy_ns,
            rwnd_limited_ns: self.rwnd_limited_ns,
            sndbuf_limited_ns: self.sndbuf_limited_ns,
            delivered_ce: self.delivered_ce_segments,
        }
    }

    /// Decodes `struct tcp_info` as the kernel returned it: `bytes` is exactly what it wrote, in
    /// native byte order. Fields past its end are `None`.
    pub fn from_kernel_bytes(bytes: &[u8]) -> Self {
        let r = Fields(bytes);
        let us = |offset| r.u32(offset).map(|v| u64::from(v) * 1_000);
        let us64 = |offset| r.u64(offset).map(|v| v.saturating_mul(1_000));
        Self {
            srtt_ns: us(off::RTT),
            rttvar_ns: us(off::RTTVAR),
            min_rtt_ns: r
                .u32(off::MIN_RTT)
                .filter(|&v| v != u32::MAX)
                .map(|v| u64::from(v) * 1_000),
            rto_ns: us(off::RTO),
            rcv_rtt_ns: us(off::RCV_RTT).filter(|&v| v != 0),
            snd_cwnd_segments: r.u32(off::SND_CWND),
            snd_ssthresh_segments: r.u32(off::SND_SSTHRESH).filter(|&v| v < INFINITE_SSTHRESH),
            snd_mss_bytes: r.u32(off::SND_MSS),
            rcv_mss_bytes: r.u32(off::RCV_MSS),
            pmtu_bytes: r.u32(off::PMTU),
            unacked_segments: r.u32(off::UNACKED),
            lost_segments: r.u32(off::LOST),
            retrans_segments: r.u32(off::RETRANS),
            total_retrans_segments: r.u32(off::TOTAL_RETRANS),
            reordering_segments: r.u32(off::REORDERING),
            reorder_events: r.u32(off::REORD_SEEN),
            dsack_dups_segments: r.u32(off::DSACK_DUPS),
            ca_state: bytes.get(off::CA_STATE).copied(),
            pacing_rate_bytes_per_second: r.u64(off::PACING_RATE).filter(|&v| v != u64::MAX),
            delivery_rate_bytes_per_second: r.u64(off::DELIVERY_RATE),
            delivery_rate_app_limited: (bytes.len() >= off::DELIVERY_RATE_END)
                .then(|| bytes[off::APP_LIMITED_BYTE] & 1 != 0),
            bytes_acked: r.u64(off::BYTES_ACKED),
            bytes_received: r.u64(off::BYTES_RECEIVED),
            bytes_sent: r.u64(off::BYTES_SENT),
            bytes_retrans: r.u64(off::BYTES_RETRANS),
            segs_out: r.u32(off::SEGS_OUT),
            segs_in: r.u32(off::SEGS_IN),
            delivered_segments: r.u32(off::DELIVERED),
            delivered_ce_segments: r.u32(off::DELIVERED_CE),
            notsent_bytes: r.u32(off::NOTSENT_BYTES),
            rcv_space_bytes: r.u32(off::RCV_SPACE),
            busy_ns: us64(off::BUSY_TIME),
            rwnd_limited_ns: us64(off::RWND_LIMITED),
            sndbuf_limited_ns: us64(off::SNDBUF_LIMITED),
            snd_wnd_bytes: r.u32(off::SND_WND),
            rcv_wnd_bytes: r.u32(off::RCV_WND),
        }
    }
}

/// Native-endian reads that are `None` past the end of what the kernel wrote.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u32(&self, offset: usize) -> Option<u32> {
        let bytes = self.0.get(offset..offset + 4)?;
        Some(u32::from_ne_bytes(bytes.try_into().ok()?))
    }
    fn u64(&self, offset: usize) -> Option<u64> {
        let bytes = self.0.get(offset..offset + 8)?;
        Some(u64::from_ne_bytes(bytes.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel answer of `len` bytes in which every u32 field holds a distinct value.
    fn kernel_bytes(len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let mut put32 = |offset: usize, v: u32| {
            if let Some(b) = buf.get_mut(offset..offset + 4) {
                b.copy_from_slice(&v.to_ne_bytes());
            }
        };
        put32(off::RTO, 204_000);
        put32(off::SND_MSS, 1_448);
        put32(off::RCV_MSS, 536);
        put32(off::PMTU, 1_500);
        put32(off::RTT, 250);
        put32(off::RTTVAR, 40);
        put32(off::SND_SSTHRESH, INFINITE_SSTHRESH);
        put32(off::SND_CWND, 10);
        put32(off::RCV_RTT, 0);
        put32(off::TOTAL_RETRANS, 3);
        put32(off::MIN_RTT, 180);
        put32(off::SND_WND, 65_535);
        let mut put64 = |offset: usize, v: u64| {
            if let Some(b) = buf.get_mut(offset..offset + 8) {
                b.copy_from_slice(&v.to_ne_bytes());
            }
        };
        put64(off::PACING_RATE, 125_000_000);
        put64(off::BYTES_ACKED, 1 << 20);
        put64(off::DELIVERY_RATE, 100_000_000);
        put64(off::BUSY_TIME, 2_000_000);
        if let Some(b) = buf.get_mut(off::APP_LIMITED_BYTE) {
            *b = 1;
        }
        if let Some(b) = buf.get_mut(off::CA_STATE) {
            *b = 3;
        }
        buf
    }

    #[test]
    fn a_current_kernels_answer_decodes_in_full() {
        let info = TcpInfoSample::from_kernel_bytes(&kernel_bytes(248));
        assert_eq!(info.srtt_ns, Some(250_000));
        assert_eq!(info.rttvar_ns, Some(40_000));
        assert_eq!(info.min_rtt_ns, Some(180_000));
        assert_eq!(info.rto_ns, Some(204_000_000));
        assert_eq!(info.snd_mss_bytes, Some(1_448));
        assert_eq!(info.rcv_mss_bytes, Some(536));
        assert_eq!(info.pmtu_bytes, Some(1_500));
        assert_eq!(info.snd_cwnd_segments, Some(10));
        assert_eq!(info.total_retrans_segments, Some(3));
        assert_eq!(info.ca_state, Some(3));
        assert_eq!(info.pacing_rate_bytes_per_second, Some(125_000_000));
        assert_eq!(info.bytes_acked, Some(1 << 20));
        assert_eq!(info.delivery_rate_bytes_per_second, Some(100_000_000));
        assert_eq!(info.delivery_rate_app_limited, Some(true));
        assert_eq!(info.busy_ns, Some(2_000_000_000));
        assert_eq!(info.snd_wnd_bytes, Some(65_535));
        assert_eq!(info.rcv_wnd_bytes, Some(0));
        // "No value yet" is not reported as a value.
        assert_eq!(info.snd_ssthresh_segments, None);
        assert_eq!(info.rcv_rtt_ns, None);
    }

    #[test]
    fn an_older_kernels_shorter_answer_leaves_the_newer_fields_unknown() {
        // Linux 3.x: the struct ended at tcpi_total_retrans (104 bytes).
        let old = TcpInfoSample::from_kernel_bytes(&kernel_bytes(104));
        assert_eq!(old.srtt_ns, Some(250_000));
        assert_eq!(old.total_retrans_segments, Some(3));
        assert_eq!(old.pacing_rate_bytes_per_second, None);
        assert_eq!(old.bytes_acked, None);
        assert_eq!(old.min_rtt_ns, None);
        assert_eq!(old.delivery_rate_bytes_per_second, None);
        // The app-limited bit's byte exists in every version, but means something only from
        // the version that added the delivery rate.
        assert_eq!(old.delivery_rate_app_limited, None);
        // Linux 4.9: delivery rate, but no busy time yet.
        let v4_9 = TcpInfoSample::from_kernel_bytes(&kernel_bytes(168));
        assert_eq!(v4_9.delivery_rate_bytes_per_second, Some(100_000_000));
        assert_eq!(v4_9.delivery_rate_app_limited, Some(true));
        assert_eq!(v4_9.busy_ns, None);
        // A field cut in half by the end is unknown, not read short.
        let cut = TcpInfoSample::from_kernel_bytes(&kernel_bytes(off::RTT + 2));
        assert_eq!(cut.srtt_ns, None);
        assert_eq!(cut.pmtu_bytes, Some(1_500));
        assert_eq!(
            TcpInfoSample::from_kernel_bytes(&[]),
            TcpInfoSample::default()
        );
    }

    #[test]
    fn the_wire_figures_are_the_samples_unchanged_and_unknown_stays_unknown() {
        let info = TcpInfoSample::from_kernel_bytes(&kernel_bytes(248));
        let wire = info.stats(3);
        assert_eq!(wire.stream, 3);
        assert_eq!(wire.srtt_ns, Some(250_000));
        assert_eq!(wire.rttvar_ns, Some(40_000));
        assert_eq!(wire.min_rtt_ns, Some(180_000));
        assert_eq!(wire.cwnd, Some(10));
        assert_eq!(wire.mss, Some(1_448));
        assert_eq!(wire.retrans, Some(3));
        assert_eq!(wire.pacing_rate, Some(125_000_000));
        assert_eq!(wire.delivery_rate, Some(100_000_000));
        assert_eq!(wire.app_limited, Some(true));
        assert_eq!(wire.busy_ns, Some(2_000_000_000));
        assert_eq!(wire.ssthresh, None);
        let old = TcpInfoSample::from_kernel_bytes(&kernel_bytes(104)).stats(0);
        assert_eq!(old.pacing_rate, None);
        assert_eq!(old.busy_ns, None);
        assert_eq!(
            TcpInfoSample::default().stats(1),
            sonde_wire::TcpInfoStats {
                stream: 1,
                ..sonde_wire::TcpInfoStats::default()
            }
        );
    }

    #[test]
    fn unlimited_pacing_and_no_min_rtt_are_unknown() {
        let mut buf = kernel_bytes(248);
        buf[off::PACING_RATE..off::PACING_RATE + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
        buf[off::MIN_RTT..off::MIN_RTT + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let info = TcpInfoSample::from_kernel_bytes(&buf);
        assert_eq!(info.pacing_rate_bytes_per_second, None);
        assert_eq!(info.min_rtt_ns, None);
    }

    /// The offsets above against glibc's `struct tcp_info` as the libc crate declares it.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn offsets_match_the_c_struct() {
        use std::mem::offset_of;
        type T = libc::tcp_info;
        let pairs = [
            (off::CA_STATE, offset_of!(T, tcpi_ca_state)),
            (off::RTO, offset_of!(T, tcpi_rto)),
            (off::SND_MSS, offset_of!(T, tcpi_snd_mss)),
            (off::RCV_MSS, offset_of!(T, tcpi_rcv_mss)),
            (off::UNACKED, offset_of!(T, tcpi_unacked)),
            (off::LOST, offset_of!(T, tcpi_lost)),
            (off::RETRANS, offset_of!(T, tcpi_retrans)),
            (off::PMTU, offset_of!(T, tcpi_pmtu)),
            (off::RTT, offset_of!(T, tcpi_rtt)),
            (off::RTTVAR, offset_of!(T, tcpi_rttvar)),
            (off::SND_SSTHRESH, offset_of!(T, tcpi_snd_ssthresh)),
            (off::SND_CWND, offset_of!(T, tcpi_snd_cwnd)),
            (off::REORDERING, offset_of!(T, tcpi_reordering)),
            (off::RCV_RTT, offset_of!(T, tcpi_rcv_rtt)),
            (off::RCV_SPACE, offset_of!(T, tcpi_rcv_space)),
            (off::TOTAL_RETRANS, offset_of!(T, tcpi_total_retrans)),
            (off::PACING_RATE, offset_of!(T, tcpi_pacing_rate)),
            (off::BYTES_ACKED, offset_of!(T, tcpi_bytes_acked)),
            (off::BYTES_RECEIVED, offset_of!(T, tcpi_bytes_received)),
            (off::SEGS_OUT, offset_of!(T, tcpi_segs_out)),
            (off::SEGS_IN, offset_of!(T, tcpi_segs_in)),
            (off::NOTSENT_BYTES, offset_of!(T, tcpi_notsent_bytes)),
            (off::MIN_RTT, offset_of!(T, tcpi_min_rtt)),
            (off::DELIVERY_RATE, offset_of!(T, tcpi_delivery_rate)),
            (off::BUSY_TIME, offset_of!(T, tcpi_busy_time)),
            (off::RWND_LIMITED, offset_of!(T, tcpi_rwnd_limited)),
            (off::SNDBUF_LIMITED, offset_of!(T, tcpi_sndbuf_limited)),
            (off::DELIVERED, offset_of!(T, tcpi_delivered)),
            (off::DELIVERED_CE, offset_of!(T, tcpi_delivered_ce)),
            (off::BYTES_SENT, offset_of!(T, tcpi_bytes_sent)),
            (off::BYTES_RETRANS, offset_of!(T, tcpi_bytes_retrans)),
            (off::DSACK_DUPS, offset_of!(T, tcpi_dsack_dups)),
            (off::REORD_SEEN, offset_of!(T, tcpi_reord_seen)),
            (off::SND_WND, offset_of!(T, tcpi_snd_wnd)),
            (off::RCV_WND, offset_of!(T, tcpi_rcv_wnd)),
        ];
        for (i, (ours, c)) in pairs.into_iter().enumerate() {
            assert_eq!(ours, c, "field {i}");
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_loopback_transfer_shows_in_tcp_info() {
        use std::io::{Read, Write};
        use std::net::{Ipv4Addr, TcpListener};
        use std::time::Duration;

        const BYTES: usize = 4 << 20;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            let mut got = 0;
            while got < BYTES {
                match receiver.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            (got, TcpInfoSample::read(&receiver).unwrap())
        });
        (&sender).write_all(&vec![7u8; BYTES]).unwrap();
        let (got, rx) = reader.join().unwrap();
        assert_eq!(got, BYTES);
        let tx = TcpInfoSample::read(&sender).unwrap();

        assert!(tx.srtt_ns.is_some_and(|v| v > 0), "{tx:?}");
        assert!(tx.rttvar_ns.is_some());
        assert!(tx.snd_cwnd_segments.is_some_and(|v| v > 0));
        assert!(tx.snd_mss_bytes.is_some_and(|v| v > 0 && v < 65_536));
        assert!(tx.total_retrans_segments.is_some());
        // This kernel has the newer fields, and the counters agree with what was moved. (The
        // last ACK may still be on its way, so bytes_acked is only bounded above; the +1 is
        // the SYN, which takes a sequence number.)
        assert!(
            tx.bytes_acked
                .is_some_and(|v| v > 0 && v <= BYTES as u64 + 1),
            "{tx:?}"
        );
        assert!(tx.bytes_sent.is_some_and(|v| v >= BYTES as u64), "{tx:?}");
        assert!(tx.segs_out.is_some_and(|v| v > 0));
        assert!(tx.delivery_rate_bytes_per_second.is_some_and(|v| v > 0));
        // Kept in jiffies by the kernel: a transfer this short may read 0, but it is there.
        assert!(tx.busy_ns.is_some());
        assert!(
            rx.bytes_received.is_some_and(|v| v >= BYTES as u64),
            "{rx:?}"
        );
        assert!(rx.segs_in.is_some_and(|v| v > 0));
    }
}
