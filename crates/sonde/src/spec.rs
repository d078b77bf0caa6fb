//! The test subcommands, registered once each in [`TESTS`], and one typed test specification,
//! the parsed options of a test subcommand, with one way to run it. The command line builds it
//! with clap ([`TestCommand`], the registry's subcommands), a plan builds it with the same clap
//! definition from the plan's keys (`msg_size = 16384` is `--msg-size 16384`), and both run it
//! with [`run_once`] (the subcommands themselves with `runner::run`): a case in a plan means
//! exactly what the same flags mean. A new test subcommand is its module (an `Opt` that
//! implements `runner::Test`) and one line in [`TESTS`].

use std::any::TypeId;

use clap::{ArgMatches, Args, FromArgMatches};

use crate::exit::EXIT_CODES;
use crate::runner::Test;
use crate::save::Saver;
use crate::{crr, latency, load, mtu, pps, throughput};

/// The test subcommands, each registered here once: its name, its options (clap definition,
/// parser, and the rest through [`Test`]) and what a plan's `protocol = "tcp"` / `"udp"` means
/// for it (the flags, or why it cannot). The order is `sonde --help`'s.
static TESTS: &[Kind] = &[
    // latency's default is TCP against an agent but UDP against sockperf://: say which.
    Kind::of::<latency::Opt>("latency", Ok(&["--tcp"]), Ok(&["--udp"])),
    Kind::of::<throughput::Opt>("throughput", Ok(&[]), Ok(&["--udp"])),
    Kind::of::<pps::Opt>("pps", Err("pps is UDP only"), Ok(&[])),
    Kind::of::<crr::Opt>("crr", Ok(&[]), Err(CRR_IS_TCP)),
    Kind::of::<load::Opt>("load", Ok(&[]), Ok(&["--udp"])),
    Kind::of::<mtu::Opt>("mtu", Err(MTU_IS_UDP), Ok(&[])),
];

const MTU_IS_UDP: &str = "mtu probes with UDP (and reads TCP's MSS after)";
const CRR_IS_TCP: &str = "crr is TCP only (a TCP connection per transaction)";

/// The flags `protocol = "tcp"` or `"udp"` stands for, or why the test cannot take it.
type ProtocolFlags = Result<&'static [&'static str], &'static str>;

/// One registered test subcommand.
struct Kind {
    name: &'static str,
    options: fn() -> TypeId,
    augment: fn(clap::Command) -> clap::Command,
    parse: fn(&ArgMatches) -> Result<TestSpec, clap::Error>,
    tcp: ProtocolFlags,
    udp: ProtocolFlags,
}

impl Kind {
    /// The subcommand `name` with options `O`.
    const fn of<O: Test + Args + FromArgMatches + 'static>(
        name: &'static str,
        tcp: ProtocolFlags,
        udp: ProtocolFlags,
    ) -> Self {
        Self {
            name,
            options: TypeId::of::<O>,
            augment: O::augment_args,
            parse: parse_spec::<O>,
            tcp,
            udp,
        }
    }
}

fn parse_spec<O: Test + FromArgMatches + 'static>(m: &ArgMatches) -> Result<TestSpec, clap::Error> {
    Ok(TestSpec(Box::new(O::from_arg_matches(m)?)))
}

