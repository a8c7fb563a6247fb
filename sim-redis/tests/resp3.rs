//! The shapes of RESP3 replies (what a connection that sent `HELLO 3`
//! reads: the client's cluster notifications use one), compared with a
//! real redis-server 7.0 command by command. (Subscription pushes are
//! checked in `model.rs`: the `redis` crate's blocking connection does
//! not read them as replies.)

use redis::Value;
use sim_redis::{Node, NodeConfig};
use test_support::RedisServer;

fn real_call(connection: &mut redis::Connection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    match cmd.query::<Value>(connection) {
        Ok(value) => value,
        Err(error) => redis::parse_redis_value(
            format!(
                "-{} {}\r\n",
                error.code().unwrap_or("?"),
                error.detail().unwrap_or("")
            )
            .as_bytes(),
        )
        .expect("an error reply parses"),
    }
}

#[test]
fn resp3_replies_have_the_shapes_of_redis_7_0() {
    let server = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/?protocol=resp3", server.port());
    let mut real = redis::Client::open(url)
        .expect("a URL")
        .get_connection()
        .expect("a RESP3 connection");
    let mut node = Node::new(NodeConfig::new("127.0.0.1", server.port()));
    let conn = node.connect();
    let hello = node.execute(conn, &["HELLO", "3"], 0).reply;
    let Value::Map(fields) = hello else {
        panic!("HELLO 3: {hello:?}")
    };
    assert!(fields.contains(&(Value::BulkString(b"proto".to_vec()), Value::Int(3))));
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64
    };
    let commands: &[&[&str]] = &[
        &["FLUSHALL"],
        &["HSET", "h", "f1", "a", "f2", "b"],
        &["HGETALL", "h"],
        &["HGETALL", "missing"],
        &["ZADD", "z", "1.5", "m1", "0.1", "m2", "+inf", "m3"],
        &["ZSCORE", "z", "m1"],
        &["ZSCORE", "z", "m3"],
        &["ZSCORE", "z", "nobody"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &[
            "ZRANGE",
            "z",
            "(0",
            "+inf",
            "BYSCORE",
            "WITHSCORES",
            "LIMIT",
            "0",
            "2",
        ],
        &["ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES"],
        &["ZADD", "z", "INCR", "2", "m1"],
        &["ZADD", "z", "XX", "INCR", "2", "nobody"],
        &["GET", "missing"],
        &["LPOP", "missing", "2"],
        &["SET", "s", "v"],
        &["EVAL", "return {double=1.5}", "0"],
        &["EVAL", "return {1, 'x', false, true, {ok='fine'}}", "0"],
        &["EVAL", "return redis.call('HGETALL', 'h')", "0"],
        &["EVAL", "return redis.call('ZSCORE', 'z', 'm1')", "0"],
        &["EVAL", "return false", "0"],
        &["EVAL", "return nil", "0"],
        &["PING"],
        &["TYPE", "z"],
        &["SCAN", "0", "MATCH", "s", "COUNT", "100"],
        &["PUBLISH", "c1", "m"],
    ];
    for args in commands {
        let expected = real_call(&mut real, args);
        let got = node.execute(conn, args, now()).reply;
        assert_eq!(got, expected, "{args:?}");
    }
}
