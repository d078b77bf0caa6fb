//! Which agent took a data channel, or why none did: what makes a test work through a load
//! balancer with several agents behind one address.
//!
//! A balancer (haproxy in TCP mode, a cloud network load balancer, an nftables `numgen` DNAT)
//! picks an agent for each TCP connection and each UDP flow on its own. A session's control
//! connection reaches one agent; its data channels may reach another, which has no such
//! session. Each agent has an [`AgentId`], named in `Accepted` ([`AgentTag`]); a data channel
//! that asks for it gets an answer: a TCP join a [`JoinAnswer`], a UDP join to an agent without
//! its session an [`UdpElsewhere`]. The client then opens the channel again from a new source
//! port, which the balancer places anew, until it reaches the session's agent, and it knows
//! (and says) that the address it tested spreads connections over several agents.
//!
//! Layouts (big-endian):
//!
//! ```text
//! JoinAnswer (TCP, 16 bytes, after a DataJoin with the "answer" flag)
//!   0..4   "SNDK"
//!   4..6   protocol version
//!   6      outcome: 0 joined, 1 no such session here, 2 from another address than the
//!          control connection, 3 of the other protocol, 4 the session takes no more
//!          channels, 5 no such stream, 6 the stream has joined already
//!   7      reserved, 0
//!   8..16  the answering agent's id
//!
//! UdpElsewhere (UDP, 32 bytes, the size of the join it answers: no amplification)
//!   0..4   "SNDN"
//!   4..6   protocol version
//!   6..8   flow index, as in the join
//!   8..16  the session's token, as in the join
//!   16..24 the answering agent's id
//!   24     outcome, as above (1 or 2)
//!   25..32 zeros
//! ```

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Error, Token, PROTOCOL_VERSION, UDP_JOIN_LEN};

/// The magic of a [`JoinAnswer`].
pub const JOIN_ANSWER_MAGIC: [u8; 4] = *b"SNDK";
/// Length of a [`JoinAnswer`] on the wire.
pub const JOIN_ANSWER_LEN: usize = 16;
/// The magic of an [`UdpElsewhere`].
pub const UDP_ELSEWHERE_MAGIC: [u8; 4] = *b"SNDN";

/// One agent process: a random 64-bit number drawn when it starts, so two agents behind one
/// balancer (or one address) tell themselves apart. Written as 16 hex digits in JSON (a
/// JavaScript reader keeps all 64 bits of a string, not of a number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AgentId(pub u64);

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Serialize for AgentId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AgentId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        u64::from_str_radix(&s, 16)
            .map(AgentId)
            .map_err(|_| serde::de::Error::custom(format!("not an agent id: {s:?}")))
    }
}

/// The agent that admitted a session, as `Accepted` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTag {
    /// The agent process.
    pub id: AgentId,
    /// The address and port the control connection reached, as the agent saw it: behind a
    /// balancer or a destination NAT, the agent's own address rather than the one the client
    /// dialled.
    pub addr: String,
}

/// What became of a data channel's join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinOutcome {
    /// The session took the channel.
    Joined,
    /// This agent has no session with that token: a balancer sent the channel to another
    /// agent than the control connection's.
    NoSuchSession,
    /// The channel came from another address than the session's control connection (a source
    /// NAT that gives each connection its own address).
    OtherAddress,
    /// A TCP channel for a UDP session, or the reverse.
    OtherProtocol,
    /// The session takes no more channels (it started, or gave up waiting).
    Closed,
    /// A stream or flow the session does not have.
    OutOfRange,
    /// That stream or flow has joined already.
    Taken,
    /// An outcome this build does not know (a later version's).
    Other(u8),
}

impl JoinOutcome {
    fn code(self) -> u8 {
        match self {
            Self::Joined => 0,
            Self::NoSuchSession => 1,
            Self::OtherAddress => 2,
            Self::OtherProtocol => 3,
            Self::Closed => 4,
            Self::OutOfRange => 5,
            Self::Taken => 6,
            Self::Other(c) => c,
        }
    }

    fn from_code(c: u8) -> Self {
        match c {
            0 => Self::Joined,
            1 => Self::NoSuchSession,
            2 => Self::OtherAddress,
            3 => Self::OtherProtocol,
            4 => Self::Closed,
            5 => Self::OutOfRange,
            6 => Self::Taken,
            c => Self::Other(c),
        }
    }
}

/// The agent's answer to a TCP [`crate::DataJoin`] that asked for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinAnswer {
    /// What became of the join.
    pub outcome: JoinOutcome,
    /// The agent that answers.
    pub agent: AgentId,
}

impl JoinAnswer {
    /// Writes the answer.
    pub fn encode(&self) -> [u8; JOIN_ANSWER_LEN] {
        let mut b = [0u8; JOIN_ANSWER_LEN];
        b[..4].copy_from_slice(&JOIN_ANSWER_MAGIC);
        b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        b[6] = self.outcome.code();
        b[8..16].copy_from_slice(&self.agent.0.to_be_bytes());
        b
    }

