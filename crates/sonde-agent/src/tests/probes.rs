//! Mesh probes (`probe.rs`): answered statelessly on the shared UDP port and as the first bytes
//! of a TCP connection, a reply never larger than its probe; a wrong MAC, a stale time, a replay,
//! or an agent without a secret get no answer, each counted by its reason; no session is taken.

use super::*;
use crate::ProbeRefusal;
use sonde_wire::probe::{Probe, ProbeReply, MAX_PROBE_LEN};
use std::time::{SystemTime, UNIX_EPOCH};

const SECRET: &[u8] = b"mesh probes";

fn secret() -> Secret {
    Secret::new(SECRET.to_vec()).expect("not empty")
}

fn now_ns() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

fn encode(p: &Probe<'_>, key: &Secret, len: usize) -> Vec<u8> {
    let mut b = [0u8; MAX_PROBE_LEN];
    let n = p.encode(key, len, &mut b).unwrap();
    b[..n].to_vec()
}

/// Sends `datagram` from a fresh socket and waits up to `wait` for an answer.
fn udp_exchange(h: &AgentHandle, datagram: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.send_to(datagram, h.local_addr()).unwrap();
    let mut b = [0u8; 2048];
    s.recv(&mut b).ok().map(|n| b[..n].to_vec())
}

/// The agent still serves sessions to a client that proves the secret.
fn serves_with_secret(h: &AgentHandle) {
    let t = target(h).with_secret(Some(secret()));
    let r = latency(&t, &latency_opts(Protocol::Tcp))
        .expect("still serves")
        .result;
    assert!(r.samples > 0, "{r:?}");
}

fn refusals(h: &AgentHandle, r: ProbeRefusal) -> u64 {
    h.stats().probe_refusals_of(r)
}

#[test]
fn udp_probes_are_answered_once_and_bad_ones_are_refused_by_reason() {
    let h = agent(|c| c.secret = Some(secret()));
    let p = Probe {
        seq: 1,
        sent_unix_ns: now_ns(),
        nonce: 77,
        sender: "prober-a",
    };
    let probe = encode(&p, &secret(), 100);
    let reply = udp_exchange(&h, &probe, PATIENCE).expect("a valid probe is answered");
    assert!(
        reply.len() <= probe.len(),
        "{} > {}",
        reply.len(),
        probe.len()
    );
    let r = ProbeReply::decode(&secret(), "prober-a", &reply).expect("the agent's MAC");
    assert_eq!((r.seq, r.nonce, r.sent_unix_ns), (1, 77, p.sent_unix_ns));
    assert_eq!(h.stats().probes_answered.load(Ordering::Relaxed), 1);

    let quiet = Duration::from_millis(300);
    // The same probe again: a replay.
    assert!(udp_exchange(&h, &probe, quiet).is_none());
    assert_eq!(refusals(&h, ProbeRefusal::Replay), 1);
    // Another secret's MAC.
    let other = Secret::new(b"not the mesh's".to_vec()).unwrap();
    let forged = encode(&Probe { nonce: 78, ..p }, &other, 100);
    assert!(udp_exchange(&h, &forged, quiet).is_none());
    assert_eq!(refusals(&h, ProbeRefusal::Mac), 1);
    // A send time a minute old (outside the 30 s window).
    let old = encode(
        &Probe {
            nonce: 79,
            sent_unix_ns: p.sent_unix_ns - 60_000_000_000,
            ..p
        },
        &secret(),
        100,
    );
    assert!(udp_exchange(&h, &old, quiet).is_none());
    assert_eq!(refusals(&h, ProbeRefusal::Stale), 1);
    // Junk that only starts like a probe: counted as junk, unanswered.
    assert!(udp_exchange(&h, b"SNDPjunk", quiet).is_none());
    assert!(wait_until(PATIENCE, || count(&h, |r| &r.udp_junk) >= 1));
    // No session was ever taken, and the prober is counted (within a second's refresh).
    assert_eq!(
        h.stats()
            .sessions
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>(),
        0
    );
    assert!(wait_until(PATIENCE, || {
        // Another valid probe nudges the count's refresh.
        let q = encode(
            &Probe {
                nonce: now_ns(),
                sent_unix_ns: now_ns(),
                ..p
            },
            &secret(),
            0,
        );
        udp_exchange(&h, &q, quiet).is_some()
            && h.stats().incoming_probers.load(Ordering::Relaxed) == 1
    }));
    serves_with_secret(&h);
}

