//! Kernel transmit timestamps, read off a socket's error queue and kept by message until its
//! reply comes.

use sonde_wire::widen_seq;

use super::{count_call, ring_slot, SEND_RING};
use crate::sys;

/// What a transmit stamp's key counts.
#[derive(Debug, Clone, Copy)]
pub(super) enum Keying {
    /// UDP: datagrams, from 0.
    Datagram,
    /// TCP: bytes, from 0, up to the last byte of the write; every message is this many bytes.
    Bytes(u64),
}

impl Keying {
    /// The message a stamp's 32-bit `key` is for, `newest` being the highest seq sent. `None`
    /// for a TCP stamp that does not end a message (a message written in parts).
    pub(super) fn seq(self, key: u32, newest: u64) -> Option<u64> {
        match self {
            Keying::Datagram => Some(widen_seq(u64::from(key), 4, newest)),
            Keying::Bytes(msg) => {
                let msg = msg.max(1);
                let last_byte = newest.saturating_add(1).saturating_mul(msg) - 1;
                let byte = widen_seq(u64::from(key), 4, last_byte);
                let end = byte.saturating_add(1);
                end.is_multiple_of(msg).then(|| end / msg - 1)
            }
        }
    }
}

/// Transmit timestamps off a socket's error queue, kept by message until their reply.
pub(super) struct TxStamps<'a> {
    /// `(seq, ns)` per ring slot; empty when transmit stamps are not read.
    ring: Vec<(u64, u64)>,
    fd: sys::SockRef<'a>,
    keying: Keying,
}

impl<'a> TxStamps<'a> {
    pub(super) fn new(reading: bool, fd: sys::SockRef<'a>, keying: Keying) -> Self {
        Self {
            ring: if reading {
                vec![(u64::MAX, 0); SEND_RING]
            } else {
                Vec::new()
            },
            fd,
            keying,
        }
    }

    /// The kernel's transmit time of message `seq`, after taking what the error queue holds.
    /// `newest` is the highest seq sent (keys carry 32 bits). A stamp outside `[sent,
    /// received]` (wall clock, ns) belongs to another message (a send the kernel dropped before
    /// numbering it would shift the keys) and is not used. TCP may put two messages written
    /// back to back into one segment, which carries only the later one's stamp: the earlier
    /// has none.
    pub(super) fn of(
        &mut self,
        seq: u64,
        newest: u64,
        sent: Option<u64>,
        received: Option<u64>,
    ) -> Option<u64> {
        if self.ring.is_empty() {
            return None;
        }
        while let Ok(Some((key, ns))) = {
            count_call();
            sys::read_tx_stamp(self.fd)
        } {
            if let Some(s) = self.keying.seq(key, newest) {
                self.ring[ring_slot(s)] = (s, ns);
            }
        }
        let (tag, ns) = self.ring[ring_slot(seq)];
        let plausible = sent.is_none_or(|a| ns >= a) && received.is_none_or(|b| ns <= b);
        (tag == seq && plausible).then_some(ns)
    }
}
