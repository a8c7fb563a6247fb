//! Random steps over a small universe of keys, tokens and ttls: the
//! project's scripts with random arguments, and plain commands (well- and
//! ill-formed) on the same keys. Ttls are either short (gone before the
//! next step: the runner sleeps past them) or long (never reached), so
//! that the simulator and the real server, whose clocks differ by the
//! latency of a step, never disagree about what has expired.

/// A small seeded generator (SplitMix64): the same seed, the same steps.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }
}

/// A short ttl (ms): expired before the next step.
pub const SHORT_MS: u64 = 8;
/// A long ttl (ms): never reached during a run.
pub const LONG_MS: u64 = 600_000;

/// One step.
#[derive(Clone, Debug)]
pub enum Step {
    /// A command sent as it is.
    Command(Vec<String>),
    /// A project script: run by EVAL, or by EVALSHA (`by_sha`).
    Script {
        name: &'static str,
        keys: Vec<String>,
        argv: Vec<String>,
        by_sha: bool,
    },
    /// A whole `SCAN` iteration with this pattern, compared as a set.
    Scan(String),
}

const TAGS: [&str; 2] = ["{a}", "{b}"];
const TOKENS: [&str; 3] = ["t1", "t2", "t3"];
const CHANNELS: [&str; 3] = ["c1", "c2", "c{a}"];

/// Every key a step may touch (the state compared after each step).
pub fn universe() -> Vec<String> {
    let mut keys = Vec::new();
    for tag in TAGS {
        for suffix in [
            "",
            ":fence",
            ":queue",
            ":waiters",
            ":tickets",
            ":l2",
            ":l2:fence",
            ":l2:queue",
            ":l2:waiters",
            ":rw",
            ":rw:readers",
            ":rw:queue",
            ":rw:waiters",
            ":rw:fence",
            ":rw:tickets",
            ":sem",
            ":sem:queue",
            ":sem:waiters",
            ":sem:tickets",
            ":x",
            ":y",
            ":client",
        ] {
            keys.push(format!("fid:{tag}{suffix}"));
        }
    }
    keys
}

fn ttl(rng: &mut Rng) -> String {
    if rng.chance(12) { SHORT_MS } else { LONG_MS }.to_string()
}

fn bit(rng: &mut Rng) -> String {
    rng.below(2).to_string()
}

fn token(rng: &mut Rng) -> String {
    rng.pick(&TOKENS).to_owned()
}

fn channel(rng: &mut Rng) -> String {
    rng.pick(&CHANNELS).to_owned()
}

fn retention(rng: &mut Rng) -> String {
    if rng.chance(50) {
        "0".to_owned()
    } else {
        LONG_MS.to_string()
    }
}

/// A quorum attempt's value: `<token>|q<n>`.
fn attempt(rng: &mut Rng) -> String {
    format!("{}|q{}", token(rng), 1 + rng.below(2))
}

fn ticket(rng: &mut Rng) -> String {
    rng.pick(&["0", "0", "100", "200"]).to_owned()
}

fn not_after(rng: &mut Rng) -> String {
    rng.pick(&["0", "0", "0", "1", "99999999999999999"])
        .to_owned()
}

fn k(tag: &str, suffix: &str) -> String {
    format!("fid:{tag}{suffix}")
}

