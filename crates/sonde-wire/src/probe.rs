//! Mesh probes: stateless, authenticated round trips answered by an agent's own port (UDP, and
//! a fresh TCP connection per probe), with no session (docs/protocols/sonde.md, "Mesh probes").
//!
//! A probe carries the sender's mesh name, a sequence number, the sender's wall-clock send time
//! (Unix nanoseconds), a random nonce and padding up to the size the sender chose, then a MAC:
//! HMAC-SHA256 keyed with the mesh's shared secret over a label and every byte before it,
//! truncated to [`PROBE_MAC_LEN`] bytes (RFC 2104 section 5). The agent answers a probe whose MAC
//! is valid, whose time is within its window and whose (sender, nonce) it has not seen
//! ([`ReplayGuard`]) with a reply of exactly the probe's length: the same header (sequence,
//! time and nonce echoed, no name) and a MAC under another label over the reply's bytes and the
//! sender's name, so the sender knows the answer came from an agent of the mesh, and for its own
//! probe. Anything else gets no answer: the port cannot reflect or amplify.
//!
//! ```
//! use sonde_wire::auth::Secret;
//! use sonde_wire::probe::{Probe, ProbeReply, MAX_PROBE_LEN};
//! let secret = Secret::new(b"mesh".to_vec()).unwrap();
//! let probe = Probe { seq: 7, sent_unix_ns: 1_700_000_000_000_000_000, nonce: 42, sender: "a" };
//! let mut buf = [0u8; MAX_PROBE_LEN];
//! let n = probe.encode(&secret, 64, &mut buf).unwrap();
//! let got = Probe::decode(&secret, &buf[..n]).unwrap();
//! assert_eq!(got, probe);
//! let mut reply = [0u8; MAX_PROBE_LEN];
//! let m = ProbeReply::answer(&secret, &got, n, &mut reply).unwrap();
//! assert_eq!(m, n, "a reply is never larger than its probe");
//! let r = ProbeReply::decode(&secret, "a", &reply[..m]).unwrap();
//! assert_eq!((r.seq, r.nonce), (7, 42));
//! ```

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use hmac::Mac;

use crate::auth::{HmacSha256, Secret};

/// The first four bytes of every probe and reply.
pub const PROBE_MAGIC: [u8; 4] = *b"SNDP";
/// The probe format's version (byte 4).
pub const PROBE_VERSION: u8 = 1;
/// Bytes before the sender's name: magic, version, kind, total length (u16), sequence (u64),
/// send time (u64), nonce (u64), name length (u8).
pub const PROBE_HEADER_LEN: usize = 33;
/// Bytes of the MAC at the end of a probe or reply (HMAC-SHA256 truncated to 128 bits).
pub const PROBE_MAC_LEN: usize = 16;
/// The largest probe (and so reply): fits one IPv6 datagram on a 1,500-byte link.
pub const MAX_PROBE_LEN: usize = 1_400;
/// The longest sender name a probe carries.
pub const MAX_SENDER_LEN: usize = 255;

const KIND_PROBE: u8 = 1;
const KIND_REPLY: u8 = 2;
const PROBE_LABEL: &[u8] = b"sonde v1 mesh probe\0";
const REPLY_LABEL: &[u8] = b"sonde v1 mesh probe reply\0";

/// The smallest probe from a sender whose name is `sender_len` bytes long.
pub const fn min_probe_len(sender_len: usize) -> usize {
    PROBE_HEADER_LEN + sender_len + PROBE_MAC_LEN
}

/// Why bytes are not a probe (or reply) to answer (or take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// Not a probe of this version at all (magic, version, kind, length or name): junk.
    #[error("not a mesh probe")]
    Malformed,
    /// Well formed, but its MAC is not the shared secret's.
    #[error("mesh probe with a wrong MAC")]
    BadMac,
    /// The buffer given to encode into is too small, the size asked for is above
    /// [`MAX_PROBE_LEN`], or the sender's name is longer than [`MAX_SENDER_LEN`].
    #[error("probe does not fit")]
    TooLarge,
}

