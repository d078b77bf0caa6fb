//! Number formatting for the table: units, separators, percentages, dates.

/// One step of a scaled quantity (`Mbit/s`, `GiB`): its size in base units and how many decimals
/// it prints with. From giga up, three decimals keep mega resolution (`0.999 Gbit/s` next to
/// `1.000 Gbit/s` still shows a difference).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Unit {
    name: &'static str,
    size: f64,
    decimals: usize,
}

/// Rates: SI steps (1 Mbit/s = 10^6 bit/s), as every network tool and link speed.
pub(super) const RATE: [Unit; 5] = [
    Unit::new("bit/s", 1.0, 0),
    Unit::new("Kbit/s", 1e3, 2),
    Unit::new("Mbit/s", 1e6, 2),
    Unit::new("Gbit/s", 1e9, 3),
    Unit::new("Tbit/s", 1e12, 3),
];

/// Byte counts: binary steps (1 MiB = 2^20 B), as iperf3's transfer column.
pub(super) const BYTES: [Unit; 6] = [
    Unit::new("B", 1.0, 0),
    Unit::new("KiB", 1024.0, 2),
    Unit::new("MiB", 1_048_576.0, 2),
    Unit::new("GiB", 1_073_741_824.0, 3),
    Unit::new("TiB", 1_099_511_627_776.0, 3),
    Unit::new("PiB", 1_125_899_906_842_624.0, 3),
];

impl Unit {
    const fn new(name: &'static str, size: f64, decimals: usize) -> Self {
        Self {
            name,
            size,
            decimals,
        }
    }

    /// The unit `largest` prints in with fewer than four integer digits (the last unit if none
    /// is big enough). Pick it from the largest value of a column so the column shares one unit.
    pub(super) fn for_largest(units: &[Self], largest: f64) -> Self {
        let mut pick = units[0];
        for u in units {
            pick = *u;
            if !largest.is_finite() || round_to(largest / u.size, u.decimals) < 1000.0 {
                break;
            }
        }
        pick
    }

    /// Its name: `Gbit/s`.
    pub(super) fn name(self) -> &'static str {
        self.name
    }

    /// `v` in this unit, the number alone (the unit in a column's header): `9.419`.
    pub(super) fn number(self, v: f64) -> String {
        if !v.is_finite() {
            return "n/a".to_owned();
        }
        let decimals = self.decimals;
        format!("{:.decimals$}", v / self.size)
    }

    /// `v` in this unit: `9.419 Gbit/s`; `n/a` when `v` is not finite.
    pub(super) fn fmt(self, v: f64) -> String {
        if !v.is_finite() {
            return "n/a".to_owned();
        }
        let decimals = self.decimals;
        format!("{:.decimals$} {}", v / self.size, self.name)
    }
}

fn round_to(v: f64, decimals: usize) -> f64 {
    let scale = 10_f64.powi(i32::try_from(decimals).unwrap_or(0));
    (v * scale).round() / scale
}

/// A rate in the unit that suits it: `941.52 Mbit/s`, `9.412 Gbit/s`.
pub(super) fn fmt_rate(bits_per_second: f64) -> String {
    Unit::for_largest(&RATE, bits_per_second).fmt(bits_per_second)
}

/// A byte count in the unit that suits it: `1.647 GiB`; below 1000 B, an integer.
pub(super) fn fmt_bytes(bytes: u64) -> String {
    Unit::for_largest(&BYTES, to_f64(bytes)).fmt(to_f64(bytes))
}

/// A size the user chose (message, datagram), exact: `64 B`, `128 KiB`; `1448 B` stays bytes.
pub(super) fn fmt_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The unit a table states times in: µs with 2 decimals while the typical value is under 1 ms,
/// ms with 3 decimals above. Sub-microsecond values stay in µs (`0.80 µs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimeUnit {
    Micros,
    Millis,
}

