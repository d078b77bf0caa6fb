//! The plan file: TOML with endpoints, defaults and `[[matrix]]` tables whose arrays are axes,
//! read with the span of every key and value so that each mistake names its line and column, and
//! expanded into cases, each parsed by its test subcommand's own clap definition.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use toml_edit::{Item, TableLike, Value};

use crate::spec::{self, KeyValue, PlanKey, TestKind, TestSpec, PROTOCOL_KEY, TARGET_KEY};
use crate::units::BadValue;

/// The keys whose values name endpoints of `[endpoints]`.
const ENDPOINT_KEYS: &[&str] = &[TARGET_KEY, "from"];

/// A plan, parsed and expanded.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) name: String,
    pub(crate) cases: Vec<Case>,
}

/// One case: a test and its options.
#[derive(Debug)]
pub(crate) struct Case {
    /// 1-based, in the order of the file.
    pub(crate) index: usize,
    pub(crate) kind: TestKind,
    /// The axis values that make this case, in the matrix's order: (key, value as written).
    pub(crate) axes: Vec<(String, String)>,
    /// What follows `sonde TEST` on the equivalent command line.
    pub(crate) args: Vec<String>,
    pub(crate) spec: TestSpec,
    pub(crate) repeat: u32,
}

impl Case {
    /// The case's name: its axis values (`target=b protocol=udp`), or the test with none.
    pub(crate) fn name(&self) -> String {
        if self.axes.is_empty() {
            return self.kind.name().to_owned();
        }
        self.axes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The equivalent command line.
    pub(crate) fn command_line(&self) -> String {
        let mut s = format!("sonde {}", self.kind.name());
        for a in &self.args {
            s.push(' ');
            s.push_str(&shell_quote(a));
        }
        s
    }

    /// How long one run measures.
    pub(crate) fn expected(&self) -> Duration {
        self.spec.test().expected()
    }
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@[]%+".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Where in the file, for errors.
struct Source<'a> {
    file: String,
    text: &'a str,
}

impl Source<'_> {
    /// `FILE:LINE:COLUMN: message` (1-based line and column, in characters).
    fn error(&self, span: Option<Range<usize>>, message: impl std::fmt::Display) -> BadValue {
        let at = span.map_or(0, |s| s.start).min(self.text.len());
        let before = &self.text[..at];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        BadValue(format!("{}:{line}:{column}: {message}", self.file))
    }
}

/// ", did you mean \"x\"?" when one candidate is close to `word`.
fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let best = candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((_, c)) => format!("; did you mean \"{c}\"?"),
        None => String::new(),
    }
}

/// A value as a flag takes it.
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Text(String),
    Switch(bool),
}

impl Scalar {
    fn of(v: &Value) -> Option<Self> {
        Some(match v {
            Value::String(s) => Self::Text(s.value().clone()),
            Value::Integer(i) => Self::Text(i.value().to_string()),
            Value::Float(f) => Self::Text(f.value().to_string()),
            Value::Boolean(b) => Self::Switch(*b.value()),
            _ => return None,
        })
    }

    fn text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::Switch(b) => b.to_string(),
        }
    }
}

/// A key's value in one case: one value, or the list of a flag given more than once.
#[derive(Debug, Clone, PartialEq)]
enum Arg {
    One(Scalar),
    Many(Vec<String>),
}

impl Arg {
    fn text(&self) -> String {
        match self {
            Self::One(s) => s.text(),
            Self::Many(v) => v.join(","),
        }
    }
}

/// A key set in the file: where, and its value(s).
#[derive(Debug, Clone)]
struct Setting {
    key: String,
    span: Option<Range<usize>>,
    value: Setting2,
}

#[derive(Debug, Clone)]
enum Setting2 {
    Fixed(Arg),
    /// An axis: each value with its span.
    Axis(Vec<(Arg, Option<Range<usize>>)>),
}

/// The keys a test takes in a plan.
struct Keys {
    kind: TestKind,
    keys: Vec<PlanKey>,
}

impl Keys {
    fn of(kind: TestKind) -> Self {
        Self {
            kind,
            keys: spec::plan_keys(kind),
        }
    }

    fn get(&self, key: &str) -> Option<&PlanKey> {
        self.keys.iter().find(|k| k.key == key)
    }

    fn knows(&self, key: &str) -> bool {
        key == PROTOCOL_KEY || self.get(key).is_some()
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .map(|k| k.key.as_str())
            .chain([PROTOCOL_KEY, "repeat"])
    }

    fn multiple(&self, key: &str) -> bool {
        self.get(key).is_some_and(|k| k.multiple)
    }
}

/// A table of the file and where it is.
type Spanned<'a> = (&'a dyn TableLike, Option<Range<usize>>);

