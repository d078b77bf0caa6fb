//! The result documents. Field names carry their units (`rtt_ns`, `bits_per_second`). A value
//! that could not be measured is `null`, never 0.
//!
//! One module per test kind (its document and the types only it uses); `meta` holds what
//! every result carries, `context` both ends' context, `stats` the statistics kinds share.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
pub use sonde_wire::{
    HostInfo, InterfaceDelta, MinDefaultMax, NicInfo, NicOffloads, SocketBufferLimits,
};

mod conf;
mod context;
mod crr;
mod index;
mod kind;
mod latency;
mod load;
mod meta;
mod mtu;
mod pps;
mod quick;
mod stats;
mod sweep;
mod throughput;

pub use self::conf::*;
pub use self::context::*;
pub use self::crr::*;
pub use self::index::{HeadlineFigures, RunIndex};
pub use self::kind::{CsvRow, ResultKind, RttRun, RunPart};
pub use self::latency::*;
pub use self::load::*;
pub use self::meta::*;
pub use self::mtu::*;
pub use self::pps::*;
pub use self::quick::*;
pub use self::stats::*;
pub use self::sweep::*;
pub use self::throughput::*;

/// Declares [`TestResult`] with one variant per kind, and its one dispatch to the kind's
/// [`ResultKind`] ([`TestResult::kind`], [`TestResult::kind_mut`]): a kind registers here in
/// one line.
macro_rules! test_results {
    ($($(#[doc = $doc:literal])* $kind:ident($document:ty),)*) => {
        /// One run's document, tagged by `test`.
        // Variants differ in size (load holds three results); a result is built once per run
        // and never sits in a hot loop, so boxing would only add noise to every construction
        // site.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "test", rename_all = "lowercase")]
        pub enum TestResult {
            $($(#[doc = $doc])* $kind($document),)*
        }

        impl TestResult {
            /// The result as its kind: the one place that matches over every variant (besides
            /// serde).
            pub fn kind(&self) -> &dyn ResultKind {
                match self {
                    $(Self::$kind(r) => r,)*
                }
            }

            /// [`kind`](Self::kind), to change the document.
            pub fn kind_mut(&mut self) -> &mut dyn ResultKind {
                match self {
                    $(Self::$kind(r) => r,)*
                }
            }
        }
    };
}

test_results! {
    /// `sonde latency`.
    Latency(LatencyResult),
    /// `sonde throughput`.
    Throughput(ThroughputResult),
    /// `sonde pps`.
    Pps(PpsResult),
    /// `sonde crr`: connection rate.
    Crr(CrrResult),
    /// `sonde quick`.
    Quick(QuickResult),
    /// `sonde load`: latency idle and under load.
    Load(LoadResult),
    /// `--sweep`: one test at each value of a parameter.
    Sweep(SweepResult),
    /// `sonde conf`: both ends' configuration, side by side.
    Conf(ConfResult),
    /// `sonde mtu`: the path MTU by DF probes, and the TCP MSS at each end.
    Mtu(MtuResult),
}
