//! Sweep specs: one test parameter run at a series of values, as qperf's `-oo` loop, so a user
//! can see where bandwidth stops growing and latency starts to climb.
//!
//! A spec is `PARAM=VALUES`:
//!
//! | form                   | example                    | values                          |
//! |------------------------|----------------------------|---------------------------------|
//! | geometric range        | `msg_size=1:64K:*2`        | 1, 2, 4, … 32768, 65536         |
//! | additive range         | `msg_size=64:1472:+256`    | 64, 320, 576, 832, 1088, 1344, 1472 |
//! | list                   | `msg_size=64,512,1400`     | 64, 512, 1400 (in that order)   |
//! | single value           | `parallel=4`               | 4                               |
//!
//! A range always starts at its start and ends at its end: when the last step would pass the end,
//! the end itself is the last value (`1:1500:*2` ends …, 1024, 1500), so the largest value asked
//! for is always measured. Lists keep the order they were written in.
//!
//! Numbers are decimal digits with an optional suffix `K`, `M` or `G` (either case). For
//! `msg_size` the suffixes are binary, as sizes are everywhere in sonde (`64K` = 65,536 bytes,
//! `1M` = 1,048,576); for `parallel`, `rate` and `bitrate` they are decimal (`10K` = 10,000 per
//! second, `1G` = 10^9 bit/s), as iperf3's `-b`. Every value is at least 1. A sweep has at most
//! [`MAX_STEPS`] values; whether a value suits the test (a message size the protocol can carry)
//! is for the test's own option checks to say.
//!
//! ```
//! use sonde_engine::sweep::{Sweep, SweepParam};
//!
//! let sweep: Sweep = "msg_size=1:64K:*2".parse().unwrap();
//! assert_eq!(sweep.param(), SweepParam::MsgSize);
//! assert_eq!(sweep.values().len(), 17);
//! assert_eq!(sweep.values().last(), Some(&65_536));
//!
//! let err = "msg_size=64:1472".parse::<Sweep>().unwrap_err();
//! assert!(err.to_string().contains("START:END:*FACTOR"));
//! ```

use std::fmt;
use std::str::FromStr;

/// The most values one sweep may have: each step is a whole test, and 256 of them is already
/// hours at the default durations.
pub const MAX_STEPS: usize = 256;

/// The test parameter a sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SweepParam {
    /// Message (or write, or datagram) size in bytes (`-m`/`-l`). Binary suffixes.
    MsgSize,
    /// Parallel streams or workers (`-P`). Decimal suffixes.
    Parallel,
    /// Messages per second of open-loop latency (`--rate`). Decimal suffixes.
    Rate,
    /// UDP bitrate in bits per second, all streams together (`-b`). Decimal suffixes.
    Bitrate,
    /// Requests in flight per flow of a latency test (`--depth`). Decimal suffixes.
    Depth,
}

impl SweepParam {
    /// Every parameter, in the order the error message lists them.
    pub const ALL: [Self; 5] = [
        Self::MsgSize,
        Self::Parallel,
        Self::Rate,
        Self::Bitrate,
        Self::Depth,
    ];

