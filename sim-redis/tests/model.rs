//! The simulator's own behaviour where no single real server can be
//! compared step by step: replication, `WAIT`, pub/sub deliveries, cluster
//! routing, Sentinel, clock skew and determinism. The expected values are
//! Redis 7.0's (its source and documentation).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use redis::{FromRedisValue, Value};
use sim_redis::{
    ClusterNode, ConnId, Executed, LinkState, MasterState, Node, NodeConfig, SentinelNode, Sync,
    Topology,
};

const T0: i64 = 1_700_000_000_000_000;

fn node(port: u16) -> Node {
    Node::new(NodeConfig::new("127.0.0.1", port))
}

fn run(node: &mut Node, conn: ConnId, args: &[&str], now: i64) -> Value {
    node.execute(conn, args, now).reply
}

fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

fn error_text(value: &Value) -> String {
    match value {
        Value::ServerError(error) => format!("{} {}", error.code(), error.details().unwrap_or("")),
        other => panic!("not an error: {other:?}"),
    }
}

/// A primary with one replica in step; returns (primary, replica, their
/// client connections).
fn pair() -> (Node, Node, ConnId, ConnId) {
    let mut primary = node(7000);
    let mut replica = node(7001);
    replica.become_replica_of("127.0.0.1", 7000);
    primary.attach_replica("127.0.0.1", 7001, 0);
    let sync = primary.psync(replica.replication_id(), replica.replication_offset());
    replica.apply_sync(sync, T0).unwrap();
    let (p, r) = (primary.connect(), replica.connect());
    (primary, replica, p, r)
}

/// Carries the primary's new entries to the replica and acknowledges them.
fn carry(primary: &mut Node, replica: &mut Node, now: i64) {
    for entry in primary.entries_since(replica.replication_offset()).unwrap() {
        replica.apply(&entry, now).unwrap();
    }
    primary.replica_acked("127.0.0.1", 7001, replica.replication_offset());
}

#[test]
fn writes_are_replicated_as_their_effects_with_absolute_times() {
    let (mut primary, mut replica, p, r) = pair();
    run(&mut primary, p, &["SET", "k", "v", "PX", "1000"], T0);
    run(&mut primary, p, &["PEXPIRE", "k", "5000"], T0);
    run(
        &mut primary,
        p,
        &[
            "EVAL",
            "redis.call('SET', KEYS[1], 'a') redis.call('RPUSH', KEYS[2], 'x') return 1",
            "2",
            "s",
            "l",
        ],
        T0,
    );
    let entries = primary.entries_since(0).unwrap();
    let texts: Vec<Vec<Vec<String>>> = entries
        .iter()
        .map(|e| {
            e.commands
                .iter()
                .map(|c| {
                    c.iter()
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect()
                })
                .collect()
        })
        .collect();
    let at = |ms: i64| (T0 / 1000 + ms).to_string();
    assert_eq!(
        texts,
        vec![
            vec![vec![
                "SET".to_owned(),
                "k".into(),
                "v".into(),
                "PXAT".into(),
                at(1000)
            ]],
            vec![vec!["PEXPIREAT".to_owned(), "k".into(), at(5000)]],
            // a script's effects, not the script, as one unit
            vec![
                vec!["SET".to_owned(), "s".into(), "a".into()],
                vec!["RPUSH".to_owned(), "l".into(), "x".into()]
            ],
        ]
    );
    // SELECT 0 comes first; the script's unit is wrapped in MULTI/EXEC
    assert_eq!(entries[0].start, 0);
    assert_eq!(entries[2].end - entries[2].start, 15 + 27 + 29 + 14);
    carry(&mut primary, &mut replica, T0);
    assert_eq!(run(&mut replica, r, &["GET", "s"], T0), bulk("a"));
    assert_eq!(run(&mut replica, r, &["PTTL", "k"], T0), Value::Int(5000));
    // a replica refuses writes, and scripts that write
    assert_eq!(
        error_text(&run(&mut replica, r, &["SET", "x", "1"], T0)),
        "READONLY You can't write against a read only replica."
    );
    let script = run(
        &mut replica,
        r,
        &["EVAL", "return redis.call('SET', 'x', 1)", "0"],
        T0,
    );
    assert!(error_text(&script)
        .starts_with("READONLY You can't write against a read only replica. script:"));
}

