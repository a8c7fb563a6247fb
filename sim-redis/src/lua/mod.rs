//! The Lua bridge: one Lua 5.1 state per node, set up as Redis 7.0 sets
//! its own (`prelude.lua`), the script cache (compiled functions by SHA1),
//! and the conversions between Redis replies and Lua values, rule for rule
//! as `script_lua.c` has them.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use mlua::{Function, Lua, MultiValue, StdLib, Table, Value as LuaValue};

use crate::number::format_double;
use crate::reply::Reply;

/// What a script's shebang line (`#!lua flags=...`) declares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScriptFlags {
    /// A shebang was given (otherwise: the compatibility mode of plain
    /// EVAL scripts).
    pub(crate) shebang: bool,
    pub(crate) no_writes: bool,
    pub(crate) allow_cross_slot: bool,
    pub(crate) no_cluster: bool,
    pub(crate) allow_stale: bool,
    pub(crate) allow_oom: bool,
}

impl ScriptFlags {
    /// Whether the script may touch keys of several slots (plain scripts
    /// may, as in Redis 7.0).
    pub(crate) fn cross_slot(&self) -> bool {
        !self.shebang || self.allow_cross_slot
    }

    /// Whether the script counts as a write command before it runs (a
    /// shebang without `no-writes`).
    pub(crate) fn declared_write(&self) -> bool {
        self.shebang && !self.no_writes
    }
}

/// Reads the shebang line; returns the flags and where the Lua code starts
/// (the line break is kept, so that line numbers stay those of the body).
pub(crate) fn shebang(body: &[u8]) -> Result<(ScriptFlags, usize), String> {
    let mut flags = ScriptFlags::default();
    if !body.starts_with(b"#!") {
        return Ok((flags, 0));
    }
    let Some(end) = body.iter().position(|&b| b == b'\n') else {
        return Err("ERR Invalid script shebang".to_owned());
    };
    let line = String::from_utf8_lossy(&body[..end]);
    let mut parts = line.split_ascii_whitespace();
    match parts.next() {
        Some("#!lua") => {}
        Some(engine) => return Err(format!("ERR Unexpected engine in script shebang: {engine}")),
        None => return Err("ERR Invalid engine in script shebang".to_owned()),
    }
    flags.shebang = true;
    for part in parts {
        let Some(list) = part.strip_prefix("flags=") else {
            return Err(format!("ERR Unknown lua shebang option: {part}"));
        };
        for flag in list.split(',').filter(|flag| !flag.is_empty()) {
            match flag {
                "no-writes" => flags.no_writes = true,
                "allow-oom" => flags.allow_oom = true,
                "allow-stale" => flags.allow_stale = true,
                "no-cluster" => flags.no_cluster = true,
                "allow-cross-slot-keys" => flags.allow_cross_slot = true,
                other => return Err(format!("ERR Unexpected flag in script shebang: {other}")),
            }
        }
    }
    Ok((flags, end))
}

