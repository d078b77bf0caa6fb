//! The socket options a client asks for on the data streams of a test, at both ends (iperf3's
//! `-w`, `-C`, `-M`, `-N`, `-S`, `--fq-rate`, `--dont-fragment`), and what each end's kernel
//! made of them.

use serde::{Deserialize, Serialize};

/// Socket options for every data stream of a test, set by the client on its end and by the
/// agent on its end ([`crate::TestSpec::socket`]). Every field is absent from the JSON when
/// unset, and the whole struct when nothing is asked, so a client that asks nothing speaks as
/// before; an agent that predates it ignores it, and the client learns that from the report's
/// missing [`AppliedSocketOptions`] ([`crate::AgentReport::socket`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SocketOptions {
    /// `-w`: `SO_SNDBUF` and `SO_RCVBUF`, bytes asked for (Linux grants twice this, capped by
    /// `net.core.wmem_max` / `rmem_max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_bytes: Option<u32>,
    /// `-C`: `TCP_CONGESTION`, the congestion control algorithm (TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    /// `-M`: `TCP_MAXSEG`, bytes (TCP): the client sets it before it connects, so its SYN
    /// holds the agent's segments to it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mss_bytes: Option<u32>,
    /// `-N`: `TCP_NODELAY` on the data streams (TCP; latency streams always have it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_delay: bool,
    /// `--fq-rate` (and TCP `-b`): `SO_MAX_PACING_RATE` on each stream an end sends on, bits
    /// per second (the kernel takes bytes per second: this divided by 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing_bits_per_second: Option<u64>,
    /// `-S`, `--dscp`, `--ecn`: the whole TOS byte (DSCP in the upper six bits, ECN in the
    /// lower two), `IP_TOS` for IPv4 and `IPV6_TCLASS` for IPv6. TCP sockets keep the kernel's
    /// own ECN bits (`net.ipv4.tcp_ecn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tos: Option<u8>,
    /// `--dont-fragment`: UDP datagrams carry DF (`IP_MTU_DISCOVER` = `IP_PMTUDISC_DO`,
    /// `IPV6_DONTFRAG`), and one larger than the path MTU fails instead of being fragmented.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dont_fragment: bool,
    /// `-Z`: TCP senders send with `MSG_ZEROCOPY` (`SO_ZEROCOPY` set on the stream): the kernel
    /// sends from the sender's pages instead of copying them, and says afterwards whether it
    /// had to copy after all ([`ZerocopyStats`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub zerocopy: bool,
}

/// What a UDP receiver with `--ecn` found in the ECN field (RFC 3168) of the datagrams it
/// received, read from each datagram's `IP_TOS` / `IPV6_TCLASS` control message: `ce` marks are
/// congestion a router signalled; `not_ect` datagrams lost the sender's ECT marking on the way
/// (bleached).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EcnCounts {
    /// Datagrams that arrived Not-ECT (`00`).
    pub not_ect: u64,
    /// Datagrams that arrived ECT(1) (`01`).
    pub ect1: u64,
    /// Datagrams that arrived ECT(0) (`10`).
    pub ect0: u64,
    /// Datagrams that arrived CE (`11`): congestion experienced.
    pub ce: u64,
}

impl EcnCounts {
    /// Counts `n` datagrams that arrived with TOS byte `tos`.
    #[inline]
    pub fn count(&mut self, tos: u8, n: u64) {
        match tos & 0b11 {
            0b00 => self.not_ect += n,
            0b01 => self.ect1 += n,
            0b10 => self.ect0 += n,
            _ => self.ce += n,
        }
    }

    /// Adds another stream's counts.
    pub fn add(&mut self, other: &Self) {
        self.not_ect += other.not_ect;
        self.ect1 += other.ect1;
        self.ect0 += other.ect0;
        self.ce += other.ce;
    }
}

/// What a TCP sender's `MSG_ZEROCOPY` sends (`-Z`) came to, from the kernel's completion
/// notifications (`SO_EE_ORIGIN_ZEROCOPY` on the error queue). A send the kernel completed
/// without `SO_EE_CODE_ZEROCOPY_COPIED` went out from the sender's pages; one with it was
/// copied after all (loopback, veth and any device without scatter-gather copy every one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ZerocopyStats {
    /// Send calls made with `MSG_ZEROCOPY` that moved data.
    pub sends: u64,
    /// Of those, the ones whose completion the sender read before it ended (the rest were
    /// still held by the kernel).
    pub completed: u64,
    /// Of the completed, the ones the kernel copied after all (`SO_EE_CODE_ZEROCOPY_COPIED`).
    pub copied: u64,
}

