//! `sonde mesh diagnose`: the diagnosis (`sonde_engine::diagnose`) as a document (`--json`), as
//! text for a terminal, and as one self-contained HTML page (`--html`): the suspects, the group
//! matrix, and the source x target heatmaps of p99 RTT and loss drawn as SVG in the page itself
//! (no script draws them, nothing is fetched), hosts ordered by group so a rack shows as a
//! block. The heatmaps of a mesh too large to draw cell by cell ([`MAX_DRAWN_HOSTS`]) are left
//! to the group matrix and the document.
//!
//! The page's first script records any script error in the `data-errors` attribute and its
//! last sets `data-ready="1"`, as `sonde report`'s page does; the browser test reads both.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};
use sonde_engine::diagnose::{
    group_matrix, Cell, Diagnosis, GroupCell, Suspect, SuspectKind, Thresholds,
};

use super::html::{esc, ERROR_TRAP_JS, REPORT_CSS};
use super::units::fmt_timestamp;

/// The most hosts whose source x target heatmaps the page draws (a cell per pair: 250 hosts
/// are 62,250 cells, a few MB of SVG); past it the page says so and draws the group matrix.
pub const MAX_DRAWN_HOSTS: usize = 250;
/// The most hosts whose heatmaps the text prints (seven columns each: wider is not readable
/// in a terminal); past it the text prints the group matrix and points at `--html`.
pub const MAX_TEXT_HOSTS: usize = 40;

/// The suspects the page lists in the open; the others are folded under them.
const PAGE_TOP_SUSPECTS: usize = 10;

/// What the diagnosis was made from, for the document's and the page's header.
#[derive(Debug, Clone, Copy)]
pub struct DiagnosisMeta<'a> {
    /// The Prometheus URL queried.
    pub prometheus: &'a str,
    /// The window the figures cover, ending when the queries ran.
    pub window: Duration,
    /// The probe protocol the series were narrowed to, if any.
    pub protocol: Option<&'a str>,
    /// What made a pair bad.
    pub thresholds: &'a Thresholds,
    /// When the diagnosis was made (ms since the Unix epoch).
    pub made_unix_ms: u64,
}

/// Milliseconds with three significant figures or so: `0.25`, `12.5`, `140`.
pub fn fmt_ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A ratio in percent, two decimals.
pub fn fmt_pct(r: f64) -> String {
    format!("{:.2}", r * 100.0)
}