/// The tables of an array of tables (`[[matrix]]`) or an array of inline tables.
fn tables(item: &Item) -> Option<Vec<Spanned<'_>>> {
    match item {
        Item::ArrayOfTables(a) => Some(a.iter().map(|t| (t as &dyn TableLike, t.span())).collect()),
        Item::Value(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_inline_table().map(|t| (t as &dyn TableLike, t.span())))
            .collect(),
        _ => None,
    }
}

/// The span of the key itself.
fn key_span(table: &dyn TableLike, key: &str) -> Option<Range<usize>> {
    table.get_key_value(key).and_then(|(k, _)| k.span())
}

impl Plan {
    /// Reads and expands a plan file; every mistake is an error naming its line and column.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = Self::read(path)?;
        Ok(Self::parse_file(&path.display().to_string(), &text)?)
    }

    /// A plan file's text.
    pub(crate) fn read(path: &Path) -> Result<String, BadValue> {
        std::fs::read_to_string(path)
            .map_err(|e| BadValue(format!("cannot read the plan {}: {e}", path.display())))
    }

    /// Parses the text of the plan file `file` (its name without the extension is the plan's
    /// default name).
    pub(crate) fn parse_file(file: &str, text: &str) -> Result<Self, BadValue> {
        let stem = Path::new(file)
            .file_stem()
            .map_or_else(|| "plan".to_owned(), |s| s.to_string_lossy().into_owned());
        Self::parse(file, &stem, text)
    }

    /// Parses a plan from its text; `file` names it in errors, `stem` is its default name.
    pub(crate) fn parse(file: &str, stem: &str, text: &str) -> Result<Self, BadValue> {
        let src = Source {
            file: file.to_owned(),
            text,
        };
        let doc = toml_edit::Document::parse(text.to_owned())
            .map_err(|e| src.error(e.span(), format!("not valid TOML: {}", e.message())))?;
        let root = doc.as_table();
        let top = ["name", "endpoints", "defaults", "matrix"];
        for (key, _) in root.iter() {
            if !top.contains(&key) {
                return Err(src.error(
                    key_span(root, key),
                    format!(
                        "unknown key \"{key}\" at the top of the plan (expected name, \
                         [endpoints], [defaults] or [[matrix]]){}",
                        suggest(key, top)
                    ),
                ));
            }
        }
        let name = match root.get("name") {
            None => stem.to_owned(),
            Some(item) => item
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| src.error(item.span(), "expected the plan's name as a string"))?,
        };
        let mut endpoints = BTreeMap::new();
        if let Some(item) = root.get("endpoints") {
            let t = item.as_table_like().ok_or_else(|| {
                src.error(
                    item.span(),
                    "expected a table of endpoints: [endpoints] NAME = \"HOST[:PORT]\"",
                )
            })?;
            for (key, v) in t.iter() {
                let addr = v.as_str().filter(|s| !s.is_empty()).ok_or_else(|| {
                    src.error(
                        v.span(),
                        format!("endpoint \"{key}\": expected \"HOST[:PORT]\" as a string"),
                    )
                })?;
                endpoints.insert(key.to_owned(), addr.to_owned());
            }
        }
        let defaults = match root.get("defaults") {
            None => None,
            Some(item) => Some(item.as_table_like().ok_or_else(|| {
                src.error(item.span(), "expected a table: [defaults] KEY = VALUE")
            })?),
        };
        let matrices = match root.get("matrix") {
            None => {
                return Err(src.error(
                    None,
                    "the plan has no cases: add a [[matrix]] with test = \"...\"",
                ))
            }
            Some(item) => tables(item).ok_or_else(|| {
                src.error(
                    item.span(),
                    "expected [[matrix]] tables (an array of tables), one per test",
                )
            })?,
        };
        let all_keys: Vec<Keys> = TestKind::all().map(Keys::of).collect();
        if let Some(d) = defaults {
            for (key, _) in d.iter() {
                if !all_keys.iter().any(|k| k.knows(key)) && key != "repeat" {
                    return Err(src.error(
                        key_span(d, key),
                        format!(
                            "unknown key \"{key}\" in [defaults]: no test has --{}{}",
                            key.replace('_', "-"),
                            suggest(key, all_keys.iter().flat_map(Keys::names))
                        ),
                    ));
                }
            }
        }
        let mut plan = Self {
            name,
            cases: Vec::new(),
        };
        for (table, span) in matrices {
            let ctx = Ctx {
                src: &src,
                endpoints: &endpoints,
            };
            ctx.matrix(table, &span, defaults, &mut plan.cases)?;
        }
        Ok(plan)
    }
}

struct Ctx<'a> {
    src: &'a Source<'a>,
    endpoints: &'a BTreeMap<String, String>,
}

