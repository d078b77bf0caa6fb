//! Selections of runs for `sonde compare` and `sonde report`: stored runs by id, group, label,
//! test or recency, or a document saved with `--json`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sonde_engine::rtt::RttRecorder;
use sonde_report::compare::Run;
use sonde_report::TestResult;
use sonde_store::{Filter, GroupId, Label, RunId, Store, HISTOGRAM_RTT};

use crate::units::BadValue;

/// How `--help` explains a selection.
pub(crate) const SELECTION_HELP: &str = "\
A SELECTION picks runs: from the results database, terms joined with commas, every term must
hold:
  17                   run 17 (as `sonde results` lists it)
  group:4              the runs of group 4 (a --repeat, a quick run, a sweep)
  label:path=private   runs with that label (label values may not contain commas here)
  test:latency         runs of that test
  last, last:5         the newest run, the newest 5 (of those the other terms select)
or a file holding one result document as `sonde ... --json` printed it.
Examples: `label:path=private,last:5`, `group:4`, `results/before.json`.";

/// One selection as the user wrote it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Selection {
    /// A saved `--json` document.
    File(PathBuf),
    /// Stored runs.
    Store(Filter),
}

/// Parses a selection: a file when such a file exists (or the name ends in `.json`), else
/// terms for the store.
pub(crate) fn parse(s: &str) -> Result<Selection, BadValue> {
    let path = Path::new(s);
    if path.is_file() || s.ends_with(".json") {
        return Ok(Selection::File(path.to_owned()));
    }
    let bad = |why: String| BadValue(format!("selection {s:?}: {why}\n\n{SELECTION_HELP}"));
    let mut filter = Filter::default();
    if s.trim().is_empty() {
        return Err(bad("empty".into()));
    }
    for term in s.split(',').map(str::trim) {
        let (kind, value) = term.split_once(':').unwrap_or((term, ""));
        match kind {
            _ if term.bytes().all(|b| b.is_ascii_digit()) && !term.is_empty() => {
                let id = term.parse::<RunId>().map_err(|e| bad(e.to_string()))?;
                filter.ids.push(id);
            }
            "last" if value.is_empty() => filter.last = Some(1),
            "last" => {
                let n: u64 = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("last:{value} is not a positive count")))?;
                filter.last = Some(n);
            }
            "group" => {
                let g = value
                    .parse::<GroupId>()
                    .map_err(|_| bad(format!("group:{value} is not a group id")))?;
                filter.group = Some(g);
            }
            "label" => {
                let label = value
                    .parse::<Label>()
                    .map_err(|e| bad(format!("label:{value}: {e}")))?;
                filter.labels.push(label);
            }
            "test" if !value.is_empty() => filter.test = Some(value.to_owned()),
            _ => {
                return Err(bad(format!(
                    "{term:?} is neither a run id nor a known term"
                )))
            }
        }
    }
    Ok(Selection::Store(filter))
}

/// The runs each selection picks, oldest first within a selection. The database is opened only
/// when a selection needs it (never created).
pub(crate) fn load(
    selections: &[Selection],
    db: &mut Option<Store>,
    db_flag: Option<&Path>,
) -> anyhow::Result<Vec<Vec<Run>>> {
    selections
        .iter()
        .map(|sel| match sel {
            Selection::File(path) => Ok(vec![from_file(path)?]),
            Selection::Store(filter) => {
                if db.is_none() {
                    let path = crate::save::db_path(db_flag)?;
                    *db = Some(Store::open_existing(&path).with_context(|| {
                        format!("reading the results database {}", path.display())
                    })?);
                }
                let store = db.as_ref().expect("opened above");
                from_store(store, filter)
            }
        })
        .collect()
}

fn from_file(path: &Path) -> anyhow::Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON document", path.display()))?;
    let labels = labels_of(&value);
    let result: TestResult = serde_json::from_value(value)
        .with_context(|| format!("{} is not a sonde result document", path.display()))?;
    let mut run = Run::new(path.display().to_string(), result);
    run.labels = labels;
    Ok(run)
}

/// The `labels` object of a document, when it has one.
fn labels_of(doc: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    doc.get("labels")
        .and_then(serde_json::Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn from_store(store: &Store, filter: &Filter) -> anyhow::Result<Vec<Run>> {
    let mut stored = store
        .documents(filter)
        .with_context(|| format!("reading {}", store.path().display()))?;
    stored.reverse(); // oldest first
    stored
        .into_iter()
        .map(|s| {
            let id = s.summary.id;
            let result: TestResult = serde_json::from_str(&s.document)
                .with_context(|| format!("run {id}'s document is not a result this sonde reads"))?;
            let mut run = Run::new(id.to_string(), result);
            run.labels = s
                .summary
                .labels
                .into_iter()
                .map(|l| (l.key, l.value))
                .collect();
            if matches!(run.result, TestResult::Latency(_)) {
                run.rtt = store
                    .histogram(id, HISTOGRAM_RTT)
                    .with_context(|| format!("reading run {id}'s histogram"))?
                    .map(|h| RttRecorder::from_histogram(&h));
            }
            Ok(run)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_make_a_filter() {
        let Selection::Store(f) = parse("label:path=private,last:5,test:latency").unwrap() else {
            panic!()
        };
        assert_eq!(f.labels, vec![Label::new("path", "private").unwrap()]);
        assert_eq!((f.last, f.test.as_deref()), (Some(5), Some("latency")));
        let Selection::Store(f) = parse("17").unwrap() else {
            panic!()
        };
        assert_eq!(f.ids, vec![RunId(17)]);
        let Selection::Store(f) = parse("group:4").unwrap() else {
            panic!()
        };
        assert_eq!(f.group, Some(GroupId(4)));
        let Selection::Store(f) = parse("last").unwrap() else {
            panic!()
        };
        assert_eq!(f.last, Some(1));
        assert_eq!(
            parse("before.json").unwrap(),
            Selection::File("before.json".into())
        );
        for bad in ["", "last:0", "group:x", "label:=x", "nonsense", "test:"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