impl ZerocopyStats {
    /// Adds another stream's counts.
    pub fn add(&mut self, other: &Self) {
        self.sends += other.sends;
        self.completed += other.completed;
        self.copied += other.copied;
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl SocketOptions {
    /// Whether nothing is asked (the field is then absent from the JSON).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// `--ecn`: whether the TOS byte asks for an ECT marking (its low two bits set), which a UDP
    /// receiver then counts as it arrives.
    pub fn ecn_asked(&self) -> bool {
        self.tos.is_some_and(|t| t & 0b11 != 0)
    }

    /// The fixed binary encoding the proof of a [`crate::auth::Request::Test`] covers: one tag
    /// byte per option that is set, then its value (big-endian integers; the congestion
    /// control's length as a big-endian u64, then its bytes), in field order.
    pub fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(w) = self.window_bytes {
            out.push(b'w');
            out.extend_from_slice(&w.to_be_bytes());
        }
        if let Some(c) = &self.congestion {
            out.push(b'C');
            out.extend_from_slice(&(c.len() as u64).to_be_bytes());
            out.extend_from_slice(c.as_bytes());
        }
        if let Some(m) = self.mss_bytes {
            out.push(b'M');
            out.extend_from_slice(&m.to_be_bytes());
        }
        if self.no_delay {
            out.push(b'N');
        }
        if let Some(r) = self.pacing_bits_per_second {
            out.push(b'b');
            out.extend_from_slice(&r.to_be_bytes());
        }
        if let Some(t) = self.tos {
            out.push(b'S');
            out.push(t);
        }
        if self.dont_fragment {
            out.push(b'D');
        }
        if self.zerocopy {
            out.push(b'Z');
        }
        out
    }
}

/// What one end's kernel made of [`SocketOptions`], read back with `getsockopt` from its first
/// data stream (every stream of an end is set alike). `null` where the end does not say: an
/// option not asked for and not read, or a platform that cannot read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AppliedSocketOptions {
    /// `SO_SNDBUF` as read back, bytes (Linux: twice what was asked, capped by `wmem_max`).
    #[serde(default)]
    pub send_buffer_bytes: Option<u64>,
    /// `SO_RCVBUF` as read back, bytes (Linux: twice what was asked, capped by `rmem_max`).
    #[serde(default)]
    pub recv_buffer_bytes: Option<u64>,
    /// `TCP_CONGESTION` as read back (TCP).
    #[serde(default)]
    pub congestion: Option<String>,
    /// `TCP_MAXSEG` as read back on the connected stream: the MSS it sends with, bytes (TCP).
    #[serde(default)]
    pub mss_bytes: Option<u32>,
    /// `TCP_NODELAY` as read back (TCP).
    #[serde(default)]
    pub no_delay: Option<bool>,
    /// `SO_MAX_PACING_RATE` as set on the streams this end sends on, bits per second.
    #[serde(default)]
    pub pacing_bits_per_second: Option<u64>,
    /// The TOS byte (`IP_TOS` or `IPV6_TCLASS`) as read back.
    #[serde(default)]
    pub tos: Option<u8>,
    /// Whether UDP datagrams leave with DF set, as read back.
    #[serde(default)]
    pub dont_fragment: Option<bool>,
    /// `-Z`: whether `SO_ZEROCOPY` is set on the streams, as read back (TCP, when asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zerocopy: Option<bool>,
    /// TCP with `--ecn`: this host's `net.ipv4.tcp_ecn` (0 off, 1 asked on outgoing
    /// connections, 2 only when the peer asks), which decides TCP's ECN bits instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_ecn_sysctl: Option<u8>,
    /// Why an option is not in force though the kernel did not refuse it (pacing could not be
    /// set); `null` when all are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_asked_is_absent_and_encodes_to_nothing() {
        let none = SocketOptions::default();
        assert!(none.is_default());
        assert_eq!(serde_json::to_string(&none).unwrap(), "{}");
        assert!(none.canonical().is_empty());
    }

    #[test]
    fn options_round_trip_through_json() {
        let o = SocketOptions {
            window_bytes: Some(4 << 20),
            congestion: Some("bbr".into()),
            mss_bytes: Some(1_200),
            no_delay: true,
            pacing_bits_per_second: Some(100_000_000),
            tos: Some(0xb8 | 1),
            dont_fragment: true,
            zerocopy: true,
        };
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<SocketOptions>(&json).unwrap(), o);
        let a = AppliedSocketOptions {
            send_buffer_bytes: Some(8 << 20),
            tcp_ecn_sysctl: Some(2),
            ..AppliedSocketOptions::default()
        };
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            serde_json::from_str::<AppliedSocketOptions>(&json).unwrap(),
            a
        );
    }

    #[test]
    fn every_option_changes_the_canonical_encoding() {
        let base = SocketOptions::default();
        let variants = [
            SocketOptions {
                window_bytes: Some(1),
                ..base.clone()
            },
            SocketOptions {
                congestion: Some("x".into()),
                ..base.clone()
            },
            SocketOptions {
                mss_bytes: Some(1),
                ..base.clone()
            },
            SocketOptions {
                no_delay: true,
                ..base.clone()
            },
            SocketOptions {
                pacing_bits_per_second: Some(1),
                ..base.clone()
            },
            SocketOptions {
                tos: Some(1),
                ..base.clone()
            },
            SocketOptions {
                dont_fragment: true,
                ..base.clone()
            },
            SocketOptions {
                zerocopy: true,
                ..base.clone()
            },
        ];
        let mut seen = vec![base.canonical()];
        for v in &variants {
            let c = v.canonical();
            assert!(!seen.contains(&c), "{v:?} encodes like another");
            seen.push(c);
        }
        // Length-prefixed: no congestion name can spell another option after it.
        let a = SocketOptions {
            congestion: Some("bbrN".into()),
            ..base.clone()
        };
        let b = SocketOptions {
            congestion: Some("bbr".into()),
            no_delay: true,
            ..base
        };
        assert_ne!(a.canonical(), b.canonical());
    }
}
