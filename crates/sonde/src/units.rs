//! Parsing the numbers people type: `64K`, `1.5M`, `100M` bits/s, `2.5` seconds.

use std::fmt;
use std::time::Duration;

/// A value on the command line that does not parse; exit code 2.
#[derive(Debug)]
pub(crate) struct BadValue(pub(crate) String);

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadValue {}

fn split_suffix(s: &str) -> (&str, Option<char>) {
    match s.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => (&s[..s.len() - 1], Some(c.to_ascii_uppercase())),
        _ => (s, None),
    }
}

fn number(s: &str, what: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("`{s}` is not a {what}"))
}

/// Sizes in bytes with binary suffixes, as iperf3's `-l`: `64K` = 65,536.
pub(crate) fn size(s: &str) -> Result<u32, String> {
    let (n, suffix) = split_suffix(s.trim());
    let mult: f64 = match suffix {
        None | Some('B') => 1.0,
        Some('K') => 1024.0,
        Some('M') => 1024.0 * 1024.0,
        Some('G') => 1024.0 * 1024.0 * 1024.0,
        Some(c) => return Err(format!("`{s}`: unknown size suffix `{c}` (use K, M or G)")),
    };
    let v = number(n, "size")? * mult;
    if v.fract() != 0.0 || v > f64::from(u32::MAX) {
        return Err(format!("`{s}` is not a whole number of bytes below 4 GiB"));
    }
    Ok(v as u32)
}

/// Byte counts with binary suffixes, as iperf3's `-n`: `10G` = 10,737,418,240 (`T` too).
pub(crate) fn byte_count(s: &str) -> Result<u64, String> {
    let (n, suffix) = split_suffix(s.trim());
    let mult: f64 = match suffix {
        None | Some('B') => 1.0,
        Some('K') => 1024.0,
        Some('M') => 1024.0 * 1024.0,
        Some('G') => 1024.0 * 1024.0 * 1024.0,
        Some('T') => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        Some(c) => {
            return Err(format!(
                "`{s}`: unknown size suffix `{c}` (use K, M, G or T)"
            ))
        }
    };
    let v = number(n, "byte count")? * mult;
    // Below 2^53, where an f64 still holds every whole number.
    if v.fract() != 0.0 || v >= 9_007_199_254_740_992.0 {
        return Err(format!("`{s}` is not a whole number of bytes below 8 PiB"));
    }
    Ok(v as u64)
}

/// Rates in bits per second with decimal suffixes, as iperf3's `-b`: `100M` = 100,000,000.
pub(crate) fn bitrate(s: &str) -> Result<u64, String> {
    let (n, suffix) = split_suffix(s.trim());
    let mult: f64 = match suffix {
        None => 1.0,
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('G') => 1e9,
        Some('T') => 1e12,
        Some(c) => {
            return Err(format!(
                "`{s}`: unknown rate suffix `{c}` (use K, M, G or T, bits per second)"
            ))
        }
    };
    let v = number(n, "rate")? * mult;
    if v > 1e15 {
        return Err(format!("`{s}` is beyond any link"));
    }
    Ok(v.round() as u64)
}

/// Seconds, fractional allowed: `10`, `2.5`, `0.1`.
pub(crate) fn seconds(s: &str) -> Result<Duration, String> {
    let v = number(s.trim().trim_end_matches('s'), "number of seconds")?;
    if v > 86_400.0 * 7.0 {
        return Err(format!("`{s}` seconds is more than a week"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A count of messages per second: `1000`, `10K`, `1.5M`.
pub(crate) fn per_second(s: &str) -> Result<f64, String> {
    let (n, suffix) = split_suffix(s.trim());
    let mult = match suffix {
        None => 1.0,
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some(c) => return Err(format!("`{s}`: unknown suffix `{c}` (use K or M)")),
    };
    let v = number(n, "rate")? * mult;
    if v <= 0.0 {
        return Err("the rate must be above zero".into());
    }
    Ok(v)
}

/// A taskset-style CPU list (`0-3,6`): `sonde server --cpu-list`, `--cpu` of throughput and
/// pps (a newtype: clap would take a bare `Vec` for repeated values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CpuList(pub(crate) Vec<u32>);

/// Parses a [`CpuList`].
pub(crate) fn cpu_list(s: &str) -> Result<CpuList, String> {
    sonde_agent::tune::parse_cpu_list(s).map(CpuList)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_like_iperf3() {
        assert_eq!(size("64"), Ok(64));
        assert_eq!(size("64K"), Ok(65_536));
        assert_eq!(size("1k"), Ok(1024));
        assert_eq!(size("1M"), Ok(1_048_576));
        assert!(size("1.5").is_err());
        assert!(size("-1").is_err());
        assert!(size("5X").is_err());
        assert!(size("8G").is_err());
    }

    #[test]
    fn bitrates_are_decimal_like_iperf3() {
        assert_eq!(bitrate("100M"), Ok(100_000_000));
        assert_eq!(bitrate("1G"), Ok(1_000_000_000));
        assert_eq!(bitrate("1.5g"), Ok(1_500_000_000));
        assert_eq!(bitrate("0"), Ok(0));
        assert!(bitrate("fast").is_err());
    }

    #[test]
    fn seconds_take_fractions() {
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds("10s"), Ok(Duration::from_secs(10)));
        assert!(seconds("-1").is_err());
        assert!(seconds("1e9").is_err());
    }

    #[test]
    fn rates_take_suffixes() {
        assert_eq!(per_second("10K"), Ok(10_000.0));
        assert!(per_second("0").is_err());
    }
}
