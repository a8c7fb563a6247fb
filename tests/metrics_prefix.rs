//! The metrics' prefix can be changed (`set_metric_prefix`), once, before
//! the first metric: every name rendered by metrics-exporter-prometheus then
//! starts with it. Its own binary: the prefix is fixed for the process.

mod common;
use common::*;

use lock_runtime::{set_metric_prefix, Client, Config, Lock};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_takes_the_prefix_set_at_start_up() {
    assert!(set_metric_prefix("9lives_").is_err());
    set_metric_prefix("billing_lock_").unwrap();
    set_metric_prefix("billing_lock_").unwrap(); // the same again: fine
    let exporter = PrometheusBuilder::new()
        .with_recommended_naming(true)
        .install_recorder()
        .unwrap();
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    Lock::new("job").client(client).run(async {}).await.unwrap();
    let text = exporter.render();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .collect();
    assert!(names.contains(&"billing_lock_acquisitions_total"), "{text}");
    assert!(names.contains(&"billing_lock_hold_seconds"), "{text}");
    assert!(
        names.iter().all(|name| name.starts_with("billing_lock_")),
        "{names:?}"
    );
    // Fixed now: another prefix is refused, with what to do.
    let late = set_metric_prefix("other_").unwrap_err().to_string();
    assert!(
        late.contains("already fixed") && late.contains("billing_lock_"),
        "{late}"
    );
}