#[test]
fn expiry_is_the_primarys_and_reaches_replicas_as_del() {
    let (mut primary, mut replica, p, r) = pair();
    run(&mut primary, p, &["SET", "k", "v", "PX", "100"], T0);
    carry(&mut primary, &mut replica, T0);
    let later = T0 + 101_000;
    // the replica hides the expired key but keeps it
    assert_eq!(run(&mut replica, r, &["GET", "k"], later), Value::Nil);
    assert_eq!(replica.raw_entries(0).len(), 1);
    // the primary deletes it when it meets it, and tells its replica
    assert_eq!(run(&mut primary, p, &["EXISTS", "k"], later), Value::Int(0));
    let entries = primary.entries_since(replica.replication_offset()).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].commands,
        vec![vec![b"DEL".to_vec(), b"k".to_vec()]]
    );
    carry(&mut primary, &mut replica, later);
    assert!(replica.raw_entries(0).is_empty());
    // active expiry does the same for keys nobody reads
    run(&mut primary, p, &["SET", "j", "v", "PX", "10"], later);
    assert_eq!(primary.active_expire(later + 11_000), 1);
    assert_eq!(
        primary
            .entries_since(replica.replication_offset())
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn wait_blocks_until_replicas_acknowledge() {
    let (mut primary, mut replica, p, _) = pair();
    // nothing written on this connection: every replica acknowledged
    assert_eq!(
        run(&mut primary, p, &["WAIT", "1", "100"], T0),
        Value::Int(1)
    );
    run(&mut primary, p, &["SET", "k", "v"], T0);
    let executed = primary.execute(p, &["WAIT", "1", "100"], T0);
    let wait = executed.wait.expect("WAIT blocks");
    assert_eq!(wait.replicas, 1);
    assert_eq!(wait.timeout_ms, 100);
    assert!(!primary.wait_satisfied(&wait));
    // at its timeout the harness answers with the count so far
    assert_eq!(primary.wait_reply(&wait), Value::Int(0));
    carry(&mut primary, &mut replica, T0);
    assert!(primary.wait_satisfied(&wait));
    assert_eq!(primary.wait_reply(&wait), Value::Int(1));
    let c = replica.connect();
    assert!(error_text(&run(&mut replica, c, &["WAIT", "1", "0"], T0))
        .starts_with("ERR WAIT cannot be used with replica instances"));
}

#[test]
fn a_failover_loses_what_was_not_replicated() {
    let (mut primary, mut replica, p, r) = pair();
    run(&mut primary, p, &["SET", "a", "1"], T0);
    carry(&mut primary, &mut replica, T0);
    run(&mut primary, p, &["SET", "b", "2"], T0); // never carried
    replica.promote();
    assert!(!replica.is_replica());
    assert_eq!(run(&mut replica, r, &["GET", "a"], T0), bulk("1"));
    assert_eq!(run(&mut replica, r, &["GET", "b"], T0), Value::Nil);
    assert_eq!(run(&mut replica, r, &["SET", "c", "3"], T0), Value::Okay);
    // the old primary follows the new one: its history went further than
    // what the new one had of it, so it is resynchronised in full
    primary.become_replica_of("127.0.0.1", 7001);
    let sync = replica.psync(primary.replication_id(), primary.replication_offset());
    assert!(matches!(sync, Sync::Full(_)));
    primary.apply_sync(sync, T0).unwrap();
    assert_eq!(run(&mut primary, p, &["GET", "b"], T0), Value::Nil);
    assert_eq!(run(&mut primary, p, &["GET", "c"], T0), bulk("3"));
    let role: redis::Role =
        FromRedisValue::from_redis_value(run(&mut primary, p, &["ROLE"], T0)).unwrap();
    assert!(matches!(
        role,
        redis::Role::Replica {
            primary_port: 7001,
            ..
        }
    ));
}

#[test]
fn a_replica_in_step_continues_after_its_primarys_failover() {
    let mut a = node(7000);
    let mut b = node(7001);
    let mut c = node(7002);
    for (replica, port) in [(&mut b, 7001), (&mut c, 7002)] {
        replica.become_replica_of("127.0.0.1", 7000);
        a.attach_replica("127.0.0.1", port, 0);
        let sync = a.psync(replica.replication_id(), replica.replication_offset());
        replica.apply_sync(sync, T0).unwrap();
    }
    let conn = a.connect();
    run(&mut a, conn, &["SET", "k", "v"], T0);
    for replica in [&mut b, &mut c] {
        for entry in a.entries_since(replica.replication_offset()).unwrap() {
            replica.apply(&entry, T0).unwrap();
        }
    }
    b.promote();
    c.become_replica_of("127.0.0.1", 7001);
    let sync = b.psync(c.replication_id(), c.replication_offset());
    assert!(matches!(sync, Sync::Continue { .. }), "{sync:?}");
    c.apply_sync(sync, T0).unwrap();
    assert_eq!(c.replication_id(), b.replication_id());
    // an entry that does not continue the replica's stream is refused
    let bc = b.connect();
    run(&mut b, bc, &["SET", "x", "1"], T0);
    run(&mut b, bc, &["SET", "y", "1"], T0);
    let entries = b.entries_since(c.replication_offset()).unwrap();
    assert!(c.apply(&entries[1], T0).is_err());
}

#[test]
fn role_answers_as_redis_for_both_roles() {
    let (mut primary, mut replica, p, r) = pair();
    run(&mut primary, p, &["SET", "k", "v"], T0);
    carry(&mut primary, &mut replica, T0);
    let role: redis::Role =
        FromRedisValue::from_redis_value(run(&mut primary, p, &["ROLE"], T0)).unwrap();
    match role {
        redis::Role::Primary {
            replication_offset,
            replicas,
        } => {
            assert_eq!(replication_offset, primary.replication_offset());
            assert_eq!(replicas.len(), 1);
            assert_eq!(replicas[0].port, 7001);
            assert_eq!(replicas[0].replication_offset as u64, replication_offset);
        }
        other => panic!("{other:?}"),
    }
    let role: redis::Role =
        FromRedisValue::from_redis_value(run(&mut replica, r, &["ROLE"], T0)).unwrap();
    assert_eq!(
        role,
        redis::Role::Replica {
            primary_ip: "127.0.0.1".into(),
            primary_port: 7000,
            replication_state: "connected".into(),
            data_received: primary.replication_offset(),
        }
    );
    // while the link is down, the offset is -1, as in Redis
    replica.set_link_state(LinkState::Connect);
    let raw = run(&mut replica, r, &["ROLE"], T0);
    assert_eq!(
        raw,
        Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(7000),
            bulk("connect"),
            Value::Int(-1)
        ])
    );
}

