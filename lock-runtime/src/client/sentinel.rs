//! Redis Sentinel's configuration: [`Config::sentinel`](super::Config::sentinel)
//! and the `redis-sentinel://` URL form.

use crate::redact::redact_url;

/// The port a sentinel listens on when none is given.
pub(super) const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The sentinels to ask, the master name, and how to log in to the data
/// nodes (the primary they name).
#[derive(Clone)]
pub(super) struct SentinelConfig {
    /// Each sentinel's URL: `redis://[user:password@]host:port/`
    /// (`rediss://` for TLS), with the credentials that sentinel wants.
    pub(super) sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub(super) master: String,
    /// The data nodes' user (`None`: `default`) and password (never shown).
    pub(super) primary_user: Option<String>,
    pub(super) primary_password: Option<String>,
    /// The database on the data nodes.
    pub(super) primary_db: i64,
    /// TLS to the data nodes (`None`: as to the sentinels).
    pub(super) primary_tls: Option<bool>,
    /// What is wrong with the URL this was read from, for `Client::new` to
    /// report (`Config::new` cannot fail).
    pub(super) invalid: Option<String>,
}

impl SentinelConfig {
    /// The sentinels `entries` (URLs, or `host[:port]`) watching `master`.
    pub(super) fn new<I, S>(entries: I, master: String) -> SentinelConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SentinelConfig {
            sentinels: entries
                .into_iter()
                .map(|entry| sentinel_url(&entry.into(), "redis", ""))
                .collect(),
            master,
            primary_user: None,
            primary_password: None,
            primary_db: 0,
            primary_tls: None,
            invalid: None,
        }
    }

    /// Whether the data nodes are reached over TLS: as asked, else as the
    /// first sentinel is.
    pub(super) fn primary_uses_tls(&self) -> bool {
        self.primary_tls.unwrap_or_else(|| {
            self.sentinels
                .first()
                .is_some_and(|url| url.to_ascii_lowercase().starts_with("rediss://"))
        })
    }

    /// The configuration in words, passwords masked: the sentinels, the
    /// master name and the data nodes' user.
    pub(super) fn redacted(&self) -> String {
        let sentinels: Vec<String> = self.sentinels.iter().map(|url| redact_url(url)).collect();
        let mut text = format!("sentinel `{}` via [{}]", self.master, sentinels.join(", "));
        match (&self.primary_user, &self.primary_password) {
            (Some(user), Some(_)) => text.push_str(&format!(", primary as {user}:***")),
            (Some(user), None) => text.push_str(&format!(", primary as {user}")),
            (None, Some(_)) => text.push_str(", primary with password ***"),
            (None, None) => {}
        }
        text
    }
}

/// The URL of a sentinel given as a URL or as `host[:port]`, with port
/// 26379 when it names none, and `userinfo` (`user:password@`, or empty)
/// when it has none of its own.
fn sentinel_url(entry: &str, scheme: &str, userinfo: &str) -> String {
    let entry = entry.trim();
    let (scheme, rest) = match entry.split_once("://") {
        Some((scheme, rest)) => (scheme.to_owned(), rest),
        None => (scheme.to_owned(), entry),
    };
    // `[user:password@]host[:port][/...]`: the port goes after the host.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (own_userinfo, host) = match authority.rsplit_once('@') {
        Some((own, host)) => (format!("{own}@"), host),
        None => (userinfo.to_owned(), authority),
    };
    let has_port = match host.rfind(']') {
        // `[::1]:26379`
        Some(bracket) => host[bracket..].contains(':'),
        None => host.contains(':'),
    };
    let port = if has_port {
        String::new()
    } else {
        format!(":{DEFAULT_SENTINEL_PORT}")
    };
    let tail = if tail.is_empty() { "/" } else { tail };
    format!("{scheme}://{own_userinfo}{host}{port}{tail}")
}

