//! What makes a test work through a load balancer: an agent names itself in `Accepted`, and
//! answers a data join that reached it for a session it does not hold, or from another address
//! than the session's control connection, so the client can open the channel again elsewhere
//! or say why not. Two agents on loopback stand for two behind one balancer.

use super::*;
use sonde_wire::{AgentTag, JoinAnswer, JoinOutcome, UdpElsewhere, JOIN_ANSWER_LEN};

/// A session on `h`: its control connection, token and the agent's tag.
fn session(h: &AgentHandle, protocol: Protocol) -> (Raw, Token, AgentTag) {
    let s = spec(TestKind::Throughput, protocol, Direction::Forward, 3_000);
    match Raw::start(h, &s) {
        (raw, ControlMsg::Accepted { token, agent, .. }) => {
            (raw, token, agent.expect("the agent names itself"))
        }
        (_, other) => panic!("expected acceptance, got {other:?}"),
    }
}

/// Joins stream `stream` of `token` at `h` from `from`, asking for an answer: the answer.
fn answered_join(
    h: &AgentHandle,
    from: Option<SocketAddr>,
    token: Token,
    stream: u32,
) -> JoinAnswer {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    if let Some(from) = from {
        sock.bind(&from.into()).expect("bind a loopback address");
    }
    sock.connect_timeout(&h.local_addr().into(), PATIENCE)
        .expect("connect a data channel");
    let mut s: TcpStream = sock.into();
    s.write_all(&preamble(Channel::Data))
        .expect("data preamble");
    let join = DataJoin {
        token,
        stream,
        answer: true,
    };
    s.write_all(&join.encode()).expect("data join");
    s.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut b = [0u8; JOIN_ANSWER_LEN];
    s.read_exact(&mut b).expect("an answer to the join");
    JoinAnswer::decode(&b).expect("a join answer")
}

#[test]
fn a_tcp_join_hears_which_agent_took_it_or_why_not() {
    let (a, b) = (agent(|_| {}), agent(|_| {}));
    let (_ctrl, token, tag) = session(&a, Protocol::Tcp);
    assert_eq!(
        tag.addr,
        a.local_addr().to_string(),
        "the address the client reached"
    );
    let (_other, _, b_tag) = session(&b, Protocol::Tcp);
    assert_ne!(tag.id, b_tag.id, "two agents, two ids");

    // The other agent behind the balancer has no such session, and says who it is.
    let elsewhere = answered_join(&b, None, token, 0);
    assert_eq!(elsewhere.outcome, JoinOutcome::NoSuchSession);
    assert_eq!(elsewhere.agent, b_tag.id);
    // From another address than the control connection's: a NAT that spreads addresses.
    let nat = answered_join(&a, Some(SocketAddr::from(([127, 0, 0, 2], 0))), token, 0);
    assert_eq!(nat.outcome, JoinOutcome::OtherAddress);
    // The session's agent takes it, once.
    let joined = answered_join(&a, None, token, 0);
    assert_eq!(
        (joined.outcome, joined.agent),
        (JoinOutcome::Joined, tag.id)
    );
    let again = answered_join(&a, None, token, 0);
    assert!(
        matches!(again.outcome, JoinOutcome::Taken | JoinOutcome::Closed),
        "{again:?}"
    );
}

#[test]
fn a_udp_join_for_a_session_the_agent_does_not_hold_is_answered_and_no_larger() {
    let (a, b) = (agent(|_| {}), agent(|_| {}));
    let (_ctrl, token, _) = session(&a, Protocol::Udp);
    let (_other, _, b_tag) = session(&b, Protocol::Udp);
    let sock = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    sock.set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    let join = UdpJoin {
        ack: false,
        flow: 1,
        token,
        ..UdpJoin::default()
    }
    .encode();
    sock.send_to(&join, b.local_addr()).expect("send a join");
    let mut buf = [0u8; 256];
    let (n, from) = sock
        .recv_from(&mut buf)
        .expect("an answer from the other agent");
    assert_eq!(from, b.local_addr(), "from the agent's shared port");
    assert_eq!(n, join.len(), "as long as the join, never longer");
    let e = UdpElsewhere::decode(&buf[..n]).expect("an elsewhere answer");
    assert_eq!(
        (e.outcome, e.agent, e.token, e.flow),
        (JoinOutcome::NoSuchSession, b_tag.id, token, 1)
    );
    // The session's agent acknowledges the flow from the right address.
    assert!(udp_join(&sock, a.local_addr(), token, 1, PATIENCE));
}

