//! The network-namespace lab: hosts in namespaces joined by veths in 198.18.0.0/15, links
//! shaped with `tc tbf`, loss from nftables, and every measurement checked against what the
//! kernel counted. Needs root, `ip`, `tc` and `nft`; each lab is torn down even when its test
//! fails. One module per lab; each file's own doc comment says what it builds and checks.

#[path = "../common/mod.rs"]
mod common;

mod balancer;
mod basic;
mod context;
mod diagnose;
mod helpers;
mod inner;
mod mesh;
mod mtu;
mod plan;
mod sockopt;
mod source;
mod store;
