//! The lottery: every instance fires at once; exactly one runs the body, the
//! others skip (no `wait`).

mod common;
use common::*;

const INSTANCES: usize = 5;

#[test]
fn exactly_one_instance_draws() {
    let server = RedisServer::start();
    let date = "2026-11-22";
    let count = INSTANCES.to_string();
    let mut instances: Vec<Process> = (0..INSTANCES)
        .map(|_| worker(&server, &["lottery", date, &count]))
        .collect();
    for instance in &mut instances {
        assert_eq!(instance.line(LINE_TIMEOUT), "ready");
    }
    for instance in &mut instances {
        instance.send("go");
    }
    let outcomes: Vec<String> = instances
        .iter_mut()
        .map(|instance| instance.line(LINE_TIMEOUT))
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| *o == "won").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "skipped").count(),
        INSTANCES - 1,
        "{outcomes:?}"
    );
    assert_eq!(
        value(&redis(&server, &["GET", &format!("runs:{date}")])).as_deref(),
        Some("1")
    );
    assert_eq!(
        redis(&server, &["EXISTS", &format!("lock:{{lottery:{date}}}")]),
        ":0\r\n"
    );
}
