//! Leader election on the operator's Lease, on the in-memory API server.

use std::time::Duration;
use wasmless_testkit::FakeApiServer;

/// The operator's Lease as replica `who` holds it, on the in-memory API server.
pub(crate) fn operator_lease(fake: &FakeApiServer, who: &str, ttl: Duration) -> wasmless_operator::leader::LeaseLock {
    wasmless_operator::leader::LeaseLock::new(fake.client(), "wasmless-system", "wasmless-operator", who, ttl)
}

#[tokio::test]
async fn only_one_replica_holds_the_lease_until_it_expires() {
    let fake = FakeApiServer::new();
    let lease = |who: &str| operator_lease(&fake, who, Duration::from_secs(1));
    let (a, b) = (lease("a"), lease("b"));
    assert!(a.try_acquire_or_renew().await.unwrap(), "a takes the free lease");
    assert!(!b.try_acquire_or_renew().await.unwrap(), "b waits while a holds it");
    assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(b.try_acquire_or_renew().await.unwrap(), "b takes the expired lease");
    assert!(!a.try_acquire_or_renew().await.unwrap(), "a has lost it");
    let leases = fake.objects("/leases/");
    assert_eq!(leases[0]["spec"]["holderIdentity"], "b");
    assert_eq!(leases[0]["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn a_hung_renewal_gives_up_leadership_before_the_lease_expires() {
    let fake = FakeApiServer::new();
    let lease = operator_lease(&fake, "a", Duration::from_secs(3));
    assert!(lease.try_acquire_or_renew().await.unwrap());
    let renewed = std::time::Instant::now();
    // The API server stops answering (a half-open connection): renewals never return.
    fake.hang(http::Method::GET, "/leases/", usize::MAX);
    let lost = tokio::time::timeout(Duration::from_secs(10), lease.keep())
        .await
        .expect("keep() returns while the renewal hangs");
    let led_for = renewed.elapsed();
    assert!(
        led_for < Duration::from_secs(3),
        "led {led_for:?} after the last renewal, past the 3 s a standby waits: {lost}"
    );
    assert!(lost.contains("not renewed within"), "{lost}");
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once() {
    let fake = FakeApiServer::new();
    let lease = |who: &str| operator_lease(&fake, who, Duration::from_secs(60));
    let (a, b) = (lease("a"), lease("b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "held for a minute");
    a.release().await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "b takes the released lease without waiting"
    );
    assert!(!a.try_acquire_or_renew().await.unwrap());
    // Releasing a lease someone else holds changes nothing.
    a.release().await;
    assert_eq!(fake.objects("/leases/")[0]["spec"]["holderIdentity"], "b");
}

#[tokio::test]
async fn an_api_error_while_acquiring_is_retried() {
    let fake = FakeApiServer::new();
    let lease = operator_lease(&fake, "a", Duration::from_secs(1));
    fake.fail(http::Method::GET, "/leases/", 2);
    tokio::time::timeout(Duration::from_secs(5), lease.acquire())
        .await
        .expect("acquired once the API server answers");
    assert_eq!(fake.objects("/leases/")[0]["spec"]["holderIdentity"], "a");
}
