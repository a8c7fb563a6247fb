//! Fidelity: random sequences of the project's scripts (random arguments
//! over a small universe of keys, tokens and ttls) and plain commands run
//! against the simulator and against a real redis-server 7.0; after each
//! step the replies and every key's state (type, value, members, scores,
//! ttl) must match. Time-dependent numbers (timestamps, fencing tokens,
//! ttls) are compared within a tolerance: the two clocks differ by the
//! latency of a step. `SCAN` iterations are compared as sets.
//!
//! A failure prints its seed; replay it with
//! `SIM_REDIS_SEED=<seed> SIM_REDIS_SEQUENCES=1 cargo test -p sim-redis --test fidelity`.
//! `SIM_REDIS_SEQUENCES` and `SIM_REDIS_STEPS` make a longer run.

mod compare;
mod generate;
mod scripts;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;
use sim_redis::{Node, NodeConfig};
use test_support::RedisServer;

use generate::{Rng, Step};

/// The sequences and steps of the test command's run.
const SEQUENCES: u64 = 24;
const STEPS: usize = 50;
/// The first seed of the test command's run.
const BASE_SEED: u64 = 0x5EED_0037;

/// Reads every key of the universe on either side: `{type, pttl,
/// content}` each (a script, so that the real server answers in one round
/// trip; the simulator runs the same script).
const DUMP: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key).ok
  local content = {}
  if t == 'string' then content = {redis.call('GET', key)}
  elseif t == 'list' then content = redis.call('LRANGE', key, 0, -1)
  elseif t == 'zset' then content = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  elseif t == 'hash' then content = redis.call('HGETALL', key) end
  out[i] = {t, redis.call('PTTL', key), content}
end
return out
";

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as i64
}

/// One command on the real server, its reply (an error reply as a value,
/// as the simulator gives it).
fn real_call(connection: &mut redis::Connection, args: &[String]) -> Value {
    let mut cmd = redis::cmd(&args[0]);
    for arg in &args[1..] {
        cmd.arg(arg.as_bytes());
    }
    match cmd.query::<Value>(connection) {
        Ok(value) => value,
        Err(error) => match (error.code(), error.detail()) {
            (Some(code), Some(detail)) => sim_error(&format!("{code} {detail}")),
            (Some(code), None) => sim_error(code),
            _ => panic!("the real server failed: {error}"),
        },
    }
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(error) if error.code() == "NOSCRIPT")
}

fn sim_error(text: &str) -> Value {
    redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("an error reply parses")
}

struct Run {
    /// Per step kind (a script's name, a command's): replies that were
    /// errors, and all replies.
    tally: std::collections::BTreeMap<String, (usize, usize)>,
    real: redis::Connection,
    node: Node,
    conn: sim_redis::ConnId,
    sources: Vec<(&'static str, String)>,
    universe: Vec<String>,
}

impl Run {
    /// Runs `args` on both sides: the simulator at the time the real call
    /// starts. Returns both replies, and how long the real call took.
    fn both(&mut self, args: &[String]) -> (Value, Value, i64, i64) {
        let start = now_us();
        let real = real_call(&mut self.real, args);
        let end = now_us();
        let sim = self.node.execute(self.conn, args, start).reply;
        (sim, real, start, end)
    }

    fn count(&mut self, kind: &str, reply: &Value) {
        let entry = self.tally.entry(kind.to_owned()).or_default();
        entry.0 += matches!(reply, Value::ServerError(_)) as usize;
        entry.1 += 1;
    }

    fn sha(source: &str) -> String {
        sha1_smol::Sha1::from(source).digest().to_string()
    }

    fn run_step(&mut self, step: &Step) -> Result<(i64, i64), String> {
        match step {
            Step::Command(args) => {
                let (sim, real, start, end) = self.both(args);
                self.count(&args[0].to_ascii_uppercase(), &real);
                let rounded = args[0].eq_ignore_ascii_case("ttl")
                    && matches!((&sim, &real), (Value::Int(a), Value::Int(b)) if *a >= 0 && *b >= 0 && (a - b).abs() <= 1);
                if !rounded {
                    // (TTL rounds to seconds: two readings a step's latency
                    // apart may round apart)
                    compare::replies(&sim, &real).map_err(|e| format!("{args:?}: {e}"))?;
                }
                Ok((start, end))
            }
            Step::Script {
                name,
                keys,
                argv,
                by_sha,
            } => {
                let source = self
                    .sources
                    .iter()
                    .find(|(n, _)| n == name)
                    .expect("a known script")
                    .1
                    .clone();
                let head = if *by_sha {
                    vec!["EVALSHA".to_owned(), Self::sha(&source)]
                } else {
                    vec!["EVAL".to_owned(), source.clone()]
                };
                let mut args = head;
                args.push(keys.len().to_string());
                args.extend(keys.iter().cloned());
                args.extend(argv.iter().cloned());
                let (mut sim, mut real, start, mut end) = self.both(&args);
                if *by_sha && is_noscript(&real) && is_noscript(&sim) {
                    // as the client does: the same call again as EVAL
                    args[0] = "EVAL".to_owned();
                    args[1] = source.clone();
                    (sim, real, _, end) = self.both(&args);
                }
                self.count(name, &real);
                compare::replies(&sim, &real).map_err(|e| {
                    format!("script {name} keys {keys:?} argv {argv:?} (by sha: {by_sha}): {e}")
                })?;
                Ok((start, end))
            }
            Step::Scan(pattern) => {
                let start = now_us();
                let real = scan_all(|args| real_call(&mut self.real, args), pattern);
                let end = now_us();
                let (node, conn) = (&mut self.node, self.conn);
                let sim = scan_all(|args| node.execute(conn, args, start).reply, pattern);
                if sim != real {
                    return Err(format!(
                        "SCAN MATCH {pattern}: simulator {sim:?}, real {real:?}"
                    ));
                }
                Ok((start, end))
            }
        }
    }

