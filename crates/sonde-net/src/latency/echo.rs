//! The agent's echoes: every TCP byte or UDP datagram back, stamped when a one-way request
//! asks. One loop over the [`Transport`]'s [`EchoState`]: TCP's (bytes, or whole stamped
//! messages) is in `tcp.rs`, UDP's (datagrams, joins answered) in `udp.rs`.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use super::transport::{EchoState, Transport};
use crate::Counters;

/// The echo loop: one receive and what it brought sent back, until EOF or `stop`. Every call
/// is counted in `counters`.
pub(super) fn echo<T: Transport>(
    sock: &T,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<()> {
    let _restore = T::Echo::timeouts(sock)?;
    let mut st = T::Echo::new();
    while !stop.load(Ordering::Relaxed) {
        let received = st.recv(sock);
        counters.syscall();
        let n = match received {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(()),
            Err(e) if T::Echo::transient(&e) => continue,
            Err(e) => return Err(e),
        };
        if !st.back(sock, n, stop, counters)? {
            return Ok(());
        }
    }
    Ok(())
}
