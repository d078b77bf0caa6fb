//! Selections of runs for `sonde compare` and `sonde report`: stored runs by id, group, label,
//! test or recency, or a document saved with `--json`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sonde_engine::rtt::RttRecorder;
use sonde_report::compare::Run;
use sonde_report::TestResult;
use sonde_store::{Filter, GroupId, Label, Location, RunId, Store, HISTOGRAM_RTT};

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
    db_flag: Option<&Location>,
) -> anyhow::Result<Vec<Vec<Run>>> {
    selections
        .iter()
        .map(|sel| match sel {
            Selection::File(path) => from_file(path),
            Selection::Store(filter) => {
                if db.is_none() {
                    let at = match db_flag {
                        Some(at) => at.clone(),
                        None => crate::save::db_location(None)?,
                    };
                    *db = Some(
                        Store::open_existing(&at)
                            .with_context(|| format!("reading the results database {at}"))?,
                    );
                }
                let store = db.as_ref().expect("opened above");
                from_store(store, filter)
            }
        })
        .collect()
}

fn from_file(path: &Path) -> anyhow::Result<Vec<Run>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let result: TestResult = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a sonde result document", path.display()))?;
    Ok(expand(&path.display().to_string(), result, |_| None))
}

fn from_store(store: &Store, filter: &Filter) -> anyhow::Result<Vec<Run>> {
    let mut stored = store
        .documents(filter)
        .with_context(|| format!("reading {}", store.location()))?;
    stored.reverse(); // oldest first
    let mut runs = Vec::new();
    for s in stored {
        let id = s.summary.id;
        let result: TestResult = serde_json::from_str(&s.document)
            .with_context(|| format!("run {id}'s document is not a result this sonde reads"))?;
        let histograms = store
            .histograms(id)
            .with_context(|| format!("reading run {id}'s histograms"))?;
        let histogram = |name: &str| {
            histograms
                .iter()
                .find(|h| h.name == name)
                .and_then(|h| h.decode().ok())
                .map(|h| RttRecorder::from_histogram(&h))
        };
        for mut run in expand(&id.to_string(), result, histogram) {
            // The database's labels are the run's (its document says the same).
            for l in &s.summary.labels {
                run.labels.insert(l.key.clone(), l.value.clone());
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// The runs a document holds: itself; for `quick` each case (labelled `case=NAME`), for a
/// sweep each step (labelled with the parameter's value), for `load` the idle and loaded
/// latency runs and the load (`phase=idle`, `phase=loaded`, `phase=load`). `histogram` gives
/// a latency part's stored RTT histogram by its name in the database.
fn expand(
    id: &str,
    result: TestResult,
    histogram: impl Fn(&str) -> Option<RttRecorder>,
) -> Vec<Run> {
    let parts = result.kind().runs();
    if parts.is_empty() {
        let mut run = Run::new(id, result);
        if run.result.kind().rtt().is_some() {
            run.rtt = histogram(HISTOGRAM_RTT);
        }
        return vec![run];
    }
    parts
        .into_iter()
        .map(|p| {
            let mut run = Run::new(format!("{id}#{}", p.name), p.result);
            for (k, v) in p.labels {
                run.labels.entry(k).or_insert(v);
            }
            run.rtt = p.histogram.and_then(&histogram);
            run
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of sonde-report's fixture documents, from its JSON snapshot.
    fn fixture(name: &str) -> TestResult {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sonde-report/src/snapshots")
            .join(format!("sonde_report__render__tests__{name}_json.snap"));
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str(text.splitn(3, "---\n").nth(2).unwrap()).unwrap()
    }

    #[test]
    fn quick_sweep_and_load_documents_become_their_runs() {
        let quick = expand("q.json", fixture("quick_all"), |_| None);
        assert!(quick.len() >= 4, "{}", quick.len());
        for r in &quick {
            let case = r.id.strip_prefix("q.json#").unwrap();
            assert_eq!(r.labels.get("case").map(String::as_str), Some(case));
        }
        let sweep = expand("s.json", fixture("sweep_latency_msg_size"), |_| None);
        assert!(sweep.len() > 1);
        assert!(
            sweep.iter().all(|r| r.labels.contains_key("msg_size")),
            "{:?}",
            sweep[0].labels
        );
        let load = expand("l.json", fixture("load_udp_bufferbloat"), |name| {
            (name == sonde_store::HISTOGRAM_LOADED_RTT).then(|| RttRecorder::new(0))
        });
        let phases: Vec<&str> = load.iter().map(|r| r.labels["phase"].as_str()).collect();
        assert_eq!(phases, ["idle", "loaded", "load"]);
        assert!(load[0].rtt.is_none() && load[1].rtt.is_some() && load[2].rtt.is_none());
        // The idle probes' histogram, by the store's name for it too.
        let load = expand("l.json", fixture("load_udp_bufferbloat"), |name| {
            (name == sonde_store::HISTOGRAM_IDLE_RTT).then(|| RttRecorder::new(0))
        });
        assert!(load[0].rtt.is_some() && load[1].rtt.is_none() && load[2].rtt.is_none());
        let one = expand("7", fixture("latency_tcp"), |name| {
            (name == HISTOGRAM_RTT).then(|| RttRecorder::new(0))
        });
        assert_eq!(one.len(), 1);
        assert!(one[0].rtt.is_some());
    }

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