    /// The name used in a spec (and in JSON): `msg_size`, `parallel`, `rate`, `bitrate`.
    pub fn name(self) -> &'static str {
        match self {
            Self::MsgSize => "msg_size",
            Self::Parallel => "parallel",
            Self::Rate => "rate",
            Self::Bitrate => "bitrate",
            Self::Depth => "depth",
        }
    }

    /// The unit of the values: `bytes`, `streams`, `messages_per_second`, `bits_per_second`.
    pub fn unit(self) -> &'static str {
        match self {
            Self::MsgSize => "bytes",
            Self::Parallel => "streams",
            Self::Rate => "messages_per_second",
            Self::Bitrate => "bits_per_second",
            Self::Depth => "requests_in_flight",
        }
    }

    /// What `K` multiplies by: 1024 for sizes, 1000 for counts and rates.
    fn kilo(self) -> u64 {
        match self {
            Self::MsgSize => 1024,
            Self::Parallel | Self::Rate | Self::Bitrate | Self::Depth => 1000,
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for SweepParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a sweep spec was refused. Each message names the parameter and the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// No `=` between the parameter and its values.
    #[error("sweep `{0}`: expected PARAM=VALUES, e.g. msg_size=1:64K:*2 or parallel=1,2,4")]
    NoEquals(String),
    /// The parameter is not one sonde can sweep.
    #[error("sweep: unknown parameter `{0}` (known: msg_size, parallel, rate, bitrate, depth)")]
    UnknownParam(String),
    /// Nothing after the `=`, or an empty list element.
    #[error("sweep {param}: empty value in `{text}`")]
    Empty {
        /// The parameter.
        param: SweepParam,
        /// The values as written.
        text: String,
    },
    /// Not digits with an optional `K`/`M`/`G`.
    #[error("sweep {param}: `{text}` is not a number (digits with an optional K, M or G suffix)")]
    BadNumber {
        /// The parameter.
        param: SweepParam,
        /// The number as written.
        text: String,
    },
    /// A number that does not fit 64 bits.
    #[error("sweep {param}: `{text}` is too large")]
    TooLarge {
        /// The parameter.
        param: SweepParam,
        /// The number as written.
        text: String,
    },
    /// A value of 0.
    #[error("sweep {param}: values must be at least 1, got `{text}`")]
    Zero {
        /// The parameter.
        param: SweepParam,
        /// The number as written.
        text: String,
    },
    /// A range that is not `START:END:*FACTOR` or `START:END:+INCREMENT`.
    #[error(
        "sweep {param}: `{text}` is not a range; write START:END:*FACTOR (e.g. 1:64K:*2) \
         or START:END:+INCREMENT (e.g. 64:1472:+256)"
    )]
    BadRange {
        /// The parameter.
        param: SweepParam,
        /// The range as written.
        text: String,
    },
    /// A range whose end is below its start.
    #[error("sweep {param}: the range ends at {end}, below its start {start}")]
    Backwards {
        /// The parameter.
        param: SweepParam,
        /// The start value.
        start: u64,
        /// The end value.
        end: u64,
    },
    /// A geometric factor below 2 (the values would not grow).
    #[error("sweep {param}: the factor must be at least 2, got `{text}`")]
    BadFactor {
        /// The parameter.
        param: SweepParam,
        /// The factor as written.
        text: String,
    },
    /// More than [`MAX_STEPS`] values.
    #[error("sweep {param}: {steps} steps, more than the {MAX_STEPS} a sweep may have")]
    TooManySteps {
        /// The parameter.
        param: SweepParam,
        /// How many values the spec asks for (saturating).
        steps: u64,
    },
}

/// A parsed, expanded sweep: the parameter and its values in the order they are to be run.
/// Never empty, at most [`MAX_STEPS`] values, every value at least 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sweep {
    param: SweepParam,
    values: Vec<u64>,
}

impl Sweep {
    /// Parses and expands `spec` (see the module documentation for the forms).
    pub fn parse(spec: &str) -> Result<Self, SweepError> {
        let (name, text) = spec
            .split_once('=')
            .ok_or_else(|| SweepError::NoEquals(spec.to_owned()))?;
        let name = name.trim();
        let param =
            SweepParam::from_name(name).ok_or_else(|| SweepError::UnknownParam(name.to_owned()))?;
        let text = text.trim();
        let values = if text.contains(':') {
            expand_range(param, text)?
        } else {
            parse_list(param, text)?
        };
        Ok(Self { param, values })
    }

    /// The parameter swept.
    pub fn param(&self) -> SweepParam {
        self.param
    }

    /// The values, in run order; never empty.
    pub fn values(&self) -> &[u64] {
        &self.values
    }
}

