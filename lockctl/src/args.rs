//! The command line: clap's builder API (no derive: no proc-macro crates).

use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command as Clap};
use lock_runtime::admin::LockKind;

/// Options every command takes.
pub struct Global {
    /// `--url`, else `REDIS_URL`.
    pub url: Option<String>,
    /// `--key-prefix` (the library's `Config::key_prefix`).
    pub key_prefix: Option<String>,
    /// `--timeout`: connect and response timeout each.
    pub timeout: Option<Duration>,
    /// `--json`: machine-readable output.
    pub json: bool,
}

pub enum Command {
    List {
        prefix: String,
    },
    Show {
        name: String,
    },
    Release {
        name: String,
        force: bool,
        yes: bool,
        kind: Option<LockKind>,
    },
    Watch {
        prefix: String,
        interval: Duration,
        count: Option<u64>,
    },
}

const ABOUT: &str = "Inspect and operate the Redis locks of lock-runtime (#[distributed_lock]).";

const AFTER: &str = "\
The Redis URL comes from --url or REDIS_URL: redis://[user:password@]host:port/db, \
rediss:// (TLS: lockctl built with its `tls-rustls` feature, `cargo install --path lockctl \
--features tls-rustls`), redis-cluster://host1:port1,host2:port2, \
redis-quorum://h1:p1,h2:p2,h3:p3 or redis-sentinel://s1:26379,s2:26379,s3:26379/mymaster. \
Passwords are never printed.

HOLDER is the head of the holder's token; INSTANCE, SINCE and FUNCTION come from the holder's \
record, which its process keeps in Redis while it holds locks (a hold from its first second on; \
a lock kept by hold_at_least while the key is kept): \"unknown (no record)\" means the lock was \
taken under a second ago, or its process may not write the record (ACL), or has not written it \
for a minute (it died or cannot reach Redis); `show` says which apply.

Exit codes: 0 done; 1 failed (Redis unreachable, bad URL, `show` of a lock that is not \
there, ...); 2 usage error (or release without --force); 3 nothing released (not held, the \
holder changed, or not confirmed).";

fn cli() -> Clap {
    let global = |arg: Arg| arg.global(true);
    Clap::new("lockctl")
        .about(ABOUT)
        .after_help(AFTER)
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(true)
        .arg_required_else_help(true)
        .arg(global(
            Arg::new("url")
                .long("url")
                .value_name("URL")
                .help("The Redis URL (default: the REDIS_URL environment variable)"),
        ))
        .arg(global(
            Arg::new("key-prefix")
                .long("key-prefix")
                .value_name("PREFIX")
                .help("The locks' key prefix, as given to Config::key_prefix [default: lock:]"),
        ))
        .arg(global(
            Arg::new("timeout")
                .long("timeout")
                .value_name("DURATION")
                .value_parser(parse_duration)
                .help("Connect and response timeout, each (e.g. 500ms, 2s) [default: 1s]"),
        ))
        .arg(global(
            Arg::new("json")
                .long("json")
                .action(ArgAction::SetTrue)
                .help("Print JSON instead of a table"),
        ))
        .subcommand(
            Clap::new("list")
                .about("List the locks whose name starts with PREFIX (all without it)")
                .arg(prefix_arg()),
        )
        .subcommand(
            Clap::new("show")
                .about(
                    "Show one lock: every holder's full token, ttl and record (instance, host, \
                     pid, function, since), waiters, fencing counter; exit 1 if it is not there",
                )
                .arg(name_arg("The lock's name, as its users give it (order:42)")),
        )
        .subcommand(
            Clap::new("release")
                .about(
                    "Release a lock on its holder's behalf (needs --force; asks for \
                     confirmation unless --yes)",
                )
                .arg(name_arg("The name of the lock to release (order:42)"))
                .arg(
                    Arg::new("force")
                        .long("force")
                        .action(ArgAction::SetTrue)
                        .help("Really take the lock from its holder"),
                )
                .arg(
                    Arg::new("yes")
                        .long("yes")
                        .short('y')
                        .action(ArgAction::SetTrue)
                        .help("Do not ask for confirmation"),
                )
                .arg(
                    Arg::new("kind")
                        .long("kind")
                        .value_name("KIND")
                        .value_parser(|text: &str| text.parse::<LockKind>().map_err(|e| e.to_string()))
                        .help("lock, rw or semaphore: which lock of NAME (needed when several are held)"),
                ),
        )
        .subcommand(
            Clap::new("watch")
                .about(
                    "List the locks again and again until Ctrl-C (with --json, one line per \
                     refresh, with its time)",
                )
                .arg(prefix_arg())
                .arg(
                    Arg::new("interval")
                        .long("interval")
                        .short('n')
                        .value_name("DURATION")
                        .value_parser(parse_duration)
                        .default_value("2s")
                        .help("Time between refreshes"),
                )
                .arg(
                    Arg::new("count")
                        .long("count")
                        .value_name("N")
                        .value_parser(clap::value_parser!(u64).range(1..))
                        .help("Stop after N refreshes"),
                ),
        )
}