/// One probe, as sent and as the agent reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe<'a> {
    /// The sender's sequence number for this target and protocol.
    pub seq: u64,
    /// The sender's wall clock at sending, nanoseconds since the Unix epoch (the agent's replay
    /// window is checked against it).
    pub sent_unix_ns: u64,
    /// Random, never repeated by a sender: with the name, what the agent's replay check keys on.
    pub nonce: u64,
    /// The sender's mesh name (its `source` label).
    pub sender: &'a str,
}

fn header(b: &mut [u8], kind: u8, len: usize, seq: u64, sent: u64, nonce: u64, name_len: u8) {
    b[..4].copy_from_slice(&PROBE_MAGIC);
    b[4] = PROBE_VERSION;
    b[5] = kind;
    // `len` is at most MAX_PROBE_LEN: checked by every caller.
    b[6..8].copy_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    b[16..24].copy_from_slice(&sent.to_be_bytes());
    b[24..32].copy_from_slice(&nonce.to_be_bytes());
    b[32] = name_len;
}

/// The header fields of `b` after its kind and length were checked against `kind`.
fn read_header(b: &[u8], kind: u8) -> Result<(u64, u64, u64, usize), ProbeError> {
    if b.len() < PROBE_HEADER_LEN + PROBE_MAC_LEN
        || b.len() > MAX_PROBE_LEN
        || b[..4] != PROBE_MAGIC
        || b[4] != PROBE_VERSION
        || b[5] != kind
        || usize::from(u16::from_be_bytes([b[6], b[7]])) != b.len()
    {
        return Err(ProbeError::Malformed);
    }
    let u = |r: std::ops::Range<usize>| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[r]);
        u64::from_be_bytes(a)
    };
    Ok((u(8..16), u(16..24), u(24..32), usize::from(b[32])))
}

fn probe_mac(secret: &Secret, signed: &[u8]) -> HmacSha256 {
    let mut mac = secret.mac();
    mac.update(PROBE_LABEL);
    mac.update(signed);
    mac
}

fn reply_mac(secret: &Secret, signed: &[u8], sender: &str) -> HmacSha256 {
    let mut mac = secret.mac();
    mac.update(REPLY_LABEL);
    mac.update(signed);
    mac.update(sender.as_bytes());
    mac
}

fn put_mac(mac: HmacSha256, out: &mut [u8]) {
    let full: [u8; 32] = mac.finalize().into_bytes().into();
    out.copy_from_slice(&full[..PROBE_MAC_LEN]);
}

impl<'a> Probe<'a> {
    /// Encodes the probe into `out`, padded with zeros to `len` bytes (or to the smallest
    /// probe that holds the name, if larger), MAC last; returns its length.
    pub fn encode(&self, secret: &Secret, len: usize, out: &mut [u8]) -> Result<usize, ProbeError> {
        let name = self.sender.as_bytes();
        let name_len = u8::try_from(name.len()).map_err(|_| ProbeError::TooLarge)?;
        let len = len.max(min_probe_len(name.len()));
        if len > MAX_PROBE_LEN || len > out.len() {
            return Err(ProbeError::TooLarge);
        }
        let out = &mut out[..len];
        header(
            out,
            KIND_PROBE,
            len,
            self.seq,
            self.sent_unix_ns,
            self.nonce,
            name_len,
        );
        let end = PROBE_HEADER_LEN + name.len();
        out[PROBE_HEADER_LEN..end].copy_from_slice(name);
        out[end..len - PROBE_MAC_LEN].fill(0);
        let (signed, mac) = out.split_at_mut(len - PROBE_MAC_LEN);
        put_mac(probe_mac(secret, signed), mac);
        Ok(len)
    }

    /// A probe from bytes, its MAC checked (in constant time).
    pub fn decode(secret: &Secret, b: &'a [u8]) -> Result<Self, ProbeError> {
        let probe = Self::parse(b)?;
        let (signed, mac) = b.split_at(b.len() - PROBE_MAC_LEN);
        probe_mac(secret, signed)
            .verify_truncated_left(mac)
            .map_err(|_| ProbeError::BadMac)?;
        Ok(probe)
    }

