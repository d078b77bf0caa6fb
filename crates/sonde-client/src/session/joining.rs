//! Opening a session's data channels, through whatever is between this host and the agent.
//!
//! On a direct path every channel reaches the agent that admitted the session. Behind a load
//! balancer (haproxy in TCP mode, a cloud network load balancer, an nftables `numgen` DNAT)
//! each TCP connection and each UDP flow is placed on its own, and may reach another agent,
//! which has no such session. An agent that named itself in `Accepted` answers a join that asks
//! ([`sonde_wire::JoinAnswer`], [`sonde_wire::UdpElsewhere`]): a channel that reached another
//! agent is opened again from a new source port, which the balancer places anew, until it
//! reaches the session's agent (at most [`MAX_TRIES`] times a channel, within [`JOIN_BUDGET`]
//! of the acceptance, well inside the agent's 10 s wait for its channels). Every figure then
//! stays that one agent's, and [`Placement`] records the other agents seen, for the result's
//! warning. A NAT that gives a channel another source address than the control connection
//! is named as such.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use sonde_wire::auth::{SessionKey, JOIN_MAC_LEN};
use sonde_wire::{
    AgentId, AgentTag, Channel, DataJoin, JoinAnswer, JoinOutcome, Preamble, Protocol, TestKind,
    TestSpec, Token, UdpElsewhere, UdpJoin, JOIN_ANSWER_LEN, PROTOCOL_VERSION, UDP_JOIN_LEN,
};

use sonde_net::socket::{Applied, DataOptionError, DataOptions};

use super::CONNECT_TIMEOUT;
use crate::run::ClientChannel;
use crate::{ClientError, Target};

/// How many times one channel is opened before the client gives up on reaching the session's
/// agent. With two agents behind a balancer that places at random, 32 misses in a row happen
/// once in four billion tries.
pub(crate) const MAX_TRIES: u32 = 32;

/// How long after the acceptance the channels may take to join, in all (the agent waits 10 s).
pub(crate) const JOIN_BUDGET: Duration = Duration::from_secs(8);

/// How long a UDP join waits for an answer before it is sent again.
const UDP_RETRY: Duration = Duration::from_millis(100);

/// How long a UDP flow sends joins without any answer before the client gives up on it.
const UDP_SILENCE: Duration = Duration::from_secs(5);

/// Where a session's channels went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The agent that admitted the session; `None` from an agent too old to say, whose joins
    /// are not answered (and so not steered).
    pub(crate) agent: Option<AgentTag>,
    /// Other agents that answered a join of this session: the address is a balancer.
    pub(crate) others: BTreeSet<AgentId>,
    /// Channels opened again because they had reached another agent.
    pub(crate) reopened: u32,
}

impl Placement {
    fn other(&mut self, agent: AgentId) {
        self.others.insert(agent);
        self.reopened += 1;
    }

    /// Why a channel could not reach the session's agent, after `tries`.
    fn gave_up(&self, target: &Target, what: &str, tries: u32) -> ClientError {
        ClientError::Path(format!(
            "{addr} sent {what} to another agent than the session's {tries} times in a row (it \
             balances connections over at least {n} agents): no channel reached the agent that \
             admitted the test. A balancer that keeps a client on one agent (source-address \
             affinity), or one agent's own address, carries the test",
            addr = target.addr,
            n = self.others.len() + 1,
        ))
    }
}

/// A channel whose source port is fixed (`--cport`) reached another agent: every try of it
/// would be placed the same way.
fn fixed_port(target: &Target, what: &str, port: u16) -> ClientError {
    ClientError::Path(format!(
        "{addr} placed {what} on another agent than the session's, and --cport fixes its source \
         port ({port}), so the balancer would place every try of it the same way: leave out \
         --cport to test through a load balancer",
        addr = target.addr
    ))
}

/// A channel's join failed in a way that names the path, not the agent.
fn refused(target: &Target, what: &str, outcome: JoinOutcome) -> ClientError {
    match outcome {
        JoinOutcome::OtherAddress => ClientError::Path(format!(
            "the agent behind {addr} saw {what} come from another address than the control \
             connection: a NAT between here and there gives each connection its own source \
             address (a NAT gateway with several addresses), and the agent takes a session's \
             channels from its control connection's address only. Test from a host whose \
             connections leave by one address",
            addr = target.addr
        )),
        other => ClientError::Protocol(format!(
            "the agent at {} did not take {what}: {other:?}",
            target.addr
        )),
    }
}

/// What this host's kernel made of the test's socket options on a channel; `None` without any.
type Opened = (ClientChannel, Option<Applied>);