#[test]
fn messages_reach_subscribers_in_their_protocol() {
    let mut n = node(7000);
    let (plain, resp3, publisher) = (n.connect(), n.connect(), n.connect());
    let executed = n.execute(plain, &["SUBSCRIBE", "c1", "c2"], T0);
    assert_eq!(
        executed.reply,
        Value::Array(vec![bulk("subscribe"), bulk("c1"), Value::Int(1)])
    );
    assert_eq!(
        executed.more_replies,
        vec![Value::Array(vec![
            bulk("subscribe"),
            bulk("c2"),
            Value::Int(2)
        ])]
    );
    // a RESP2 subscriber may only (un)subscribe and ping
    assert!(
        error_text(&run(&mut n, plain, &["GET", "k"], T0)).starts_with("ERR Can't execute 'get'")
    );
    assert_eq!(
        run(&mut n, plain, &["PING"], T0),
        Value::Array(vec![bulk("pong"), bulk("")])
    );
    run(&mut n, resp3, &["HELLO", "3"], T0);
    let confirmed = n.execute(resp3, &["SUBSCRIBE", "c1"], T0).reply;
    assert!(matches!(
        confirmed,
        Value::Push {
            kind: redis::PushKind::Subscribe,
            ..
        }
    ));
    let published = n.execute(publisher, &["PUBLISH", "c1", "hello"], T0);
    assert_eq!(published.reply, Value::Int(2));
    let to: Vec<(ConnId, Value)> = published
        .deliveries
        .iter()
        .map(|d| (d.conn, d.value.clone()))
        .collect();
    assert_eq!(
        to,
        vec![
            (
                plain,
                Value::Array(vec![bulk("message"), bulk("c1"), bulk("hello")])
            ),
            (
                resp3,
                Value::Push {
                    kind: redis::PushKind::Message,
                    data: vec![bulk("c1"), bulk("hello")]
                }
            ),
        ]
    );
    // from a script too, and to sharded subscribers
    let s = n.connect();
    n.execute(s, &["SSUBSCRIBE", "w:{a}"], T0);
    let executed = n.execute(
        publisher,
        &[
            "EVAL",
            "return redis.pcall('SPUBLISH', ARGV[1], 'x')",
            "0",
            "w:{a}",
        ],
        T0,
    );
    assert_eq!(executed.reply, Value::Int(1));
    assert_eq!(
        executed.deliveries[0].value,
        Value::Array(vec![bulk("smessage"), bulk("w:{a}"), bulk("x")])
    );
    n.disconnect(plain);
    assert_eq!(
        run(&mut n, publisher, &["PUBLISH", "c1", "again"], T0),
        Value::Int(1)
    );
}

