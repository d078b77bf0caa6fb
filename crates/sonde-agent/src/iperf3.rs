//! The iperf3 compatibility listener: answers real `iperf3 -c` clients (PROTOCOLS.md part 1).
//!
//! Work in progress: owned by the iperf3-server change.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::{CompatListener, Shared};

/// Accepts iperf3 control and data connections until the agent shuts down.
pub(crate) fn serve(listener: CompatListener, shared: &Arc<Shared>) {
    for conn in listener.tcp.incoming() {
        if shared.shutdown.load(Ordering::Relaxed) {
            break;
        }
        drop(conn);
    }
}