/// Opens channel `index` of an admitted session (`token`), with the test's socket `options`
/// (when any) set on it, steering it to the session's agent: the channel, and what this host's
/// kernel made of the options.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_channel(
    target: &Target,
    spec: &TestSpec,
    options: Option<&DataOptions>,
    token: Token,
    key: Option<&SessionKey>,
    index: u32,
    placement: &mut Placement,
    deadline: Instant,
) -> Result<Opened, ClientError> {
    // The pacing rate and zero-copy sends are for the streams this end sends on.
    let options = options.map(|o| DataOptions {
        max_pacing_rate_bytes_per_second: o
            .max_pacing_rate_bytes_per_second
            .filter(|_| spec.client_sends(index) && spec.kind != TestKind::Latency),
        zerocopy: o.zerocopy && spec.client_sends(index),
        ..o.clone()
    });
    let options = options.as_ref();
    // `--cport`: this channel's source port, the same on every try (0: a new one each time).
    let port = target.source.port(index, spec.channels())?;
    match spec.protocol {
        Protocol::Tcp => {
            let what = format!("data stream {index}");
            let answered = placement.agent.is_some();
            let mut tries = 0;
            while tries < MAX_TRIES {
                tries += 1;
                let (mut s, applied) = tcp_connect(target, spec, options, port)?;
                send_join(&mut s, token, index, answered)?;
                if !answered {
                    // An agent that does not answer: as before, the channel is taken on trust.
                    return Ok((ClientChannel::Tcp(s), applied));
                }
                let answer = read_answer(&mut s, deadline, index)?;
                match answer.outcome {
                    JoinOutcome::Joined => return Ok((ClientChannel::Tcp(s), applied)),
                    JoinOutcome::NoSuchSession => placement.other(answer.agent),
                    other => return Err(refused(target, &what, other)),
                }
                if port != 0 {
                    return Err(fixed_port(target, &what, port));
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            Err(placement.gave_up(target, &what, tries))
        }
        Protocol::Udp => {
            let flow = u16::try_from(index)
                .map_err(|_| ClientError::Usage("at most 65,536 UDP flows".into()))?;
            let what = format!("UDP flow {index}");
            let mut tries = 0;
            while tries < MAX_TRIES {
                tries += 1;
                let sock = target.source.udp(target.addr, port, index)?;
                let applied = options
                    .map(|o| o.apply_udp(&sock).map_err(|e| super::socket_refused(&e)))
                    .transpose()?;
                if spec.socket.dont_fragment {
                    super::fits_path_mtu(&sock, spec.msg_size)?;
                }
                match join_udp(&sock, token, key, flow)? {
                    UdpJoined::Joined => return Ok((ClientChannel::Udp(sock), applied)),
                    UdpJoined::Elsewhere(e) if e.outcome == JoinOutcome::NoSuchSession => {
                        placement.other(e.agent);
                        if port != 0 {
                            return Err(fixed_port(target, &what, port));
                        }
                    }
                    UdpJoined::Elsewhere(e) => return Err(refused(target, &what, e.outcome)),
                    UdpJoined::Silent(refused_by_host) => {
                        return Err(udp_silent(target, index, placement, refused_by_host))
                    }
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            Err(placement.gave_up(target, &what, tries))
        }
    }
}

/// No answer at all to a UDP flow's joins.
fn udp_silent(
    target: &Target,
    index: u32,
    placement: &Placement,
    refused_by_host: bool,
) -> ClientError {
    if refused_by_host {
        return ClientError::Path(format!(
            "{addr} refused UDP flow {index} (ICMP port unreachable): nothing takes UDP on port \
             {port} there. The test's TCP control connection got through, so {addr} forwards \
             TCP only: a TCP-mode load balancer (haproxy) or a TCP-only forward. Test UDP \
             against an agent's own address, or through a balancer that forwards UDP",
            addr = target.addr,
            port = target.addr.port(),
        ));
    }
    if placement.agent.is_some() {
        return ClientError::Path(format!(
            "no answer from {addr} to UDP flow {index} within {s} s, though the test's TCP \
             control connection got through: UDP port {port} is blocked on the way (a \
             firewall, a security group), or {addr} forwards only TCP (a TCP-mode load \
             balancer such as haproxy)",
            addr = target.addr,
            s = UDP_SILENCE.as_secs(),
            port = target.addr.port(),
        ));
    }
    ClientError::UdpBlocked(target.addr, index)
}

/// A TCP connection to the agent with the test's socket options set before the handshake (the
/// MSS goes in the SYN), and what the kernel made of them.
fn tcp_connect(
    target: &Target,
    spec: &TestSpec,
    options: Option<&DataOptions>,
    port: u16,
) -> Result<(TcpStream, Option<Applied>), ClientError> {
    let nodelay = spec.kind == TestKind::Latency;
    match options {
        None => Ok((target.source.tcp(target.addr, port, nodelay)?, None)),
        Some(o) => {
            let o = DataOptions {
                nodelay: o.nodelay || nodelay,
                ..o.clone()
            };
            let (s, applied) = sonde_net::socket::tcp_connect_from_with(
                target.addr,
                &target.source.bind,
                port,
                CONNECT_TIMEOUT,
                &o,
            )
            .map_err(|e| match e {
                DataOptionError::Socket(e) => ClientError::Connect(e, target.addr),
                DataOptionError::Source(e) => ClientError::Source(e),
                e => super::socket_refused(&e),
            })?;
            Ok((s, Some(applied)))
        }
    }
}

fn send_join(s: &mut TcpStream, token: Token, index: u32, answer: bool) -> Result<(), ClientError> {
    let preamble = Preamble {
        version: PROTOCOL_VERSION,
        channel: Channel::Data,
    };
    let join = DataJoin {
        token,
        stream: index,
        answer,
    };
    let mut b = [0u8; sonde_wire::PREAMBLE_LEN + sonde_wire::DATA_JOIN_LEN];
    b[..sonde_wire::PREAMBLE_LEN].copy_from_slice(&preamble.encode());
    b[sonde_wire::PREAMBLE_LEN..].copy_from_slice(&join.encode());
    s.write_all(&b).map_err(|e| ClientError::Data(e, index))
}

fn read_answer(
    s: &mut TcpStream,
    deadline: Instant,
    index: u32,
) -> Result<JoinAnswer, ClientError> {
    let mut b = [0u8; JOIN_ANSWER_LEN];
    let by = deadline.max(Instant::now() + CONNECT_TIMEOUT);
    sonde_net::control::read_exact_by(s, &mut b, by).map_err(|e| {
        ClientError::Protocol(format!(
            "data stream {index}: no answer to its join from the agent: {e}"
        ))
    })?;
    JoinAnswer::decode(&b).map_err(|e| {
        ClientError::Protocol(format!(
            "data stream {index}: the answer to its join is not one: {e}"
        ))
    })
}

/// What became of a UDP flow's joins.
enum UdpJoined {
    /// The session's agent acknowledged the flow.
    Joined,
    /// An agent answered that it cannot take the flow.
    Elsewhere(UdpElsewhere),
    /// No answer within [`UDP_SILENCE`]; `true` when the host refused the datagrams (ICMP
    /// port unreachable).
    Silent(bool),
}

/// Sends join datagrams for `flow` (signed with the session key when there is one) every
/// [`UDP_RETRY`] until an agent answers, for [`UDP_SILENCE`] at most.
fn join_udp(
    sock: &UdpSocket,
    token: Token,
    key: Option<&SessionKey>,
    flow: u16,
) -> Result<UdpJoined, ClientError> {
    let index = u32::from(flow);
    let mut join = UdpJoin {
        ack: false,
        flow,
        token,
        mac: [0; JOIN_MAC_LEN],
    };
    if let Some(key) = key {
        join.mac = key.join_mac(&join.signed());
    }
    // Silence is judged over its own span; the budget ends the steering, not a first join.
    let until = Instant::now() + UDP_SILENCE;
    let mut buf = [0u8; 64];
    let mut unreachable = false;
    sock.set_read_timeout(Some(UDP_RETRY))
        .map_err(|e| ClientError::Data(e, index))?;
    while Instant::now() < until {
        // A refused send (ICMP unreachable from an earlier try) is retried like a loss.
        if let Err(e) = sock.send(&join.encode()) {
            unreachable |= e.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        let wait_until = Instant::now() + UDP_RETRY;
        while Instant::now() < wait_until {
            match sock.recv(&mut buf) {
                Ok(n) if n == UDP_JOIN_LEN => {
                    let got = &buf[..n];
                    if UdpJoin::decode(got)
                        .is_ok_and(|a| a.ack && a.token == token && a.flow == flow)
                    {
                        let _ = sock.set_read_timeout(None);
                        return Ok(UdpJoined::Joined);
                    }
                    if let Ok(e) = UdpElsewhere::decode(got) {
                        if e.token == token && e.flow == flow {
                            return Ok(UdpJoined::Elsewhere(e));
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    unreachable |= e.kind() == std::io::ErrorKind::ConnectionRefused;
                    break;
                }
            }
        }
    }
    Ok(UdpJoined::Silent(unreachable))
}