/// The optional `PREFIX` of `list` and `watch`.
fn prefix_arg() -> Arg {
    Arg::new("prefix")
        .value_name("PREFIX")
        .default_value("")
        .hide_default_value(true)
        .help("Only the locks whose name starts with PREFIX (order: for order:42); all without it")
}

/// The `NAME` of `show` and `release`.
fn name_arg(help: &'static str) -> Arg {
    Arg::new("name")
        .value_name("NAME")
        .required(true)
        .help(help)
}

/// The command line, parsed; clap prints help or a usage error and exits
/// (code 2) itself.
pub fn parse() -> (Global, Command) {
    from(cli().get_matches())
}

fn from(matches: ArgMatches) -> (Global, Command) {
    let global = Global {
        url: matches.get_one::<String>("url").cloned(),
        key_prefix: matches.get_one::<String>("key-prefix").cloned(),
        timeout: matches.get_one::<Duration>("timeout").copied(),
        json: matches.get_flag("json"),
    };
    let text =
        |matches: &ArgMatches, id: &str| matches.get_one::<String>(id).cloned().unwrap_or_default();
    let command = match matches.subcommand() {
        Some(("list", sub)) => Command::List {
            prefix: text(sub, "prefix"),
        },
        Some(("show", sub)) => Command::Show {
            name: text(sub, "name"),
        },
        Some(("release", sub)) => Command::Release {
            name: text(sub, "name"),
            force: sub.get_flag("force"),
            yes: sub.get_flag("yes"),
            kind: sub.get_one::<LockKind>("kind").copied(),
        },
        Some(("watch", sub)) => Command::Watch {
            prefix: text(sub, "prefix"),
            interval: sub
                .get_one::<Duration>("interval")
                .copied()
                .unwrap_or(Duration::from_secs(2)),
            count: sub.get_one::<u64>("count").copied(),
        },
        // `subcommand_required`: clap never lets this through.
        _ => unreachable!("a subcommand is required"),
    };
    (global, command)
}

/// `500ms`, `2s`, `1.5s`, `1m`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: write e.g. 500ms, 2s or 1m"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" | "min" => number * 60.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use ms, s or m"
            ))
        }
    };
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        return Err(format!("`{text}` is out of range: give from 1 ms to a day"));
    }
    Ok(Duration::from_secs_f64(seconds).max(Duration::from_millis(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<(Global, Command), clap::Error> {
        cli().try_get_matches_from(args).map(from)
    }

    /// `lockctl <command> --help` explains every argument.
    #[test]
    fn every_argument_has_help() {
        let cli = cli();
        let mut checked = 0;
        for command in std::iter::once(&cli).chain(cli.get_subcommands()) {
            assert!(
                command.get_about().is_some() || command.get_name() == "lockctl",
                "{} has no about",
                command.get_name()
            );
            for arg in command.get_arguments() {
                assert!(
                    arg.get_help()
                        .is_some_and(|help| !help.to_string().is_empty()),
                    "`{}` of `{}` has no help",
                    arg.get_id(),
                    command.get_name()
                );
                checked += 1;
            }
        }
        assert!(checked >= 12, "{checked}");
    }

    #[test]
    fn reads_durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("2h").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn reads_every_command() {
        let (global, command) = parsed(&[
            "lockctl",
            "release",
            "a",
            "--force",
            "-y",
            "--url",
            "redis://h",
            "--kind",
            "rw",
        ])
        .unwrap();
        assert_eq!(global.url.as_deref(), Some("redis://h"));
        assert!(matches!(
            command,
            Command::Release {
                force: true,
                yes: true,
                kind: Some(LockKind::ReadWrite),
                ..
            }
        ));
        let (global, command) =
            parsed(&["lockctl", "--json", "watch", "order:", "--count", "2"]).unwrap();
        assert!(global.json);
        assert!(matches!(
            command,
            Command::Watch { count: Some(2), ref prefix, interval } if prefix == "order:" && interval == Duration::from_secs(2)
        ));
        assert!(
            matches!(parsed(&["lockctl", "list"]).unwrap().1, Command::List { ref prefix } if prefix.is_empty())
        );
        assert!(parsed(&["lockctl", "show"]).is_err());
        assert!(parsed(&["lockctl", "release", "a", "--kind", "mutex"]).is_err());
        assert!(parsed(&["lockctl", "watch", "--count", "0"]).is_err());
        assert!(parsed(&["lockctl"]).is_err());
    }
}
