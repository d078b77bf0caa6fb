//! Platform code. Linux gets batching and GSO; other platforms fall back to one datagram per call.