#[test]
fn a_session_runs_under_the_token_asked_for_unless_this_agent_has_it() {
    let a = agent(|_| {});
    let s = spec(TestKind::Crr, Protocol::Tcp, Direction::Forward, 3_000);
    let start = |token: Token| {
        let mut raw = Raw::hello(&a);
        raw.send(&ControlMsg::Start {
            spec: s.clone(),
            proof: None,
            tuning: sonde_wire::Tuning::default(),
            token: Some(token),
        });
        let reply = raw.recv();
        (raw, reply)
    };
    // Another agent behind the balancer gave the test this token: this one takes it.
    let asked = Token(0x0123_4567_89ab_cdef);
    let (_first, reply) = start(asked);
    assert!(
        matches!(reply, ControlMsg::Accepted { token, .. } if token == asked),
        "{reply:?}"
    );
    // The search for agents reaches this one again: it says it has the test already.
    let (_again, reply) = start(asked);
    assert!(
        matches!(
            reply,
            ControlMsg::Refused {
                reason: Refusal::TokenTaken,
                ..
            }
        ),
        "{reply:?}"
    );
}

/// A TCP balancer in front of the agents: connection `n` goes to `route(n)`, from the source
/// address it names (any when `None`), with a thread per direction per connection.
fn balancer(
    route: impl Fn(usize) -> (SocketAddr, Option<SocketAddr>) + Send + 'static,
) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let addr = listener.local_addr().expect("its address");
    thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            let (to, from) = route(n);
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("a TCP socket");
            if let Some(from) = from {
                sock.bind(&from.into()).expect("bind a loopback address");
            }
            if sock.connect(&to.into()).is_err() {
                return;
            }
            let server: TcpStream = sock.into();
            for (mut from, mut into) in [
                (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                ),
                (server, client),
            ] {
                thread::spawn(move || {
                    let _ = io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    addr
}

#[test]
fn a_balancer_that_never_places_a_channel_on_the_sessions_agent_is_named() {
    let (a, b) = (agent(|_| {}), agent(|_| {}));
    let (first, rest) = (a.local_addr(), b.local_addr());
    let front = balancer(move |n| (if n == 0 { first } else { rest }, None));
    let target = sonde_client::resolve(&front.to_string(), 0).expect("a literal address");
    let opt = ThroughputOptions {
        duration: Duration::from_millis(300),
        ..ThroughputOptions::default()
    };
    let err = throughput(&target, &opt).expect_err("no channel can reach the session");
    assert!(matches!(err, ClientError::Path(_)), "{err:?}");
    assert_eq!(err.exit_code(), 3);
    let text = err.to_string();
    assert!(
        text.contains("32 times in a row") && text.contains("at least 2 agents"),
        "{text}"
    );
}

#[test]
fn a_nat_that_gives_the_channels_another_address_is_named() {
    let a = agent(|_| {});
    let to = a.local_addr();
    // The control connection leaves from 127.0.0.1, every other from 127.0.0.2.
    let front = balancer(move |n| {
        let from = (n > 0).then(|| SocketAddr::from(([127, 0, 0, 2], 0)));
        (to, from)
    });
    let target = sonde_client::resolve(&front.to_string(), 0).expect("a literal address");
    let opt = ThroughputOptions {
        duration: Duration::from_millis(300),
        ..ThroughputOptions::default()
    };
    let err = throughput(&target, &opt).expect_err("the agent takes no channel from elsewhere");
    assert!(matches!(err, ClientError::Path(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("another address than the control connection"),
        "{text}"
    );
    assert!(text.contains("NAT"), "{text}");
}

#[test]
fn a_udp_join_from_another_address_than_the_sessions_is_answered_so() {
    let a = agent(|_| {});
    let (_ctrl, token, tag) = session(&a, Protocol::Udp);
    let join = UdpJoin {
        ack: false,
        flow: 1,
        token,
        ..UdpJoin::default()
    }
    .encode();
    let mut buf = [0u8; 256];
    // From another address than the session's control connection.
    let nat = UdpSocket::bind("127.0.0.2:0").expect("a UDP socket on 127.0.0.2");
    nat.set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    nat.send_to(&join, a.local_addr()).expect("send a join");
    let (n, _) = nat.recv_from(&mut buf).expect("an answer");
    let e = UdpElsewhere::decode(&buf[..n]).expect("an elsewhere answer");
    assert_eq!((e.outcome, e.agent), (JoinOutcome::OtherAddress, tag.id));
}