/// The parts of a `redis-sentinel://[user:password@]host1:port1,host2:port2/master[/db]`
/// URL (`rediss-sentinel://` for TLS to the sentinels and the data nodes):
/// the credentials log in to the data nodes; the query parameters
/// `sentinel_user` and `sentinel_password` to the sentinels. `None` for any
/// other URL.
pub(super) fn parse(url: &str) -> Option<SentinelConfig> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "redis-sentinel" => "redis",
        "rediss-sentinel" => "rediss",
        _ => return None,
    };
    let mut problems: Vec<String> = Vec::new();
    // The hosts end at the path (`/master`) or the query.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, query),
        None => (tail, ""),
    };
    let mut segments = path.trim_start_matches('/').split('/');
    let master = segments.next().unwrap_or_default().to_owned();
    let primary_db = match segments.next().filter(|db| !db.is_empty()) {
        None => 0,
        Some(db) => db.parse::<i64>().unwrap_or_else(|_| {
            problems.push(format!(
                "`{db}` after the master name is not a database number"
            ));
            0
        }),
    };
    if segments.next().is_some_and(|extra| !extra.is_empty()) {
        problems.push("the path holds more than the master name and a database".to_owned());
    }
    let (mut sentinel_user, mut sentinel_password) = (None, None);
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        match name {
            "sentinel_user" | "sentinel_username" => sentinel_user = Some(value.to_owned()),
            "sentinel_password" => sentinel_password = Some(value.to_owned()),
            other => problems.push(format!(
                "unknown parameter `{}` (known: sentinel_user, sentinel_password)",
                other.escape_debug()
            )),
        }
    }
    let sentinel_userinfo = match (&sentinel_user, &sentinel_password) {
        (None, None) => String::new(),
        (user, password) => format!(
            "{}:{}@",
            user.as_deref().unwrap_or_default(),
            password.as_deref().unwrap_or_default()
        ),
    };
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| sentinel_url(host, scheme, &sentinel_userinfo))
        .collect();
    // The data nodes' credentials, percent-decoded as in any Redis URL.
    let (mut primary_user, mut primary_password) = (None, None);
    if let Some(userinfo) = userinfo.filter(|userinfo| !userinfo.is_empty()) {
        match redis::Client::open(format!("redis://{userinfo}@localhost/")) {
            Ok(parsed) => {
                let settings = parsed.get_connection_info().redis_settings();
                primary_user = settings.username().map(str::to_owned);
                primary_password = settings.password().map(str::to_owned);
            }
            Err(_) => problems.push(
                "the user name or password cannot be read: percent-encode its `@`, `:`, `/`, \
                 `?` and `#`"
                    .to_owned(),
            ),
        }
    }
    Some(SentinelConfig {
        sentinels,
        master,
        primary_user,
        primary_password,
        primary_db,
        primary_tls: Some(scheme == "rediss"),
        invalid: (!problems.is_empty()).then(|| problems.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_url_form() {
        let config = parse(
            "redis-sentinel://locker:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/mymaster/2\
             ?sentinel_password=watch",
        )
        .unwrap();
        assert_eq!(
            config.sentinels,
            [
                "redis://:watch@10.0.0.1:26379/",
                "redis://:watch@10.0.0.2:26379/",
                "redis://:watch@[::1]:26380/",
            ]
        );
        assert_eq!(config.master, "mymaster");
        assert_eq!(config.primary_user.as_deref(), Some("locker"));
        assert_eq!(config.primary_password.as_deref(), Some("s@cret"));
        assert_eq!(config.primary_db, 2);
        assert!(!config.primary_uses_tls());
        assert!(config.invalid.is_none());

        let tls = parse("rediss-sentinel://s1:26379,s2:26379/cache").unwrap();
        assert_eq!(tls.sentinels, ["rediss://s1:26379/", "rediss://s2:26379/"]);
        assert!(tls.primary_uses_tls());
        assert_eq!(tls.primary_user, None);
        assert_eq!(tls.primary_password, None);

        assert!(parse("redis://h:6379/").is_none());
        assert!(parse("redis-cluster://h:6379,g:6379").is_none());
    }

    #[test]
    fn mistakes_in_the_url_are_kept_for_the_client_to_report() {
        let config = parse("redis-sentinel://h1,h2/mymaster/x?sentinel_pw=1").unwrap();
        let invalid = config.invalid.unwrap();
        assert!(invalid.contains("`x`"), "{invalid}");
        assert!(invalid.contains("`sentinel_pw`"), "{invalid}");
        let no_name = parse("redis-sentinel://h1,h2").unwrap();
        assert_eq!(no_name.master, "");
    }

    #[test]
    fn sentinels_given_apart_get_the_default_port() {
        let config = SentinelConfig::new(
            ["s1", "s2:26380", "rediss://:pw@s3", "redis://[::1]"],
            "m".to_owned(),
        );
        assert_eq!(
            config.sentinels,
            [
                "redis://s1:26379/",
                "redis://s2:26380/",
                "rediss://:pw@s3:26379/",
                "redis://[::1]:26379/",
            ]
        );
        assert!(!config.primary_uses_tls());
    }

    #[test]
    fn the_redacted_form_shows_no_password() {
        let mut config = parse(
            "redis-sentinel://locker:SECRET1@h1,h2/mymaster?sentinel_user=s&sentinel_password=SECRET2",
        )
        .unwrap();
        let shown = config.redacted();
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(
            shown.contains("mymaster") && shown.contains("h1:26379"),
            "{shown}"
        );
        assert!(shown.contains("locker:***"), "{shown}");
        config.primary_user = None;
        assert!(!config.redacted().contains("SECRET"));
    }
}