#[test]
fn publishes_reach_replicas_subscribers_through_the_stream() {
    let (mut primary, mut replica, p, _) = pair();
    let listener = replica.connect();
    replica.execute(listener, &["SUBSCRIBE", "c1"], T0);
    run(&mut primary, p, &["PUBLISH", "c1", "m"], T0);
    let entry = primary
        .entries_since(replica.replication_offset())
        .unwrap()
        .remove(0);
    let deliveries = replica.apply(&entry, T0).unwrap();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].conn, listener);
}

fn cluster() -> (Rc<RefCell<Topology>>, Node, Node, Node) {
    let mut topology = Topology::new();
    for (id, port, of) in [
        ("a", 7000, None),
        ("b", 7001, None),
        ("a2", 7002, Some("a")),
    ] {
        topology.add_node(ClusterNode {
            id: id.repeat(40 / id.len()).chars().take(40).collect(),
            host: "127.0.0.1".into(),
            port,
            replica_of: of.map(|o: &str| o.repeat(40).chars().take(40).collect()),
        });
    }
    let id = |s: &str| -> String { s.repeat(40).chars().take(40).collect() };
    topology.assign(0, 8191, &id("a"));
    topology.assign(8192, 16383, &id("b"));
    let topology = topology.shared();
    let make = |port, name: &str| {
        Node::new(NodeConfig::new("127.0.0.1", port).with_cluster(Rc::clone(&topology), id(name)))
    };
    let a = make(7000, "a");
    let b = make(7001, "b");
    let mut a2 = Node::new(NodeConfig::new("127.0.0.1", 7002).with_cluster(
        Rc::clone(&topology),
        "a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2",
    ));
    a2.become_replica_of("127.0.0.1", 7000);
    (topology, a, b, a2)
}

#[test]
fn a_cluster_node_serves_its_slots_and_redirects_the_others() {
    let (topology, mut a, mut b, mut a2) = cluster();
    let (ca, cb, c2) = (a.connect(), b.connect(), a2.connect());
    // {a} is slot 15495 (b's), {b} 3300 (a's)
    assert_eq!(sim_redis::key_slot(b"{a}"), 15495);
    assert_eq!(run(&mut a, ca, &["SET", "{b}k", "v"], T0), Value::Okay);
    assert_eq!(
        error_text(&run(&mut a, ca, &["SET", "{a}k", "v"], T0)),
        "MOVED 15495 127.0.0.1:7001"
    );
    assert_eq!(
        error_text(&run(&mut b, cb, &["DEL", "{a}x", "{b}y"], T0)),
        "CROSSSLOT Keys in request don't hash to the same slot"
    );
    // a script's declared keys route it; its other keys must be local
    let script = "return redis.call('GET', ARGV[1])";
    assert_eq!(
        run(&mut a, ca, &["EVAL", script, "1", "{b}k", "{b}k"], T0),
        bulk("v")
    );
    assert!(
        error_text(&run(&mut a, ca, &["EVAL", script, "1", "{b}k", "{a}k"], T0)).starts_with(
            "ERR Script attempted to access a non local key in a cluster node script:"
        )
    );
    // a replica serves reads to READONLY connections, redirects the others
    assert_eq!(
        error_text(&run(&mut a2, c2, &["GET", "{b}k"], T0)),
        "MOVED 3300 127.0.0.1:7000"
    );
    assert_eq!(run(&mut a2, c2, &["READONLY"], T0), Value::Okay);
    assert_eq!(run(&mut a2, c2, &["GET", "{b}k"], T0), Value::Nil);
    assert_eq!(
        error_text(&run(&mut a2, c2, &["SET", "{b}k", "v"], T0)),
        "MOVED 3300 127.0.0.1:7000"
    );
    // CLUSTER SLOTS from the topology
    let slots = run(&mut b, cb, &["CLUSTER", "SLOTS"], T0);
    let Value::Array(ranges) = &slots else {
        panic!("{slots:?}")
    };
    assert_eq!(ranges.len(), 2);
    let Value::Array(first) = &ranges[0] else {
        panic!()
    };
    assert_eq!(first[0], Value::Int(0));
    assert_eq!(first[1], Value::Int(8191));
    assert_eq!(first.len(), 4, "a's range lists its replica: {first:?}");
    // a failover moves the slots; shard subscribers of lost slots are told
    let listener = a.connect();
    a.execute(listener, &["SSUBSCRIBE", "w:{b}"], T0);
    topology
        .borrow_mut()
        .fail_over("a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2");
    let told = a.topology_changed();
    assert!(
        told.is_empty(),
        "a is a2's replica now: it still serves the shard"
    );
    topology.borrow_mut().assign(0, 8191, &"b".repeat(40));
    let told = a.topology_changed();
    assert_eq!(told.len(), 1);
    assert_eq!(
        told[0].value,
        Value::Array(vec![bulk("sunsubscribe"), bulk("w:{b}"), Value::Int(0)])
    );
    // publishes are relayed by the harness
    let executed = b.execute(cb, &["SPUBLISH", "w:{b}", "x"], T0);
    assert_eq!(executed.relay.len(), 1);
    assert_eq!(executed.relay[0].slot, Some(3300));
    assert!(
        error_text(&run(&mut b, cb, &["SELECT", "1"], T0)).starts_with("ERR SELECT is not allowed")
    );
}

