use sim_redis::{Node, NodeConfig};
fn main() {
    let mut node = Node::new(NodeConfig::new("127.0.0.1", 7000));
    let c = node.connect();
    let t = 1_700_000_000_000_000i64;
    for cmd in [
        vec!["SET", "a", "1", "PX", "100"],
        vec!["GET", "a"],
        vec!["PTTL", "a"],
        vec!["EVAL", "x = 1", "0"],
        vec!["EVAL", "return y", "0"],
        vec!["EVAL", "string.foo = 1", "0"],
        vec!["EVAL", "_G.x = 1", "0"],
        vec!["EVAL", "rawset(_G, 'x', 1)", "0"],
        vec!["EVAL", "return redis.call('nosuch')", "0"],
        vec!["EVAL", "return redis.call('get')", "0"],
        vec!["EVAL", "return redis.call('get', {})", "0"],
        vec!["EVAL", "return redis.pcall('get', 'a', 'b')", "0"],
        vec!["EVAL", "error('boom')", "0"],
        vec!["EVAL", "error({err='MY thing'})", "0"],
        vec!["EVAL", "return {1,2,nil,3}", "0"],
        vec!["EVAL", "return 3.9", "0"],
        vec!["EVAL", "return {err='oops'}", "0"],
        vec!["EVAL", "return redis.error_reply('x y')", "0"],
        vec!["EVAL", "return tostring(1e15+1)", "0"],
        vec!["EVAL", "return redis.call('set','a', 1e15+0.5)", "0"],
        vec!["GET", "a"],
        vec!["EVAL", "local x = ", "0"],
        vec!["EVALSHA", "abc", "0"],
        vec!["EVAL", "return redis.call('TIME')", "0"],
        vec![
            "EVAL",
            "return {redis.call('ZADD', KEYS[1], 0.1, 'm'), redis.call('ZSCORE', KEYS[1], 'm')}",
            "1",
            "z",
        ],
        vec![
            "EVAL",
            "return redis.call('SET', KEYS[1], 'v', 'PX', 5)",
            "1",
            "k",
        ],
        vec!["EVAL", "return pcall(redis.call, 'nosuch')", "0"],
        vec![
            "EVAL",
            "local ok, e = pcall(redis.call, 'nosuch') return e",
            "0",
        ],
        vec!["EVAL", "return redis.sha1hex('')", "0"],
        vec!["EVAL", "return math.random(100)", "0"],
        vec!["HGETALL", "nope"],
        vec!["CLIENT", "SETINFO", "LIB-NAME", "x"],
        vec!["HELLO", "3"],
        vec!["HGETALL", "nope"],
    ] {
        let e = node.execute(c, &cmd, t);
        println!("{:?} -> {:?}", cmd, e.reply);
    }
}