/// A test subcommand (one of [`TESTS`]).
#[derive(Clone, Copy)]
pub(crate) struct TestKind(&'static Kind);

impl PartialEq for TestKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for TestKind {}

impl std::fmt::Debug for TestKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

impl TestKind {
    /// Every test subcommand, in `sonde --help`'s order.
    pub(crate) fn all() -> impl Iterator<Item = Self> {
        TESTS.iter().map(Self)
    }

    /// The subcommand whose options are `O`.
    ///
    /// # Panics
    /// `O` is not registered in [`TESTS`] (a programming error).
    pub(crate) fn of<O: 'static>() -> Self {
        Self::all()
            .find(|k| (k.0.options)() == TypeId::of::<O>())
            .unwrap_or_else(|| unreachable!("{} is not in spec::TESTS", std::any::type_name::<O>()))
    }

    /// The subcommand's name.
    pub(crate) fn name(self) -> &'static str {
        self.0.name
    }

    /// The test named `name`.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::all().find(|k| k.name() == name)
    }

    /// The names of every test, as a sentence lists them: `latency, throughput, ... or load`.
    pub(crate) fn names() -> String {
        let names: Vec<&str> = Self::all().map(Self::name).collect();
        match names.split_last() {
            Some((end, [])) => (*end).to_owned(),
            Some((end, rest)) => format!("{} or {end}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// The subcommand's options as clap defines them (the same definition as `sonde NAME`).
    pub(crate) fn command(self) -> clap::Command {
        (self.0.augment)(clap::Command::new(self.name()))
    }

    /// Parses `args` (what follows `sonde NAME` on a command line) with the subcommand's own
    /// definition.
    pub(crate) fn parse(self, args: &[String]) -> Result<TestSpec, clap::Error> {
        (self.0.parse)(&self.matches(args)?)
    }

    /// Parses `args` with the subcommand's own definition into its options, `O`, for a caller
    /// that knows which test it runs (a mesh's scheduled test).
    pub(crate) fn parse_as<O: FromArgMatches>(self, args: &[String]) -> Result<O, clap::Error> {
        O::from_arg_matches(&self.matches(args)?)
    }

    fn matches(self, args: &[String]) -> Result<ArgMatches, clap::Error> {
        let argv = std::iter::once(self.name().to_owned()).chain(args.iter().cloned());
        self.command().try_get_matches_from(argv)
    }
}

/// A test, fully specified: the parsed options of a test subcommand.
#[derive(Debug)]
pub(crate) struct TestSpec(Box<dyn Test>);

impl TestSpec {
    /// The options, as the runner sees them.
    pub(crate) fn test(&self) -> &dyn Test {
        &*self.0
    }
}

/// One run of the test, printed and saved by `saver`: what each repetition of a subcommand
/// and each case of a plan does.
pub(crate) fn run_once(spec: &TestSpec, saver: &mut Saver) -> anyhow::Result<()> {
    spec.test().run_once(saver)
}

/// The test subcommands on `sonde`'s command line: `sonde NAME`, each with the exit codes in
/// its `--help`, parsed into its options.
#[derive(Debug)]
pub(crate) struct TestCommand(TestSpec);

impl TestCommand {
    /// The options, as the runner sees them.
    pub(crate) fn test(&self) -> &dyn Test {
        self.0.test()
    }
}

impl FromArgMatches for TestCommand {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let kind = m
            .subcommand()
            .and_then(|(name, sub)| Some((TestKind::from_name(name)?, sub)));
        let Some((kind, sub)) = kind else {
            return Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand));
        };
        (kind.0.parse)(sub).map(Self)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Subcommand for TestCommand {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        TestKind::all().fold(cmd, |cmd, kind| {
            cmd.subcommand(kind.command().after_help(EXIT_CODES))
        })
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        TestKind::from_name(name).is_some()
    }
}

/// The plan key that stands for the subcommand's positional `HOST[:PORT]`.
pub(crate) const TARGET_KEY: &str = "target";

/// The plan key for the protocol, turned into the subcommand's own flags (`-u`, `--tcp`).
pub(crate) const PROTOCOL_KEY: &str = "protocol";

/// The flags a plan case may not set, with what to do instead.
pub(crate) const NOT_IN_PLANS: &[(&str, &str)] = &[
    (
        "json",
        "a plan prints its matrix; `sonde plan run --json` prints it as JSON",
    ),
    (
        "csv",
        "a plan prints its matrix; read the cases back with `sonde results --csv`",
    ),
    (
        "json-stream",
        "a plan prints its matrix; `sonde plan run --json` prints it as JSON",
    ),
    ("db", "give the database to `sonde plan run --db`"),
    (
        "no-save",
        "a plan saves every case (that is how it resumes)",
    ),
    ("label", "a plan labels each case with its axis values"),
    ("pause", "a plan interleaves the cases' repetitions instead"),
    (
        "sweep",
        "make the parameter an axis instead: an array of values",
    ),
];