#[test]
fn a_sentinel_answers_the_clients_questions_and_announces_failovers() {
    let mut sentinel = SentinelNode::new("127.0.0.1", 26379);
    sentinel.monitor("main", MasterState::new("127.0.0.1", 7000));
    let ask = sentinel.connect();
    let fields: HashMap<String, String> = FromRedisValue::from_redis_value(
        sentinel.execute(ask, &["SENTINEL", "MASTER", "main"]).reply,
    )
    .unwrap();
    assert_eq!(fields["ip"], "127.0.0.1");
    assert_eq!(fields["port"], "7000");
    assert_eq!(fields["config-epoch"], "0");
    assert_eq!(fields["flags"], "master");
    assert_eq!(
        error_text(
            &sentinel
                .execute(ask, &["SENTINEL", "MASTER", "other"])
                .reply
        ),
        "ERR No such master with that name"
    );
    assert_eq!(
        sentinel
            .execute(ask, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "main"])
            .reply,
        Value::Array(vec![bulk("127.0.0.1"), bulk("7000")])
    );
    assert_eq!(
        sentinel.execute(ask, &["PING"]).reply,
        Value::SimpleString("PONG".into())
    );
    let listen = sentinel.connect();
    let Executed { reply, .. } = sentinel.execute(listen, &["SUBSCRIBE", "+switch-master"]);
    assert_eq!(
        reply,
        Value::Array(vec![
            bulk("subscribe"),
            bulk("+switch-master"),
            Value::Int(1)
        ])
    );
    let told = sentinel.switch_master("main", "127.0.0.1", 7001);
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].conn, listen);
    assert_eq!(
        told[0].value,
        Value::Array(vec![
            bulk("message"),
            bulk("+switch-master"),
            bulk("main 127.0.0.1 7000 127.0.0.1 7001")
        ])
    );
    assert_eq!(
        sim_redis::parse_switch_master(&told[0].value),
        Some((
            "main".into(),
            "127.0.0.1".into(),
            7000,
            "127.0.0.1".into(),
            7001
        ))
    );
    assert_eq!(sentinel.master("main").unwrap().config_epoch, 1);
    let role: redis::Role =
        FromRedisValue::from_redis_value(sentinel.execute(ask, &["ROLE"]).reply).unwrap();
    assert_eq!(
        role,
        redis::Role::Sentinel {
            primary_names: vec!["main".into()]
        }
    );
    assert!(error_text(&sentinel.execute(ask, &["GET", "k"]).reply)
        .starts_with("ERR unknown command 'GET'"));
}