impl TimeUnit {
    pub(super) fn for_typical(ns: f64) -> Self {
        if ns < 1e6 {
            Self::Micros
        } else {
            Self::Millis
        }
    }

    pub(super) fn suffix(self) -> &'static str {
        match self {
            Self::Micros => "µs",
            Self::Millis => "ms",
        }
    }
}

/// `ns` in `unit`, number only: `38.91`, `12.411`.
pub(super) fn ns_number(ns: f64, unit: TimeUnit) -> String {
    match unit {
        TimeUnit::Micros => format!("{:.2}", ns / 1e3),
        TimeUnit::Millis => format!("{:.3}", ns / 1e6),
    }
}

/// `ns` in `unit`, with the unit: `38.91 µs`, `12.411 ms`.
pub(super) fn fmt_ns(ns: f64, unit: TimeUnit) -> String {
    format!("{} {}", ns_number(ns, unit), unit.suffix())
}

/// `ns` in the unit that suits it alone.
pub(super) fn fmt_ns_auto(ns: f64) -> String {
    fmt_ns(ns, TimeUnit::for_typical(ns))
}

/// A duration in seconds, 3 decimals: `10.000 s`.
pub(super) fn fmt_secs(ns: u64) -> String {
    format!("{:.3} s", ns_to_s(ns))
}

pub(super) fn ns_to_s(ns: u64) -> f64 {
    to_f64(ns) / 1e9
}

/// An integer with thousands separators: `1,234,567`.
pub(super) fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A non-negative float rounded to an integer, with separators; `n/a` when not finite.
pub(super) fn fmt_count_f64(v: f64) -> String {
    if !v.is_finite() || v < 0.0 {
        return "n/a".to_owned();
    }
    // Finite and non-negative; `as` saturates beyond u64::MAX.
    fmt_count(v.round() as u64)
}

/// A percentage: two significant digits below 1 % (one loss in 10^7 must not print as 0),
/// two decimals above: `0%`, `0.012%`, `0.000010%`, `1.67%`.
pub(super) fn fmt_percent(p: f64) -> String {
    if !p.is_finite() {
        return "n/a".to_owned();
    }
    if p == 0.0 {
        return "0%".to_owned();
    }
    if p >= 1.0 {
        return format!("{p:.2}%");
    }
    let decimals = ((-p.log10()).ceil() as usize + 1).min(9);
    format!("{p:.decimals$}%")
}

/// `part` as a percentage of `whole`; `n/a` when `whole` is 0.
pub(super) fn fmt_ratio(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "n/a".to_owned();
    }
    fmt_percent(to_f64(part) * 100.0 / to_f64(whole))
}

/// `bytes` over `ns` in bits per second; NaN for an empty span.
pub(super) fn rate(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        return f64::NAN;
    }
    to_f64(bytes) * 8.0 / (to_f64(ns) / 1e9)
}

/// Exact below 2^53, which covers every count and nanosecond figure sonde can measure.
pub(super) fn to_f64(v: u64) -> f64 {
    v as f64
}

