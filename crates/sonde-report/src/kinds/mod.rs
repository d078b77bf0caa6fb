//! Each test kind's [`ResultKind`](crate::ResultKind): what its result gives every consumer (its
//! table, its line in quick's table, its CSV columns and rows, its labels and metas, the runs it
//! is made of, its RTTs, and how `sonde compare` reads it: its [`compare::Kind`](crate::compare::Kind)
//! and its value of each [`Figure`](crate::compare::Figure)), one module per kind. [`TestResult::kind`](crate::TestResult::kind) is the one dispatch; a new kind adds
//! its module here, its document in [`model`](crate::model) and its line in `model`'s
//! `test_results!` (the variant and its arm of the dispatch).

mod conf;
mod crr;
mod latency;
mod load;
mod mtu;
mod pps;
mod quick;
mod sweep;
mod throughput;