    /// Compares every key's state.
    fn compare_state(&mut self) -> Result<(), String> {
        let mut args = vec![
            "EVAL".to_owned(),
            DUMP.to_owned(),
            self.universe.len().to_string(),
        ];
        args.extend(self.universe.iter().cloned());
        let (sim, real, _, _) = self.both(&args);
        compare::states(&self.universe, &sim, &real)
    }

    /// When every short-lived thing a step made (a key's ttl, a deadline
    /// kept as a sorted set's score) is past on both sides: the real server
    /// ran the step at most `latency` after the simulator's time. Read from
    /// every entry of the simulator, expired or not, right after the step.
    fn short_times_over_us(&self, step_us: i64, latency_us: i64) -> Option<i64> {
        let step_ms = step_us / 1000;
        let horizon = step_ms + 10_000;
        let mut latest: Option<i64> = None;
        for (_, entry) in self.node.raw_entries(0) {
            let mut times = Vec::new();
            if let Some(expire) = entry.expire_ms {
                times.push(expire);
            }
            if let sim_redis::Data::ZSet(set) = &entry.data {
                times.extend(set.iter().map(|(_, score)| score as i64));
            }
            for time in times {
                if time >= step_ms - 1000 && time < horizon {
                    latest = Some(latest.map_or(time, |l: i64| l.max(time)));
                }
            }
        }
        latest.map(|latest| (latest + 1) * 1000 + latency_us + 3_000)
    }
}

/// A whole SCAN iteration: the keys found, sorted.
fn scan_all(mut call: impl FnMut(&[String]) -> Value, pattern: &str) -> Vec<Vec<u8>> {
    let mut cursor = "0".to_owned();
    let mut keys = Vec::new();
    for _ in 0..10_000 {
        let args = ["SCAN", &cursor, "MATCH", pattern, "COUNT", "3"].map(str::to_owned);
        let Value::Array(mut reply) = call(&args) else {
            panic!("SCAN answered with no array");
        };
        let found = reply.pop();
        let next = reply.pop();
        if let Some(Value::Array(found)) = found {
            for key in found {
                if let Value::BulkString(key) = key {
                    keys.push(key);
                }
            }
        }
        match next {
            Some(Value::BulkString(next)) => cursor = String::from_utf8_lossy(&next).into_owned(),
            other => panic!("SCAN answered with cursor {other:?}"),
        }
        if cursor == "0" {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// One sequence from `seed`, on a fresh simulator and an emptied server.
fn sequence(
    server: &RedisServer,
    seed: u64,
    steps: usize,
    tally: &mut std::collections::BTreeMap<String, (usize, usize)>,
) -> Result<usize, String> {
    let client = redis::Client::open(server.url()).expect("a URL");
    let mut real = client
        .get_connection()
        .expect("a connection to the real server");
    redis::cmd("FLUSHALL").exec(&mut real).expect("FLUSHALL");
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut real)
        .expect("SCRIPT FLUSH");
    let mut node = Node::new(NodeConfig::new("127.0.0.1", server.port()));
    let conn = node.connect();
    let sources: Vec<(&'static str, String)> = scripts::all()
        .into_iter()
        .map(|s| (s.name, s.source))
        .collect();
    let names: Vec<&'static str> = sources.iter().map(|(n, _)| *n).collect();
    let mut run = Run {
        tally: std::mem::take(tally),
        real,
        node,
        conn,
        sources,
        universe: generate::universe(),
    };
    let mut rng = Rng::new(seed);
    for i in 0..steps {
        let step = generate::step(&mut rng, &names);
        let (start, end) = run.run_step(&step).map_err(|e| format!("step {i}: {e}"))?;
        let over = run.short_times_over_us(start, end - start);
        run.compare_state()
            .map_err(|e| format!("after step {i} ({step:?}): {e}"))?;
        if let Some(over) = over {
            let wait = over - now_us();
            if wait > 0 {
                std::thread::sleep(Duration::from_micros(wait as u64));
            }
        }
    }
    *tally = run.tally;
    Ok(steps)
}

#[test]
fn the_simulator_answers_as_redis_7_0_does() {
    let server = RedisServer::start();
    let sequences = env("SIM_REDIS_SEQUENCES").unwrap_or(SEQUENCES);
    let steps = env("SIM_REDIS_STEPS").map_or(STEPS, |s| s as usize);
    let base = env("SIM_REDIS_SEED").unwrap_or(BASE_SEED);
    let started = Instant::now();
    let mut total = 0;
    let mut tally = std::collections::BTreeMap::new();
    for n in 0..sequences {
        let seed = base + n;
        match sequence(&server, seed, steps, &mut tally) {
            Ok(done) => total += done,
            Err(error) => panic!(
                "the simulator and redis-server differ, seed {seed}: {error}\n\
                 replay: SIM_REDIS_SEED={seed} SIM_REDIS_SEQUENCES=1 SIM_REDIS_STEPS={steps} \
                 cargo test -p sim-redis --test fidelity"
            ),
        }
    }
    eprintln!(
        "fidelity: {sequences} sequences, {total} steps in {:.1?}",
        started.elapsed()
    );
    if std::env::var_os("SIM_REDIS_TALLY").is_some() {
        for (kind, (errors, all)) in &tally {
            eprintln!("  {kind}: {all} runs, {errors} error replies");
        }
    }
}
