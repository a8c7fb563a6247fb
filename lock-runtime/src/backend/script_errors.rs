//! Errors raised inside the lock scripts, made to say what they mean.
//!
//! A command that a script runs and the Redis user's ACL forbids fails the
//! whole call with Redis 7.0's `ERR The user executing the script can't run
//! this command or subcommand script: <sha1>, on @user_script:<line>.`: a
//! plain `ERR`, which does not name the command. Every script's source and
//! SHA1 are known here, so the line names it: the error is rebuilt as a
//! permission error (`NOPERM`, so that its advice, its retries and every
//! caller treat it as one) that names the command and the rule to add.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::scripts;

/// What Redis 7.0 says when a script's command is refused by the ACL, and
/// what the user lacks then.
const REFUSALS: [(&str, Lacks); 4] = [
    (
        "The user executing the script can't run this command",
        Lacks::Command,
    ),
    (
        "The user executing the script can't access at least one of the keys",
        Lacks::Keys,
    ),
    (
        "The user executing the script can't publish to the channel",
        Lacks::Channel,
    ),
    (
        "The user executing the script is lacking the permissions",
        Lacks::Command,
    ),
];

#[derive(Clone, Copy)]
enum Lacks {
    Command,
    Keys,
    Channel,
}

/// `error`, rebuilt as a permission error naming the command when it is a
/// lock script's command refused by the ACL; otherwise unchanged.
pub(crate) fn explain(error: RedisError) -> RedisError {
    if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return error; // a NOPERM reply names its command
    }
    let text = error.to_string();
    let Some(lacks) = REFUSALS
        .iter()
        .find(|(said, _)| text.contains(said))
        .map(|(_, lacks)| *lacks)
    else {
        return error;
    };
    let place = where_in_script(&text);
    let command = place
        .as_ref()
        .map_or_else(String::new, |place| place.commands.join("` or `"));
    let at = place.as_ref().map_or_else(
        || "in a lock script".to_owned(),
        |place| format!("in {} line {}", place.file, place.line),
    );
    let detail = match lacks {
        Lacks::Command if !command.is_empty() => format!(
            "`{command}` ({at}) is refused: add `+{}` to the user's ACL rule (the minimal \
             rule in lock_runtime's guide, Configuration, lists every command the scripts run); Redis \
             said: {text}",
            place
                .as_ref()
                .map_or("", |place| place.commands[0].as_str())
        ),
        Lacks::Command => format!(
            "a command {at} is refused: compare the user's ACL rule with the minimal rule \
             in lock_runtime's guide (Configuration); Redis said: {text}"
        ),
        Lacks::Keys => format!(
            "`{command}` ({at}) may not touch the lock's keys: add the key pattern of the key \
             prefix to the user's ACL rule (`~lock:*` for the default prefix); Redis said: {text}"
        ),
        Lacks::Channel => format!(
            "`{command}` ({at}) may not publish to the waiters' channels: add the channel \
             pattern `&lock-waiters:*` to the user's ACL rule; Redis said: {text}"
        ),
    };
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::NoPerm),
        "the Redis user lacks a permission that a lock script needs",
        detail,
    ))
}

/// Where in a script an error happened.
struct Place {
    file: &'static str,
    line: usize,
    /// The commands the line runs (`redis.call('GET', ...)`), lowercase.
    commands: Vec<String>,
}

/// Reads `script: <sha1>, on @user_script:<line>` in Redis's error text
/// and finds the line in the script of that SHA1.
fn where_in_script(text: &str) -> Option<Place> {
    let sha_at = text.find("script: ")? + "script: ".len();
    let sha = text.get(sha_at..sha_at + 40)?;
    let line_at = text.find("@user_script:")? + "@user_script:".len();
    let line: usize = text[line_at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    let script = scripts::all()
        .into_iter()
        .find(|script| script.hash() == sha)?;
    let (file, line, source) = script.line(line)?;
    Some(Place {
        file,
        line,
        commands: commands(source),
    })
}

/// The commands a line of Lua runs: the first argument of each
/// `redis.call(...)` and `redis.pcall(...)`, lowercase.
fn commands(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("call(") {
        rest = &rest[at + "call(".len()..];
        let quoted = rest.trim_start();
        let Some(quote @ ('\'' | '"')) = quoted.chars().next() else {
            continue;
        };
        if let Some(end) = quoted[1..].find(quote) {
            found.push(quoted[1..1 + end].to_ascii_lowercase());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::scripts::RELEASE;

    fn refused(sha: &str, line: usize) -> RedisError {
        let reply = format!(
            "-ERR The user executing the script can't run this command or subcommand script: \
             {sha}, on @user_script:{line}.\r\n"
        );
        redis::parse_redis_value(reply.as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn the_commands_of_a_line_are_read() {
        assert_eq!(
            commands("  local held = redis.call('GET', KEYS[1]) redis.pcall(\"DEL\", x)"),
            ["get", "del"]
        );
        assert!(commands("-- no call here").is_empty());
    }

    #[test]
    fn a_refused_command_in_a_script_is_named() {
        // The line of release.lua that deletes the key.
        let line = (1..)
            .find(|&n| {
                RELEASE
                    .line(n)
                    .is_some_and(|(_, _, text)| text.contains("'DEL'"))
            })
            .unwrap();
        let error = explain(refused(RELEASE.hash(), line));
        assert_eq!(error.kind(), ErrorKind::Server(ServerErrorKind::NoPerm));
        let text = error.to_string();
        assert!(text.contains("`del`") && text.contains("`+del`"), "{text}");
        assert!(text.contains("release.lua line"), "{text}");
        assert!(!crate::backend::retryable(&error));
    }

    #[test]
    fn other_errors_are_left_alone() {
        let other = refused(&"0".repeat(40), 1);
        let explained = explain(other);
        // An unknown script: still a permission error, without the command.
        assert_eq!(explained.kind(), ErrorKind::Server(ServerErrorKind::NoPerm));
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::BrokenPipe).into();
        assert_eq!(explain(io).kind(), ErrorKind::Io);
    }
}