/// The lowercase hex SHA1 of a script body (its name for `EVALSHA`).
pub(crate) fn sha1_hex(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

/// A cached script.
pub(crate) struct Script {
    function: Function,
    pub(crate) flags: ScriptFlags,
}

/// How a script's run ended.
pub(crate) enum Outcome {
    /// Its reply (an error reply included, if it returned one).
    Reply(Reply),
    /// It raised an error: the reply is that error, worded as Redis words
    /// it (`... script: <sha>, on @user_script:<line>.`).
    Failed(Reply),
}

/// One node's Lua state and script cache.
pub(crate) struct LuaEngine {
    lua: Lua,
    env: Table,
    run: Function,
    set_pending: Function,
    scripts: HashMap<String, Script>,
}

/// `redisLrand48`'s initial state.
const RAND48_INITIAL: u64 = 0x1234_ABCD_330E;

impl LuaEngine {
    pub(crate) fn new() -> LuaEngine {
        // SAFETY: the debug library is loaded for Redis's error handler
        // (which keeps it) and removed from the globals by the prelude.
        let lua = unsafe {
            Lua::unsafe_new_with(
                StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::DEBUG,
                mlua::LuaOptions::default(),
            )
        };
        let (env, run, set_pending) = Self::prelude(&lua).expect("the scripting prelude loads");
        LuaEngine {
            lua,
            env,
            run,
            set_pending,
            scripts: HashMap::new(),
        }
    }

    fn prelude(lua: &Lua) -> mlua::Result<(Table, Function, Function)> {
        let sha1 = lua.create_function(|lua, text: mlua::String| {
            lua.create_string(sha1_hex(&text.as_bytes()))
        })?;
        let state = Rc::new(Cell::new(RAND48_INITIAL));
        let rand_state = Rc::clone(&state);
        let random = lua.create_function(move |_, args: MultiValue| {
            let mut x = rand_state.get();
            x = (x.wrapping_mul(0x5_DEEC_E66D).wrapping_add(0xB)) & ((1 << 48) - 1);
            rand_state.set(x);
            let drawn = (x >> 17) as i64 % i64::from(i32::MAX);
            let r = drawn as f64 / f64::from(i32::MAX);
            let int_arg = |at: usize| -> mlua::Result<i64> {
                match args.get(at) {
                    Some(LuaValue::Integer(i)) => Ok(*i),
                    Some(LuaValue::Number(n)) => Ok(*n as i64),
                    _ => Err(mlua::Error::runtime(format!(
                        "bad argument #{} to 'random' (number expected)",
                        at + 1
                    ))),
                }
            };
            match args.len() {
                0 => Ok(r),
                1 => {
                    let u = int_arg(0)?;
                    if u < 1 {
                        return Err(mlua::Error::runtime(
                            "bad argument #1 to 'random' (interval is empty)",
                        ));
                    }
                    Ok((r * u as f64).floor() + 1.0)
                }
                2 => {
                    let (l, u) = (int_arg(0)?, int_arg(1)?);
                    if l > u {
                        return Err(mlua::Error::runtime(
                            "bad argument #2 to 'random' (interval is empty)",
                        ));
                    }
                    Ok((r * (u - l + 1) as f64).floor() + l as f64)
                }
                _ => Err(mlua::Error::runtime("wrong number of arguments")),
            }
        })?;
        let randomseed = lua.create_function(move |_, seed: i64| {
            let seed = seed as i32 as u32 as u64;
            state.set(((seed >> 16) << 32) | ((seed & 0xFFFF) << 16) | 0x330E);
            Ok(())
        })?;
        lua.load(include_str!("prelude.lua"))
            .set_name("=sim_redis")
            .call((sha1, random, randomseed))
    }

    /// Compiles and caches `body` unless cached: its SHA1, or Redis's
    /// error (a bad shebang, a syntax error).
    pub(crate) fn load(&mut self, body: &[u8]) -> Result<String, Reply> {
        let sha = sha1_hex(body);
        if self.scripts.contains_key(&sha) {
            return Ok(sha);
        }
        let (flags, start) = shebang(body).map_err(Reply::Error)?;
        let function = self
            .lua
            .load(&body[start..])
            .set_name("@user_script")
            .set_environment(self.env.clone())
            .into_function()
            .map_err(|error| {
                let message = match &error {
                    mlua::Error::SyntaxError { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                Reply::Error(format!(
                    "ERR Error compiling script (new function): {message}"
                ))
            })?;
        self.scripts.insert(sha.clone(), Script { function, flags });
        Ok(sha)
    }

    /// The cached script named `sha` (lowercase hex).
    pub(crate) fn script(&self, sha: &str) -> Option<&Script> {
        self.scripts.get(sha)
    }

    pub(crate) fn exists(&self, sha: &str) -> bool {
        self.scripts.contains_key(sha)
    }

    /// `SCRIPT FLUSH`: forgets every script.
    pub(crate) fn flush(&mut self) {
        self.scripts.clear();
        self.lua.gc_collect().ok();
    }

    /// Runs the cached script `sha` with KEYS and ARGV; each `redis.call`
    /// goes to `call` (arguments as Redis has them), whose reply the script
    /// reads.
    pub(crate) fn run(
        &self,
        sha: &str,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
        call: &mut dyn FnMut(Vec<Vec<u8>>) -> Reply,
    ) -> Outcome {
        let function = self.scripts[sha].function.clone();
        let call = std::cell::RefCell::new(call);
        let result = self.lua.scope(|scope| {
            // redis.call: an error reply is raised (through the prelude's
            // `pending`, as a table); redis.pcall: returned.
            let raising = scope.create_function(|lua, args: MultiValue| {
                let (value, failed) = bridge(lua, &args, &mut **call.borrow_mut())?;
                if failed {
                    self.set_pending.call::<()>(value)?;
                    return Err(mlua::Error::runtime("redis.call failed"));
                }
                Ok(value)
            })?;
            let returning = scope.create_function(|lua, args: MultiValue| {
                let (value, _) = bridge(lua, &args, &mut **call.borrow_mut())?;
                Ok(value)
            })?;
            let keys = strings_table(&self.lua, keys)?;
            let argv = strings_table(&self.lua, argv)?;
            let (ok, result): (bool, LuaValue) =
                self.run.call((function, keys, argv, raising, returning))?;
            if ok {
                Ok(Outcome::Reply(lua_to_reply(result, 0)))
            } else {
                Ok(Outcome::Failed(Reply::Error(failure_text(sha, &result))))
            }
        });
        result.unwrap_or_else(|error: mlua::Error| {
            Outcome::Failed(Reply::Error(format!(
                "ERR Error running script {sha}, {}",
                error.to_string().chars().take(100).collect::<String>()
            )))
        })
    }
}

/// One `redis.call`/`redis.pcall`: the arguments converted, the command
/// run by `call`, its reply converted; and whether it is an error.
fn bridge(
    lua: &Lua,
    args: &MultiValue,
    call: &mut dyn FnMut(Vec<Vec<u8>>) -> Reply,
) -> mlua::Result<(LuaValue, bool)> {
    let args = match command_args(args) {
        Ok(args) => args,
        Err(message) => return Ok((error_table(lua, message)?, true)),
    };
    let reply = call(args).into_resp2();
    let failed = reply.is_error();
    Ok((reply_to_lua(lua, reply)?, failed))
}

/// A Lua array of strings (KEYS, ARGV).
fn strings_table(lua: &Lua, items: &[Vec<u8>]) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(items.len(), 0)?;
    for (i, item) in items.iter().enumerate() {
        table.raw_seti(i + 1, lua.create_string(item)?)?;
    }
    Ok(table)
}

/// The arguments of `redis.call`: strings as they are, numbers as
/// `%.17g` writes them (Redis 7.0), anything else refused.
fn command_args(args: &MultiValue) -> Result<Vec<Vec<u8>>, &'static str> {
    if args.is_empty() {
        return Err("Please specify at least one argument for this redis lib call");
    }
    args.iter()
        .map(|arg| match arg {
            LuaValue::String(s) => Ok(s.as_bytes().to_vec()),
            LuaValue::Integer(i) => Ok(format_double(*i as f64).into_bytes()),
            LuaValue::Number(n) => Ok(format_double(*n).into_bytes()),
            _ => Err("Lua redis lib command arguments must be strings or integers"),
        })
        .collect()
}

/// `{err = "ERR <message>"}`.
fn error_table(lua: &Lua, message: &str) -> mlua::Result<LuaValue> {
    let table = lua.create_table()?;
    table.raw_set("err", format!("ERR {message}"))?;
    Ok(LuaValue::Table(table))
}

/// A reply (in RESP2 terms) as the script reads it: integers as numbers,
/// bulk strings as strings, nil as `false`, arrays as tables, a status as
/// `{ok=...}`, an error as `{err=...}`.
fn reply_to_lua(lua: &Lua, reply: Reply) -> mlua::Result<LuaValue> {
    Ok(match reply {
        Reply::Int(i) => LuaValue::Number(i as f64),
        Reply::Bulk(bytes) => LuaValue::String(lua.create_string(bytes)?),
        Reply::Nil | Reply::NilArray => LuaValue::Boolean(false),
        Reply::Ok => {
            let table = lua.create_table()?;
            table.raw_set("ok", "OK")?;
            LuaValue::Table(table)
        }
        Reply::Status(text) => {
            let table = lua.create_table()?;
            table.raw_set("ok", text)?;
            LuaValue::Table(table)
        }
        Reply::Error(text) => {
            // as luaPushErrorBuff splits `-CODE msg`
            let text = match text.split_once(' ') {
                Some((code, msg)) => format!("{code} {}", msg.trim_matches(['\r', '\n'])),
                None => format!("ERR {text}"),
            };
            let table = lua.create_table()?;
            table.raw_set("err", text)?;
            LuaValue::Table(table)
        }
        Reply::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                table.raw_seti(i + 1, reply_to_lua(lua, item)?)?;
            }
            LuaValue::Table(table)
        }
        other => reply_to_lua(lua, other.into_resp2())?,
    })
}

