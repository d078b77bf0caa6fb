//! Shared-secret authentication of a session: the computations over bytes, nothing else.
//!
//! An agent started with a secret admits only clients that prove they know it, without the
//! secret ever crossing the wire (the exchange, message by message, is in `crates/README.md`):
//!
//! * the client's `Hello` carries a fresh random client [`Nonce`], the agent's `Welcome` a fresh
//!   random agent [`Nonce`] and whether a secret is required;
//! * the client's request (`Start` or `Describe`) carries a [`Proof`]: HMAC-SHA256 keyed with the
//!   secret over a domain-separation label, both nonces and the request itself ([`Request`]), so
//!   a proof fits one connection and one request only (a replay meets another agent nonce);
//! * both ends derive a [`SessionKey`] from the secret and both nonces, and the client's UDP join
//!   datagrams carry a MAC under it ([`SessionKey::join_mac`]), so a stranger who saw a token
//!   cannot attach a flow.
//!
//! The MACs are the `hmac` and `sha2` crates'; checks compare in constant time
//! (`Mac::verify_slice`, `Mac::verify_truncated_left`). Nonces come from the caller (this crate
//! has no entropy source, as it has no clock).
//!
//! ```
//! use sonde_wire::auth::{Nonce, Request, Secret};
//! let secret = Secret::new(b"correct horse".to_vec()).unwrap();
//! let (agent, client) = (Nonce([1; 32]), Nonce([2; 32]));
//! let proof = secret.proof(&agent, &client, &Request::Describe);
//! assert!(secret.check_proof(&agent, &client, &Request::Describe, &proof));
//! let other = Nonce([3; 32]);
//! assert!(!secret.check_proof(&other, &client, &Request::Describe, &proof), "a replay fails");
//! ```

use hmac::{Hmac, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;

use crate::TestSpec;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// Bytes in a [`Nonce`].
pub const NONCE_LEN: usize = 32;
/// Bytes in a [`Proof`] (a full HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Bytes of the MAC a UDP join carries (HMAC-SHA256 truncated to its first 128 bits, as
/// RFC 2104 section 5 allows).
pub const JOIN_MAC_LEN: usize = 16;

/// Domain-separation labels: one per use of the secret, so a MAC made for one purpose is never
/// valid for another.
const PROOF_LABEL: &[u8] = b"sonde v2 client proof\0";
const KEY_LABEL: &[u8] = b"sonde v2 session key\0";
const JOIN_LABEL: &[u8] = b"sonde v2 udp join\0";

/// The secret an agent and its clients share. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why a secret cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// Nothing is left once the line end is removed.
    #[error("the secret is empty")]
    Empty,
}

impl Secret {
    /// A secret from its bytes; an empty one is refused.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretError> {
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self(bytes))
    }

    /// A secret as a file (or an environment variable) holds it: one trailing line end (`\n` or
    /// `\r\n`) is not part of it, everything else is.
    pub fn from_text(mut bytes: Vec<u8>) -> Result<Self, SecretError> {
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Self::new(bytes)
    }

    pub(crate) fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
        <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }

    fn proof_mac(&self, agent: &Nonce, client: &Nonce, request: &Request<'_>) -> HmacSha256 {
        let mut mac = self.mac();
        mac.update(PROOF_LABEL);
        mac.update(&agent.0);
        mac.update(&client.0);
        request.feed(&mut mac);
        mac
    }

    /// The client's proof for `request` on the connection where the agent said `agent` and the
    /// client `client`.
    pub fn proof(&self, agent: &Nonce, client: &Nonce, request: &Request<'_>) -> Proof {
        Proof(
            self.proof_mac(agent, client, request)
                .finalize()
                .into_bytes()
                .into(),
        )
    }

    /// Whether `proof` is this secret's for `request` and these nonces (constant time).
    pub fn check_proof(
        &self,
        agent: &Nonce,
        client: &Nonce,
        request: &Request<'_>,
        proof: &Proof,
    ) -> bool {
        self.proof_mac(agent, client, request)
            .verify_slice(&proof.0)
            .is_ok()
    }

    /// The key of the session opened with these nonces: keys the MAC of its UDP joins.
    pub fn session_key(&self, agent: &Nonce, client: &Nonce) -> SessionKey {
        let mut mac = self.mac();
        mac.update(KEY_LABEL);
        mac.update(&agent.0);
        mac.update(&client.0);
        SessionKey(mac.finalize().into_bytes().into())
    }
}

