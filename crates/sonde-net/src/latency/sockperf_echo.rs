//! The sockperf echo, as `sockperf server` answers (docs/protocols/sockperf.md §4): the data
//! loops of the agent's sockperf compatibility listener. The agent keeps the protocol's
//! decisions (who is admitted, for how long, what is logged and counted as refused or junk);
//! the loops that read, frame, answer and time out live here, beside sonde's own echoes.
//!
//! Every message starts with sockperf's 14-byte header. A message without the client flag, or a
//! warm-up, is ignored; every other message is counted ([`Tally`]), and one that asks for a
//! reply (`PONG_REQUEST`) is sent back byte for byte with only the client bit cleared: over UDP
//! to the datagram's source address, over TCP on the same connection. Messages of 14 to
//! [`MAX_MSG`] bytes are accepted. A length below 14 is never looped on (a 3.7 server spins
//! forever on a zero length).
//!
//! The loops do not allocate, lock or log per message: buffers are allocated once per
//! connection or thread.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sonde_wire::sockperf::{self, Parsed};

use crate::fault;

/// The largest message accepted, bytes: `sockperf server`'s default maximum.
pub const MAX_MSG: u32 = sockperf::SERVER_MAX_MSG;
/// How often blocked reads and writes look at the stop flag and the deadlines.
pub const POLL: Duration = Duration::from_millis(200);
/// How often the UDP loop has its peers swept ([`UdpPeers::sweep`]).
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// A TCP client that takes none of its replies for this long is closed.
pub const WRITE_STALL: Duration = Duration::from_secs(10);
/// TCP receive buffer: several largest messages, so that reads are large and a message never
/// waits for room.
const TCP_BUF: usize = 4 * 65_536;
/// The TCP loop moves a partial message to the front of its buffer when less room than this is
/// left after it, so that reads stay large.
const READ_ROOM: usize = 65_536;
/// UDP receive buffer: above the largest IPv6 UDP payload, so nothing is cut off unseen.
const UDP_BUF: usize = 65_536;

/// How long a TCP connection may go on, as the caller decides.
#[derive(Debug, Clone, Copy)]
pub struct TcpLimits {
    /// The first whole message must come within this long of the start.
    pub first_message: Duration,
    /// After it, a connection silent this long is closed.
    pub idle: Duration,
    /// A connection is closed this long after its start...
    pub max_life: Duration,
    /// ...reported as over this duration ([`TcpEnd::OverDuration`]).
    pub max_duration: Duration,
}

/// How a TCP connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpEnd {
    /// EOF or a reset from the client: its normal way to finish.
    PeerClosed,
    /// EOF with part of a message buffered.
    Truncated(usize),
    /// A header whose length is below 14.
    TooShort(u32),
    /// A header whose length is above [`MAX_MSG`].
    TooLong(u32),
    /// No bytes within the idle limit.
    Idle(Duration),
    /// The session reached `max_duration` (plus slack).
    OverDuration(Duration),
    /// The client took no replies for [`WRITE_STALL`].
    WriteStalled,
    /// The stop flag was raised (the agent is shutting down).
    Shutdown,
    /// Any other socket error.
    Failed(io::ErrorKind),
}

impl TcpEnd {
    /// Whether the client sent something sockperf cannot frame.
    #[must_use]
    pub fn is_junk(self) -> bool {
        matches!(
            self,
            Self::Truncated(_) | Self::TooShort(_) | Self::TooLong(_)
        )
    }
}

impl std::fmt::Display for TcpEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PeerClosed => f.write_str("closed by the client"),
            Self::Truncated(n) => write!(
                f,
                "closed by the client in the middle of a message ({n} bytes of it)"
            ),
            Self::TooShort(n) => write!(
                f,
                "closed: a message length of {n}, below the 14-byte header"
            ),
            Self::TooLong(n) => write!(
                f,
                "closed: a message of {n} bytes, over the {MAX_MSG}-byte maximum"
            ),
            Self::Idle(d) => write!(f, "closed: no message for {} s", d.as_secs()),
            Self::OverDuration(d) => write!(f, "closed: over --max-duration ({} s)", d.as_secs()),
            Self::WriteStalled => write!(
                f,
                "closed: the client took no replies for {} s",
                WRITE_STALL.as_secs()
            ),
            Self::Shutdown => f.write_str("closed: the agent is stopping"),
            Self::Failed(kind) => write!(f, "closed: {kind}"),
        }
    }
}

/// What a connection or UDP peer handled.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Messages counted (client flag set, not a warm-up).
    pub messages: u64,
    /// Replies sent.
    pub replies: u64,
}