    /// Reads an answer.
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        let b = crate::data::fixed::<JOIN_ANSWER_LEN>(b)?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != JOIN_ANSWER_MAGIC {
            return Err(Error::BadMagic(magic));
        }
        Ok(Self {
            outcome: JoinOutcome::from_code(b[6]),
            agent: AgentId(crate::data::be_u64(&b[8..16])),
        })
    }
}

/// An agent's answer to a UDP join it cannot take: it has no session with that token (a
/// balancer sent the flow to another agent than the control connection's), or the session's
/// control connection came from another address. Sent from the agent's shared port, as long
/// as the join and never longer, so the port cannot amplify a forged source's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpElsewhere {
    /// Flow index, as in the join.
    pub flow: u16,
    /// The token, as in the join.
    pub token: Token,
    /// The agent that answers.
    pub agent: AgentId,
    /// Why: [`JoinOutcome::NoSuchSession`] or [`JoinOutcome::OtherAddress`].
    pub outcome: JoinOutcome,
}

impl UdpElsewhere {
    /// Writes the answer.
    pub fn encode(&self) -> [u8; UDP_JOIN_LEN] {
        let mut b = [0u8; UDP_JOIN_LEN];
        b[..4].copy_from_slice(&UDP_ELSEWHERE_MAGIC);
        b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&self.flow.to_be_bytes());
        b[8..16].copy_from_slice(&self.token.0.to_be_bytes());
        b[16..24].copy_from_slice(&self.agent.0.to_be_bytes());
        b[24] = self.outcome.code();
        b
    }

    /// Reads an answer; anything else (a join, an acknowledgement, junk) is an error.
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        if b.len() != UDP_JOIN_LEN {
            return Err(Error::Truncated {
                need: UDP_JOIN_LEN,
                have: b.len(),
            });
        }
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != UDP_ELSEWHERE_MAGIC {
            return Err(Error::BadMagic(magic));
        }
        Ok(Self {
            flow: u16::from_be_bytes([b[6], b[7]]),
            token: Token(crate::data::be_u64(&b[8..16])),
            agent: AgentId(crate::data::be_u64(&b[16..24])),
            outcome: JoinOutcome::from_code(b[24]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_answer_round_trips_and_keeps_its_layout() {
        let a = JoinAnswer {
            outcome: JoinOutcome::NoSuchSession,
            agent: AgentId(0x0102_0304_0506_0708),
        };
        let b = a.encode();
        assert_eq!(&b[..4], b"SNDK");
        assert_eq!(&b[4..8], &[0, 2, 1, 0]);
        assert_eq!(&b[8..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(JoinAnswer::decode(&b).unwrap(), a);
        for code in 0..=7u8 {
            let mut b = b;
            b[6] = code;
            let back = JoinAnswer::decode(&b).unwrap().outcome;
            assert_eq!(back.code(), code);
        }
        assert_eq!(
            JoinAnswer::decode(&b[..15]),
            Err(Error::Truncated { need: 16, have: 15 })
        );
        let mut junk = b;
        junk[..4].copy_from_slice(b"SNDE");
        assert!(JoinAnswer::decode(&junk).is_err());
    }

    #[test]
    fn an_elsewhere_answer_is_the_size_of_a_join_and_is_not_one() {
        let e = UdpElsewhere {
            flow: 3,
            token: Token(0xAABB),
            agent: AgentId(7),
            outcome: JoinOutcome::OtherAddress,
        };
        let b = e.encode();
        assert_eq!(b.len(), UDP_JOIN_LEN);
        assert_eq!(&b[..4], b"SNDN");
        assert_eq!(b[24], 2);
        assert!(b[25..].iter().all(|&x| x == 0));
        assert_eq!(UdpElsewhere::decode(&b).unwrap(), e);
        // A join or an acknowledgement is not an elsewhere, and the reverse.
        assert!(crate::UdpJoin::decode(&b).is_err());
        let join = crate::UdpJoin {
            ack: true,
            flow: 3,
            token: Token(0xAABB),
            mac: [0; crate::auth::JOIN_MAC_LEN],
        };
        assert!(UdpElsewhere::decode(&join.encode()).is_err());
    }

    #[test]
    fn an_agent_id_is_sixteen_hex_digits_in_json() {
        let tag = AgentTag {
            id: AgentId(0x00ab_cdef_0123_4567),
            addr: "198.18.2.2:5300".into(),
        };
        let json = serde_json::to_string(&tag).unwrap();
        assert_eq!(
            json,
            r#"{"id":"00abcdef01234567","addr":"198.18.2.2:5300"}"#
        );
        assert_eq!(serde_json::from_str::<AgentTag>(&json).unwrap(), tag);
        assert!(serde_json::from_str::<AgentId>(r#""not hex""#).is_err());
    }
}
