//! The sockperf compatibility listener: answers real `sockperf` clients (PROTOCOLS.md part 2).
//!
//! Work in progress: owned by the sockperf change.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::{CompatListener, Shared};

/// Accepts sockperf TCP connections and UDP messages until the agent shuts down.
pub(crate) fn serve(listener: CompatListener, shared: &Arc<Shared>) {
    for conn in listener.tcp.incoming() {
        if shared.shutdown.load(Ordering::Relaxed) {
            break;
        }
        drop(conn);
    }
}