/// How a plan key reaches the subcommand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanKey {
    /// The key as a plan writes it: the long flag with `_` for `-` (`msg_size`).
    pub(crate) key: String,
    /// The long flag (`msg-size`); `None` for the positional target.
    pub(crate) long: Option<String>,
    /// A switch (`udp = true`), not a flag that takes a value.
    pub(crate) switch: bool,
    /// Given more than once (`--from A --from B`): an array is the list, an array of arrays an
    /// axis.
    pub(crate) multiple: bool,
}

/// The keys a plan case of `kind` takes: one per long flag of the subcommand (and its visible
/// aliases), `target` for `HOST[:PORT]`, less [`NOT_IN_PLANS`] and `repeat` (a plan key of its
/// own). `protocol` comes on top (see [`protocol_args`]).
pub(crate) fn plan_keys(kind: TestKind) -> Vec<PlanKey> {
    let cmd = kind.command();
    let mut keys = Vec::new();
    for arg in cmd.get_arguments() {
        let multiple = matches!(arg.get_action(), clap::ArgAction::Append);
        let switch = !arg.get_action().takes_values();
        if arg.is_positional() {
            keys.push(PlanKey {
                key: TARGET_KEY.to_owned(),
                long: None,
                switch,
                multiple,
            });
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        if long == "repeat" || long == "help" || NOT_IN_PLANS.iter().any(|(l, _)| *l == long) {
            continue;
        }
        let names = std::iter::once(long).chain(arg.get_visible_aliases().unwrap_or_default());
        for name in names {
            keys.push(PlanKey {
                key: name.replace('-', "_"),
                long: Some(name.to_owned()),
                switch,
                multiple,
            });
        }
    }
    keys
}

/// The flags that give `protocol = "tcp"` or `"udp"` its meaning for `kind`, or why that
/// test cannot take it.
pub(crate) fn protocol_args(kind: TestKind, value: &str) -> Result<Vec<String>, String> {
    let udp = match value {
        "tcp" => false,
        "udp" => true,
        _ => return Err(format!("expected \"tcp\" or \"udp\", found {value:?}")),
    };
    let flags = if udp { kind.0.udp } else { kind.0.tcp };
    flags
        .map(|f| f.iter().map(|&f| f.to_owned()).collect())
        .map_err(str::to_owned)
}

/// A plan key's value, as a flag takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyValue {
    /// A string or a number, as written.
    Text(String),
    /// `true` or `false`.
    Switch(bool),
    /// The values of a flag given more than once.
    Many(Vec<String>),
}

/// The arguments `key = value` stands for on the test's command line, for a key of `keys`
/// (the test's [`plan_keys`]) or [`PROTOCOL_KEY`]: `msg_size = 16384` is `--msg-size 16384`,
/// `udp = true` is `--udp` (and `false` nothing), a list is the flag once per value. What a
/// plan case and a mesh's scheduled test both go through. [`TARGET_KEY`] is the caller's
/// (the positional `HOST[:PORT]`).
pub(crate) fn key_args(
    kind: TestKind,
    keys: &[PlanKey],
    key: &str,
    value: &KeyValue,
) -> Result<Vec<String>, String> {
    if key == PROTOCOL_KEY {
        return match value {
            KeyValue::Text(v) => protocol_args(kind, v),
            _ => Err("expected \"tcp\" or \"udp\"".into()),
        };
    }
    let long = keys
        .iter()
        .find(|k| k.key == key)
        .and_then(|k| k.long.as_ref().map(|long| (k, long)));
    let Some((k, long)) = long else {
        return Err(format!(
            "{} has no --{}",
            kind.name(),
            key.replace('_', "-")
        ));
    };
    let flag = format!("--{long}");
    let mut args = Vec::new();
    match value {
        KeyValue::Switch(true) if k.switch => args.push(flag),
        KeyValue::Switch(false) if k.switch => {}
        KeyValue::Text(_) | KeyValue::Many(_) if k.switch => {
            return Err(format!(
                "\"{key}\" is a switch ({flag}): expected true or false"
            ));
        }
        KeyValue::Switch(b) => push_flag(&mut args, &flag, &b.to_string()),
        KeyValue::Text(v) => push_flag(&mut args, &flag, v),
        KeyValue::Many(list) => {
            for v in list {
                push_flag(&mut args, &flag, v);
            }
        }
    }
    Ok(args)
}

