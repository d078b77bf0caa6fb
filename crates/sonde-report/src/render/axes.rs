//! The axes of a case table, for the report's charts: which label keys tell its cases apart, and
//! which of them goes on the chart's category axis, which makes the series (bars side by side),
//! which make small multiples (one panel per value). A plan stores its axes as labels on each
//! run (`target`, `protocol`), so a plan run's report groups by the plan's axes; any selection
//! of labelled runs groups the same way.

use std::collections::BTreeMap;

use crate::compare::{CaseRow, Run};

/// Labels a plan puts on every run that are bookkeeping, not an axis: `plan_case` numbers the
/// case (`case` names it, and repeats the axes where there are any).
const BOOKKEEPING: [&str; 1] = ["plan_case"];
/// The label that names a plan's case by its axis values together.
const CASE: &str = "case";
/// The most series a chart draws in colours of their own; an axis with more values goes on the
/// category axis or into panels.
pub(crate) const MAX_SERIES: usize = 10;

/// How a table's cases are laid out on a chart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Axes {
    /// The label keys whose values differ between the cases, in layout order: panels, the
    /// category axis, the series.
    pub(crate) keys: Vec<String>,
    /// The category axis (the bars' groups); `None`: each case is its own category.
    pub(crate) x: Option<String>,
    /// The series (bars side by side within a group).
    pub(crate) series: Option<String>,
    /// One panel per combination of these.
    pub(crate) panels: Vec<String>,
    /// Labels every case shares (`plan=zones`), said once above the table.
    pub(crate) shared: Vec<(String, String)>,
    /// Each key's values in the order the runs first carry them (a plan's order).
    pub(crate) order: BTreeMap<String, Vec<String>>,
}

/// What the user asked for (`--x`, `--series`); `None` picks automatically.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout<'a> {
    /// The label key on the category axis.
    pub x: Option<&'a str>,
    /// The label key whose values are the series.
    pub series: Option<&'a str>,
}

/// Every label key the runs carry (what `--x` and `--series` can name).
pub fn label_keys(runs: &[Run]) -> Vec<String> {
    let mut keys: Vec<String> = runs.iter().flat_map(|r| r.labels.keys().cloned()).collect();
    keys.sort();
    keys.dedup();
    keys
}

impl Axes {
    /// The axes of `rows`, with the values ordered as `runs` first carry them. Automatic: the
    /// key with the fewest values (at most [`MAX_SERIES`]) makes the series, the one with the
    /// most the category axis, the others panels. `layout` fixes either.
    pub(crate) fn of(rows: &[CaseRow], runs: &[Run], layout: Layout<'_>) -> Self {
        let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for run in runs {
            for (k, v) in &run.labels {
                let values = order.entry(k.clone()).or_default();
                if !values.contains(v) {
                    values.push(v.clone());
                }
            }
        }
        let labelled: Vec<&CaseRow> = rows.iter().filter(|r| !r.labels.is_empty()).collect();
        let mut all: Vec<&String> = labelled.iter().flat_map(|r| r.labels.keys()).collect();
        all.sort();
        all.dedup();
        // A key varies when two labelled cases differ in it (a missing value is a value).
        let distinct = |k: &str| {
            let mut v: Vec<Option<&String>> = labelled.iter().map(|r| r.labels.get(k)).collect();
            v.sort();
            v.dedup();
            v.len()
        };
        let mut varying: Vec<&String> = all
            .iter()
            .copied()
            .filter(|k| !BOOKKEEPING.contains(&k.as_str()) && distinct(k) > 1)
            .collect();
        if varying.len() > 1 {
            varying.retain(|k| k.as_str() != CASE);
        }
        let shared: Vec<(String, String)> = all
            .iter()
            .filter(|k| distinct(k) == 1 && labelled.len() > 1)
            .filter_map(|k| Some(((*k).clone(), labelled[0].labels.get(*k)?.clone())))
            .filter(|(k, _)| layout.x != Some(k.as_str()) && layout.series != Some(k.as_str()))
            .collect();
        // Fewest values first; ties by name.
        varying.sort_by_key(|k| (distinct(k), (*k).clone()));
        let mut free: Vec<String> = varying.iter().map(|k| (*k).clone()).collect();
        // Asked for: used even when every case has the same value of it.
        let claim = |want: Option<&str>, free: &mut Vec<String>| {
            want.filter(|w| all.iter().any(|k| k.as_str() == *w))
                .map(|w| {
                    free.retain(|k| k != w);
                    w.to_owned()
                })
        };
        let mut series = claim(layout.series, &mut free);
        let mut x = claim(layout.x, &mut free);
        // The series only with a key left for the category axis.
        if layout.series.is_none()
            && (x.is_some() || free.len() >= 2)
            && free.first().is_some_and(|k| distinct(k) <= MAX_SERIES)
        {
            series = Some(free.remove(0));
        }
        if layout.x.is_none() {
            x = free.pop();
        }
        let mut panels = free;
        let keys: Vec<String> = panels
            .iter()
            .chain(x.iter())
            .chain(series.iter())
            .cloned()
            .collect();
        // Chosen automatically, the layout must group something: cases that are not a matrix
        // (no category holds two of them) are each a category of their own.
        let grouped = {
            let mut seen: Vec<Vec<Option<&String>>> = Vec::new();
            labelled.iter().any(|r| {
                let at: Vec<Option<&String>> = panels
                    .iter()
                    .chain(x.iter())
                    .map(|k| r.labels.get(k))
                    .collect();
                let twice = seen.contains(&at);
                seen.push(at);
                twice
            })
        };
        if layout.x.is_none() && layout.series.is_none() && series.is_some() && !grouped {
            (x, series) = (None, None);
            panels.clear();
        }
        Self {
            keys,
            x,
            series,
            panels,
            shared,
            order,
        }
    }