    /// The probe's fields without checking its MAC (for the fuzz target; never answer one).
    pub fn parse(b: &'a [u8]) -> Result<Self, ProbeError> {
        let (seq, sent_unix_ns, nonce, name_len) = read_header(b, KIND_PROBE)?;
        let end = PROBE_HEADER_LEN + name_len;
        if end + PROBE_MAC_LEN > b.len() || name_len == 0 {
            return Err(ProbeError::Malformed);
        }
        let sender =
            std::str::from_utf8(&b[PROBE_HEADER_LEN..end]).map_err(|_| ProbeError::Malformed)?;
        Ok(Self {
            seq,
            sent_unix_ns,
            nonce,
            sender,
        })
    }
}

/// An agent's answer to a probe: the probe's sequence, send time and nonce, echoed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReply {
    /// The probe's sequence number.
    pub seq: u64,
    /// The probe's send time, as the probe said it.
    pub sent_unix_ns: u64,
    /// The probe's nonce.
    pub nonce: u64,
}

impl ProbeReply {
    /// Encodes the answer to `probe` (a valid probe of `probe_len` bytes) into `out`: exactly
    /// `probe_len` bytes, never more, so the port amplifies nothing; returns its length.
    pub fn answer(
        secret: &Secret,
        probe: &Probe<'_>,
        probe_len: usize,
        out: &mut [u8],
    ) -> Result<usize, ProbeError> {
        let len = probe_len;
        if !(PROBE_HEADER_LEN + PROBE_MAC_LEN..=MAX_PROBE_LEN).contains(&len) || len > out.len() {
            return Err(ProbeError::TooLarge);
        }
        let out = &mut out[..len];
        header(
            out,
            KIND_REPLY,
            len,
            probe.seq,
            probe.sent_unix_ns,
            probe.nonce,
            0,
        );
        out[PROBE_HEADER_LEN..len - PROBE_MAC_LEN].fill(0);
        let (signed, mac) = out.split_at_mut(len - PROBE_MAC_LEN);
        put_mac(reply_mac(secret, signed, probe.sender), mac);
        Ok(len)
    }

    /// A reply to a probe of `sender`'s, its MAC checked (in constant time).
    pub fn decode(secret: &Secret, sender: &str, b: &[u8]) -> Result<Self, ProbeError> {
        let reply = Self::parse(b)?;
        let (signed, mac) = b.split_at(b.len() - PROBE_MAC_LEN);
        reply_mac(secret, signed, sender)
            .verify_truncated_left(mac)
            .map_err(|_| ProbeError::BadMac)?;
        Ok(reply)
    }

    /// The reply's fields without checking its MAC (for the fuzz target).
    pub fn parse(b: &[u8]) -> Result<Self, ProbeError> {
        let (seq, sent_unix_ns, nonce, name_len) = read_header(b, KIND_REPLY)?;
        if name_len != 0 {
            return Err(ProbeError::Malformed);
        }
        Ok(Self {
            seq,
            sent_unix_ns,
            nonce,
        })
    }
}

/// The length a TCP probe's reader needs once it has the first 8 bytes: `None` when they are
/// not a probe's (so the connection is something else).
pub fn probe_len_from_prefix(prefix: &[u8; 8]) -> Option<usize> {
    let len = usize::from(u16::from_be_bytes([prefix[6], prefix[7]]));
    (prefix[..4] == PROBE_MAGIC
        && prefix[4] == PROBE_VERSION
        && prefix[5] == KIND_PROBE
        && (PROBE_HEADER_LEN + 1 + PROBE_MAC_LEN..=MAX_PROBE_LEN).contains(&len))
    .then_some(len)
}

/// What an agent's [`ReplayGuard`] says of a probe whose MAC was valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Never seen, within the window: answer it.
    Fresh,
    /// Its send time is [`ReplayGuard::window_ns`] or more away from the agent's clock.
    Stale,
    /// This (sender, nonce) was answered before.
    Replayed,
    /// The guard holds its maximum of recent nonces: not answered (nor remembered).
    Full,
}