impl Ctx<'_> {
    /// One `[[matrix]]`: its keys, axes and overrides, expanded into cases.
    fn matrix(
        &self,
        table: &dyn TableLike,
        span: &Option<Range<usize>>,
        defaults: Option<&dyn TableLike>,
        cases: &mut Vec<Case>,
    ) -> Result<(), BadValue> {
        let src = self.src;
        let test = table.get("test").ok_or_else(|| {
            let names: Vec<&str> = TestKind::all().map(TestKind::name).collect();
            let (first, rest) = names.split_first().unwrap_or((&"", &[]));
            src.error(
                span.clone(),
                format!(
                    "this [[matrix]] has no test: add test = \"{}\" (or {})",
                    first,
                    rest.join(", ")
                ),
            )
        })?;
        let test_name = test
            .as_str()
            .ok_or_else(|| src.error(test.span(), "expected the test's name as a string"))?;
        let kind = TestKind::from_name(test_name).ok_or_else(|| {
            src.error(
                test.span(),
                format!(
                    "unknown test \"{test_name}\" (expected {}){}",
                    TestKind::names(),
                    suggest(test_name, TestKind::all().map(TestKind::name))
                ),
            )
        })?;
        let keys = Keys::of(kind);
        let mut settings: Vec<Setting> = Vec::new();
        let mut repeat = None;
        // The defaults first (those this test takes), then the matrix's own keys.
        for (from_defaults, t) in defaults
            .into_iter()
            .map(|d| (true, d))
            .chain([(false, table)])
        {
            for (key, item) in t.iter() {
                match key {
                    "test" | "case" if !from_defaults => continue,
                    "repeat" => {
                        repeat = Some(self.repeat(item)?);
                        continue;
                    }
                    _ => {}
                }
                if !keys.knows(key) {
                    if from_defaults {
                        continue;
                    }
                    return Err(self.unknown_key(&keys, t, key));
                }
                let setting = self.setting(&keys, key, item, true)?;
                settings.retain(|s| s.key != key);
                settings.push(setting);
            }
        }
        let axes: Vec<&Setting> = settings
            .iter()
            .filter(|s| matches!(s.value, Setting2::Axis(_)))
            .collect();
        let overrides = self.overrides(&keys, table, &settings)?;
        // The cross product, the first axis slowest.
        let mut combos: Vec<Vec<usize>> = vec![Vec::new()];
        for axis in &axes {
            let Setting2::Axis(values) = &axis.value else {
                continue;
            };
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    (0..values.len()).map(move |i| {
                        let mut c = c.clone();
                        c.push(i);
                        c
                    })
                })
                .collect();
        }
        for combo in combos {
            let mut picked: Vec<(String, Arg, Option<Range<usize>>)> = Vec::new();
            let mut axis_values = Vec::new();
            let mut axis_i = 0;
            for s in &settings {
                match &s.value {
                    Setting2::Fixed(a) => picked.push((s.key.clone(), a.clone(), s.span.clone())),
                    Setting2::Axis(values) => {
                        let (a, span) = &values[combo[axis_i]];
                        axis_i += 1;
                        axis_values.push((s.key.clone(), a.text()));
                        picked.push((s.key.clone(), a.clone(), span.clone()));
                    }
                }
            }
            for o in &overrides {
                let applies = o.matches.iter().all(|(key, want)| {
                    axis_values
                        .iter()
                        .any(|(k, v)| k == key && *v == want.text())
                });
                if applies {
                    for s in &o.sets {
                        let Setting2::Fixed(a) = &s.value else {
                            continue;
                        };
                        picked.retain(|(k, _, _)| *k != s.key);
                        picked.push((s.key.clone(), a.clone(), s.span.clone()));
                    }
                }
            }
            let case = self.case(kind, &keys, span.clone(), &picked, axis_values, repeat)?;
            cases.push(Case {
                index: cases.len() + 1,
                ..case
            });
        }
        Ok(())
    }

    fn unknown_key(&self, keys: &Keys, t: &dyn TableLike, key: &str) -> BadValue {
        let why = spec::NOT_IN_PLANS
            .iter()
            .find(|(l, _)| *l == key.replace('_', "-"))
            .map(|(l, why)| format!("--{l} is not for plans: {why}"));
        self.src.error(
            key_span(t, key),
            why.unwrap_or_else(|| {
                format!(
                    "unknown key \"{key}\" for {}: it has no --{}{}",
                    keys.kind.name(),
                    key.replace('_', "-"),
                    suggest(key, keys.names())
                )
            }),
        )
    }

    fn repeat(&self, item: &Item) -> Result<u32, BadValue> {
        item.as_integer()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                self.src
                    .error(item.span(), "expected repeat as a whole number, 1 or more")
            })
    }

    /// A key's value: a scalar, a list (for a flag given more than once), or an axis (`axes`:
    /// arrays allowed).
    fn setting(
        &self,
        keys: &Keys,
        key: &str,
        item: &Item,
        axes: bool,
    ) -> Result<Setting, BadValue> {
        let src = self.src;
        let multiple = keys.multiple(key);
        let span = item.span();
        let value = item.as_value().ok_or_else(|| {
            src.error(
                span.clone(),
                format!("\"{key}\": expected a value, not a table"),
            )
        })?;
        let scalar = |v: &Value| -> Result<Scalar, BadValue> {
            let s = Scalar::of(v).ok_or_else(|| {
                src.error(
                    v.span(),
                    format!("\"{key}\": expected a string, a number or a boolean"),
                )
            })?;
            if keys.get(key).is_some_and(|k| k.switch) && !matches!(s, Scalar::Switch(_)) {
                return Err(src.error(
                    v.span(),
                    format!(
                        "\"{key}\" is a switch (--{}): expected true or false",
                        key.replace('_', "-")
                    ),
                ));
            }
            self.check_value(keys.kind, key, &s, v.span())?;
            Ok(s)
        };
        let list = |a: &toml_edit::Array| -> Result<Vec<String>, BadValue> {
            a.iter().map(|v| scalar(v).map(|s| s.text())).collect()
        };
        let value = match value {
            Value::Array(a) if multiple => {
                if a.iter().all(Value::is_array) && !a.is_empty() {
                    if !axes {
                        return Err(src.error(
                            span,
                            format!("\"{key}\": an override takes one value, not an axis"),
                        ));
                    }
                    let values = a
                        .iter()
                        .map(|v| {
                            let inner = v.as_array().map(list).unwrap_or_else(|| Ok(Vec::new()));
                            inner.map(|l| (Arg::Many(l), v.span()))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Setting2::Axis(values)
                } else {
                    Setting2::Fixed(Arg::Many(list(a)?))
                }
            }
            Value::Array(a) => {
                if !axes {
                    return Err(src.error(
                        span,
                        format!("\"{key}\": an override takes one value, not an axis"),
                    ));
                }
                if a.is_empty() {
                    return Err(
                        src.error(span, format!("\"{key}\": an axis needs at least one value"))
                    );
                }
                let values = a
                    .iter()
                    .map(|v| scalar(v).map(|s| (Arg::One(s), v.span())))
                    .collect::<Result<Vec<_>, _>>()?;
                Setting2::Axis(values)
            }
            v if multiple => Setting2::Fixed(Arg::Many(vec![scalar(v)?.text()])),
            v => Setting2::Fixed(Arg::One(scalar(v)?)),
        };
        Ok(Setting {
            key: key.to_owned(),
            span,
            value,
        })
    }

    /// What can be checked of one value alone: endpoints exist, the protocol is one the test
    /// speaks. The rest is the subcommand's parser's, when the case is parsed.
    fn check_value(
        &self,
        kind: TestKind,
        key: &str,
        value: &Scalar,
        span: Option<Range<usize>>,
    ) -> Result<(), BadValue> {
        if ENDPOINT_KEYS.contains(&key) {
            let Scalar::Text(name) = value else {
                return Err(self
                    .src
                    .error(span, format!("\"{key}\": expected an endpoint's name")));
            };
            if !self.endpoints.contains_key(name) {
                let known = if self.endpoints.is_empty() {
                    "the plan has no [endpoints]".to_owned()
                } else {
                    format!(
                        "[endpoints] names {}",
                        self.endpoints
                            .keys()
                            .map(String::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(self.src.error(
                    span,
                    format!(
                        "unknown endpoint \"{name}\" ({known}){}",
                        suggest(name, self.endpoints.keys().map(String::as_str))
                    ),
                ));
            }
        }
        if key == PROTOCOL_KEY {
            spec::protocol_args(kind, &value.text())
                .map_err(|e| self.src.error(span, format!("protocol: {e}")))?;
        }
        Ok(())
    }

    fn overrides(
        &self,
        keys: &Keys,
        table: &dyn TableLike,
        settings: &[Setting],
    ) -> Result<Vec<Override>, BadValue> {
        let src = self.src;
        let Some(item) = table.get("case") else {
            return Ok(Vec::new());
        };
        let list = tables(item).ok_or_else(|| {
            src.error(
                item.span(),
                "expected [[matrix.case]] tables: the axis values to match and the keys to set",
            )
        })?;
        let mut out = Vec::new();
        for (t, span) in list {
            let mut o = Override {
                matches: Vec::new(),
                sets: Vec::new(),
            };
            for (key, item) in t.iter() {
                let axis = settings
                    .iter()
                    .find(|s| s.key == key)
                    .and_then(|s| match &s.value {
                        Setting2::Axis(values) => Some(values),
                        Setting2::Fixed(_) => None,
                    });
                if let Some(values) = axis {
                    let s = self.setting(keys, key, item, false)?;
                    let Setting2::Fixed(want) = s.value else {
                        continue;
                    };
                    if !values.iter().any(|(v, _)| v.text() == want.text()) {
                        return Err(src.error(
                            item.span(),
                            format!(
                                "{key} = {:?} matches no case: the axis {key} has {}",
                                want.text(),
                                values
                                    .iter()
                                    .map(|(v, _)| format!("{:?}", v.text()))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        ));
                    }
                    o.matches.push((key.to_owned(), want));
                } else if key == "repeat" || key == "test" {
                    return Err(src.error(
                        key_span(t, key),
                        format!("\"{key}\" is the matrix's; a case override cannot set it"),
                    ));
                } else if keys.knows(key) {
                    o.sets.push(self.setting(keys, key, item, false)?);
                } else {
                    return Err(self.unknown_key(keys, t, key));
                }
            }
            if o.matches.is_empty() {
                return Err(src.error(
                    span,
                    "a [[matrix.case]] names the axis values of the cases it changes (e.g. \
                     target = \"b\"); this one names none",
                ));
            }
            out.push(o);
        }
        Ok(out)
    }

    /// One case from the keys it ends up with, parsed by the subcommand's definition.
    fn case(
        &self,
        kind: TestKind,
        keys: &Keys,
        matrix_span: Option<Range<usize>>,
        picked: &[(String, Arg, Option<Range<usize>>)],
        axes: Vec<(String, String)>,
        repeat: Option<u32>,
    ) -> Result<Case, BadValue> {
        let src = self.src;
        let endpoint = |name: &str| self.endpoints.get(name).cloned().unwrap_or_default();
        let Some((_, target, _)) = picked.iter().find(|(k, _, _)| k == TARGET_KEY) else {
            return Err(src.error(
                matrix_span,
                format!(
                    "this {} matrix has no target: add target = \"ENDPOINT\" (a name from \
                     [endpoints])",
                    kind.name()
                ),
            ));
        };
        let mut args = vec![endpoint(&target.text())];
        // Which key each flag came from, for errors.
        let mut origin: Vec<(String, Option<Range<usize>>)> = Vec::new();
        for (key, value, span) in picked {
            if key == TARGET_KEY {
                continue;
            }
            let value = match value {
                Arg::One(Scalar::Text(s)) => KeyValue::Text(s.clone()),
                Arg::One(Scalar::Switch(b)) => KeyValue::Switch(*b),
                Arg::Many(list) if ENDPOINT_KEYS.contains(&key.as_str()) => {
                    KeyValue::Many(list.iter().map(|v| endpoint(v)).collect())
                }
                Arg::Many(list) => KeyValue::Many(list.clone()),
            };
            let flags = spec::key_args(kind, &keys.keys, key, &value).map_err(|e| {
                let e = if key == PROTOCOL_KEY {
                    format!("protocol: {e}")
                } else {
                    e
                };
                src.error(span.clone(), e)
            })?;
            for f in &flags {
                if let Some(name) = f.strip_prefix("--") {
                    let name = name.split('=').next().unwrap_or(name);
                    origin.push((name.to_owned(), span.clone()));
                }
            }
            args.extend(flags);
        }
        // Parsed as if with --json: a case prints nothing (the saver of a plan's case is quiet),
        // and --json also keeps a throughput case's -i lines off stdout, where the plan's matrix
        // (or its --json document) goes. The command line shown stays without it.
        let parsed: Vec<String> = args.iter().cloned().chain(["--json".to_owned()]).collect();
        let spec = kind.parse(&parsed).map_err(|e| {
            let message = e.render().to_string();
            let message = message
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
                .to_owned();
            // The key the error is about: the first flag it names that a key set.
            let span = origin
                .iter()
                .find(|(long, _)| {
                    message.contains(&format!("'--{long}"))
                        || message.contains(&format!("'--{long} "))
                })
                .and_then(|(_, s)| s.clone())
                .or(matrix_span);
            src.error(
                span,
                format!(
                    "{message} (as `{}`)",
                    std::iter::once(format!("sonde {}", kind.name()))
                        .chain(args.iter().map(|a| shell_quote(a)))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            )
        })?;
        Ok(Case {
            index: 0,
            kind,
            axes,
            args,
            spec,
            repeat: repeat.unwrap_or(1),
        })
    }
}

/// A `[[matrix.case]]`: the axis values it matches, the keys it sets.
struct Override {
    matches: Vec<(String, Arg)>,
    sets: Vec<Setting>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "[endpoints]\nb = \"198.18.0.2\"\nc = \"198.18.1.2:5301\"\n";

    fn parse(text: &str) -> Plan {
        Plan::parse("p.toml", "p", text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(text: &str) -> String {
        match Plan::parse("p.toml", "p", text) {
            Ok(p) => panic!("parsed: {p:?}"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn axes_expand_to_their_cross_product_first_axis_slowest() {
        let p = parse(&format!(
            "{HEAD}[defaults]\ntime = \"2s\"\n[[matrix]]\ntest = \"latency\"\n\
             target = [\"b\", \"c\"]\nprotocol = [\"tcp\", \"udp\"]\nmsg_size = 16384\nrepeat = 3\n"
        ));
        assert_eq!(p.name, "p");
        let names: Vec<String> = p.cases.iter().map(Case::name).collect();
        assert_eq!(
            names,
            [
                "target=b protocol=tcp",
                "target=b protocol=udp",
                "target=c protocol=tcp",
                "target=c protocol=udp"
            ]
        );
        assert_eq!(
            p.cases[3].command_line(),
            "sonde latency 198.18.1.2:5301 --time 2s --udp --msg-size 16384"
        );
        assert!(p.cases.iter().all(|c| c.repeat == 3));
        assert_eq!(
            p.cases.iter().map(|c| c.index).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        // The defaults reach the subcommand's options: 1 s warm-up + 2 s.
        assert_eq!(p.cases[0].expected(), Duration::from_secs(3));
    }

    #[test]
    fn a_case_override_changes_only_the_cases_it_matches() {
        let p = parse(&format!(
            "name = \"zones\"\n{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
             time = 1\n[[matrix.case]]\ntarget = \"c\"\ntime = \"3\"\nudp = true\n"
        ));
        assert_eq!(p.name, "zones");
        assert_eq!(
            p.cases[0].command_line(),
            "sonde latency 198.18.0.2 --time 1"
        );
        assert_eq!(
            p.cases[1].command_line(),
            "sonde latency 198.18.1.2:5301 --time 3 --udp"
        );
        assert_eq!(p.cases[1].expected(), Duration::from_secs(4));
    }

    /// A flag given more than once (`--from A --from B`): an array is
    /// its list, an array of arrays an axis of lists, and its values name endpoints.
    #[test]
    fn a_repeated_flag_takes_an_array_as_its_list() {
        let mut keys = Keys::of(TestKind::of::<crate::pps::Opt>());
        keys.keys.push(PlanKey {
            key: "from".into(),
            long: Some("from".into()),
            switch: false,
            multiple: true,
        });
        let endpoints: BTreeMap<String, String> = [("a1", "198.18.0.1"), ("a2", "198.18.0.3")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into_iter()
            .collect();
        let text = "list = [\"a1\", \"a2\"]\naxis = [[\"a1\"], [\"a1\", \"a2\"]]\nbad = [\"a3\"]\n";
        let src = Source {
            file: "p.toml".into(),
            text,
        };
        let doc = toml_edit::Document::parse(text.to_owned()).expect("toml");
        let ctx = Ctx {
            src: &src,
            endpoints: &endpoints,
        };
        let item = |k: &str| doc.as_table().get(k).expect("key");
        let list = ctx
            .setting(&keys, "from", item("list"), true)
            .expect("list");
        assert!(matches!(
            list.value,
            Setting2::Fixed(Arg::Many(ref v)) if v == &["a1", "a2"]
        ));
        let axis = ctx
            .setting(&keys, "from", item("axis"), true)
            .expect("axis");
        let Setting2::Axis(values) = axis.value else {
            panic!("not an axis: {axis:?}");
        };
        let texts: Vec<String> = values.iter().map(|(a, _)| a.text()).collect();
        assert_eq!(texts, ["a1", "a1,a2"]);
        let bad = ctx
            .setting(&keys, "from", item("bad"), true)
            .expect_err("a3 is no endpoint");
        assert_eq!(
            bad.0,
            "p.toml:3:8: unknown endpoint \"a3\" ([endpoints] names a1, a2)"
        );
    }

    #[test]
    fn every_test_and_a_parallel_axis() {
        let p = parse(&format!(
            "{HEAD}[defaults]\ntime = 1\nrate = 500\n\
             [[matrix]]\ntest = \"throughput\"\ntarget = \"b\"\nparallel = [1, 2, 5]\nreverse = true\n\
             [[matrix]]\ntest = \"pps\"\ntarget = \"b\"\nmsg_size = 14\nflows = 64\nprotocol = \"udp\"\n\
             [[matrix]]\ntest = \"crr\"\ntarget = \"b\"\nworkers = 4\nrst = false\n\
             [[matrix]]\ntest = \"load\"\ntarget = \"c\"\nbidir = true\n"
        ));
        let lines: Vec<String> = p.cases.iter().map(Case::command_line).collect();
        assert_eq!(
            lines,
            [
                "sonde throughput 198.18.0.2 --time 1 --parallel 1 --reverse",
                "sonde throughput 198.18.0.2 --time 1 --parallel 2 --reverse",
                "sonde throughput 198.18.0.2 --time 1 --parallel 5 --reverse",
                "sonde pps 198.18.0.2 --time 1 --msg-size 14 --flows 64",
                "sonde crr 198.18.0.2 --time 1 --workers 4",
                // `rate` is a default only tests that have --rate take.
                "sonde load 198.18.1.2:5301 --time 1 --rate 500 --bidir",
            ]
        );
        assert_eq!(p.cases[2].name(), "parallel=5");
        assert_eq!(p.cases[3].name(), "pps");
    }

    /// `-B`, `--bind-dev`, `--cport`, `-4`/`-6` are plan keys like any flag, and a value the
    /// flag refuses is the plan's error.
    #[test]
    fn source_keys_are_the_source_flags() {
        let p = parse(&format!(
            "{HEAD}[[matrix]]\ntest = \"throughput\"\ntarget = \"b\"\nparallel = 2\n\
             bind = \"198.18.0.1%veth0\"\ncport = \"5001-5002\"\nipv4 = true\n\
             [[matrix]]\ntest = \"crr\"\ntarget = \"b\"\nbind_dev = \"veth0\"\n"
        ));
        let lines: Vec<String> = p.cases.iter().map(Case::command_line).collect();
        assert_eq!(
            lines,
            [
                "sonde throughput 198.18.0.2 --parallel 2 --bind 198.18.0.1%veth0 --cport \
                 5001-5002 --ipv4",
                "sonde crr 198.18.0.2 --bind-dev veth0",
            ]
        );
        let e = err(&format!(
            "{HEAD}[[matrix]]\ntest = \"pps\"\ntarget = \"b\"\ncport = \"9-1\"\n"
        ));
        assert!(e.contains("the range ends before it starts"), "{e}");
        // crr opens a connection per transaction: it has no --cport.
        let e = err(&format!(
            "{HEAD}[[matrix]]\ntest = \"crr\"\ntarget = \"b\"\ncport = 5001\n"
        ));
        assert!(e.contains("cport"), "{e}");
    }

    /// Every error names the file, line and column, and says what was expected.
    #[test]
    fn a_plan_that_cannot_be_read_says_which_and_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gone.toml");
        let e = Plan::load(&path).expect_err("no such file");
        let want = format!("cannot read the plan {}: ", path.display());
        let got = format!("{e:#}");
        assert!(got.starts_with(&want) && got.len() > want.len(), "{got}");
        assert!(e.is::<BadValue>(), "a usage error (exit 2): {got}");
    }

    #[test]
    fn errors_name_line_and_column() {
        let m = "[[matrix]]\ntest = \"latency\"\ntarget = \"b\"\n";
        let cases: &[(String, &str)] = &[
            (
                "[matrix\n".into(),
                "p.toml:1:8: not valid TOML: unclosed table, expected `]`",
            ),
            (
                format!("names = 1\n{HEAD}"),
                "p.toml:1:1: unknown key \"names\" at the top of the plan (expected name, \
                 [endpoints], [defaults] or [[matrix]]); did you mean \"name\"?",
            ),
            (
                format!("name = 3\n{HEAD}{m}"),
                "p.toml:1:8: expected the plan's name as a string",
            ),
            (
                "endpoints = 1\n".into(),
                "p.toml:1:13: expected a table of endpoints: [endpoints] NAME = \"HOST[:PORT]\"",
            ),
            (
                "[endpoints]\nb = 5300\n".into(),
                "p.toml:2:5: endpoint \"b\": expected \"HOST[:PORT]\" as a string",
            ),
            (
                HEAD.to_owned(),
                "p.toml:1:1: the plan has no cases: add a [[matrix]] with test = \"...\"",
            ),
            (
                format!("{HEAD}[matrix]\ntest = \"latency\"\n"),
                "p.toml:4:1: expected [[matrix]] tables (an array of tables), one per test",
            ),
            (
                format!("{HEAD}[defaults]\ntmie = 1\n{m}"),
                "p.toml:5:1: unknown key \"tmie\" in [defaults]: no test has --tmie; did you \
                 mean \"time\"?",
            ),
            (
                format!("{HEAD}[[matrix]]\ntarget = \"b\"\n"),
                "p.toml:4:1: this [[matrix]] has no test: add test = \"latency\" (or \
                 throughput, pps, crr, load, mtu)",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = \"latenci\"\n"),
                "p.toml:5:8: unknown test \"latenci\" (expected latency, throughput, pps, crr, \
                 load or mtu); did you mean \"latency\"?",
            ),
            (
                format!("{HEAD}{m}msg-size = 10\n"),
                "p.toml:7:1: unknown key \"msg-size\" for latency: it has no --msg-size; did \
                 you mean \"msg_size\"?",
            ),
            (
                format!("{HEAD}{m}json = true\n"),
                "p.toml:7:1: --json is not for plans: a plan prints its matrix; `sonde plan \
                 run --json` prints it as JSON",
            ),
            (
                format!("{HEAD}{m}repeat = 0\n"),
                "p.toml:7:10: expected repeat as a whole number, 1 or more",
            ),
            (
                format!("{HEAD}{m}time = 1979-05-27\n"),
                "p.toml:7:8: \"time\": expected a string, a number or a boolean",
            ),
            (
                format!("{HEAD}{m}msg_size = {{ a = 1 }}\n"),
                "p.toml:7:12: \"msg_size\": expected a string, a number or a boolean",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"d\"]\n"),
                "p.toml:6:16: unknown endpoint \"d\" ([endpoints] names b, c)",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = \"pps\"\ntarget = \"b\"\nprotocol = \"tcp\"\n"),
                "p.toml:7:12: protocol: pps is UDP only",
            ),
            (
                format!("{HEAD}{m}protocol = \"quic\"\n"),
                "p.toml:7:12: protocol: expected \"tcp\" or \"udp\", found \"quic\"",
            ),
            (
                format!("{HEAD}{m}time = []\n"),
                "p.toml:7:8: \"time\": an axis needs at least one value",
            ),
            (
                format!("{HEAD}{m}case = 1\n"),
                "p.toml:7:8: expected [[matrix.case]] tables: the axis values to match and the \
                 keys to set",
            ),
            (
                format!(
                    "{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
                     [[matrix.case]]\ntarget = \"x\"\n"
                ),
                "p.toml:8:10: unknown endpoint \"x\" ([endpoints] names b, c)",
            ),
            (
                format!(
                    "{HEAD}[endpoints.d]\n[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
                     [[matrix.case]]\ntime = 2\n"
                ),
                "p.toml:4:1: endpoint \"d\": expected \"HOST[:PORT]\" as a string",
            ),
            (
                format!(
                    "{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
                     [[matrix.case]]\ntime = 2\n"
                ),
                "p.toml:7:1: a [[matrix.case]] names the axis values of the cases it changes \
                 (e.g. target = \"b\"); this one names none",
            ),
            (
                format!(
                    "{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = \"b\"\ntime = [1, 2]\n\
                     [[matrix.case]]\ntime = 3\n"
                ),
                "p.toml:9:8: time = \"3\" matches no case: the axis time has \"1\", \"2\"",
            ),
            (
                format!(
                    "{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
                     [[matrix.case]]\ntarget = \"b\"\nrepeat = 2\n"
                ),
                "p.toml:9:1: \"repeat\" is the matrix's; a case override cannot set it",
            ),
            (
                format!(
                    "{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
                     [[matrix.case]]\ntarget = \"b\"\ntime = [1, 2]\n"
                ),
                "p.toml:9:8: \"time\": an override takes one value, not an axis",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = \"latency\"\ntime = 1\n"),
                "p.toml:4:1: this latency matrix has no target: add target = \"ENDPOINT\" (a \
                 name from [endpoints])",
            ),
            (
                format!("{HEAD}{m}msg_size = \"lots\"\n"),
                "p.toml:7:12: invalid value 'lots' for '--msg-size <SIZE>': `lots`: unknown \
                 size suffix `S` (use K, M or G) (as `sonde latency 198.18.0.2 --msg-size lots`)",
            ),
            (
                format!("{HEAD}{m}udp = true\ntcp = true\n"),
                "p.toml:7:7: the argument '--udp' cannot be used with '--tcp' (as `sonde \
                 latency 198.18.0.2 --udp --tcp`)",
            ),
            (
                format!("{HEAD}{m}histogram = \"yes\"\n"),
                "p.toml:7:13: \"histogram\" is a switch (--histogram): expected true or false",
            ),
            (
                format!("defaults = 1\n{HEAD}{m}"),
                "p.toml:1:12: expected a table: [defaults] KEY = VALUE",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = 5\n"),
                "p.toml:5:8: expected the test's name as a string",
            ),
            (
                format!("{HEAD}{m}[matrix.time]\nsecs = 1\n"),
                "p.toml:7:1: \"time\": expected a value, not a table",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = true\n"),
                "p.toml:6:10: \"target\": expected an endpoint's name",
            ),
            (
                m.to_owned(),
                "p.toml:3:10: unknown endpoint \"b\" (the plan has no [endpoints])",
            ),
            (
                format!(
                    "{HEAD}[[matrix]]\ntest = \"latency\"\ntarget = [\"b\", \"c\"]\n\
                     [[matrix.case]]\ntarget = \"b\"\ntest = \"pps\"\n"
                ),
                "p.toml:9:1: \"test\" is the matrix's; a case override cannot set it",
            ),
            (
                format!("{HEAD}[[matrix]]\ntest = \"crr\"\ntarget = \"b\"\nprotocol = \"udp\"\n"),
                "p.toml:7:12: protocol: crr is TCP only (a TCP connection per transaction)",
            ),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter_map(|(text, want)| {
                let got = err(text);
                (got != *want).then(|| format!("plan:\n{text}\ngot:  {got}\nwant: {want}\n"))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