/// The keys and arguments of script `name`.
fn script_args(rng: &mut Rng, name: &'static str) -> (Vec<String>, Vec<String>) {
    let tag = rng.pick(&TAGS);
    let lock = |s: &str| k(tag, s);
    let exclusive = vec![lock(""), lock(":fence"), lock(":queue"), lock(":waiters")];
    let quorum = vec![lock(""), lock(":fence"), lock(":tickets"), lock(":waiters")];
    let rw = vec![
        lock(":rw"),
        lock(":rw:readers"),
        lock(":rw:queue"),
        lock(":rw:waiters"),
        lock(":rw:fence"),
    ];
    let sem = vec![lock(":sem"), lock(":sem:queue"), lock(":sem:waiters")];
    match name {
        "acquire" => {
            let t = token(rng);
            let member = format!("{}|{}", channel(rng), t);
            (
                exclusive,
                vec![
                    t,
                    ttl(rng),
                    retention(rng),
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    member,
                    bit(rng),
                ],
            )
        }
        "acquire_all" => {
            let mut keys = exclusive;
            if rng.chance(60) {
                keys.extend([
                    lock(":l2"),
                    lock(":l2:fence"),
                    lock(":l2:queue"),
                    lock(":l2:waiters"),
                ]);
            }
            let t = token(rng);
            let member = format!("{}|{}*", channel(rng), t);
            (
                keys,
                vec![
                    t,
                    ttl(rng),
                    retention(rng),
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    member,
                    bit(rng),
                ],
            )
        }
        "release" => {
            let held = if rng.chance(20) {
                format!("{}|{}|{}", token(rng), channel(rng), token(rng))
            } else {
                token(rng)
            };
            (vec![lock("")], vec![held])
        }
        "release_keeping" => (vec![lock("")], vec![token(rng), ttl(rng)]),
        "leave" => (
            vec![lock(""), lock(":queue"), lock(":waiters")],
            vec![format!("{}|{}", channel(rng), token(rng))],
        ),
        "renew" => {
            let mut keys = vec![lock("")];
            let mut argv = vec![ttl(rng), token(rng)];
            if rng.chance(40) {
                keys.push(lock(":l2"));
                argv.extend([ttl(rng), token(rng)]);
            }
            (keys, argv)
        }
        "renew_any_slot" => {
            let mut argv = vec!["2".to_owned(), lock(""), lock(":l2")];
            argv.extend([ttl(rng), token(rng), ttl(rng), token(rng)]);
            (vec![lock("")], argv)
        }
        "fence_raise" => (
            vec![lock(":fence")],
            vec![
                rng.pick(&["5", "1700000000000000", "99999999999999"])
                    .to_owned(),
                LONG_MS.to_string(),
            ],
        ),
        "handoff" => (
            vec![lock(""), lock(":fence")],
            vec![token(rng), token(rng), ttl(rng), retention(rng)],
        ),
        "quorum_acquire" => {
            let entry = format!("{}|{}", channel(rng), token(rng));
            (
                quorum,
                vec![
                    attempt(rng),
                    ttl(rng),
                    retention(rng),
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    entry,
                    bit(rng),
                    ticket(rng),
                    not_after(rng),
                ],
            )
        }
        "quorum_release" => {
            let own = if rng.chance(50) {
                String::new()
            } else {
                format!("{}|{}", channel(rng), token(rng))
            };
            let value = if rng.chance(50) {
                token(rng)
            } else {
                attempt(rng)
            };
            (quorum, vec![value, own])
        }
        "quorum_leave" => (quorum, vec![format!("{}|{}", channel(rng), token(rng))]),
        "quorum_rw_acquire" => {
            let mode = rng.pick(&["r", "w"]).to_owned();
            let entry = format!("{mode}|{}|{}", channel(rng), token(rng));
            (
                vec![
                    lock(":rw"),
                    lock(":rw:fence"),
                    lock(":rw:tickets"),
                    lock(":rw:waiters"),
                    lock(":rw:readers"),
                ],
                vec![
                    attempt(rng),
                    ttl(rng),
                    retention(rng),
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    entry,
                    bit(rng),
                    ticket(rng),
                    not_after(rng),
                    mode,
                ],
            )
        }
        "quorum_semaphore_acquire" => {
            let n = 2 + rng.below(2);
            let k = 1 + rng.below(2);
            let first = rng.below(n);
            let slots: Vec<String> = (0..k).map(|i| ((first + i) % n).to_string()).collect();
            let value = format!("{}|s{}", attempt(rng), slots.join(","));
            let entry = format!("{k}|{}|{}", channel(rng), token(rng));
            (
                vec![
                    lock(":sem"),
                    lock(":sem:fence"),
                    lock(":sem:tickets"),
                    lock(":sem:waiters"),
                ],
                vec![
                    value,
                    ttl(rng),
                    "0".to_owned(),
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    entry,
                    bit(rng),
                    ticket(rng),
                    not_after(rng),
                    k.to_string(),
                    n.to_string(),
                ],
            )
        }
        "quorum_shared_release" | "quorum_shared_leave" => {
            let semaphore = rng.chance(40);
            let keys = if semaphore {
                vec![
                    lock(":sem"),
                    lock(":sem:fence"),
                    lock(":sem:tickets"),
                    lock(":sem:waiters"),
                    lock(":sem"),
                ]
            } else {
                vec![
                    lock(":rw"),
                    lock(":rw:fence"),
                    lock(":rw:tickets"),
                    lock(":rw:waiters"),
                    lock(":rw:readers"),
                ]
            };
            let mode = if semaphore {
                (1 + rng.below(2)).to_string()
            } else {
                rng.pick(&["r", "w"]).to_owned()
            };
            let entry = format!("{mode}|{}|{}", channel(rng), token(rng));
            if name == "quorum_shared_leave" {
                (keys, vec![entry])
            } else {
                let value = if semaphore {
                    format!("{mode}|{}|s0", attempt(rng))
                } else {
                    attempt(rng)
                };
                let own = if rng.chance(50) { String::new() } else { entry };
                (keys, vec![value, own, mode])
            }
        }
        "rw_acquire" => {
            let mode = rng.pick(&["r", "w"]).to_owned();
            let t = token(rng);
            let entry = format!("{mode}|{}|{t}", channel(rng));
            (
                rw,
                vec![
                    mode,
                    t,
                    ttl(rng),
                    retention(rng),
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    entry,
                    bit(rng),
                ],
            )
        }
        "rw_release" => {
            let mode = rng.pick(&["r", "w"]).to_owned();
            let keep = rng.pick(&["0", "0", "8", "600000"]).to_owned();
            (rw, vec![mode, token(rng), keep])
        }
        "rw_leave" => {
            let mode = rng.pick(&["r", "w"]);
            (rw, vec![format!("{mode}|{}|{}", channel(rng), token(rng))])
        }
        "semaphore_acquire" => {
            let kk = (1 + rng.below(2)).to_string();
            let n = (1 + rng.below(3)).to_string();
            let t = token(rng);
            let entry = format!("{kk}|{}|{t}", channel(rng));
            (
                sem,
                vec![
                    t,
                    ttl(rng),
                    kk,
                    n,
                    ttl(rng),
                    bit(rng),
                    bit(rng),
                    entry,
                    bit(rng),
                ],
            )
        }
        "semaphore_release" => (
            sem,
            vec![token(rng), (1 + rng.below(2)).to_string(), bit(rng)],
        ),
        "semaphore_leave" => {
            let kk = 1 + rng.below(2);
            (
                sem,
                vec![
                    format!("{kk}|{}|{}", channel(rng), token(rng)),
                    (1 + rng.below(3)).to_string(),
                    bit(rng),
                ],
            )
        }
        "renew_shares" | "renew_shares_any_slot" => {
            let mut keys = Vec::new();
            let mut argv = Vec::new();
            for _ in 0..1 + rng.below(2) {
                if rng.chance(50) {
                    keys.push(lock(":sem"));
                    argv.extend([
                        format!("{}|{}", 1 + rng.below(2), token(rng)),
                        ttl(rng),
                        "1".to_owned(),
                    ]);
                } else {
                    keys.extend([lock(":rw"), lock(":rw:readers")]);
                    let t = token(rng);
                    let member = if rng.chance(30) { format!("r:{t}") } else { t };
                    argv.extend([member, ttl(rng), "2".to_owned()]);
                }
            }
            if name == "renew_shares" {
                (keys, argv)
            } else {
                let mut all = vec![keys.len().to_string()];
                all.extend(keys.iter().cloned());
                all.extend(argv);
                (vec![keys[0].clone()], all)
            }
        }
        "inspect" => (
            vec![
                lock(""),
                lock(":fence"),
                lock(":waiters"),
                lock(":rw"),
                lock(":rw:readers"),
                lock(":rw:waiters"),
                lock(":rw:fence"),
                lock(":sem"),
                lock(":sem:waiters"),
            ],
            Vec::new(),
        ),
        "record" => {
            let n = rng.below(3);
            let mut argv = vec![ttl(rng), bit(rng), n.to_string()];
            for _ in 0..n {
                argv.push(format!("f{}", rng.below(4)));
                argv.push(token(rng));
            }
            for _ in 0..rng.below(2) {
                argv.push(format!("f{}", rng.below(4)));
            }
            (vec![lock(":client")], argv)
        }
        other => panic!("no arguments for script {other}"),
    }
}