/// A session's key, derived from the secret and both nonces ([`Secret::session_key`]).
#[derive(Clone)]
pub struct SessionKey([u8; 32]);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    fn join(&self, signed: &[u8]) -> HmacSha256 {
        let mut mac =
            <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        mac.update(JOIN_LABEL);
        mac.update(signed);
        mac
    }

    /// The MAC of a UDP join's first bytes (`UdpJoin::signed`).
    pub fn join_mac(&self, signed: &[u8]) -> [u8; JOIN_MAC_LEN] {
        let full: [u8; 32] = self.join(signed).finalize().into_bytes().into();
        let mut out = [0u8; JOIN_MAC_LEN];
        out.copy_from_slice(&full[..JOIN_MAC_LEN]);
        out
    }

    /// Whether `mac` is this key's for `signed` (constant time).
    pub fn check_join_mac(&self, signed: &[u8], mac: &[u8; JOIN_MAC_LEN]) -> bool {
        self.join(signed).verify_truncated_left(mac).is_ok()
    }
}

/// What a client asks for, as its proof covers it: a proof for one request is no proof for
/// another.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// Run this test (`Start`).
    Test(&'a TestSpec),
    /// Describe the agent's host (`Describe`, for `sonde conf`).
    Describe,
    /// Run this test against this target as a helper (`Help`, for `--from`).
    Help(&'a str, &'a crate::HelperTest),
}

impl Request<'_> {
    /// Feeds a fixed-layout encoding of the request (big-endian integers, one tag byte per
    /// enum), independent of JSON's spelling.
    fn feed(&self, mac: &mut HmacSha256) {
        match self {
            Self::Describe => mac.update(b"describe"),
            Self::Test(s) => {
                mac.update(b"test");
                mac.update(&[s.kind as u8, s.protocol as u8, s.direction as u8]);
                mac.update(&s.streams.to_be_bytes());
                mac.update(&s.msg_size.to_be_bytes());
                mac.update(&s.bitrate_per_stream.to_be_bytes());
                mac.update(&s.duration_ms.to_be_bytes());
                mac.update(&s.interval_ms.to_be_bytes());
                // Only when set, so a default request's proof is what it was before the field.
                if s.read_size != 0 {
                    mac.update(b"read");
                    mac.update(&s.read_size.to_be_bytes());
                }
                // Likewise only when set: the socket options' canonical encoding, length-prefixed.
                if !s.socket.is_default() {
                    let socket = s.socket.canonical();
                    mac.update(b"sock");
                    mac.update(&(socket.len() as u64).to_be_bytes());
                    mac.update(&socket);
                }
                if s.omit_ms != 0 {
                    mac.update(b"omit");
                    mac.update(&s.omit_ms.to_be_bytes());
                }
                if s.skip_rx_copy {
                    mac.update(b"trunc");
                }
                if s.bytes != 0 {
                    mac.update(b"bytes");
                    mac.update(&s.bytes.to_be_bytes());
                }
                if s.blocks != 0 {
                    mac.update(b"blocks");
                    mac.update(&s.blocks.to_be_bytes());
                }
                if let Some(rr) = &s.request_response {
                    mac.update(b"rr");
                    mac.update(&rr.depth.to_be_bytes());
                    mac.update(&rr.response_size.to_be_bytes());
                    mac.update(&rr.threads.to_be_bytes());
                }
            }
            Self::Help(target, test) => {
                mac.update(b"help");
                // Length-prefixed, so no target and test can spell another pair's bytes.
                mac.update(&(target.len() as u64).to_be_bytes());
                mac.update(target.as_bytes());
                Self::Test(&test.spec).feed(mac);
                mac.update(&[match test.gso {
                    None => 0,
                    Some(false) => 1,
                    Some(true) => 2,
                }]);
                mac.update(&test.warmup_ms.to_be_bytes());
            }
        }
    }
}

/// A fresh random value one side contributes to a connection; hex on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nonce(pub [u8; NONCE_LEN]);

/// A client's proof that it knows the secret ([`Secret::proof`]); hex on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof(pub [u8; PROOF_LEN]);

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])
        .map(char::from)
        .collect()
}

fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

macro_rules! hex_serde {
    ($t:ident, $n:expr, $what:literal) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&to_hex(&self.0))
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                from_hex::<{ $n }>(&text).map(Self).ok_or_else(|| {
                    serde::de::Error::custom(concat!($what, ": expected ", $n, " bytes in hex"))
                })
            }
        }
    };
}

hex_serde!(Nonce, 32, "nonce");
hex_serde!(Proof, 32, "proof");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Direction, Protocol, TestKind};

    fn spec() -> TestSpec {
        TestSpec {
            kind: TestKind::Throughput,
            protocol: Protocol::Tcp,
            direction: Direction::Reverse,
            streams: 2,
            msg_size: 131_072,
            bitrate_per_stream: 0,
            duration_ms: 10_000,
            interval_ms: 1_000,
            read_size: 0,
            socket: crate::SocketOptions::default(),
            omit_ms: 0,
            skip_rx_copy: false,
            bytes: 0,
            blocks: 0,
            request_response: None,
        }
    }

    #[test]
    fn a_proof_binds_the_secret_both_nonces_and_the_request() {
        let secret = Secret::new(b"s3cret".to_vec()).unwrap();
        let (a, c) = (Nonce([7; 32]), Nonce([9; 32]));
        let s = spec();
        let p = secret.proof(&a, &c, &Request::Test(&s));
        assert!(secret.check_proof(&a, &c, &Request::Test(&s), &p));
        let wrong = Secret::new(b"s3cres".to_vec()).unwrap();
        assert!(!wrong.check_proof(&a, &c, &Request::Test(&s), &p));
        assert!(!secret.check_proof(&Nonce([8; 32]), &c, &Request::Test(&s), &p));
        assert!(!secret.check_proof(&a, &Nonce([8; 32]), &Request::Test(&s), &p));
        assert!(!secret.check_proof(&a, &c, &Request::Describe, &p));
        let longer = TestSpec {
            duration_ms: 300_000,
            ..s.clone()
        };
        assert!(!secret.check_proof(&a, &c, &Request::Test(&longer), &p));
        // The read size is bound too, once set; a default request's proof is as before it.
        let one_byte_reads = TestSpec {
            read_size: 1,
            ..s.clone()
        };
        assert!(!secret.check_proof(&a, &c, &Request::Test(&one_byte_reads), &p));
        let q = secret.proof(&a, &c, &Request::Test(&one_byte_reads));
        assert!(secret.check_proof(&a, &c, &Request::Test(&one_byte_reads), &q));
        let two_byte_reads = TestSpec {
            read_size: 2,
            ..s.clone()
        };
        assert!(!secret.check_proof(&a, &c, &Request::Test(&two_byte_reads), &q));
        // -O is covered too, and only when set.
        let omitting = TestSpec {
            omit_ms: 2_000,
            ..s.clone()
        };
        let q = secret.proof(&a, &c, &Request::Test(&omitting));
        assert!(secret.check_proof(&a, &c, &Request::Test(&omitting), &q));
        let other = TestSpec {
            omit_ms: 3_000,
            ..s.clone()
        };
        assert!(!secret.check_proof(&a, &c, &Request::Test(&other), &q));
        assert!(!secret.check_proof(&a, &c, &Request::Test(&s), &q));
        let trunc = TestSpec {
            skip_rx_copy: true,
            ..s.clone()
        };
        assert!(!secret.check_proof(&a, &c, &Request::Test(&trunc), &q));
        let mut flipped = p;
        flipped.0[31] ^= 1;
        assert!(!secret.check_proof(&a, &c, &Request::Test(&s), &flipped));
    }

    #[test]
    fn a_proof_binds_the_socket_options_and_is_unchanged_without_them() {
        let secret = Secret::new(b"s3cret".to_vec()).unwrap();
        let (a, c) = (Nonce([7; 32]), Nonce([9; 32]));
        let plain = spec();
        // The proof of a spec without socket options, as a client before them computed it
        // (the layout above, with nothing appended): an old client's proof still checks.
        let mut old = secret.mac();
        old.update(PROOF_LABEL);
        old.update(&a.0);
        old.update(&c.0);
        old.update(b"test");
        old.update(&[
            plain.kind as u8,
            plain.protocol as u8,
            plain.direction as u8,
        ]);
        old.update(&plain.streams.to_be_bytes());
        old.update(&plain.msg_size.to_be_bytes());
        old.update(&plain.bitrate_per_stream.to_be_bytes());
        old.update(&plain.duration_ms.to_be_bytes());
        old.update(&plain.interval_ms.to_be_bytes());
        let old = Proof(old.finalize().into_bytes().into());
        assert!(secret.check_proof(&a, &c, &Request::Test(&plain), &old));

        let ef = TestSpec {
            socket: crate::SocketOptions {
                tos: Some(0xb8),
                ..crate::SocketOptions::default()
            },
            ..plain.clone()
        };
        let p = secret.proof(&a, &c, &Request::Test(&ef));
        assert!(secret.check_proof(&a, &c, &Request::Test(&ef), &p));
        assert!(!secret.check_proof(&a, &c, &Request::Test(&plain), &p));
        let cs1 = TestSpec {
            socket: crate::SocketOptions {
                tos: Some(0x20),
                ..crate::SocketOptions::default()
            },
            ..plain
        };
        assert!(!secret.check_proof(&a, &c, &Request::Test(&cs1), &p));
    }

    #[test]
    fn a_helper_proof_binds_the_target_and_the_test() {
        let secret = Secret::new(b"s3cret".to_vec()).unwrap();
        let (a, c) = (Nonce([7; 32]), Nonce([9; 32]));
        let test = crate::HelperTest {
            spec: spec(),
            gso: Some(false),
            warmup_ms: 0,
        };
        let p = secret.proof(&a, &c, &Request::Help("198.18.0.2", &test));
        assert!(secret.check_proof(&a, &c, &Request::Help("198.18.0.2", &test), &p));
        assert!(!secret.check_proof(&a, &c, &Request::Help("198.18.0.3", &test), &p));
        assert!(!secret.check_proof(&a, &c, &Request::Test(&test.spec), &p));
        let gso_on = crate::HelperTest {
            gso: Some(true),
            ..test.clone()
        };
        assert!(!secret.check_proof(&a, &c, &Request::Help("198.18.0.2", &gso_on), &p));
        assert!(!secret.check_proof(&Nonce([8; 32]), &c, &Request::Help("198.18.0.2", &test), &p));
    }

    #[test]
    fn known_answer_for_hmac_sha256() {
        // RFC 4231 test case 2, through the same construction (label and nonces empty aside):
        // guards against a wrong hash or key handling in the dependency wiring.
        let mut mac = Secret::new(b"Jefe".to_vec()).unwrap().mac();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            to_hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn join_macs_depend_on_the_session_key() {
        let secret = Secret::new(b"s3cret".to_vec()).unwrap();
        let k1 = secret.session_key(&Nonce([1; 32]), &Nonce([2; 32]));
        let k2 = secret.session_key(&Nonce([1; 32]), &Nonce([3; 32]));
        let m = k1.join_mac(b"SNDJ join bytes!");
        assert!(k1.check_join_mac(b"SNDJ join bytes!", &m));
        assert!(!k2.check_join_mac(b"SNDJ join bytes!", &m));
        assert!(!k1.check_join_mac(b"SNDJ join bytes?", &m));
    }

    #[test]
    fn nonces_and_proofs_are_hex_in_json() {
        let n = Nonce([0xab; 32]);
        let json = serde_json::to_string(&n).unwrap();
        assert_eq!(json, format!("\"{}\"", "ab".repeat(32)));
        assert_eq!(serde_json::from_str::<Nonce>(&json).unwrap(), n);
        assert!(serde_json::from_str::<Nonce>("\"abcd\"").is_err());
        assert!(serde_json::from_str::<Proof>(&format!("\"{}\"", "zz".repeat(32))).is_err());
    }

    #[test]
    fn a_secret_loses_one_line_end_only() {
        let s = Secret::from_text(b"abc\r\n".to_vec()).unwrap();
        assert_eq!(s.0, b"abc");
        let s = Secret::from_text(b" abc \n\n".to_vec()).unwrap();
        assert_eq!(s.0, b" abc \n");
        assert_eq!(
            Secret::from_text(b"\n".to_vec()).unwrap_err(),
            SecretError::Empty
        );
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }
}