impl FromStr for Sweep {
    type Err = SweepError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// `a,b,c` (or a single value), in the order written.
fn parse_list(param: SweepParam, text: &str) -> Result<Vec<u64>, SweepError> {
    // Counted before anything is parsed, so a huge list costs nothing.
    let steps = text.split(',').count();
    if steps > MAX_STEPS {
        return Err(SweepError::TooManySteps {
            param,
            steps: steps as u64,
        });
    }
    text.split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() {
                Err(SweepError::Empty {
                    param,
                    text: text.to_owned(),
                })
            } else {
                parse_value(param, item)
            }
        })
        .collect()
}

/// `START:END:*FACTOR` or `START:END:+INCREMENT`.
fn expand_range(param: SweepParam, text: &str) -> Result<Vec<u64>, SweepError> {
    let bad_range = || SweepError::BadRange {
        param,
        text: text.to_owned(),
    };
    let mut parts = text.split(':').map(str::trim);
    let (Some(start), Some(end), Some(step), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad_range());
    };
    let start = parse_value(param, start)?;
    let end = parse_value(param, end)?;
    if end < start {
        return Err(SweepError::Backwards { param, start, end });
    }
    if let Some(factor) = step.strip_prefix('*') {
        let factor_text = factor.trim();
        let factor = parse_number(param, factor_text)?;
        if factor < 2 {
            return Err(SweepError::BadFactor {
                param,
                text: factor_text.to_owned(),
            });
        }
        geometric(param, start, end, factor)
    } else if let Some(increment) = step.strip_prefix('+') {
        let increment = parse_value(param, increment.trim())?;
        additive(param, start, end, increment)
    } else {
        Err(bad_range())
    }
}

/// `start, start*f, start*f², …` below `end`, then `end`. At most 65 values for `f >= 2`.
fn geometric(param: SweepParam, start: u64, end: u64, factor: u64) -> Result<Vec<u64>, SweepError> {
    let mut values = vec![start];
    let mut v = start;
    while v < end {
        v = v.checked_mul(factor).map_or(end, |next| next.min(end));
        values.push(v);
    }
    if values.len() > MAX_STEPS {
        return Err(SweepError::TooManySteps {
            param,
            steps: values.len() as u64,
        });
    }
    Ok(values)
}

/// `start, start+i, start+2i, …` below `end`, then `end`.
fn additive(
    param: SweepParam,
    start: u64,
    end: u64,
    increment: u64,
) -> Result<Vec<u64>, SweepError> {
    // Steps before the end, plus the end itself, computed before anything is allocated.
    let steps = (end - start).div_ceil(increment).saturating_add(1);
    if steps > MAX_STEPS as u64 {
        return Err(SweepError::TooManySteps { param, steps });
    }
    let mut values = Vec::with_capacity(steps as usize);
    let mut v = start;
    while v < end {
        values.push(v);
        // `end - v >= 1`, so this never passes `end` and never overflows.
        v += increment.min(end - v);
    }
    values.push(end);
    Ok(values)
}

/// A number of at least 1.
fn parse_value(param: SweepParam, text: &str) -> Result<u64, SweepError> {
    match parse_number(param, text)? {
        0 => Err(SweepError::Zero {
            param,
            text: text.to_owned(),
        }),
        n => Ok(n),
    }
}

