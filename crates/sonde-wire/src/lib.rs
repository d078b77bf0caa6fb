//! sonde's wire formats, and nothing else: no sockets, no clocks.
//!
//! Everything that crosses the network between a sonde client and a sonde agent is defined here:
//!
//! * the 8-byte [`Preamble`] that opens every TCP connection to the agent's port and says whether
//!   it is a control channel or a data channel;
//! * control frames: a 4-byte big-endian length (at most [`MAX_FRAME_LEN`]) followed by one JSON
//!   document, a [`ControlMsg`];
//! * the 16-byte [`DataJoin`] that a TCP data channel sends after its preamble;
//! * the 16-byte [`CrrJoin`] that each connection of a connection-rate test sends after its
//!   preamble, before its request;
//! * the 32-byte UDP [`UdpJoin`] datagram (and its acknowledgement) that binds a UDP flow to a
//!   session;
//! * the computations of shared-secret authentication ([`auth`]): HMAC-SHA256 over bytes;
//! * the 16-byte [`DataHeader`] at the front of every UDP data datagram (sequence number and send
//!   time), and the 14-byte [`PpsHeader`] (48-bit sequence number) of pps datagrams shorter
//!   than that;
//! * the agent's receive and send times inside latency messages ([`stamps`], for one-way
//!   delay);
//! * mesh probes and their replies ([`probe`]): stateless, MACed with the mesh's secret,
//!   answered by the agent's own port, a reply never larger than its probe.
//!
//! Decoders take caller buffers and never panic or allocate from a length field they have not
//! checked.
//!
//! ```
//! use sonde_wire::{decode_frame, encode_frame, ControlMsg, PROTOCOL_VERSION};
//! let mut buf = Vec::new();
//! encode_frame(&ControlMsg::Hello { protocol: PROTOCOL_VERSION, software: "sonde 0.1.0".into(), nonce: sonde_wire::auth::Nonce([0; 32]) }, &mut buf).unwrap();
//! let (msg, used) = decode_frame(&buf).unwrap().unwrap();
//! assert_eq!(used, buf.len());
//! assert!(matches!(msg, ControlMsg::Hello { protocol: PROTOCOL_VERSION, .. }));
//! ```
#![forbid(unsafe_code)]

mod answers;
pub mod auth;
mod control;
mod data;
mod hostinfo;
mod socket;
// The bodies of the fuzz targets in `fuzz/`, for them (feature `fuzzing`) and for this crate's
// stable tests; not part of the API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod iperf3;
pub mod probe;
pub mod sockperf;
pub mod stamps;

pub use answers::*;
pub use control::*;
pub use data::*;
pub use hostinfo::{
    HostInfo, InterfaceDelta, MinDefaultMax, NicInfo, NicOffloads, SocketBufferLimits,
};
pub use socket::{AppliedSocketOptions, EcnCounts, SocketOptions, ZerocopyStats};

/// Errors from decoding bytes that came from the network.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The first four bytes were not `SNDE`: this is not a sonde peer.
    #[error("not a sonde peer (bad magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The peer speaks a protocol version this build does not.
    #[error("protocol version {theirs} is not supported (this build speaks {ours})")]
    Version {
        /// The version the peer announced.
        theirs: u16,
        /// The version this build speaks.
        ours: u16,
    },
    /// A preamble named a channel kind that does not exist.
    #[error("unknown channel kind {0:#04x}")]
    Channel(u8),
    /// A frame's length field exceeds [`MAX_FRAME_LEN`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte limit")]
    FrameTooLarge(u32),
    /// A frame's body is not a valid control message.
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// A fixed-size structure was shorter than it must be.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes required.
        need: usize,
        /// Bytes present.
        have: usize,
    },
}