/// `--flag VALUE`, or `--flag=VALUE` when the value could pass for a flag.
fn push_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    if value.starts_with('-') {
        args.push(format!("{flag}={value}"));
    } else {
        args.push(flag.to_owned());
        args.push(value.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn kind(name: &str) -> TestKind {
        TestKind::from_name(name).expect("a test subcommand")
    }

    /// The keys each test takes in a plan, as the book documents them (docs/plans.md). A flag
    /// added to a subcommand fails this test until it is listed here (it then works in plans
    /// with no other change) or in `NOT_IN_PLANS`; a key listed here that is no flag fails it
    /// too.
    fn documented(kind: TestKind) -> Vec<&'static str> {
        const SHARED: &[&str] = &["target", "secret_file"];
        let own: &[&str] = match kind.name() {
            "latency" => &[
                "udp",
                "tcp",
                "msg_size",
                "time",
                "count",
                "warmup",
                "interval",
                "rate",
                "full_log",
                "histogram",
                "timestamps",
                "one_way",
                "from",
                "busy_poll",
                "cpu",
                "parallel",
                "depth",
                "response_size",
                "threads",
                "window",
                "tos",
                "dscp",
                "ecn",
                "congestion",
                "set_mss",
                "dont_fragment",
                "bind",
                "bind_dev",
                "cport",
                "ipv4",
                "ipv6",
            ],
            "throughput" => &[
                "udp",
                "parallel",
                "reverse",
                "bidir",
                "bitrate",
                "length",
                "read_size",
                "time",
                "omit",
                "skip_rx_copy",
                "bytes",
                "blockcount",
                "interval",
                "from",
                "cpu",
                "window",
                "tos",
                "dscp",
                "ecn",
                "congestion",
                "set_mss",
                "no_delay",
                "dont_fragment",
                "fq_rate",
                "zerocopy",
                "bind",
                "bind_dev",
                "cport",
                "ipv4",
                "ipv6",
            ],
            "pps" => &[
                "msg_size",
                "flows",
                "time",
                "omit",
                "interval",
                "gso",
                "from",
                "cpu",
                "window",
                "tos",
                "dscp",
                "ecn",
                "dont_fragment",
                "bind",
                "bind_dev",
                "cport",
                "ipv4",
                "ipv6",
            ],
            "crr" => &[
                "workers",
                "parallel",
                "msg_size",
                "response_size",
                "time",
                "rst",
                "timeout",
                "interval",
                "window",
                "tos",
                "dscp",
                "ecn",
                "congestion",
                "set_mss",
                "bind",
                "bind_dev",
                "ipv4",
                "ipv6",
            ],
            "load" => &[
                "udp",
                "msg_size",
                "rate",
                "time",
                "warmup",
                "ramp",
                "parallel",
                "reverse",
                "bidir",
                "length",
                "window",
                "tos",
                "dscp",
                "ecn",
                "congestion",
                "set_mss",
                "no_delay",
                "fq_rate",
                "bind",
                "bind_dev",
                "ipv4",
                "ipv6",
            ],
            "mtu" => &[
                "time",
                "tries",
                "max_probes",
                "no_tcp",
                "bind",
                "bind_dev",
                "ipv4",
                "ipv6",
            ],
            other => panic!("{other}: list its plan keys here"),
        };
        own.iter().chain(SHARED).copied().collect()
    }

    #[test]
    fn every_flag_is_a_plan_key_or_excluded() {
        for kind in TestKind::all() {
            let mut keys: Vec<String> = plan_keys(kind).into_iter().map(|k| k.key).collect();
            keys.sort();
            let mut want: Vec<String> = documented(kind).iter().map(|k| (*k).to_owned()).collect();
            want.sort();
            assert_eq!(keys, want, "plan keys of {}", kind.name());
            // The other direction: every long flag of the subcommand is a key or excluded.
            for arg in kind.command().get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let key = long.replace('-', "_");
                let excluded = long == "repeat" || NOT_IN_PLANS.iter().any(|(l, _)| *l == long);
                assert!(
                    excluded || keys.contains(&key),
                    "{} --{long} is neither a plan key nor excluded",
                    kind.name()
                );
            }
        }
    }

    #[test]
    fn exclusions_name_real_flags() {
        // An exclusion of a flag no test has any more is dead text.
        for (long, _) in NOT_IN_PLANS {
            assert!(
                TestKind::all().any(|k| k
                    .command()
                    .get_arguments()
                    .any(|a| a.get_long() == Some(long))),
                "--{long} is excluded from plans but no test has it"
            );
        }
    }

    #[test]
    fn keys_parse_as_the_flags_do() {
        let spec = kind("latency")
            .parse(&[
                "127.0.0.1:9".into(),
                "--udp".into(),
                "--msg-size".into(),
                "16K".into(),
                "--time".into(),
                "2s".into(),
            ])
            .expect("parses");
        assert_eq!(spec.test().expected(), Duration::from_secs(3));
        let err = kind("pps")
            .parse(&["h".into(), "--flows".into(), "many".into()])
            .expect_err("not a number");
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
    }

    /// A plan's latency case with `parallel`, `depth`, `response_size` and `threads` runs the
    /// many-flow test, as the flags do.
    #[test]
    fn many_flow_keys_reach_the_latency_options() {
        let spec = kind("latency")
            .parse(&[
                "127.0.0.1:9".into(),
                "--parallel".into(),
                "16".into(),
                "--depth".into(),
                "8".into(),
                "--response-size".into(),
                "1K".into(),
                "--threads".into(),
                "2".into(),
            ])
            .expect("parses");
        let opt = format!("{:?}", spec.test());
        for want in [
            "parallel: 16",
            "depth: 8",
            "response_size: Some(1024)",
            "threads: Some(2)",
        ] {
            assert!(opt.contains(want), "{want} not in {opt}");
        }
    }

    /// A plan case's (and a mesh's scheduled test's) socket options: the keys are the flags,
    /// and they reach the test's options as the flags do.
    #[test]
    fn socket_option_keys_reach_the_tests_options() {
        let k = kind("throughput");
        let keys = plan_keys(k);
        let mut args = vec!["127.0.0.1:9".to_owned()];
        for (key, value) in [
            ("window", KeyValue::Text("4M".into())),
            ("congestion", KeyValue::Text("reno".into())),
            ("set_mss", KeyValue::Text("1200".into())),
            ("no_delay", KeyValue::Switch(true)),
            ("dscp", KeyValue::Text("af41".into())),
            ("fq_rate", KeyValue::Text("100M".into())),
        ] {
            args.extend(key_args(k, &keys, key, &value).unwrap());
        }
        let opt: crate::throughput::Opt = k.parse_as(&args).unwrap();
        let socket = opt.options().socket;
        assert_eq!(socket.window_bytes, Some(4 << 20));
        assert_eq!(socket.congestion.as_deref(), Some("reno"));
        assert_eq!(socket.mss_bytes, Some(1_200));
        assert!(socket.no_delay);
        assert_eq!(socket.tos, Some(34 << 2));
        assert_eq!(socket.pacing_bits_per_second, Some(100_000_000));
        // A key the test does not take is refused, as its flag is.
        let pps = kind("pps");
        assert!(key_args(
            pps,
            &plan_keys(pps),
            "congestion",
            &KeyValue::Text("reno".into())
        )
        .unwrap_err()
        .contains("pps has no --congestion"));
    }

    #[test]
    fn protocol_maps_to_each_tests_flags() {
        assert_eq!(
            protocol_args(kind("latency"), "udp").unwrap(),
            vec!["--udp"]
        );
        assert_eq!(
            protocol_args(kind("latency"), "tcp").unwrap(),
            vec!["--tcp"]
        );
        assert!(protocol_args(kind("throughput"), "tcp").unwrap().is_empty());
        assert!(protocol_args(kind("pps"), "tcp").is_err());
        assert!(protocol_args(kind("crr"), "udp").is_err());
        assert!(protocol_args(kind("load"), "sctp").is_err());
    }
}