/// Decimal digits with an optional `K`/`M`/`G` suffix in the parameter's base.
fn parse_number(param: SweepParam, text: &str) -> Result<u64, SweepError> {
    let bad = || SweepError::BadNumber {
        param,
        text: text.to_owned(),
    };
    let too_large = || SweepError::TooLarge {
        param,
        text: text.to_owned(),
    };
    let (digits, power) = match text.as_bytes().last() {
        Some(b'k' | b'K') => (&text[..text.len() - 1], 1),
        Some(b'm' | b'M') => (&text[..text.len() - 1], 2),
        Some(b'g' | b'G') => (&text[..text.len() - 1], 3),
        _ => (text, 0),
    };
    // `u64::from_str` would also take a leading `+`; sonde's numbers are plain digits.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    n.checked_mul(param.kilo().pow(power)).ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values(spec: &str) -> Vec<u64> {
        Sweep::parse(spec).unwrap().values().to_vec()
    }

    #[test]
    fn geometric_doubles_from_one_byte_to_64_kib() {
        let v = values("msg_size=1:64K:*2");
        assert_eq!(v.len(), 17);
        assert_eq!(v, (0..17).map(|i| 1u64 << i).collect::<Vec<_>>());
    }

    #[test]
    fn additive_clamps_the_last_step_to_the_end_and_includes_it() {
        assert_eq!(
            values("msg_size=64:1472:+256"),
            [64, 320, 576, 832, 1088, 1344, 1472]
        );
        // An end the steps land on exactly is not repeated.
        assert_eq!(values("msg_size=64:576:+256"), [64, 320, 576]);
    }

    #[test]
    fn geometric_ends_at_the_end_when_the_factor_overshoots_it() {
        assert_eq!(
            values("msg_size=1:1500:*2"),
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1500]
        );
        assert_eq!(values("parallel=1:8:*2"), [1, 2, 4, 8]);
        assert_eq!(values("parallel=3:100:*10"), [3, 30, 100]);
    }

    #[test]
    fn a_list_keeps_its_order_and_a_single_value_is_one_step() {
        assert_eq!(values("msg_size=64,512,1400"), [64, 512, 1400]);
        assert_eq!(values("msg_size=1400, 64"), [1400, 64]);
        assert_eq!(values("parallel=4"), [4]);
        assert_eq!(values("rate=5:5:*2"), [5]);
    }

    #[test]
    fn size_suffixes_are_binary_and_rate_suffixes_decimal() {
        assert_eq!(values("msg_size=64K"), [65_536]);
        assert_eq!(values("msg_size=1m,1G"), [1 << 20, 1 << 30]);
        assert_eq!(values("rate=10K"), [10_000]);
        assert_eq!(values("bitrate=100M:1G:*10"), [100_000_000, 1_000_000_000]);
        assert_eq!(values("parallel=1k"), [1_000]);
    }

    #[test]
    fn the_parameter_is_named_and_has_a_unit() {
        let s = Sweep::parse("rate=1K:4K:+1K").unwrap();
        assert_eq!(s.param(), SweepParam::Rate);
        assert_eq!(s.param().unit(), "messages_per_second");
        assert_eq!(s.values(), [1_000, 2_000, 3_000, 4_000]);
        assert_eq!(SweepParam::MsgSize.to_string(), "msg_size");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = |spec: &str| Sweep::parse(spec).unwrap_err();
        assert_eq!(err("msg_size"), SweepError::NoEquals("msg_size".into()));
        assert_eq!(err("size=64"), SweepError::UnknownParam("size".into()));
        assert!(err("size=64").to_string().contains("known: msg_size"));
        let p = SweepParam::MsgSize;
        assert_eq!(
            err("msg_size=64x"),
            SweepError::BadNumber {
                param: p,
                text: "64x".into()
            }
        );
        assert!(matches!(err("msg_size=+64"), SweepError::BadNumber { .. }));
        assert!(matches!(err("msg_size=-1"), SweepError::BadNumber { .. }));
        assert!(matches!(err("msg_size=K"), SweepError::BadNumber { .. }));
        assert!(matches!(err("msg_size="), SweepError::Empty { .. }));
        assert!(matches!(err("msg_size=1,,2"), SweepError::Empty { .. }));
        assert_eq!(
            err("msg_size=0:8:*2"),
            SweepError::Zero {
                param: p,
                text: "0".into()
            }
        );
        assert_eq!(
            err("msg_size=64:1472").to_string(),
            "sweep msg_size: `64:1472` is not a range; write START:END:*FACTOR (e.g. 1:64K:*2) \
             or START:END:+INCREMENT (e.g. 64:1472:+256)"
        );
        assert!(matches!(
            err("msg_size=1:8:/2"),
            SweepError::BadRange { .. }
        ));
        assert!(matches!(
            err("msg_size=1:8:*2:4"),
            SweepError::BadRange { .. }
        ));
        assert_eq!(
            err("msg_size=8:1:*2"),
            SweepError::Backwards {
                param: p,
                start: 8,
                end: 1
            }
        );
        assert!(matches!(
            err("msg_size=1:8:*1"),
            SweepError::BadFactor { .. }
        ));
        assert!(matches!(
            err("msg_size=1:8:*0"),
            SweepError::BadFactor { .. }
        ));
        assert!(matches!(err("msg_size=1:8:+0"), SweepError::Zero { .. }));
        assert!(matches!(
            err("msg_size=99999999999999999999"),
            SweepError::TooLarge { .. }
        ));
        assert!(matches!(
            err("msg_size=20000000000G"),
            SweepError::TooLarge { .. }
        ));
    }

    #[test]
    fn the_number_of_steps_is_bounded() {
        assert_eq!(values("msg_size=1:256:+1").len(), MAX_STEPS);
        assert_eq!(
            Sweep::parse("msg_size=1:257:+1").unwrap_err(),
            SweepError::TooManySteps {
                param: SweepParam::MsgSize,
                steps: 257
            }
        );
        // Counted, not expanded: a range of 2^64 steps is refused at once.
        assert!(matches!(
            Sweep::parse(&format!("rate=1:{}:+1", u64::MAX)).unwrap_err(),
            SweepError::TooManySteps { .. }
        ));
        let long_list = vec!["1"; MAX_STEPS + 1].join(",");
        assert!(matches!(
            Sweep::parse(&format!("parallel={long_list}")).unwrap_err(),
            SweepError::TooManySteps { steps: 257, .. }
        ));
    }

    #[test]
    fn a_geometric_range_to_the_top_of_u64_stops_there() {
        let v = values(&format!("rate=1:{}:*2", u64::MAX));
        assert_eq!(v.len(), 65);
        assert_eq!(v[63], 1 << 63);
        assert_eq!(v[64], u64::MAX);
    }

    proptest! {
        #[test]
        fn parsing_never_panics(spec in ".{0,40}") {
            let _ = Sweep::parse(&spec);
        }

        #[test]
        fn parsing_range_like_text_never_panics(
            spec in "(msg_size|parallel|rate|bitrate)=[0-9kKmMgG:*+,]{0,24}"
        ) {
            if let Ok(sweep) = Sweep::parse(&spec) {
                prop_assert!(!sweep.values().is_empty());
                prop_assert!(sweep.values().len() <= MAX_STEPS);
                prop_assert!(sweep.values().iter().all(|&v| v >= 1));
            }
        }

        #[test]
        fn ranges_start_at_the_start_rise_and_end_at_the_end(
            start in 1u64..1_000_000,
            span in 0u64..10_000_000,
            step in 1u64..100_000,
            geometric in any::<bool>(),
        ) {
            let end = start + span;
            let spec = if geometric {
                format!("msg_size={start}:{end}:*{}", step % 16 + 2)
            } else {
                format!("msg_size={start}:{end}:+{step}")
            };
            match Sweep::parse(&spec) {
                Ok(sweep) => {
                    let v = sweep.values();
                    prop_assert!(!v.is_empty());
                    prop_assert_eq!(v[0], start);
                    prop_assert_eq!(*v.last().unwrap(), end);
                    prop_assert!(v.iter().all(|&x| x <= end));
                    prop_assert!(v.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(v.len() <= MAX_STEPS);
                }
                Err(SweepError::TooManySteps { steps, .. }) => {
                    prop_assert!(!geometric);
                    prop_assert!(steps > MAX_STEPS as u64);
                }
                Err(e) => prop_assert!(false, "{spec}: {e}"),
            }
        }

        #[test]
        fn lists_come_back_in_the_order_written(
            list in proptest::collection::vec(1u64..1_000_000_000, 1..=MAX_STEPS),
        ) {
            let text: Vec<String> = list.iter().map(u64::to_string).collect();
            let sweep = Sweep::parse(&format!("parallel={}", text.join(","))).unwrap();
            prop_assert_eq!(sweep.values(), &list[..]);
        }
    }
}
