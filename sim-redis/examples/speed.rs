//! How fast the simulator runs the project's acquire and release scripts
//! (`cargo run --release -p sim-redis --example speed`).
use std::time::Instant;

use sim_redis::{Node, NodeConfig};

const LUA: &str = "../lock-runtime/src/backend/lua/";

fn read(file: &str) -> String {
    std::fs::read_to_string(format!("{}/{LUA}{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn main() {
    let acquire = ["publish.lua", "mark.lua", "prune.lua", "acquire.lua"]
        .map(read)
        .concat();
    let release = ["release.lua", "publish.lua", "release_wake.lua"]
        .map(read)
        .concat();
    let started = Instant::now();
    let nodes = 200;
    let mut calls = 0;
    for n in 0..nodes {
        let mut node = Node::new(NodeConfig::new("127.0.0.1", 7000 + n));
        let c = node.connect();
        for i in 0..100i64 {
            let t = 1_700_000_000_000_000 + i * 1000;
            let key = format!("lock:{{k{}}}", i % 7);
            let keys = [
                key.clone(),
                format!("{key}:fence"),
                format!("{key}:queue"),
                format!("{key}:waiters"),
            ];
            let mut args = vec!["EVAL".to_owned(), acquire.clone(), "4".into()];
            args.extend(keys);
            args.extend(["t1", "30000", "0", "30000", "1", "1", "c|t1", "0"].map(str::to_owned));
            node.execute(c, &args, t);
            node.execute(c, &["EVAL", &release, "1", &key, "t1"], t);
            calls += 2;
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{nodes} nodes, {calls} script calls in {elapsed:.2?}: {:.1} us a call (node creation and compiling included)",
        elapsed.as_secs_f64() * 1e6 / calls as f64
    );
}