/// Remembers the (sender, nonce) of every probe answered in the last two windows or more, so a
/// captured probe sent again is not answered again. No clock: the caller says what time it is.
///
/// A probe is answered only while `|now - sent| < window`; a nonce is kept in three
/// generations that each turn over after at least one window, so it is remembered at least two
/// windows after it was answered: until after its send time is out of the window for good.
#[derive(Debug)]
pub struct ReplayGuard {
    window_ns: u64,
    capacity: usize,
    generations: [HashSet<u128>; 3],
    generation_start: u64,
}

impl ReplayGuard {
    /// A guard accepting send times within `window_ns` of the agent's clock, remembering at
    /// most `capacity` nonces per generation.
    pub fn new(window_ns: u64, capacity: usize) -> Self {
        Self {
            window_ns: window_ns.max(1),
            capacity,
            generations: Default::default(),
            generation_start: 0,
        }
    }

    /// The window, nanoseconds.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Checks a probe (its MAC already valid) at `now_unix_ns`, remembering it when fresh.
    pub fn check(&mut self, probe: &Probe<'_>, now_unix_ns: u64) -> Freshness {
        if now_unix_ns.abs_diff(probe.sent_unix_ns) >= self.window_ns {
            return Freshness::Stale;
        }
        // A clock that steps back turns nothing over: nonces are then kept longer, never less.
        if now_unix_ns.saturating_sub(self.generation_start) >= self.window_ns {
            let [a, b, c] = &mut self.generations;
            std::mem::swap(c, b);
            std::mem::swap(b, a);
            a.clear();
            self.generation_start = now_unix_ns;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        probe.sender.hash(&mut h);
        let key = (u128::from(h.finish()) << 64) | u128::from(probe.nonce);
        if self.generations.iter().any(|g| g.contains(&key)) {
            return Freshness::Replayed;
        }
        if self.generations[0].len() >= self.capacity {
            return Freshness::Full;
        }
        self.generations[0].insert(key);
        Freshness::Fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_800_000_000_000_000_000;

    fn secret() -> Secret {
        Secret::new(b"mesh secret".to_vec()).unwrap()
    }

    fn probe(nonce: u64) -> Probe<'static> {
        Probe {
            seq: 3,
            sent_unix_ns: T0,
            nonce,
            sender: "node-a",
        }
    }

    #[test]
    fn layout_and_round_trip() {
        let mut b = [0u8; MAX_PROBE_LEN];
        let n = probe(9).encode(&secret(), 0, &mut b).unwrap();
        assert_eq!(n, min_probe_len(6));
        assert_eq!(&b[..8], b"SNDP\x01\x01\x00\x37");
        assert_eq!(b[32], 6);
        assert_eq!(&b[33..39], b"node-a");
        assert_eq!(Probe::decode(&secret(), &b[..n]).unwrap(), probe(9));
        assert_eq!(probe_len_from_prefix(b[..8].try_into().unwrap()), Some(n));
        // Padded to the size asked for.
        let n = probe(9).encode(&secret(), 200, &mut b).unwrap();
        assert_eq!(n, 200);
        assert_eq!(Probe::decode(&secret(), &b[..n]).unwrap(), probe(9));
    }

    #[test]
    fn a_wrong_secret_or_any_flipped_bit_is_refused() {
        let mut b = [0u8; MAX_PROBE_LEN];
        let n = probe(1).encode(&secret(), 80, &mut b).unwrap();
        let other = Secret::new(b"other".to_vec()).unwrap();
        assert_eq!(
            Probe::decode(&other, &b[..n]),
            Err(ProbeError::BadMac),
            "another mesh's secret"
        );
        for i in 0..n {
            for bit in 0..8 {
                let mut c = b;
                c[i] ^= 1 << bit;
                assert!(
                    Probe::decode(&secret(), &c[..n]).is_err(),
                    "byte {i} bit {bit}"
                );
            }
        }
        // Cut short or lengthened: the length field no longer matches.
        assert_eq!(
            Probe::decode(&secret(), &b[..n - 1]),
            Err(ProbeError::Malformed)
        );
    }

    #[test]
    fn a_reply_is_bound_to_its_sender_and_is_no_probe() {
        let mut b = [0u8; MAX_PROBE_LEN];
        let n = probe(5).encode(&secret(), 0, &mut b).unwrap();
        let p = Probe::decode(&secret(), &b[..n]).unwrap();
        let mut r = [0u8; MAX_PROBE_LEN];
        let m = ProbeReply::answer(&secret(), &p, n, &mut r).unwrap();
        let reply = ProbeReply::decode(&secret(), "node-a", &r[..m]).unwrap();
        assert_eq!((reply.seq, reply.sent_unix_ns, reply.nonce), (3, T0, 5));
        assert_eq!(
            ProbeReply::decode(&secret(), "node-b", &r[..m]),
            Err(ProbeError::BadMac),
            "another sender's reply"
        );
        // A reply sent to an agent is not a probe, and a probe is not a reply.
        assert!(Probe::decode(&secret(), &r[..m]).is_err());
        assert!(ProbeReply::decode(&secret(), "node-a", &b[..n]).is_err());
    }

    #[test]
    fn replays_and_stale_probes_are_refused() {
        let w = 30_000_000_000;
        let mut g = ReplayGuard::new(w, 1_000);
        assert_eq!(g.check(&probe(1), T0), Freshness::Fresh);
        assert_eq!(g.check(&probe(1), T0 + 1), Freshness::Replayed);
        assert_eq!(g.check(&probe(2), T0 + 1), Freshness::Fresh);
        // Another sender may use the same nonce.
        let b = Probe {
            sender: "node-b",
            ..probe(1)
        };
        assert_eq!(g.check(&b, T0 + 2), Freshness::Fresh);
        // Outside the window either way.
        assert_eq!(g.check(&probe(3), T0 + w), Freshness::Stale);
        assert_eq!(g.check(&probe(3), T0 - w), Freshness::Stale);
        // Remembered for as long as its send time is in the window, whatever the generations
        // did meanwhile (probes of later times turn them over).
        for k in 1..=4u64 {
            let later = Probe {
                sent_unix_ns: T0 + k * w / 2,
                ..probe(100 + k)
            };
            assert_eq!(g.check(&later, T0 + k * w / 2), Freshness::Fresh);
            let replay_at = (T0 + w - 1).max(T0 + k * w / 2);
            let expect = if replay_at - T0 < w {
                Freshness::Replayed
            } else {
                Freshness::Stale
            };
            assert_eq!(g.check(&probe(1), replay_at), expect, "k = {k}");
        }
    }

    #[test]
    fn a_full_guard_answers_nothing_new() {
        let mut g = ReplayGuard::new(1_000_000_000, 2);
        assert_eq!(g.check(&probe(1), T0), Freshness::Fresh);
        assert_eq!(g.check(&probe(2), T0), Freshness::Fresh);
        assert_eq!(g.check(&probe(3), T0), Freshness::Full);
        assert_eq!(g.check(&probe(1), T0), Freshness::Replayed);
    }

    proptest! {
        /// Every valid probe round-trips, and its reply is exactly as long (never larger).
        #[test]
        fn round_trip_and_no_amplification(
            seq: u64, sent: u64, nonce: u64,
            sender in "[a-z0-9.:-]{1,255}",
            len in 0usize..=MAX_PROBE_LEN,
        ) {
            let s = secret();
            let p = Probe { seq, sent_unix_ns: sent, nonce, sender: &sender };
            let mut b = [0u8; MAX_PROBE_LEN];
            let n = p.encode(&s, len, &mut b).unwrap();
            prop_assert!(n >= len);
            let got = Probe::decode(&s, &b[..n]).unwrap();
            prop_assert_eq!(got, p);
            let mut r = [0u8; MAX_PROBE_LEN];
            let m = ProbeReply::answer(&s, &got, n, &mut r).unwrap();
            prop_assert!(m <= n);
            let reply = ProbeReply::decode(&s, &sender, &r[..m]).unwrap();
            prop_assert_eq!((reply.seq, reply.sent_unix_ns, reply.nonce), (seq, sent, nonce));
        }

        /// Decoding never panics on any bytes.
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let _ = Probe::decode(&secret(), &data);
            let _ = ProbeReply::decode(&secret(), "a", &data);
            crate::fuzzing::mesh_probe(&data);
        }
    }
}