    /// Where `value` of `key` comes in the runs' order.
    fn rank(&self, key: &str, value: Option<&String>) -> usize {
        value
            .and_then(|v| self.order.get(key)?.iter().position(|o| o == v))
            .unwrap_or(usize::MAX)
    }

    /// The rows in layout order: by panel, category, series, in the runs' order of the values;
    /// unlabelled runs last, as they came.
    pub(crate) fn sort<'r>(&self, rows: &'r [CaseRow]) -> Vec<&'r CaseRow> {
        let mut out: Vec<&CaseRow> = rows.iter().collect();
        out.sort_by_key(|r| {
            (
                r.labels.is_empty(),
                self.keys
                    .iter()
                    .map(|k| self.rank(k, r.labels.get(k)))
                    .collect::<Vec<_>>(),
            )
        });
        out
    }

    /// A case's name in the table and the charts: the values of the keys that tell the cases
    /// apart (`target=b-elb protocol=tcp`); an unlabelled run's own name (`run 4`).
    pub(crate) fn name(&self, row: &CaseRow) -> String {
        let parts: Vec<String> = self
            .keys
            .iter()
            .filter_map(|k| Some(format!("{k}={}", row.labels.get(k)?)))
            .collect();
        if parts.is_empty() {
            row.name.clone()
        } else {
            parts.join(" ")
        }
    }

    /// The value of `key` in `row`, for a chart: an unlabelled run goes by its name.
    pub(crate) fn value(row: &CaseRow, key: &str) -> String {
        match row.labels.get(key) {
            Some(v) => v.clone(),
            None if row.labels.is_empty() => row.name.clone(),
            None => "(none)".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(labels: &[(&str, &str)]) -> CaseRow {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        CaseRow {
            name: labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            labels,
            runs: vec![],
            samples: None,
            cells: vec![],
        }
    }

    /// Seed 000's plan: two zones x three kinds of address x TCP/UDP, with a plan's bookkeeping.
    fn seed() -> Vec<CaseRow> {
        let mut rows = Vec::new();
        let mut index = 0;
        for zone in ["b", "c"] {
            for kind in ["private", "public", "elb"] {
                for proto in ["tcp", "udp"] {
                    let target = format!("{zone}-{kind}");
                    let case = format!("target={target} protocol={proto}");
                    index += 1;
                    let index = index.to_string();
                    rows.push(row(&[
                        ("target", &target),
                        ("protocol", proto),
                        ("zone", zone),
                        ("case", &case),
                        ("plan", "zones"),
                        ("plan_run", "3"),
                        ("plan_case", &index),
                    ]));
                }
            }
        }
        rows
    }

    #[test]
    fn a_plans_axes_pick_the_series_the_category_and_the_panels() {
        let rows = seed();
        let a = Axes::of(&rows, &[], Layout::default());
        assert_eq!(a.series.as_deref(), Some("protocol"));
        assert_eq!(a.x.as_deref(), Some("target"));
        assert_eq!(a.panels, ["zone"]);
        assert_eq!(
            a.shared,
            [
                ("plan".to_owned(), "zones".to_owned()),
                ("plan_run".to_owned(), "3".to_owned())
            ]
        );
        assert_eq!(a.name(&rows[0]), "zone=b target=b-private protocol=tcp");
        // Asked for: zone on the category axis, target into panels.
        let a = Axes::of(
            &rows,
            &[],
            Layout {
                x: Some("zone"),
                series: None,
            },
        );
        assert_eq!(
            (a.x.as_deref(), a.series.as_deref(), a.panels.as_slice()),
            (
                Some("zone"),
                Some("protocol"),
                ["target".to_owned()].as_slice()
            )
        );
    }

    #[test]
    fn rows_follow_the_runs_order_of_values_tcp_beside_udp() {
        let rows = seed();
        let mut runs = Vec::new();
        // The plan ran udp before tcp and elb first.
        for (t, p) in [("b-elb", "udp"), ("b-elb", "tcp"), ("b-private", "udp")] {
            let mut r = Run::new("1", crate::fixtures::latency_tcp());
            r.labels = [("target", t), ("protocol", p), ("zone", "b")]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            runs.push(r);
        }
        let a = Axes::of(&rows, &runs, Layout::default());
        let names: Vec<String> = a.sort(&rows).iter().take(4).map(|r| a.name(r)).collect();
        assert_eq!(
            names,
            [
                "zone=b target=b-elb protocol=udp",
                "zone=b target=b-elb protocol=tcp",
                "zone=b target=b-private protocol=udp",
                "zone=b target=b-private protocol=tcp",
            ]
        );
    }

    #[test]
    fn one_key_is_the_category_and_unlabelled_runs_keep_their_names() {
        let mut rows = vec![row(&[("path", "private")]), row(&[("path", "public")])];
        rows.push(CaseRow {
            name: "run 4".into(),
            ..row(&[])
        });
        let a = Axes::of(&rows, &[], Layout::default());
        assert_eq!((a.x.as_deref(), a.series.as_deref()), (Some("path"), None));
        assert_eq!(a.name(&rows[2]), "run 4");
        assert_eq!(Axes::value(&rows[2], "path"), "run 4");
        // No labels at all: no axis; each case is its own category.
        let plain = vec![CaseRow {
            name: "run 1".into(),
            ..row(&[])
        }];
        let a = Axes::of(&plain, &[], Layout::default());
        assert_eq!(a, Axes::default());
        // Two keys, but not a matrix (path=private; path=public zone=other): no category would
        // hold two cases, so each case is its own, named by both keys.
        let mut rows = vec![
            row(&[("path", "private")]),
            row(&[("path", "public"), ("zone", "other")]),
        ];
        let a = Axes::of(&rows, &[], Layout::default());
        assert_eq!((a.x.as_deref(), a.series.as_deref()), (None, None));
        assert_eq!(a.name(&rows[1]), "zone=other path=public");
        // With a third case that pairs with one of them, it is a matrix again.
        rows.push(row(&[("path", "private"), ("zone", "other")]));
        let a = Axes::of(&rows, &[], Layout::default());
        assert_eq!(
            (a.x.as_deref(), a.series.as_deref()),
            (Some("zone"), Some("path"))
        );
        assert_eq!(a.name(&plain[0]), "run 1");
    }
}