/// Serves one sockperf TCP connection (started at `started`) until it ends: answers every
/// message that asks for a reply, counts into `tally`, and says why it ended. The limits are the
/// caller's ([`TcpLimits`]); `stop` is looked at every [`POLL`].
pub fn tcp_serve(
    stream: &TcpStream,
    limits: &TcpLimits,
    stop: &AtomicBool,
    started: Instant,
    tally: &mut Tally,
) -> TcpEnd {
    // sockperf turns Nagle off in ping-pong and under-load; a reply held back by Nagle would
    // add up to 40 ms to the client's RTT.
    if let Err(e) = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(POLL)))
        .and_then(|()| stream.set_write_timeout(Some(POLL)))
    {
        return TcpEnd::Failed(e.kind());
    }
    let max_life = limits.max_life;
    let first_limit = limits.first_message;
    let mut buf = vec![0u8; TCP_BUF];
    // Unparsed bytes are buf[start..end].
    let (mut start, mut end) = (0usize, 0usize);
    let mut last_data = started;
    let mut s = stream;
    loop {
        // Answer every whole message in the buffer.
        loop {
            match sockperf::parse(&buf[start..end], MAX_MSG) {
                Parsed::Message(h) => {
                    // Only whole messages are traffic: a byte at a time does not keep a
                    // session alive.
                    last_data = Instant::now();
                    let len = h.length as usize;
                    let msg = &mut buf[start..start + len];
                    if h.counted_by_server() {
                        tally.messages += 1;
                        if h.wants_reply() {
                            sockperf::make_reply(msg);
                            if let Err(e) = write_reply(stream, msg, stop) {
                                return e;
                            }
                            tally.replies += 1;
                        }
                    }
                    start += len;
                }
                Parsed::Incomplete { need } => {
                    if start > 0 && (start + need > buf.len() || buf.len() - end < READ_ROOM) {
                        // `need` is at most MAX_MSG, well under the buffer: moving the partial
                        // message to the front always makes room for it, and for a large read.
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                    }
                    break;
                }
                Parsed::TooShort(h) => return TcpEnd::TooShort(h.length),
                Parsed::TooLong(h) => return TcpEnd::TooLong(h.length),
            }
        }
        if start == end {
            (start, end) = (0, 0);
        }
        match s.read(&mut buf[end..]) {
            Ok(0) => {
                return if start == end {
                    TcpEnd::PeerClosed
                } else {
                    TcpEnd::Truncated(end - start)
                };
            }
            Ok(n) => end += n,
            Err(e) if fault::again(&e) => {}
            Err(e) if fault::peer_gone(&e) => return TcpEnd::PeerClosed,
            Err(e) => return TcpEnd::Failed(e.kind()),
        }
        if stop.load(Ordering::Relaxed) {
            return TcpEnd::Shutdown;
        }
        let now = Instant::now();
        let idle_limit = if last_data == started {
            first_limit
        } else {
            limits.idle
        };
        if now.duration_since(last_data) >= idle_limit {
            return TcpEnd::Idle(idle_limit);
        }
        if now.duration_since(started) >= max_life {
            return TcpEnd::OverDuration(limits.max_duration);
        }
    }
}

/// Writes one reply whole. A client that stops reading holds the loop at most [`WRITE_STALL`];
/// the stop flag is looked at every [`POLL`].
fn write_reply(stream: &TcpStream, mut data: &[u8], stop: &AtomicBool) -> Result<(), TcpEnd> {
    let mut s = stream;
    let mut stalled_since: Option<Instant> = None;
    while !data.is_empty() {
        match s.write(data) {
            Ok(0) => return Err(TcpEnd::Failed(io::ErrorKind::WriteZero)),
            Ok(k) => {
                data = &data[k..];
                stalled_since = None;
            }
            Err(e) if fault::again(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Err(TcpEnd::Shutdown);
                }
                if stalled_since.get_or_insert_with(Instant::now).elapsed() >= WRITE_STALL {
                    return Err(TcpEnd::WriteStalled);
                }
            }
            Err(e) if fault::peer_gone(&e) => return Err(TcpEnd::PeerClosed),
            Err(e) => return Err(TcpEnd::Failed(e.kind())),
        }
    }
    Ok(())
}

/// The UDP peers being served: the caller's table of sessions, with its decisions.
pub trait UdpPeers {
    /// A datagram from `from` (to be answered with [`serve_datagram`] if the caller admits it).
    fn on_datagram(&mut self, udp: &UdpSocket, datagram: &mut [u8], from: SocketAddr);
    /// Called about every 250 ms: end the peers that have gone quiet or run too long.
    fn sweep(&mut self, now: Instant);
}

/// Serves sockperf UDP messages on `udp` until `stop`, through `peers`.
///
/// # Errors
/// Only when the socket's read timeout cannot be set (before anything is served); a failed
/// receive is the poll's timeout, or an ICMP error about an earlier reply to a client that has
/// gone, and concerns no other peer.
pub fn udp_serve(udp: &UdpSocket, stop: &AtomicBool, peers: &mut impl UdpPeers) -> io::Result<()> {
    udp.set_read_timeout(Some(POLL))?;
    let mut buf = vec![0u8; UDP_BUF];
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, from)) = udp.recv_from(&mut buf) {
            peers.on_datagram(udp, &mut buf[..n], from);
        }
        let now = Instant::now();
        if now >= next_sweep {
            next_sweep = now + SWEEP_EVERY;
            peers.sweep(now);
        }
    }
    Ok(())
}

