//! The one loop that reads a whole message toward a deadline.
//!
//! A control frame, a CRR request and a TCP latency reply are all read the same way: read into
//! the rest of the buffer until it is full, a closed connection ending it early. What differs is
//! the caller's policy, and only that is passed in ([`Fill`]): what to look at before each read
//! (a deadline on `Instant`, the time left set as the socket's read timeout), what a failed read
//! means (a signal or a poll timeout reads again; a deadline passed or a stop flag raised ends
//! the read with the caller's error), and what the peer closing is. The read itself is a
//! closure, so a caller can read with kernel timestamps or count its system calls.

use std::io;

/// A caller's policy around [`read_full`].
pub(crate) trait Fill {
    /// The error a read ends with.
    type Error;
    /// Before each read: `Err` ends the read (a deadline passed); may set the socket's timeout.
    fn before_read(&mut self) -> Result<(), Self::Error>;
    /// A failed read: `Ok` to read again, `Err` to end the read.
    fn failed(&mut self, e: io::Error) -> Result<(), Self::Error>;
    /// The peer closed the connection before the buffer was full.
    fn closed(&mut self) -> Self::Error;
}

/// Fills `buf` with `read` (which reads into the slice it is given), under `policy`.
pub(crate) fn read_full<P: Fill>(
    buf: &mut [u8],
    mut read: impl FnMut(&mut [u8]) -> io::Result<usize>,
    policy: &mut P,
) -> Result<(), P::Error> {
    let mut got = 0;
    while got < buf.len() {
        policy.before_read()?;
        match read(&mut buf[got..]) {
            Ok(0) => return Err(policy.closed()),
            Ok(n) => got += n,
            Err(e) => policy.failed(e)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what the loop asked of its policy; ends at the third failure.
    #[derive(Default)]
    struct Tally {
        before: u32,
        failed: u32,
    }

    impl Fill for Tally {
        type Error = &'static str;
        fn before_read(&mut self) -> Result<(), &'static str> {
            self.before += 1;
            Ok(())
        }
        fn failed(&mut self, _e: io::Error) -> Result<(), &'static str> {
            self.failed += 1;
            if self.failed >= 3 {
                Err("gave up")
            } else {
                Ok(())
            }
        }
        fn closed(&mut self) -> &'static str {
            "closed"
        }
    }

    #[test]
    fn split_reads_fill_the_buffer_failures_go_to_the_policy_and_eof_ends_it() {
        // 5 bytes in reads of 2, 1 failure, then the rest.
        let mut script: Vec<io::Result<&[u8]>> = vec![
            Ok(b"ab"),
            Err(io::ErrorKind::WouldBlock.into()),
            Ok(b"cd"),
            Ok(b"e"),
        ];
        script.reverse();
        let mut buf = [0u8; 5];
        let mut p = Tally::default();
        let read = |dst: &mut [u8]| {
            script.pop().unwrap().map(|src| {
                dst[..src.len()].copy_from_slice(src);
                src.len()
            })
        };
        assert_eq!(read_full(&mut buf, read, &mut p), Ok(()));
        assert_eq!(&buf, b"abcde");
        assert_eq!((p.before, p.failed), (4, 1));

        let mut p = Tally::default();
        let r = read_full(&mut [0u8; 4], |_: &mut [u8]| Ok(0), &mut p);
        assert_eq!(r, Err("closed"));
        let mut p = Tally::default();
        let r = read_full(
            &mut [0u8; 4],
            |_: &mut [u8]| Err(io::ErrorKind::TimedOut.into()),
            &mut p,
        );
        assert_eq!(r, Err("gave up"));
        assert_eq!(p.failed, 3);
    }
}