#[test]
fn tcp_probes_are_answered_and_closed_without_a_session() {
    let h = agent(|c| {
        c.secret = Some(secret());
        // Probes are no sessions: an agent that takes none still answers them.
        c.max_sessions = 1;
        c.max_sessions_per_source = 1;
    });
    for i in 0..20u64 {
        let p = Probe {
            seq: i,
            sent_unix_ns: now_ns(),
            nonce: 1_000 + i,
            sender: "prober-b",
        };
        let probe = encode(&p, &secret(), 64);
        let mut s = connect(&h);
        s.write_all(&probe).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)
            .expect("the agent answers and closes");
        assert_eq!(reply.len(), probe.len());
        let r = ProbeReply::decode(&secret(), "prober-b", &reply).expect("the agent's MAC");
        assert_eq!(r.seq, i);
    }
    // A forged one: closed unanswered.
    let forged = encode(
        &Probe {
            seq: 0,
            sent_unix_ns: now_ns(),
            nonce: 5,
            sender: "prober-b",
        },
        &Secret::new(b"wrong".to_vec()).unwrap(),
        64,
    );
    let mut s = connect(&h);
    s.write_all(&forged).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    assert!(reply.is_empty(), "{reply:02x?}");
    assert_eq!(refusals(&h, ProbeRefusal::Mac), 1);
    assert_eq!(h.stats().probes_answered.load(Ordering::Relaxed), 20);
    serves_with_secret(&h);
}

#[test]
fn tcp_probes_whose_bytes_come_late_or_in_pieces_are_answered() {
    // The accepting thread waits up to FIRST_BYTES_WAIT for a probe's bytes; one that comes
    // later, or in two pieces, is handed to a connection thread and answered there.
    let h = agent(|c| c.secret = Some(secret()));
    let cases: [(Duration, Option<Duration>); 4] = [
        (Duration::ZERO, None),
        (Duration::from_millis(1), None),
        (crate::probe::FIRST_BYTES_WAIT * 10, None),
        (Duration::ZERO, Some(Duration::from_millis(20))),
    ];
    for (i, (before, split)) in (0u64..).zip(cases) {
        let p = Probe {
            seq: i,
            sent_unix_ns: now_ns(),
            nonce: 2_000 + i,
            sender: "prober-c",
        };
        let probe = encode(&p, &secret(), 64);
        let mut s = connect(&h);
        std::thread::sleep(before);
        if let Some(pause) = split {
            s.write_all(&probe[..8]).unwrap();
            std::thread::sleep(pause);
            s.write_all(&probe[8..]).unwrap();
        } else {
            s.write_all(&probe).unwrap();
        }
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)
            .expect("the agent answers and closes");
        let r = ProbeReply::decode(&secret(), "prober-c", &reply)
            .unwrap_or_else(|e| panic!("case {i}: {e:?} ({reply:02x?})"));
        assert_eq!((r.seq, r.nonce), (i, 2_000 + i));
    }
    assert_eq!(h.stats().probes_answered.load(Ordering::Relaxed), 4);
    serves_with_secret(&h);
}

#[test]
fn an_agent_without_a_secret_answers_no_probe() {
    let h = agent(|_| {});
    let p = Probe {
        seq: 1,
        sent_unix_ns: now_ns(),
        nonce: 1,
        sender: "prober-c",
    };
    assert!(udp_exchange(&h, &encode(&p, &secret(), 0), Duration::from_millis(300)).is_none());
    assert_eq!(refusals(&h, ProbeRefusal::Mac), 1);
}
