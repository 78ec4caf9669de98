//! The pool's unit tests: its table, its caps and the shares it keeps by name.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use wasmless_testkit::free_port;

/// A pool loading nothing ahead, its ports quarantined for `quarantine`.
fn pool(quarantine: Duration) -> Arc<Pool> {
    // `--pool` as the pool itself is started; its table comes from the tests instead.
    let args = [
        "--pool",
        "/nonexistent",
        "--bind",
        "127.0.0.1",
        "--pool-load-ahead",
        "false",
    ]
    .map(String::from);
    let config = Config::for_pooled_function(&args).unwrap();
    let engine = EngineHost::new(&config.request_limits(), None).unwrap();
    let metrics = Arc::new(Metrics::new_pool("pool"));
    let (pool, _) = Pool::new(engine, metrics, &config, 1);
    *pool.quarantine.lock().unwrap() = quarantine::PortQuarantine::new(quarantine);
    pool
}

/// `function` on `port`, its entry first written at `claimed_since` (RFC 3339).
fn row(function: &str, port: u16, claimed_since: Option<&str>) -> Row {
    row_with(function, port, claimed_since, &[])
}

/// [`row`] with `extra` arguments.
fn row_with(function: &str, port: u16, claimed_since: Option<&str>, extra: &[&str]) -> Row {
    let mut args = vec!["--function", function, "--module", "/m.wasm"];
    args.extend_from_slice(extra);
    let entry = serde_json::json!({"port": port, "args": args});
    Row {
        origin: format!("ConfigMap {function}-pool"),
        entry: table::parse_entry(entry.to_string().as_bytes()),
        claimed_since: claimed_since.map(|time| Time(time.parse().unwrap())),
    }
}

fn table(rows: impl IntoIterator<Item = (&'static str, Row)>) -> Table {
    rows.into_iter().map(|(name, row)| (name.to_string(), row)).collect()
}

/// When the pool starts, nobody holds a port yet: of two entries claiming one, the
/// one written first gets it, whichever name sorts first (a forged `a-pool` did).
#[test]
fn of_two_new_entries_for_one_port_the_older_claim_gets_it() {
    let pool = pool(Duration::from_secs(30));
    let port = free_port();
    pool.apply(table([
        ("a", row("a", port, Some("2024-05-02T00:00:00Z"))),
        ("victim", row("victim", port, Some("2024-05-01T00:00:00Z"))),
    ]));
    let status = pool.status();
    assert!(status["victim"].listening, "{status:?}");
    assert!(!status["a"].listening, "{status:?}");
    let error = status["a"].error.clone().unwrap_or_default();
    assert!(error.contains(&format!("port {port} is victim's already")), "{error}");
    assert_eq!(pool.tenant(port).unwrap().function.as_ref(), "victim");
}

/// Door 4 of issue 38: a port one Function left is not given to another at once, and
/// `/pool` says why; once the quarantine is over, the waiting entry is served without
/// any change to the table.
#[tokio::test]
async fn a_port_left_by_one_function_waits_before_another_has_it() {
    let quarantine = Duration::from_millis(300);
    let pool = pool(quarantine);
    let port = free_port();
    pool.apply(table([("a", row("a", port, None))]));
    assert!(pool.status()["a"].listening);

    pool.apply(table([("b", row("b", port, None))]));
    let waiting = pool.status()["b"].clone();
    assert!(!waiting.listening, "{waiting:?}");
    assert_eq!(waiting.port, port);
    let error = waiting.error.unwrap_or_default();
    assert!(error.contains("was Function a's"), "{error}");
    assert!(pool.tenant(port).is_none(), "nobody serves the port meanwhile");

    tokio::time::sleep(quarantine + Duration::from_millis(200)).await;
    let served = pool.status()["b"].clone();
    assert!(served.listening && served.error.is_none(), "{served:?}");
    assert_eq!(pool.tenant(port).unwrap().function.as_ref(), "b");
}

#[test]
fn the_function_that_left_a_port_comes_back_to_it_at_once() {
    let pool = pool(Duration::from_secs(30));
    let port = free_port();
    pool.apply(table([("a", row("a", port, None))]));
    pool.apply(Table::new());
    pool.apply(table([("a", row("a", port, None))]));
    assert!(pool.status()["a"].listening);
}

/// An edit while the Function's requests run gives its new tenant the slots those
/// requests left, not a share of its own: the Function still gets 503s past its share.
/// A share the edit makes smaller is reached as the requests in flight end.
#[tokio::test]
async fn an_edit_while_requests_run_gives_the_function_no_more_slots() {
    let pool = pool(Duration::from_secs(30));
    let port = free_port();
    pool.apply(table([("a", row("a", port, None))]));
    let before = pool.tenant(port).unwrap();
    let share = before.permits.available_permits();
    assert_eq!(share, pool.caps.slots as usize);
    let in_flight = before.permits.clone().try_acquire_many_owned(share as u32).unwrap();

    pool.apply(table([("a", row_with("a", port, None, &["--env", "EDITED=1"]))]));
    let edited = pool.tenant(port).unwrap();
    assert!(!Arc::ptr_eq(&before, &edited), "the edit made a new tenant");
    assert_eq!(
        edited.permits.available_permits(),
        0,
        "its share is held by the old tenant's requests"
    );
    drop(in_flight);
    assert_eq!(edited.permits.available_permits(), share);

    let in_flight = edited.permits.clone().try_acquire_many_owned(share as u32).unwrap();
    pool.apply(table([("a", row_with("a", port, None, &["--max-concurrency", "4"]))]));
    let smaller = pool.tenant(port).unwrap();
    assert_eq!(smaller.permits.available_permits(), 0);
    drop(in_flight);
    let until = Instant::now() + Duration::from_secs(5);
    while smaller.permits.available_permits() != 4 {
        assert!(
            Instant::now() < until,
            "the share is not 4: {} free",
            smaller.permits.available_permits()
        );
        tokio::task::yield_now().await;
    }
    pool.apply(table([("a", row_with("a", port, None, &["--max-concurrency", "6"]))]));
    assert_eq!(
        pool.tenant(port).unwrap().permits.available_permits(),
        6,
        "and larger at once"
    );

    pool.apply(Table::new());
    assert!(
        pool.accounts.lock().unwrap().is_empty(),
        "a removed Function's share goes"
    );
}