#[test]
fn each_node_keeps_its_own_clock() {
    let mut n = node(7000);
    let c = n.connect();
    n.set_clock_skew_us(-2_000_000);
    assert_eq!(
        run(&mut n, c, &["TIME"], T0),
        Value::Array(vec![bulk("1699999998"), bulk("0")])
    );
    run(&mut n, c, &["SET", "k", "v", "PX", "1000"], T0);
    // 1.5 s later on the simulated clock; the key is 1 s old by the node's
    n.set_clock_skew_us(-2_500_000);
    assert_eq!(
        run(&mut n, c, &["PTTL", "k"], T0 + 1_500_000),
        Value::Int(0)
    );
    assert_eq!(run(&mut n, c, &["GET", "k"], T0 + 1_500_000), bulk("v"));
    assert_eq!(run(&mut n, c, &["GET", "k"], T0 + 1_501_000), Value::Nil);
}

#[test]
fn the_same_calls_give_the_same_history() {
    let history = || {
        let (mut primary, mut replica, p, _) = pair();
        let mut replies = Vec::new();
        for i in 0..50 {
            let t = T0 + i * 7_000;
            let key = format!("k{}", i % 5);
            replies.push(run(&mut primary, p, &["EVAL", "redis.call('ZADD', KEYS[1], math.random(1000), ARGV[1]) return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')", "1", &key, &i.to_string()], t));
            replies.push(run(&mut primary, p, &["SET", &key, "v", "PX", "10"], t));
            replies.push(run(&mut primary, p, &["SCAN", "0", "COUNT", "2"], t));
            if i % 3 == 0 {
                carry(&mut primary, &mut replica, t);
            }
        }
        (
            replies,
            primary.replication_id().to_owned(),
            primary.replication_offset(),
        )
    };
    assert_eq!(history(), history());
}

#[test]
fn a_restart_forgets_everything() {
    let mut n = node(7000);
    let c = n.connect();
    let sha = run(&mut n, c, &["SCRIPT", "LOAD", "return 1"], T0);
    run(&mut n, c, &["SET", "k", "v"], T0);
    let id = n.replication_id().to_owned();
    n.restart_empty();
    assert!(!n.is_connected(c));
    let c = n.connect();
    assert_eq!(run(&mut n, c, &["GET", "k"], T0), Value::Nil);
    let Value::BulkString(sha) = sha else {
        panic!()
    };
    let sha = String::from_utf8(sha).unwrap();
    assert!(error_text(&run(&mut n, c, &["EVALSHA", &sha, "0"], T0)).starts_with("NOSCRIPT"));
    assert_ne!(n.replication_id(), id);
    assert_eq!(n.replication_offset(), 0);
}

#[test]
fn a_password_is_asked_as_redis_asks_it() {
    let mut n = Node::new(NodeConfig::new("127.0.0.1", 7000).with_password("secret"));
    let c = n.connect();
    assert_eq!(
        error_text(&run(&mut n, c, &["GET", "k"], T0)),
        "NOAUTH Authentication required."
    );
    assert!(
        error_text(&run(&mut n, c, &["HELLO", "3"], T0)).starts_with("NOAUTH HELLO must be called")
    );
    assert_eq!(
        error_text(&run(&mut n, c, &["AUTH", "wrong"], T0)),
        "WRONGPASS invalid username-password pair or user is disabled."
    );
    let hello = n
        .execute(c, &["HELLO", "3", "AUTH", "default", "secret"], T0)
        .reply;
    assert!(matches!(hello, Value::Map(_)));
    assert_eq!(run(&mut n, c, &["GET", "k"], T0), Value::Nil);
}

#[test]
fn newer_servers_delete_conditionally() {
    use sim_redis::Flavour;
    for (flavour, args) in [
        (Flavour::Valkey9, vec!["DELIFEQ", "k", "v"]),
        (Flavour::Redis84, vec!["DELEX", "k", "IFEQ", "v"]),
    ] {
        let mut n = Node::new(NodeConfig::new("127.0.0.1", 7000).with_flavour(flavour));
        let c = n.connect();
        run(&mut n, c, &["SET", "k", "w"], T0);
        assert_eq!(run(&mut n, c, &args, T0), Value::Int(0));
        run(&mut n, c, &["SET", "k", "v"], T0);
        assert_eq!(run(&mut n, c, &args, T0), Value::Int(1));
        assert_eq!(run(&mut n, c, &["EXISTS", "k"], T0), Value::Int(0));
        assert_eq!(
            run(&mut n, c, &["CLIENT", "SETINFO", "LIB-NAME", "x"], T0),
            Value::Okay
        );
        let mut redis7 = node(7001);
        let c = redis7.connect();
        assert!(error_text(&run(&mut redis7, c, &args, T0)).starts_with("ERR unknown command"));
    }
}