/// A script's result as Redis replies with it (`luaReplyToRedisReply`):
/// a number truncated to an integer, `true` as 1, `false` and nil as nil,
/// a table with a string `err` as an error, with a string `ok` as a status,
/// with a number `double` as a double, otherwise as an array up to its
/// first nil.
fn lua_to_reply(value: LuaValue, depth: usize) -> Reply {
    if depth > 1000 {
        return Reply::err("ERR reached lua stack limit");
    }
    match value {
        LuaValue::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        LuaValue::Boolean(true) => Reply::Int(1),
        LuaValue::Boolean(false) => Reply::Nil,
        LuaValue::Integer(i) => Reply::Int(i),
        LuaValue::Number(n) => Reply::Int(truncate(n)),
        LuaValue::Table(table) => {
            if let Ok(LuaValue::String(err)) = table.raw_get::<LuaValue>("err") {
                let text = String::from_utf8_lossy(&err.as_bytes()).into_owned();
                return Reply::Error(text);
            }
            if let Ok(LuaValue::String(ok)) = table.raw_get::<LuaValue>("ok") {
                let text = String::from_utf8_lossy(&ok.as_bytes()).replace(['\r', '\n'], " ");
                return if text == "OK" {
                    Reply::Ok
                } else {
                    Reply::Status(text)
                };
            }
            if let Ok(number @ (LuaValue::Number(_) | LuaValue::Integer(_))) =
                table.raw_get::<LuaValue>("double")
            {
                let d = match number {
                    LuaValue::Integer(i) => i as f64,
                    LuaValue::Number(n) => n,
                    _ => 0.0,
                };
                return Reply::Double(d);
            }
            if let Ok(LuaValue::Table(map)) = table.raw_get::<LuaValue>("map") {
                let mut pairs = Vec::new();
                for (k, v) in map.pairs::<LuaValue, LuaValue>().flatten() {
                    pairs.push((lua_to_reply(k, depth + 1), lua_to_reply(v, depth + 1)));
                }
                return Reply::Map(pairs);
            }
            let mut items = Vec::new();
            for i in 1.. {
                match table.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(item) => items.push(lua_to_reply(item, depth + 1)),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Nil,
    }
}

/// C's `(long long)` cast of a double, as x86-64 does it: toward zero,
/// and the "integer indefinite" value (`i64::MIN`) for NaN and numbers out
/// of range (a script returning `1e20` replies with it).
fn truncate(n: f64) -> i64 {
    if n.is_nan() || !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

/// The error of a failed script: its message, and where
/// (`script: <sha>, on @user_script:<line>.`).
fn failure_text(sha: &str, error: &LuaValue) -> String {
    let LuaValue::Table(table) = error else {
        return format!("ERR Error running script {sha}, execution failure");
    };
    let field = |name: &str| -> Option<String> {
        match table.raw_get::<LuaValue>(name).ok()? {
            LuaValue::String(s) => Some(String::from_utf8_lossy(&s.as_bytes()).into_owned()),
            LuaValue::Integer(i) => Some(i.to_string()),
            LuaValue::Number(n) => Some(format_double(n)),
            _ => None,
        }
    };
    let message = field("err").unwrap_or_else(|| "(null)".to_owned());
    match (field("source"), field("line")) {
        (Some(source), Some(line)) => format!("{message} script: {sha}, on {source}:{line}."),
        _ => message,
    }
}