/// Handles a datagram holding exactly one message, as real sockperf clients send them; `false`
/// for anything else (a datagram of several messages, or with bytes after its message), which
/// is dropped unanswered. One reply at most, never longer than its request: the UDP port cannot
/// amplify traffic toward a spoofed source (one datagram of 105 messages got 105 replies).
pub fn serve_datagram(
    udp: &UdpSocket,
    datagram: &mut [u8],
    from: SocketAddr,
    tally: &mut Tally,
) -> bool {
    let Parsed::Message(h) = sockperf::parse(datagram, MAX_MSG) else {
        return false;
    };
    if usize::try_from(h.length).ok() != Some(datagram.len()) {
        return false;
    }
    if h.counted_by_server() {
        tally.messages += 1;
        if h.wants_reply() {
            sockperf::make_reply(datagram);
            // A reply the kernel cannot queue is lost like any other datagram.
            if udp.send_to(datagram, from).is_ok() {
                tally.replies += 1;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::thread;

    use sonde_wire::sockperf::Flags;

    use super::*;

    fn limits() -> TcpLimits {
        TcpLimits {
            first_message: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            max_life: Duration::from_secs(30),
            max_duration: Duration::from_secs(25),
        }
    }

    fn message(seq: u64, flags: Flags, len: usize) -> Vec<u8> {
        let mut m = vec![0x5a; len];
        sockperf::write_request(seq, flags, &mut m).unwrap();
        m
    }

    /// One connection: the client's bytes in, the echo's end and tally out, and what came back.
    fn serve(input: &[u8]) -> (TcpEnd, Tally, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let stop = AtomicBool::new(false);
        let stop = &stop;
        thread::scope(|s| {
            // The connection closes when the echo ends, as the agent's does.
            let echo = s.spawn(move || {
                let mut tally = Tally::default();
                let end = tcp_serve(&server, &limits(), stop, Instant::now(), &mut tally);
                drop(server);
                (end, tally)
            });
            // Written in two halves, apart: the echo reassembles.
            let (a, b) = input.split_at(input.len() / 2);
            client.write_all(a).unwrap();
            client.flush().unwrap();
            thread::sleep(Duration::from_millis(20));
            client.write_all(b).unwrap();
            client.shutdown(std::net::Shutdown::Write).unwrap();
            let mut back = Vec::new();
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            client.read_to_end(&mut back).unwrap();
            let (end, tally) = echo.join().unwrap();
            (end, tally, back)
        })
    }

    #[test]
    fn tcp_answers_pong_requests_counts_client_messages_and_ignores_the_rest() {
        let ping = message(1, Flags::CLIENT | Flags::PONG_REQUEST, 64);
        let load = message(2, Flags::CLIENT, 100);
        let warmup = message(3, Flags::CLIENT | Flags::PONG_REQUEST | Flags::WARMUP, 20);
        let stray = message(4, Flags::PONG_REQUEST, 30);
        let input = [ping.clone(), load, warmup, stray].concat();
        let (end, tally, back) = serve(&input);
        assert_eq!(end, TcpEnd::PeerClosed, "{end}");
        assert_eq!((tally.messages, tally.replies), (2, 1));
        let mut reply = ping;
        sockperf::make_reply(&mut reply);
        assert_eq!(back, reply);
    }

    #[test]
    fn tcp_closes_on_a_length_it_cannot_frame_and_on_a_message_cut_off() {
        let mut short = message(1, Flags::CLIENT, 14);
        short[10..14].copy_from_slice(&3u32.to_be_bytes());
        let (end, _, back) = serve(&short);
        assert_eq!(end, TcpEnd::TooShort(3));
        assert!(end.is_junk() && back.is_empty());
        let whole = message(1, Flags::CLIENT | Flags::PONG_REQUEST, 40);
        let (end, tally, _) = serve(&whole[..30]);
        assert_eq!(end, TcpEnd::Truncated(30));
        assert_eq!(tally.messages, 0);
        assert_eq!(
            TcpEnd::TooLong(70_000).to_string(),
            "closed: a message of 70000 bytes, over the 65507-byte maximum"
        );
    }

    #[test]
    fn a_udp_datagram_of_one_message_is_answered_once_and_anything_else_is_not() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let from = client.local_addr().unwrap();
        let mut tally = Tally::default();
        let ping = message(7, Flags::CLIENT | Flags::PONG_REQUEST, 64);
        let mut d = ping.clone();
        assert!(serve_datagram(&server, &mut d, from, &mut tally));
        let mut back = [0u8; 128];
        let n = client.recv(&mut back).unwrap();
        let mut reply = ping.clone();
        sockperf::make_reply(&mut reply);
        assert_eq!(&back[..n], &reply[..]);
        assert_eq!((tally.messages, tally.replies), (1, 1));
        // Two messages in one datagram, or bytes after the message: dropped unanswered.
        let mut two = [ping.clone(), ping.clone()].concat();
        assert!(!serve_datagram(&server, &mut two, from, &mut tally));
        let mut tail = [ping, vec![0]].concat();
        assert!(!serve_datagram(&server, &mut tail, from, &mut tally));
        assert_eq!((tally.messages, tally.replies), (1, 1));
    }
}