/// A key for a plain command: mostly keys of their own, sometimes a
/// lock's (a script then meets a wrong type, or a state it did not make).
fn key(rng: &mut Rng) -> String {
    let tag = rng.pick(&TAGS);
    let suffix = if rng.chance(88) {
        rng.pick(&[":x", ":y"])
    } else {
        rng.pick(&[
            "",
            ":queue",
            ":waiters",
            ":rw:readers",
            ":fence",
            ":rw",
            ":sem",
        ])
    };
    k(tag, suffix)
}

fn value(rng: &mut Rng) -> String {
    rng.pick(&["v1", "v2", "", "12", "-3", "0.1", "1e3"])
        .to_owned()
}

fn number(rng: &mut Rng) -> String {
    rng.pick(&[
        "0",
        "1",
        "2",
        "-1",
        "-2",
        "3",
        "x",
        "01",
        "+1",
        "1.5",
        "9223372036854775808",
    ])
    .to_owned()
}

fn score(rng: &mut Rng) -> String {
    rng.pick(&[
        "0", "1", "1.5", "0.1", "-2", "+inf", "-inf", "1e3", "x", "nan", "(1", "3",
    ])
    .to_owned()
}

fn bound(rng: &mut Rng) -> String {
    rng.pick(&["-inf", "+inf", "0", "(0", "1", "(1.5", "2", "x", "(", "inf"])
        .to_owned()
}