/// A window as people write it: `5 min`, `1 h`, `90 s`.
pub fn fmt_window(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() == 0 && s.is_multiple_of(3_600) {
        format!("{} h", s / 3_600)
    } else if d.subsec_millis() == 0 && s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

/// What a suspect would mean, in words.
pub fn suspect_description(kind: &SuspectKind) -> String {
    match kind {
        SuspectKind::Source(h) => format!("source {h} (a bad row: what it sends, or the way back)"),
        SuspectKind::Target(h) => {
            format!("target {h} (a bad column: it answers badly or not at all)")
        }
        SuspectKind::Cross(h) => format!("host {h} (bad both ways)"),
        SuspectKind::Group(g) => format!("group {g} (its pairs to every other group: its uplink)"),
    }
}

/// Why a suspect is one, in a line.
pub fn suspect_evidence(s: &Suspect, d: &Diagnosis) -> String {
    let mut e = format!("{} of its {} pairs bad", s.bad_pairs, s.pairs);
    let mut why = Vec::new();
    if s.slow_pairs > 0 {
        let med = s.median_bad_p99.map_or(String::new(), |p| {
            let base = d
                .baseline_p99
                .map_or(String::new(), |b| format!(" vs {} ms", fmt_ms(b)));
            format!(", median p99 {} ms{base}", fmt_ms(p))
        });
        why.push(format!("{} slow{med}", s.slow_pairs));
    }
    if s.lossy_pairs > 0 {
        let med = s
            .median_bad_loss
            .map_or(String::new(), |l| format!(", median loss {} %", fmt_pct(l)));
        why.push(format!("{} lossy{med}", s.lossy_pairs));
    }
    if s.down_pairs > 0 {
        why.push(format!("{} unreachable", s.down_pairs));
    }
    if !why.is_empty() {
        let _ = write!(e, " ({})", why.join("; "));
    }
    if s.silent_as_source {
        e.push_str("; no series from it as a source (is its agent running?)");
    }
    e
}

fn ns(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The diagnosis as `sonde mesh diagnose --json` prints it.
pub fn diagnosis_json(
    d: &Diagnosis,
    groups: &BTreeMap<String, String>,
    meta: &DiagnosisMeta<'_>,
) -> Value {
    let th = meta.thresholds;
    json!({
        "prometheus": meta.prometheus,
        "window_ns": ns(Some(meta.window)),
        "protocol": meta.protocol,
        "thresholds": {
            "rtt_factor": th.rtt_factor,
            "rtt_excess_ns": ns(Some(th.rtt_excess)),
            "loss_ratio": th.loss_ratio,
            "min_lost": th.min_lost,
            "min_up": th.min_up,
            "min_group": th.min_group,
        },
        "baseline_p99_rtt_ns": ns(d.baseline_p99),
        "hosts": d.hosts.iter().map(|h| json!({"host": h, "group": groups.get(h)})).collect::<Vec<_>>(),
        "bad_pairs": d.bad_pairs,
        "pairs": d.cells.iter().map(|c| json!({
            "source": c.source,
            "target": c.target,
            "p99_rtt_ns": ns(c.stats.p99_rtt),
            "probes_sent": c.stats.sent,
            "probes_lost": c.stats.lost,
            "loss_ratio": c.stats.loss_ratio(),
            "up_fraction": c.stats.up_fraction,
            "slow": c.verdict.slow,
            "lossy": c.verdict.lossy,
            "down": c.verdict.down,
        })).collect::<Vec<_>>(),
        "group_pairs": group_matrix(d, groups).iter().map(|g| json!({
            "source": g.source,
            "target": g.target,
            "pairs": g.pairs,
            "bad_pairs": g.bad_pairs,
            "median_p99_rtt_ns": ns(g.median_p99),
            "loss_ratio": g.loss_ratio,
        })).collect::<Vec<_>>(),
        "suspects": d.suspects.iter().map(|s| json!({
            "kind": s.kind.label(),
            "name": s.kind.name(),
            "description": suspect_description(&s.kind),
            "evidence": suspect_evidence(s, d),
            "score": s.score,
            "pairs": s.pairs,
            "bad_pairs": s.bad_pairs,
            "slow_pairs": s.slow_pairs,
            "lossy_pairs": s.lossy_pairs,
            "down_pairs": s.down_pairs,
            "median_bad_p99_rtt_ns": ns(s.median_bad_p99),
            "median_bad_loss_ratio": s.median_bad_loss,
            "silent_as_source": s.silent_as_source,
        })).collect::<Vec<_>>(),
    })
}

/// The headline: window, source, hosts, pairs, bad pairs, baseline.
fn headline(d: &Diagnosis, meta: &DiagnosisMeta<'_>) -> String {
    let proto = meta
        .protocol
        .map_or(String::new(), |p| format!(", {p} probes"));
    format!(
        "Mesh diagnosis over the last {} from {}{proto}: {} hosts, {} pairs with data, {} bad; \
         baseline p99 {} ms",
        fmt_window(meta.window),
        meta.prometheus,
        d.hosts.len(),
        d.cells.len(),
        d.bad_pairs,
        d.baseline_p99.map_or("n/a".to_owned(), fmt_ms)
    )
}

/// A pair's p99 cell as text and whether it is bad.
fn p99_text(c: &Cell) -> (String, bool) {
    let v = match (c.stats.p99_rtt, c.verdict.down) {
        (Some(p), _) => fmt_ms(p),
        (None, true) => "down".to_owned(),
        (None, false) => "n/a".to_owned(),
    };
    (v, c.verdict.slow || c.verdict.down)
}

/// A pair's loss cell as text and whether it is bad.
fn loss_text(c: &Cell) -> (String, bool) {
    let v = match (c.stats.loss_ratio(), c.verdict.down) {
        (Some(l), false) => fmt_pct(l),
        (_, true) => "down".to_owned(),
        (None, false) => "n/a".to_owned(),
    };
    (v, c.verdict.lossy || c.verdict.down)
}

/// The groups that appear in the group matrix, in order.
fn group_names(cells: &[GroupCell]) -> Vec<&str> {
    let set: BTreeSet<&str> = cells
        .iter()
        .flat_map(|c| [c.source.as_str(), c.target.as_str()])
        .collect();
    set.into_iter().collect()
}

/// The diagnosis for a terminal: the suspects (at most `top`), then the heatmaps of up to
/// [`MAX_TEXT_HOSTS`] hosts, and the group matrix when there are two groups or more.
pub fn diagnosis_text(
    d: &Diagnosis,
    groups: &BTreeMap<String, String>,
    meta: &DiagnosisMeta<'_>,
    top: usize,
) -> String {
    let mut out = headline(d, meta);
    out.push_str("\n\n");
    if d.suspects.is_empty() {
        out.push_str("Suspects: none, every pair is within the thresholds.\n");
    } else {
        out.push_str("Suspects (best first; score 0 to 1):\n");
        for (i, s) in d.suspects.iter().take(top).enumerate() {
            let _ = writeln!(
                out,
                "  {}. {:.2}  {}\n         {}",
                i + 1,
                s.score,
                suspect_description(&s.kind),
                suspect_evidence(s, d)
            );
        }
        if d.suspects.len() > top {
            let _ = writeln!(
                out,
                "  ({} more: --top N, or --json)",
                d.suspects.len() - top
            );
        }
    }
    let gm = group_matrix(d, groups);
    let names = group_names(&gm);
    if names.len() >= 2 {
        let width = names
            .iter()
            .map(|g| g.len())
            .max()
            .unwrap_or(0)
            .clamp(6, 16)
            + 2;
        let cell: BTreeMap<(&str, &str), &GroupCell> = gm
            .iter()
            .map(|c| ((c.source.as_str(), c.target.as_str()), c))
            .collect();
        let _ = write!(
            out,
            "\nBetween groups: bad pairs of pairs (source group row x target group column):\n{:>width$}",
            ""
        );
        for g in &names {
            let _ = write!(out, "{:>width$}", trunc(g, width - 2));
        }
        out.push('\n');
        for s in &names {
            let _ = write!(out, "{:>width$}", trunc(s, width - 2));
            for t in &names {
                let text = cell
                    .get(&(*s, *t))
                    .map_or(".".to_owned(), |c| format!("{}/{}", c.bad_pairs, c.pairs));
                let _ = write!(out, "{text:>width$}");
            }
            out.push('\n');
        }
    }
    if d.hosts.len() > MAX_TEXT_HOSTS {
        let _ = writeln!(
            out,
            "\nThe heatmaps of {} hosts are too wide for a terminal: --html FILE draws them, \
             --json has every pair.",
            d.hosts.len()
        );
        return out;
    }
    // The heatmaps: rows are sources, columns targets, by number (the legend names them).
    let idx: BTreeMap<&str, usize> = d
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (h.as_str(), i + 1))
        .collect();
    let cells: BTreeMap<(&str, &str), &Cell> = d
        .cells
        .iter()
        .map(|c| ((c.source.as_str(), c.target.as_str()), c))
        .collect();
    out.push_str("\nHosts:\n");
    for (i, h) in d.hosts.iter().enumerate() {
        let g = groups
            .get(h)
            .map_or(String::new(), |g| format!("  (group {g})"));
        let _ = writeln!(out, "  [{}] {h}{g}", i + 1);
    }
    let width = 7;
    let table = |title: &str, value: fn(&Cell) -> (String, bool)| {
        let mut t = format!("\n{title} (source row x target column; * bad, . no data):\n");
        let _ = write!(t, "{:>5}", "");
        for h in &d.hosts {
            let _ = write!(t, "{:>width$}", format!("[{}]", idx[h.as_str()]));
        }
        t.push('\n');
        for s in &d.hosts {
            let _ = write!(t, "{:>5}", format!("[{}]", idx[s.as_str()]));
            for tg in &d.hosts {
                let text = if s == tg {
                    "-".to_owned()
                } else if let Some(c) = cells.get(&(s.as_str(), tg.as_str())) {
                    let (v, bad) = value(c);
                    if bad {
                        format!("{v}*")
                    } else {
                        v
                    }
                } else {
                    ".".to_owned()
                };
                let _ = write!(t, "{text:>width$}");
            }
            t.push('\n');
        }
        t
    };
    out.push_str(&table("p99 RTT, ms", p99_text));
    out.push_str(&table("Loss, % of probes", loss_text));
    out
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Green (0) to red (1), through yellow.
fn ramp(t: f64) -> String {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        1.0
    };
    format!("hsl({:.0},75%,{:.0}%)", 120.0 * (1.0 - t), 42.0 + 8.0 * t)
}

const NO_DATA: &str = "#e8e8e8";
const DOWN: &str = "#222";

/// How bad a p99 looks: 0 at the baseline, the threshold factor about two thirds of the way,
/// red from twice the factor.
fn p99_shade(p99: Duration, baseline: Option<Duration>, th: &Thresholds) -> f64 {
    let Some(base) = baseline.filter(|b| !b.is_zero()) else {
        return 0.0;
    };
    let r = p99.as_secs_f64() / base.as_secs_f64();
    if r <= 1.0 {
        return 0.0;
    }
    r.ln() / (2.0 * th.rtt_factor.max(1.5)).ln()
}

/// How bad a loss looks: the square root of the loss over twice the threshold (the threshold at
/// 0.7, red from twice it), so small losses still show.
fn loss_shade(loss: f64, th: &Thresholds) -> f64 {
    (loss / (2.0 * th.loss_ratio.max(1e-6))).sqrt()
}

/// A drawn cell: its fill, whether it is bad (outlined), and its hover text.
struct Shade {
    fill: String,
    bad: bool,
    title: String,
}

/// What a heatmap draws at (row, column); `None` leaves the cell empty (no data).
type CellOf<'a> = dyn Fn(&str, &str) -> Option<Shade> + 'a;

/// One heatmap as SVG: `order` gives the rows and the columns (with their group, for the
/// separating lines), `cell` a present cell's fill, whether it is bad, and its hover text.
/// The host matrix leaves its diagonal out (a host does not probe itself); the group matrix
/// draws it (a group's own pairs).
fn heatmap_svg(
    order: &[(&str, Option<&str>)],
    kind: &str,
    diagonal: bool,
    cell: &CellOf<'_>,
) -> String {
    let n = order.len();
    let (span, largest) = if diagonal { (600, 48) } else { (760, 26) };
    let size = (span / n.max(1)).clamp(4, largest);
    let labelled = size >= 9;
    let font = (size - 2).min(12);
    let name_width = if labelled {
        order
            .iter()
            .map(|(h, _)| h.chars().count())
            .max()
            .unwrap_or(0)
            .min(28)
            * font
            * 6
            / 10
            + 8
    } else {
        4
    };
    let (x0, y0) = (name_width, name_width);
    let w = x0 + n * size + 4;
    let h = y0 + n * size + 4;
    let mut s = format!(
        "<svg class=\"heatmap\" data-heatmap=\"{kind}\" \
         width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-size=\"{font}\" \
         font-family=\"system-ui, sans-serif\">\n"
    );
    if labelled {
        for (i, (host, _)) in order.iter().enumerate() {
            let c = i * size + size / 2;
            let name = esc(&trunc(host, 28));
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\">{name}</text>\
                 <text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"start\" \
                 dominant-baseline=\"middle\">{name}</text>",
                x0 - 4,
                y0 + c,
                x0 + c,
                y0 - 4
            );
        }
    }
    let _ = writeln!(
        s,
        "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#ccc\"/>",
        n * size,
        n * size
    );
    for (i, (src, _)) in order.iter().enumerate() {
        for (j, (tgt, _)) in order.iter().enumerate() {
            if i == j && !diagonal {
                continue;
            }
            let Some(Shade { fill, bad, title }) = cell(src, tgt) else {
                continue;
            };
            let (x, y) = (x0 + j * size, y0 + i * size);
            let class = if bad { "c bad" } else { "c" };
            let stroke = if bad {
                " stroke=\"#000\" stroke-width=\"1\""
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "<rect class=\"{class}\" x=\"{x}\" y=\"{y}\" width=\"{size}\" height=\"{size}\" \
                 fill=\"{fill}\"{stroke}><title>{}</title></rect>",
                esc(&title)
            );
        }
    }
    // A line where the group changes, along both axes: a rack is a block.
    for i in 1..n {
        if order[i].1 != order[i - 1].1 {
            let p = i * size;
            let _ = writeln!(
                s,
                "<line x1=\"{x0}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"#555\"/>\
                 <line x1=\"{x}\" y1=\"{y0}\" x2=\"{x}\" y2=\"{y2}\" stroke=\"#555\"/>",
                y = y0 + p,
                x = x0 + p,
                x2 = x0 + n * size,
                y2 = y0 + n * size,
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The colour key under a heatmap.
fn legend(stops: &[(f64, &str)], extra: &str) -> String {
    let mut s = String::from("<p class=\"note legend\">");
    for (t, label) in stops {
        let _ = write!(
            s,
            "<span class=\"swatch\" style=\"background:{}\"></span>{} ",
            ramp(*t),
            esc(label)
        );
    }
    s.push_str(extra);
    s.push_str("</p>\n");
    s
}

const PAGE_CSS: &str = ".heatmap { display: block; max-width: 100%; height: auto; margin: 8px 0; }
.heatmap rect.c:hover { stroke: #06c; stroke-width: 2; }
.swatch { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 10px; vertical-align: -2px; border: 1px solid #999; }
td.score { font-variant-numeric: tabular-nums; }";

/// The diagnosis as one self-contained HTML page (`sonde mesh diagnose --html FILE`).
pub fn diagnosis_html(
    d: &Diagnosis,
    groups: &BTreeMap<String, String>,
    meta: &DiagnosisMeta<'_>,
) -> String {
    let th = meta.thresholds;
    let mut body = String::new();
    body.push_str("<h1>Mesh diagnosis</h1>\n");
    let _ = writeln!(
        body,
        "<p class=\"sub\">{}. Made {} by sonde {}.</p>",
        esc(&headline(d, meta)),
        fmt_timestamp(meta.made_unix_ms),
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(
        body,
        "<p class=\"note\">A pair is bad when its target was unreachable for part of the window, \
         when it lost at least {} % of its probes (and at least {} of them), or when its p99 RTT \
         is at least {} times the baseline and {} ms above it. The baseline is the lower quartile \
         of every pair's p99. A suspect's score (0 to 1) is the F0.5 of the pairs it names \
         against the bad pairs: 1 when it names exactly the bad pairs.</p>",
        fmt_pct(th.loss_ratio),
        th.min_lost,
        th.rtt_factor,
        fmt_ms(th.rtt_excess)
    );

    body.push_str("<h2>Suspects</h2>\n");
    if d.suspects.is_empty() {
        body.push_str("<p id=\"no-suspects\">None: every pair is within the thresholds.</p>\n");
    } else {
        let head = "<thead><tr><th>#</th><th>Score</th><th class=\"l\">Suspect</th>\
                    <th class=\"l\">Evidence</th></tr></thead>";
        let _ = writeln!(body, "<table id=\"suspects\">{head}<tbody>");
        for (i, s) in d.suspects.iter().enumerate() {
            if i == PAGE_TOP_SUSPECTS {
                let _ = write!(
                    body,
                    "</tbody></table>\n<details><summary>{} more suspects</summary>\n\
                     <table id=\"more-suspects\">{head}<tbody>\n",
                    d.suspects.len() - PAGE_TOP_SUSPECTS
                );
            }
            let _ = writeln!(
                body,
                "<tr data-kind=\"{}\" data-name=\"{}\"><td>{}</td><td class=\"score\">{:.2}</td>\
                 <td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                s.kind.label(),
                esc(s.kind.name()),
                i + 1,
                s.score,
                esc(&suspect_description(&s.kind)),
                esc(&suspect_evidence(s, d))
            );
        }
        body.push_str("</tbody></table>\n");
        if d.suspects.len() > PAGE_TOP_SUSPECTS {
            body.push_str("</details>\n");
        }
    }

    let gm = group_matrix(d, groups);
    let names = group_names(&gm);
    if names.len() >= 2 {
        body.push_str("<h2>Between groups</h2>\n");
        body.push_str(
            "<p class=\"note\">Each cell pools the pairs from a host of the row's group to a host \
             of the column's: the share of them that is bad (the colour), how many, their median \
             p99 and pooled loss (hover). A group whose uplink is bad is a bad row and column; \
             the diagonal is a group's own pairs.</p>\n",
        );
        let order: Vec<(&str, Option<&str>)> = names.iter().map(|g| (*g, None)).collect();
        let cells: BTreeMap<(&str, &str), &GroupCell> = gm
            .iter()
            .map(|c| ((c.source.as_str(), c.target.as_str()), c))
            .collect();
        let cell = |s: &str, t: &str| {
            let c = cells.get(&(s, t))?;
            let share = c.bad_pairs as f64 / c.pairs.max(1) as f64;
            let title = format!(
                "{s} → {t}: {} of {} pairs bad; median p99 {} ms; loss {} %",
                c.bad_pairs,
                c.pairs,
                c.median_p99.map_or("n/a".to_owned(), fmt_ms),
                c.loss_ratio.map_or("n/a".to_owned(), fmt_pct)
            );
            Some(Shade {
                fill: ramp(share),
                bad: share >= 0.5,
                title,
            })
        };
        body.push_str(&heatmap_svg(&order, "groups", true, &cell));
        body.push_str(&legend(
            &[(0.0, "no bad pair"), (0.5, "half"), (1.0, "all bad")],
            "(outlined: at least half of the pairs bad)",
        ));
    }

    // The host heatmaps, hosts ordered by group then name.
    let mut order: Vec<(&str, Option<&str>)> = d
        .hosts
        .iter()
        .map(|h| (h.as_str(), groups.get(h).map(String::as_str)))
        .collect();
    order.sort_by(|a, b| (a.1.is_none(), a.1, a.0).cmp(&(b.1.is_none(), b.1, b.0)));
    let cells: BTreeMap<(&str, &str), &Cell> = d
        .cells
        .iter()
        .map(|c| ((c.source.as_str(), c.target.as_str()), c))
        .collect();
    if d.hosts.len() > MAX_DRAWN_HOSTS {
        let _ = writeln!(
            body,
            "<h2>Source x target</h2>\n<p class=\"note\" id=\"too-many-hosts\">{} hosts: more \
             than the {MAX_DRAWN_HOSTS} this page draws cell by cell. The group matrix above and \
             the suspects say where to look; `sonde mesh diagnose --json` has every pair.</p>",
            d.hosts.len()
        );
    } else {
        let base = d.baseline_p99;
        body.push_str("<h2>p99 RTT, source (row) to target (column)</h2>\n");
        body.push_str(
            "<p class=\"note\">Rows are the probing hosts, columns the probed, ordered by group \
             (lines between groups). Hover a cell for its figures; an outlined cell is a bad \
             pair, black is unreachable, grey no data.</p>\n",
        );
        let p99_cell = |s: &str, t: &str| {
            let c = cells.get(&(s, t))?;
            let (text, bad) = p99_text(c);
            let fill = match (c.stats.p99_rtt, c.verdict.down) {
                (_, true) => DOWN.to_owned(),
                (Some(p), false) => ramp(p99_shade(p, base, th)),
                (None, false) => NO_DATA.to_owned(),
            };
            let unit = if c.stats.p99_rtt.is_some() { " ms" } else { "" };
            Some(Shade {
                fill,
                bad,
                title: format!("{s} → {t}: p99 {text}{unit}"),
            })
        };
        body.push_str(&heatmap_svg(&order, "p99", false, &p99_cell));
        let b = base.map_or(1.0, |b| b.as_secs_f64() * 1e3);
        let f = 2.0 * th.rtt_factor.max(1.5);
        body.push_str(&legend(
            &[
                (0.0, &format!("≤ baseline ({} ms)", fmt_ms_f(b))),
                (
                    th.rtt_factor.ln() / f.ln(),
                    &format!("{} x ({} ms)", th.rtt_factor, fmt_ms_f(b * th.rtt_factor)),
                ),
                (1.0, &format!("≥ {f} x")),
            ],
            "",
        ));
        body.push_str("<h2>Loss, source (row) to target (column)</h2>\n");
        let loss_cell = |s: &str, t: &str| {
            let c = cells.get(&(s, t))?;
            let (text, bad) = loss_text(c);
            let fill = match (c.stats.loss_ratio(), c.verdict.down) {
                (_, true) => DOWN.to_owned(),
                (Some(l), false) => ramp(loss_shade(l, th)),
                (None, false) => NO_DATA.to_owned(),
            };
            let unit = if text == "down" || text == "n/a" {
                ""
            } else {
                " %"
            };
            let probes = c
                .stats
                .sent
                .map_or(String::new(), |n| format!(" of {n:.0} probes"));
            Some(Shade {
                fill,
                bad,
                title: format!("{s} → {t}: loss {text}{unit}{probes}"),
            })
        };
        body.push_str(&heatmap_svg(&order, "loss", false, &loss_cell));
        body.push_str(&legend(
            &[
                (0.0, "0 %"),
                (
                    loss_shade(th.loss_ratio, th),
                    &format!("{} % (bad)", fmt_pct(th.loss_ratio)),
                ),
                (1.0, &format!("≥ {} %", fmt_pct(2.0 * th.loss_ratio))),
            ],
            "",
        ));
    }

    let mut out = String::with_capacity(body.len() + 4096);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<title>Mesh diagnosis</title>\n");
    let _ = writeln!(out, "<script>{ERROR_TRAP_JS}</script>");
    let _ = writeln!(out, "<style>{REPORT_CSS}\n{PAGE_CSS}</style>");
    out.push_str("</head>\n<body>\n");
    out.push_str(&body);
    out.push_str(
        "<script>document.documentElement.setAttribute(\"data-ready\", \"1\");</script>\n",
    );
    out.push_str("</body>\n</html>\n");
    out
}

fn fmt_ms_f(ms: f64) -> String {
    fmt_ms(Duration::from_secs_f64(ms.max(0.0) / 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_engine::diagnose::{diagnose, PairStats};

    /// `racks` racks of `per` hosts (`r0-h0` ...), every pair probed; `bad(s, t)` makes a pair
    /// lose 5 % of its probes.
    fn mesh(
        racks: usize,
        per: usize,
        bad: impl Fn(&str, &str) -> bool,
    ) -> (Diagnosis, BTreeMap<String, String>) {
        let hosts: Vec<String> = (0..racks * per)
            .map(|i| format!("r{}-h{}", i / per, i % per))
            .collect();
        let groups = hosts
            .iter()
            .map(|h| (h.clone(), h[..2].to_owned()))
            .collect();
        let mut pairs = BTreeMap::new();
        for s in &hosts {
            for t in hosts.iter().filter(|t| *t != s) {
                let lost = if bad(s, t) { 30.0 } else { 0.0 };
                pairs.insert(
                    (s.clone(), t.clone()),
                    PairStats {
                        p99_rtt: Some(Duration::from_micros(300)),
                        sent: Some(600.0),
                        lost: Some(lost),
                        up_fraction: Some(1.0),
                    },
                );
            }
        }
        let d = diagnose(&pairs, &groups, &Thresholds::default());
        (d, groups)
    }

    fn meta(th: &Thresholds) -> DiagnosisMeta<'_> {
        DiagnosisMeta {
            prometheus: "http://prom:9090",
            window: Duration::from_secs(300),
            protocol: Some("udp"),
            thresholds: th,
            made_unix_ms: 0,
        }
    }

    #[test]
    fn the_page_draws_every_pair_and_outlines_the_bad_ones() {
        // r1-h2 loses both ways: its row and column are bad, 2 x 8 pairs.
        let (d, groups) = mesh(3, 3, |s, t| s == "r1-h2" || t == "r1-h2");
        let th = Thresholds::default();
        let page = diagnosis_html(&d, &groups, &meta(&th));
        let svg = |kind: &str| {
            let from = page
                .find(&format!("data-heatmap=\"{kind}\""))
                .expect("heatmap");
            let to = from + page[from..].find("</svg>").unwrap();
            &page[from..to]
        };
        for kind in ["p99", "loss"] {
            assert_eq!(
                svg(kind).matches("<rect class=\"c").count(),
                9 * 8,
                "{kind}"
            );
        }
        assert_eq!(svg("p99").matches("class=\"c bad\"").count(), 0);
        assert_eq!(svg("loss").matches("class=\"c bad\"").count(), 16);
        assert!(svg("loss").contains("<title>r1-h2 → r0-h0: loss 5.00 % of 600 probes</title>"));
        // Three racks: a 3 x 3 group matrix, its diagonal drawn; r1's own pairs are 4 of 6 bad.
        assert_eq!(svg("groups").matches("<rect class=\"c").count(), 9);
        assert!(svg("groups").contains("<title>r1 → r1: 4 of 6 pairs bad;"));
        // Two lines a group boundary, two boundaries.
        assert_eq!(svg("loss").matches("<line ").count(), 4);
        let first = page.find("<tr data-kind=").unwrap();
        assert!(
            page[first..].starts_with("<tr data-kind=\"cross\" data-name=\"r1-h2\">"),
            "{}",
            &page[first..first + 80]
        );
        assert!(page.contains("data-ready"));
        assert!(!page.contains("too-many-hosts"));
    }

    #[test]
    fn names_are_escaped() {
        let (mut d, groups) = mesh(1, 2, |_, _| false);
        d.hosts[0] = "<b>&".to_owned();
        d.cells[0].source = "<b>&".to_owned();
        let th = Thresholds::default();
        let page = diagnosis_html(&d, &groups, &meta(&th));
        assert!(!page.contains("<b>&"));
        assert!(page.contains("&lt;b&gt;&amp;"));
    }

    #[test]
    fn a_large_mesh_is_drawn_by_group_and_the_text_stays_narrow() {
        // 13 racks of 20: 260 hosts, 67,340 pairs; rack r3's pairs to the others lossy.
        let (d, groups) = mesh(13, 20, |s, t| s.starts_with("r3-") != t.starts_with("r3-"));
        let th = Thresholds::default();
        let page = diagnosis_html(&d, &groups, &meta(&th));
        assert!(page.contains("id=\"too-many-hosts\">260 hosts"));
        assert!(!page.contains("data-heatmap=\"p99\""));
        assert!(page.contains("data-heatmap=\"groups\""));
        assert!(page.contains("<tr data-kind=\"group\" data-name=\"r3\">"));
        let text = diagnosis_text(&d, &groups, &meta(&th), 3);
        assert!(
            text.contains("The heatmaps of 260 hosts are too wide"),
            "{text}"
        );
        assert!(text.lines().all(|l| l.chars().count() < 160), "{text}");
        // Row r3: 400 pairs to each other rack, all bad; its own 380 good.
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("r3 "))
            .unwrap();
        assert!(
            row.contains(" 400/400 ") && row.contains(" 0/380 "),
            "{row}"
        );
    }

    #[test]
    fn the_document_carries_the_thresholds_the_groups_and_the_evidence() {
        let (d, groups) = mesh(2, 2, |s, _| s == "r0-h1");
        let th = Thresholds::default();
        let doc = diagnosis_json(&d, &groups, &meta(&th));
        assert_eq!(doc["thresholds"]["rtt_factor"], th.rtt_factor);
        assert_eq!(doc["group_pairs"].as_array().unwrap().len(), 4);
        assert_eq!(doc["suspects"][0]["kind"], "source");
        assert_eq!(
            doc["suspects"][0]["evidence"],
            "3 of its 3 pairs bad (3 lossy, median loss 5.00 %)"
        );
    }
}