/// Milliseconds since the Unix epoch as `2024-05-01 12:00:00 UTC`.
pub(super) fn fmt_timestamp(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(secs / 86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian: Howard Hinnant's
/// `civil_from_days`, <https://howardhinnant.github.io/date_algorithms.html#civil_from_days>,
/// for non-negative days.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_uses_si_steps() {
        assert_eq!(fmt_rate(0.0), "0 bit/s");
        assert_eq!(fmt_rate(999.0), "999 bit/s");
        assert_eq!(fmt_rate(1_000.0), "1.00 Kbit/s");
        assert_eq!(fmt_rate(941_520_000.0), "941.52 Mbit/s");
        assert_eq!(fmt_rate(9_412_345_678.0), "9.412 Gbit/s");
        // 999.999 Mbit/s would print as 1000.00 Mbit/s: go up a unit instead.
        assert_eq!(fmt_rate(999_999_000.0), "1.000 Gbit/s");
        assert_eq!(fmt_rate(400e12), "400.000 Tbit/s");
        assert_eq!(fmt_rate(4e18), "4000000.000 Tbit/s");
        assert_eq!(fmt_rate(f64::NAN), "n/a");
    }

    #[test]
    fn one_rate_unit_per_column() {
        let unit = Unit::for_largest(&RATE, 1_850_000_000.0);
        assert_eq!(unit.fmt(922_750_000.0), "0.923 Gbit/s");
        assert_eq!(unit.fmt(1_850_000_000.0), "1.850 Gbit/s");
        assert_eq!(unit.fmt(f64::INFINITY), "n/a");
        let unit = Unit::for_largest(&RATE, 998_760_000.0);
        assert_eq!(unit.fmt(5_000.0), "0.01 Mbit/s");
    }

    #[test]
    fn bytes_use_binary_steps() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(999), "999 B");
        assert_eq!(fmt_bytes(1000), "0.98 KiB");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(1_048_576), "1.00 MiB");
        assert_eq!(fmt_bytes(587_202_560), "560.00 MiB");
        assert_eq!(fmt_bytes(1_767_903_232), "1.646 GiB");
        assert_eq!(fmt_bytes(u64::MAX), "16384.000 PiB");
    }

    #[test]
    fn sizes_are_exact() {
        assert_eq!(fmt_size(64), "64 B");
        assert_eq!(fmt_size(1448), "1448 B");
        assert_eq!(fmt_size(131_072), "128 KiB");
        assert_eq!(fmt_size(1 << 20), "1 MiB");
    }

    #[test]
    fn ns_in_the_table_unit() {
        assert_eq!(TimeUnit::for_typical(999_999.0), TimeUnit::Micros);
        assert_eq!(TimeUnit::for_typical(1_000_000.0), TimeUnit::Millis);
        assert_eq!(fmt_ns(38_911.0, TimeUnit::Micros), "38.91 µs");
        assert_eq!(fmt_ns(800.0, TimeUnit::Micros), "0.80 µs");
        assert_eq!(fmt_ns(1_204_223.0, TimeUnit::Micros), "1204.22 µs");
        assert_eq!(fmt_ns(12_410_879.0, TimeUnit::Millis), "12.411 ms");
        assert_eq!(fmt_ns(31_231.0, TimeUnit::Millis), "0.031 ms");
        assert_eq!(fmt_ns_auto(23_417.0), "23.42 µs");
        assert_eq!(fmt_secs(1_034_000_000), "1.034 s");
    }

    #[test]
    fn counts_and_percentages() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1000), "1,000");
        assert_eq!(fmt_count(1_234_567), "1,234,567");
        assert_eq!(fmt_count(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(fmt_count_f64(1_180_342.4), "1,180,342");
        assert_eq!(fmt_count_f64(f64::NAN), "n/a");
        assert_eq!(fmt_percent(0.0), "0%");
        assert_eq!(fmt_percent(0.012_08), "0.012%");
        assert_eq!(fmt_percent(0.1), "0.10%");
        assert_eq!(fmt_percent(0.5), "0.50%");
        assert_eq!(fmt_percent(0.000_01), "0.000010%");
        assert_eq!(fmt_percent(1.666_7), "1.67%");
        assert_eq!(fmt_percent(100.0), "100.00%");
        assert_eq!(fmt_ratio(1, 0), "n/a");
        assert_eq!(fmt_ratio(50, 110_000), "0.045%");
        assert!(rate(1, 0).is_nan());
        assert!((rate(125_000_000, 1_000_000_000) - 1e9).abs() < 1e-6);
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(fmt_timestamp(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(fmt_timestamp(1_714_564_800_000), "2024-05-01 12:00:00 UTC");
        assert_eq!(fmt_timestamp(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(fmt_timestamp(4_102_444_799_999), "2099-12-31 23:59:59 UTC");
    }
}