fn words(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A plain command on the universe's keys.
fn command(rng: &mut Rng) -> Vec<String> {
    let key = key(rng);
    let mut c = match rng.below(40) {
        0 => words(&["GET"]),
        1..=4 => {
            let mut c = vec!["SET".to_owned(), key.clone(), value(rng)];
            for _ in 0..rng.below(4) {
                match rng.below(9) {
                    0 => c.push("NX".into()),
                    1 => c.push("XX".into()),
                    2 => c.push("GET".into()),
                    3 => c.push("KEEPTTL".into()),
                    4 => c.extend(["PX".into(), ttl(rng)]),
                    5 => c.extend(["EX".into(), rng.pick(&["600", "0", "-1", "x"]).to_owned()]),
                    6 => c.extend([
                        "PXAT".into(),
                        rng.pick(&["1", "99999999999999", "0"]).to_owned(),
                    ]),
                    7 => c.extend(["EXAT".into(), "99999999999".into()]),
                    _ => c.push(rng.pick(&["px", "nx", "BAD"]).to_owned()),
                }
            }
            return c;
        }
        5 => words(&["DEL"]),
        6 => return vec!["DEL".into(), key, self::key(rng)],
        7 => return vec!["EXISTS".into(), key.clone(), key, self::key(rng)],
        8 => words(&["TYPE"]),
        9 => words(&["PTTL"]),
        10 => words(&["TTL"]),
        11 => {
            let name = rng
                .pick(&["PEXPIRE", "EXPIRE", "PEXPIREAT", "EXPIREAT"])
                .to_owned();
            let when = match name.as_str() {
                "PEXPIRE" => ttl(rng),
                "EXPIRE" => rng.pick(&["600", "0", "-5", "x"]).to_owned(),
                "PEXPIREAT" => rng.pick(&["1", "99999999999999"]).to_owned(),
                _ => rng.pick(&["1", "99999999999"]).to_owned(),
            };
            let mut c = vec![name, key, when];
            if rng.chance(30) {
                c.push(rng.pick(&["NX", "XX", "GT", "LT", "ZZ"]).to_owned());
            }
            return c;
        }
        12 => words(&["PERSIST"]),
        13..=14 => {
            let mut c = vec![rng.pick(&["RPUSH", "LPUSH"]).to_owned(), key];
            for _ in 0..1 + rng.below(3) {
                c.push(rng.pick(&["e1", "e2", "e3"]).to_owned());
            }
            return c;
        }
        15 => {
            let mut c = vec![rng.pick(&["LPOP", "RPOP"]).to_owned(), key];
            if rng.chance(40) {
                c.push(number(rng));
            }
            return c;
        }
        16 => {
            return vec![
                "LREM".into(),
                key,
                number(rng),
                rng.pick(&["e1", "e2"]).to_owned(),
            ]
        }
        17 => return vec!["LINDEX".into(), key, number(rng)],
        18 => return vec!["LRANGE".into(), key, number(rng), number(rng)],
        19 => words(&["LLEN"]),
        20..=22 => {
            let mut c = vec!["ZADD".to_owned(), key];
            for _ in 0..rng.below(3) {
                c.push(rng.pick(&["NX", "XX", "CH", "INCR", "GT", "LT"]).to_owned());
            }
            for _ in 0..1 + rng.below(2) {
                c.push(score(rng));
                c.push(rng.pick(&["m1", "m2", "m3"]).to_owned());
            }
            return c;
        }
        23 => {
            return vec![
                "ZREM".into(),
                key,
                "m1".into(),
                rng.pick(&["m2", "m3"]).to_owned(),
            ]
        }
        24 => {
            let mut c = vec!["ZRANGE".to_owned(), key];
            if rng.chance(50) {
                c.extend([bound(rng), bound(rng), "BYSCORE".into()]);
                if rng.chance(40) {
                    c.extend(["LIMIT".into(), number(rng), number(rng)]);
                }
            } else {
                c.extend([number(rng), number(rng)]);
            }
            if rng.chance(30) {
                c.push("REV".into());
            }
            if rng.chance(50) {
                c.push("WITHSCORES".into());
            }
            return c;
        }
        25 => {
            let mut c = vec!["ZRANGEBYSCORE".to_owned(), key, bound(rng), bound(rng)];
            if rng.chance(50) {
                c.push("WITHSCORES".into());
            }
            return c;
        }
        26 => return vec!["ZSCORE".into(), key, rng.pick(&["m1", "m2"]).to_owned()],
        27 => return vec!["ZREMRANGEBYSCORE".into(), key, bound(rng), bound(rng)],
        28 => words(&["ZCARD"]),
        29 => return vec!["ZCOUNT".into(), key, bound(rng), bound(rng)],
        30..=31 => {
            let mut c = vec!["HSET".to_owned(), key];
            for _ in 0..1 + rng.below(2) {
                c.push(rng.pick(&["f1", "f2", "f3"]).to_owned());
                c.push(value(rng));
            }
            if rng.chance(10) {
                c.push("odd".into());
            }
            return c;
        }
        32 => {
            return vec![
                "HDEL".into(),
                key,
                rng.pick(&["f1", "f2"]).to_owned(),
                "f3".into(),
            ]
        }
        33 => words(&["HGETALL"]),
        34 => return vec!["HGET".into(), key, rng.pick(&["f1", "f2"]).to_owned()],
        35 => {
            // malformed
            return match rng.below(6) {
                0 => words(&["GET"]),
                1 => vec!["NOSUCH".into(), key, "arg".into()],
                2 => words(&["SET", "fid:{a}:x"]),
                3 => vec!["ZADD".into(), key, "1".into()],
                4 => words(&["EVALSHA", "0123456789012345678901234567890123456789", "0"]),
                _ => vec!["LPOP".into(), key, "1".into(), "2".into()],
            };
        }
        36 => {
            // The lone reader's plain SET, and the EXISTS beside it
            // (redis_backend/shared.rs).
            return if rng.chance(50) {
                vec![
                    "SET".into(),
                    k(rng.pick(&TAGS), ":rw"),
                    format!("r:{}", token(rng)),
                    "NX".into(),
                    "PX".into(),
                    ttl(rng),
                ]
            } else {
                vec!["EXISTS".into(), k(rng.pick(&TAGS), ":rw:queue")]
            };
        }
        37 => {
            return rng
                .pick(&[
                    &["PING"][..],
                    &["PING", "hello"],
                    &["ECHO", "x"],
                    &["SELECT", "0"],
                    &[
                        "SCRIPT",
                        "EXISTS",
                        "da39a3ee5e6b4b0d3255bfef95601890afd80709",
                    ],
                    &["PUBLISH", "c1", "hi"],
                    &["SPUBLISH", "c{a}", "hi"],
                ])
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
        }
        _ => return eval_snippet(rng),
    };
    c.push(key);
    c
}

/// A small ad-hoc script: the conversion rules and error wording.
fn eval_snippet(rng: &mut Rng) -> Vec<String> {
    let body = rng.pick(&[
        "return {1, 2.9, -3.7, 'x', false, true, {ok='fine'}, nil, 5}",
        "return redis.call('GET', KEYS[1])",
        "return redis.pcall('LPUSH', KEYS[1], 'e')",
        "return redis.call('ZADD', KEYS[1], 1.5, 'm1')",
        "return redis.call('ZSCORE', KEYS[1], 'm1')",
        "return redis.call('SET', KEYS[1], 0.1)",
        "return redis.call('SET', KEYS[1], 1e20)",
        "return redis.call('SET', KEYS[1], 12345678901234)",
        "return redis.call('HGETALL', KEYS[1])",
        "return redis.call('TYPE', KEYS[1])",
        "return {err='CUSTOM failure'}",
        "return redis.error_reply('MY bad')",
        "return redis.status_reply('FINE')",
        "local x = redis.call('GET', KEYS[1]) return x .. 'y'",
        "return #ARGV + #KEYS",
        "return tonumber(ARGV[1]) * 2",
        "return redis.call('EXPIRE', KEYS[1], ARGV[1])",
        "return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')",
        "return redis.sha1hex(ARGV[1])",
        "return pcall(function() error({err='E1'}) end)",
        "local ok, e = pcall(redis.call, 'LPUSH', KEYS[1]) return e",
        "y = 1",
        "return undefined_global",
        "return redis.call('SUBSCRIBE', 'c1')",
        "return redis.call('PING')",
        "return {redis.call('SCRIPT', 'EXISTS', 'x')}",
    ]);
    vec![
        "EVAL".into(),
        body.to_owned(),
        "1".into(),
        key(rng),
        rng.pick(&["3", "-2", "abc", "600"]).to_owned(),
    ]
}

/// The next step.
pub fn step(rng: &mut Rng, scripts: &[&'static str]) -> Step {
    let roll = rng.below(100);
    if roll < 55 {
        let name = scripts[rng.below(scripts.len())];
        let (keys, argv) = script_args(rng, name);
        Step::Script {
            name,
            keys,
            argv,
            by_sha: rng.chance(50),
        }
    } else if roll < 97 {
        Step::Command(command(rng))
    } else if roll < 99 {
        Step::Scan(
            rng.pick(&["fid:*", "fid:{a}*", "*:queue", "fid:{b}:?"])
                .to_owned(),
        )
    } else {
        Step::Command(words(&["SCRIPT", "FLUSH"]))
    }
}
