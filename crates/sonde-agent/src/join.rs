//! Whether a data channel may join a session, without sockets: the checks the agent makes on a
//! TCP data join (`DataJoin`) and a UDP join datagram (`UdpJoin`) once their token has named a
//! session, and where the channel goes among the session's places. `join_tcp` and `udp_join`
//! in the crate root apply them to real connections; `src/tests/robustness.rs` and `secrets.rs`
//! make the same faults over sockets.

use std::net::IpAddr;

use sonde_wire::{Protocol, UdpJoin};

use crate::{canonical, Slot};

/// Why a data channel is not handed to a session (counted as a bad join).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadJoin {
    /// Not from the address that opened the session's control connection.
    OtherAddress,
    /// A TCP channel for a UDP session, or the reverse.
    OtherProtocol,
    /// A UDP join without the session key's MAC (a session with a shared secret).
    BadMac,
    /// The session has taken its channels, or given up waiting for them.
    Closed,
    /// A stream or flow the session does not have.
    OutOfRange,
    /// A stream or flow that has joined already.
    Taken,
}

impl BadJoin {
    /// How a [`sonde_wire::JoinAnswer`] names it.
    pub(crate) fn outcome(self) -> sonde_wire::JoinOutcome {
        use sonde_wire::JoinOutcome as O;
        match self {
            Self::OtherAddress => O::OtherAddress,
            Self::OtherProtocol => O::OtherProtocol,
            // A TCP join has no MAC; a UDP join with a bad one is not answered.
            Self::BadMac | Self::Closed => O::Closed,
            Self::OutOfRange => O::OutOfRange,
            Self::Taken => O::Taken,
        }
    }
}

/// Whether a channel from `from`, of `protocol`, may join `slot`; a UDP join brings its
/// datagram (`udp`), whose MAC a session with a key checks.
pub(crate) fn check(
    slot: &Slot,
    from: IpAddr,
    protocol: Protocol,
    udp: Option<&UdpJoin>,
) -> Result<(), BadJoin> {
    if canonical(from) != canonical(slot.peer_ip) {
        return Err(BadJoin::OtherAddress);
    }
    if slot.spec.protocol != protocol {
        return Err(BadJoin::OtherProtocol);
    }
    if let (Some(key), Some(join)) = (&slot.key, udp) {
        if !key.check_join_mac(&join.signed(), &join.mac) {
            return Err(BadJoin::BadMac);
        }
    }
    Ok(())
}

/// The place of channel `index` among a session's `places`, when it is free and the session
/// (`closed` once it has taken its channels) still takes joins.
pub(crate) fn place<T>(
    places: &mut [Option<T>],
    closed: bool,
    index: u32,
) -> Result<&mut Option<T>, BadJoin> {
    if closed {
        return Err(BadJoin::Closed);
    }
    let place = usize::try_from(index)
        .ok()
        .and_then(|i| places.get_mut(i))
        .ok_or(BadJoin::OutOfRange)?;
    if place.is_some() {
        return Err(BadJoin::Taken);
    }
    Ok(place)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32};
    use std::sync::{Condvar, Mutex};

    use sonde_wire::auth::{Nonce, Secret, JOIN_MAC_LEN};
    use sonde_wire::{Direction, TestKind, TestSpec, Token};

    use super::*;

    fn slot(protocol: Protocol, key: Option<sonde_wire::auth::SessionKey>) -> Slot {
        Slot {
            peer_ip: "198.18.0.7".parse().unwrap(),
            spec: TestSpec {
                kind: TestKind::Throughput,
                protocol,
                direction: Direction::Forward,
                streams: 2,
                msg_size: 1_000,
                bitrate_per_stream: 1_000_000,
                duration_ms: 1_000,
                interval_ms: 0,
                read_size: 0,
                socket: Default::default(),
                omit_ms: 0,
                skip_rx_copy: false,
                bytes: 0,
                blocks: 0,
                request_response: None,
            },
            channels: Mutex::new(vec![None, None]),
            joined: Condvar::new(),
            closed: AtomicBool::new(false),
            overlap: AtomicU32::new(0),
            key,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_channel_from_another_address_or_of_the_other_protocol_is_refused() {
        let tcp = slot(Protocol::Tcp, None);
        assert_eq!(check(&tcp, ip("198.18.0.7"), Protocol::Tcp, None), Ok(()));
        // The same address, IPv4-mapped (a dual-stack socket), is the same client.
        assert_eq!(
            check(&tcp, ip("::ffff:198.18.0.7"), Protocol::Tcp, None),
            Ok(())
        );
        assert_eq!(
            check(&tcp, ip("198.18.0.8"), Protocol::Tcp, None),
            Err(BadJoin::OtherAddress)
        );
        assert_eq!(
            check(&tcp, ip("198.18.0.7"), Protocol::Udp, None),
            Err(BadJoin::OtherProtocol)
        );
    }

    #[test]
    fn a_udp_join_without_the_session_mac_is_refused() {
        let secret = Secret::new(b"the agent's secret".to_vec()).unwrap();
        let (agent, client) = (Nonce([1; 32]), Nonce([2; 32]));
        let udp = slot(Protocol::Udp, Some(secret.session_key(&agent, &client)));
        let mut join = UdpJoin {
            ack: false,
            flow: 1,
            token: Token(9),
            mac: [0; JOIN_MAC_LEN],
        };
        let from = ip("198.18.0.7");
        assert_eq!(
            check(&udp, from, Protocol::Udp, Some(&join)),
            Err(BadJoin::BadMac)
        );
        // Signed with another session's key (a replay from another connection).
        let other = secret.session_key(&Nonce([3; 32]), &client);
        join.mac = other.join_mac(&join.signed());
        assert_eq!(
            check(&udp, from, Protocol::Udp, Some(&join)),
            Err(BadJoin::BadMac)
        );
        // Signed with this session's key, as the client derives it.
        join.mac = secret.session_key(&agent, &client).join_mac(&join.signed());
        assert_eq!(check(&udp, from, Protocol::Udp, Some(&join)), Ok(()));
        // Another flow under the same MAC: the MAC covers the flow.
        join.flow = 0;
        assert_eq!(
            check(&udp, from, Protocol::Udp, Some(&join)),
            Err(BadJoin::BadMac)
        );
        // Without a secret, any MAC.
        let open = slot(Protocol::Udp, None);
        assert_eq!(check(&open, from, Protocol::Udp, Some(&join)), Ok(()));
    }

    #[test]
    fn joins_out_of_range_taken_or_after_the_session_took_its_channels_are_refused() {
        let mut places: Vec<Option<u8>> = vec![None, None];
        *place(&mut places, false, 1).unwrap() = Some(1);
        assert_eq!(place(&mut places, false, 1), Err(BadJoin::Taken));
        assert_eq!(place(&mut places, false, 2), Err(BadJoin::OutOfRange));
        assert_eq!(
            place(&mut places, false, u32::MAX),
            Err(BadJoin::OutOfRange)
        );
        assert_eq!(place(&mut places, true, 0), Err(BadJoin::Closed));
        assert!(place(&mut places, false, 0).is_ok());
    }
}
