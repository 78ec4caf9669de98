//! Events delivered through a real NATS server with JetStream (testkit's, on loopback) to
//! a handler over HTTP: retries with growing delays, dead letters with the last error, the
//! same `ce-id` on every try, and no message lost when the deliverer or the broker dies.

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmless_events::broker::jetstream::JetStream;
use wasmless_events::broker::{Broker, ConsumerSpec, Publish};
use wasmless_events::cloudevent::{ATTEMPT_HEADER, Kind};
use wasmless_events::deliver::{self, Target};
use wasmless_events::endpoints::Addresses;
use wasmless_events::metrics::EventMetrics;
use wasmless_events::names::{self, TriggerRef};
use wasmless_events::retry::DeliveryPolicy;
use wasmless_testkit::nats::Nats;

/// What the handler answers each try of a message.
#[derive(Clone, Copy)]
enum Script {
    /// 503 to the first `n` tries of each message, then 200.
    FailFirst(u32),
    /// This status and body, every time.
    Always(u16, &'static str),
    /// 200 after this long.
    SlowOk(Duration),
}

#[derive(Clone, Debug)]
struct Seen {
    id: String,
    attempt: u32,
    at: Instant,
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

struct Handler {
    script: Script,
    seen: Mutex<Vec<Seen>>,
}

impl Handler {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn answered_ok(&self) -> usize {
        self.seen().iter().filter(|seen| seen.status == 200).count()
    }
}

async fn handle(
    axum::extract::State(handler): axum::extract::State<Arc<Handler>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let id = headers
        .get("ce-id")
        .map(|id| id.to_str().unwrap().to_string())
        .unwrap_or_default();
    let attempt = headers[ATTEMPT_HEADER].to_str().unwrap().parse().unwrap();
    let tries_before = handler.seen().iter().filter(|seen| seen.id == id).count() as u32;
    let (status, words) = match handler.script {
        Script::FailFirst(n) if tries_before < n => (503, "not yet"),
        Script::FailFirst(_) => (200, "ok"),
        Script::Always(status, words) => (status, words),
        Script::SlowOk(delay) => {
            tokio::time::sleep(delay).await;
            (200, "ok")
        }
    };
    handler.seen.lock().unwrap().push(Seen {
        id,
        attempt,
        at: Instant::now(),
        status,
        headers,
        body,
    });
    (StatusCode::from_u16(status).unwrap(), words)
}

struct Harness {
    nats: Nats,
    broker: Arc<JetStream>,
    handler: Arc<Handler>,
    url: http::Uri,
    registry: Arc<Mutex<prometheus_client::registry::Registry>>,
    metrics: EventMetrics,
    trigger: TriggerRef,
    journal: wasmless_events::journal::Journal,
    notes: Mutex<tokio::sync::mpsc::Receiver<wasmless_events::journal::Note>>,
}

impl Harness {
    async fn start(script: Script) -> Self {
        let nats = Nats::start();
        let broker = Arc::new(JetStream::connect(&nats.url(), None).await.unwrap());
        let handler = Arc::new(Handler {
            script,
            seen: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .route("/orders", axum::routing::post(handle))
            .with_state(handler.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/orders", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = EventMetrics::register(&mut registry);
        let trigger = TriggerRef::new("shop", "orders", "created");
        broker.ensure_namespace("shop").await.unwrap();
        let (journal, notes) = wasmless_events::journal::Journal::collecting();
        Self {
            nats,
            broker,
            handler,
            url,
            registry: Arc::new(Mutex::new(registry)),
            metrics,
            trigger,
            journal,
            notes: Mutex::new(notes),
        }
    }

    /// The notes for people written so far: (reason, text).
    fn notes(&self) -> Vec<(&'static str, String)> {
        let mut notes = self.notes.lock().unwrap();
        std::iter::from_fn(|| notes.try_recv().ok())
            .map(|note| (note.reason, note.text))
            .collect()
    }

    fn consumer(&self, max_in_flight: u32, ack_wait: Duration, policy: &DeliveryPolicy) -> ConsumerSpec {
        ConsumerSpec {
            trigger: self.trigger.clone(),
            subject: names::subject("shop", "orders.created").unwrap(),
            max_in_flight,
            ack_wait,
            max_deliver: policy.retries + 2,
        }
    }

    /// The deliverer, started again whenever its consumer's stream ends (as the component's
    /// supervisor does), until the task is aborted.
    async fn deliver(&self, consumer: &ConsumerSpec, policy: DeliveryPolicy) -> tokio::task::JoinHandle<()> {
        self.deliver_with_slots(consumer, policy, 256).await
    }

    /// The deliverer, with `slots` deliveries at once in the process.
    async fn deliver_with_slots(
        &self,
        consumer: &ConsumerSpec,
        policy: DeliveryPolicy,
        slots: usize,
    ) -> tokio::task::JoinHandle<()> {
        self.broker.ensure_consumer(consumer).await.unwrap();
        self.metrics.trigger_started(&self.trigger);
        let address = format!("{}:{}", self.url.host().unwrap(), self.url.port_u16().unwrap());
        let target = Arc::new(Target {
            trigger: self.trigger.clone(),
            kind: Kind::Queue,
            addresses: Arc::new(Addresses::fixed(vec![address.parse().unwrap()])),
            path: self.url.path().to_string(),
            policy,
            journal: self.journal.clone(),
        });
        let (broker, consumer, metrics) = (self.broker.clone(), consumer.clone(), self.metrics.clone());
        let in_flight = Arc::new(tokio::sync::Semaphore::new(slots));
        tokio::spawn(async move {
            loop {
                let ended = deliver::deliver_all(
                    broker.clone(),
                    consumer.clone(),
                    target.clone(),
                    deliver::http_client(),
                    metrics.clone(),
                    in_flight.clone(),
                )
                .await;
                if let Err(error) = ended {
                    eprintln!("deliverer: {error}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }

    async fn publish(&self, id: Option<&str>, payload: &str) {
        self.broker
            .publish(Publish {
                subject: "wasmless.shop.orders.created".into(),
                id: id.map(str::to_string),
                headers: vec![("Content-Type".into(), "application/json".into())],
                payload: Bytes::from(payload.to_string()),
            })
            .await
            .unwrap();
    }

    fn metric(&self, outcome: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry.lock().unwrap()).unwrap();
        let series = format!(
            "wasmless_events_delivered_total{{function=\"orders\",function_namespace=\"shop\",trigger=\"created\",outcome=\"{outcome}\"}} "
        );
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    async fn wait_until(&self, seconds: u64, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {seconds} s; the handler saw {} tries",
                self.handler.seen().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The consumer's messages all settled (acknowledged or given up on).
    async fn lag_back_to_zero(&self, consumer: &ConsumerSpec) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let lag = self.broker.progress(consumer).await.unwrap().lag;
            if lag == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the consumer's lag is {lag}, not 0, 5 s after the last try"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The dead letters parked for the trigger, read as a user would, from the stream.
    async fn dead_letters(&self) -> Vec<async_nats::Message> {
        let client = async_nats::connect(self.nats.url()).await.unwrap();
        let stream = async_nats::jetstream::new(client)
            .get_stream(names::stream("shop"))
            .await
            .unwrap();
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: self.trigger.dead_letter_subject(),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut messages = consumer.messages().await.unwrap();
        let mut letters = Vec::new();
        while let Ok(Some(Ok(message))) = tokio::time::timeout(Duration::from_millis(500), messages.next()).await {
            letters.push(message.message);
        }
        letters
    }
}

fn header<'a>(message: &'a async_nats::Message, name: &str) -> &'a str {
    message.headers.as_ref().unwrap().get(name).unwrap().as_str()
}

#[tokio::test]
async fn a_handler_failing_three_times_then_succeeding_gets_the_event_after_growing_delays() {
    let harness = Harness::start(Script::FailFirst(3)).await;
    let policy = DeliveryPolicy {
        retries: 5,
        backoff: Duration::from_millis(200),
        ..Default::default()
    };
    let consumer = harness.consumer(4, Duration::from_secs(30), &policy);
    let _deliverer = harness.deliver(&consumer, policy).await;
    harness.publish(Some("order-1"), r#"{"order":1}"#).await;
    harness
        .wait_until(20, "the fourth try answered 200", |harness| {
            harness.handler.answered_ok() == 1
        })
        .await;

    let seen = harness.handler.seen();
    assert_eq!(seen.len(), 4, "three failures and a success");
    assert!(
        seen.iter().all(|seen| seen.id == "order-1"),
        "every try carries the same ce-id"
    );
    assert_eq!(seen.iter().map(|seen| seen.attempt).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(seen[0].headers["ce-type"], "io.wasmless.queue");
    assert_eq!(seen[0].headers["ce-source"], "wasmless/shop/orders/created");
    assert_eq!(seen[0].headers["ce-subject"], "orders.created");
    assert_eq!(seen[0].body, r#"{"order":1}"#);
    let gaps: Vec<Duration> = seen.windows(2).map(|pair| pair[1].at - pair[0].at).collect();
    for (retry, gap) in gaps.iter().enumerate() {
        let backoff = Duration::from_millis(200) * 2u32.pow(retry as u32);
        assert!(
            *gap >= backoff.mul_f64(0.8),
            "retry {} came after {gap:?}, before its backoff {backoff:?}",
            retry + 1
        );
    }
    assert!(gaps[2] > gaps[0], "the delays grew: {gaps:?}");
    assert_eq!(
        (
            harness.metric("retry"),
            harness.metric("ok"),
            harness.metric("dead_letter")
        ),
        (3, 1, 0)
    );
    harness.lag_back_to_zero(&consumer).await;
    // What `wasmless events` shows: each failed try, then the success.
    let notes = harness.notes();
    let reasons: Vec<&str> = notes.iter().map(|note| note.0).collect();
    assert_eq!(
        reasons,
        [
            "EventRetrying",
            "EventRetrying",
            "EventRetrying",
            "EventHandledAfterRetries"
        ],
        "{notes:?}"
    );
    assert!(
        notes[0]
            .1
            .starts_with("created: event order-1 failed on try 1 (status 503: not yet); tried again in 0."),
        "{}",
        notes[0].1
    );
    assert_eq!(notes[3].1, "created: event order-1 handled on try 4");
}

#[tokio::test]
async fn an_always_failing_handler_parks_the_event_as_a_dead_letter_with_its_last_error() {
    let harness = Harness::start(Script::Always(500, "out of stock")).await;
    let policy = DeliveryPolicy {
        retries: 2,
        backoff: Duration::from_millis(50),
        ..Default::default()
    };
    let consumer = harness.consumer(4, Duration::from_secs(30), &policy);
    let _deliverer = harness.deliver(&consumer, policy).await;
    // A publisher's headers that would refuse the dead letter (the broker acts on them) or
    // forge what it says: the dead letter keeps neither.
    let headers = [
        ("Content-Type", "application/json"),
        ("Nats-Expected-Last-Subject-Sequence", "0"),
        ("Wasmless-Last-Error", "forged"),
        ("X-Order-Source", "web"),
    ];
    harness
        .broker
        .publish(Publish {
            subject: "wasmless.shop.orders.created".into(),
            id: Some("order-2".into()),
            headers: headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            payload: Bytes::from_static(br#"{"order":2}"#),
        })
        .await
        .unwrap();
    harness
        .wait_until(20, "a dead letter counted", |harness| {
            harness.metric("dead_letter") == 1
        })
        .await;
    let letters = harness.dead_letters().await;
    assert_eq!(letters.len(), 1, "one dead letter");
    let letter = &letters[0];
    assert_eq!(letter.payload, r#"{"order":2}"#);
    let all = |name: &str| {
        let values = letter.headers.as_ref().unwrap().get_all(name);
        values.map(|value| value.as_str().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(all("Wasmless-Last-Error"), ["status 500: out of stock"]);
    assert_eq!(header(letter, "X-Order-Source"), "web");
    assert!(all("Nats-Expected-Last-Subject-Sequence").is_empty());
    assert_eq!(header(letter, "Wasmless-Attempts"), "3");
    assert_eq!(header(letter, "ce-id"), "order-2");
    assert_eq!(header(letter, "Wasmless-Subject"), "wasmless.shop.orders.created");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        harness.handler.seen().len(),
        3,
        "the first try and two retries, then no more"
    );
    harness.lag_back_to_zero(&consumer).await;
    let progress = harness.broker.progress(&consumer).await.unwrap();
    assert_eq!((progress.lag, progress.dead_letters), (0, 1), "{progress:?}");
    assert!(progress.last_delivered.is_some());
    let notes = harness.notes();
    let reasons: Vec<&str> = notes.iter().map(|note| note.0).collect();
    assert_eq!(
        reasons,
        ["EventRetrying", "EventRetrying", "EventDeadLettered"],
        "{notes:?}"
    );
    assert_eq!(
        notes[2].1,
        "created: event order-2 parked on wasmless.shop._deadletter.orders.created after try 3: status 500: out of stock"
    );
}

#[tokio::test]
async fn an_event_the_handler_calls_bad_is_parked_at_once_and_an_id_published_twice_is_delivered_once() {
    let harness = Harness::start(Script::Always(400, "no such order")).await;
    let policy = DeliveryPolicy {
        retries: 5,
        backoff: Duration::from_millis(50),
        ..Default::default()
    };
    let consumer = harness.consumer(4, Duration::from_secs(30), &policy);
    let _deliverer = harness.deliver(&consumer, policy).await;
    harness.publish(Some("order-3"), "{}").await;
    harness.publish(Some("order-3"), "{}").await;
    harness
        .wait_until(20, "a dead letter counted", |harness| {
            harness.metric("dead_letter") == 1
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        harness.handler.seen().len(),
        1,
        "a 400 is not retried, and the duplicate publish was dropped"
    );
    assert_eq!(harness.metric("retry"), 0);
    let letters = harness.dead_letters().await;
    assert_eq!(header(&letters[0], "Wasmless-Last-Error"), "status 400: no such order");
    // A namespace's messages are at most 1 MiB: a bigger one is refused at its publish.
    let too_big = Publish {
        subject: "wasmless.shop.orders.created".into(),
        payload: Bytes::from(vec![b'x'; 2 << 20]),
        ..Default::default()
    };
    assert!(
        harness.broker.publish(too_big).await.is_err(),
        "a 2 MiB message was stored"
    );
}

#[tokio::test]
async fn an_event_waiting_for_a_slot_is_neither_handed_out_again_nor_counted_as_a_try() {
    // One slot in the process and a handler taking 0.8 s: the fourth message waits 2.4 s
    // for it, more than twice the consumer's ack_wait of 1 s.
    let harness = Harness::start(Script::SlowOk(Duration::from_millis(800))).await;
    let policy = DeliveryPolicy {
        retries: 3,
        backoff: Duration::from_millis(100),
        ..Default::default()
    };
    let consumer = harness.consumer(4, Duration::from_secs(1), &policy);
    let _deliverer = harness.deliver_with_slots(&consumer, policy, 1).await;
    for n in 0..4 {
        harness.publish(Some(&format!("w-{n}")), "{}").await;
    }
    harness
        .wait_until(20, "four messages handled", |harness| {
            harness.handler.answered_ok() >= 4
        })
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = harness.handler.seen();
    let mut ids: Vec<&str> = seen.iter().map(|seen| seen.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["w-0", "w-1", "w-2", "w-3"], "each once");
    assert!(
        seen.iter().all(|seen| seen.attempt == 1),
        "no try counted while waiting: {seen:?}"
    );
}

#[tokio::test]
async fn no_event_is_lost_when_the_deliverer_and_then_the_broker_die_mid_way() {
    const MESSAGES: usize = 2000;
    let mut harness = Harness::start(Script::SlowOk(Duration::from_millis(2))).await;
    let policy = DeliveryPolicy {
        retries: 10,
        backoff: Duration::from_millis(100),
        ..Default::default()
    };
    // A message handed out to a deliverer that died is handed out again after 2 s.
    let consumer = harness.consumer(32, Duration::from_secs(2), &policy);
    harness.broker.ensure_consumer(&consumer).await.unwrap();
    for n in 0..MESSAGES {
        harness
            .publish(Some(&format!("m-{n}")), &format!("{{\"n\":{n}}}"))
            .await;
    }
    assert_eq!(
        harness.broker.progress(&consumer).await.unwrap().lag,
        MESSAGES as u64,
        "all waiting before delivery starts"
    );

    let first = harness.deliver(&consumer, policy.clone()).await;
    harness
        .wait_until(60, "a quarter handled", |harness| {
            harness.handler.answered_ok() >= MESSAGES / 4
        })
        .await;
    first.abort();
    let _second = harness.deliver(&consumer, policy).await;
    harness
        .wait_until(60, "half handled", |harness| {
            harness.handler.answered_ok() >= MESSAGES / 2
        })
        .await;
    harness.nats.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    harness.nats.restart();
    harness
        .wait_until(120, "every message handled", |harness| {
            let ids: std::collections::HashSet<String> = harness
                .handler
                .seen()
                .into_iter()
                .filter(|seen| seen.status == 200)
                .map(|seen| seen.id)
                .collect();
            ids.len() == MESSAGES
        })
        .await;

    let mut tries: HashMap<String, usize> = HashMap::new();
    for seen in harness.handler.seen() {
        *tries.entry(seen.id).or_default() += 1;
    }
    let duplicates: usize = tries.values().map(|n| n - 1).sum();
    eprintln!("{MESSAGES} messages, {duplicates} handled more than once (a deliverer and a broker killed)");
    assert!(
        (0..MESSAGES).all(|n| tries.contains_key(&format!("m-{n}"))),
        "no message lost"
    );
    assert!(
        duplicates < MESSAGES / 4,
        "{duplicates} duplicates: only what was in flight at a kill is handed out again"
    );
}

/// A handler that counts what reaches it: another namespace's pod, in the test below.
async fn victim() -> (std::net::SocketAddr, Arc<Mutex<usize>>) {
    let reached = Arc::new(Mutex::new(0));
    let counter = reached.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            *counter.lock().unwrap() += 1;
            "reached"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, reached)
}

/// The component's whole path, against the in-memory API server: a Function's queue trigger
/// read from the API, its consumer made, its Service's ready Pods found, and the messages
/// delivered there; a message of another namespace on the same words never is, and no
/// EndpointSlice the namespace's users write leads the component to another namespace's pod.
#[tokio::test]
async fn a_functions_queue_trigger_read_from_the_api_delivers_to_its_own_pods_and_only_its_namespaces_messages() {
    use kube::api::{Api, DynamicObject, PostParams};
    use serde_json::json;
    use wasmless_events::running::Running;
    use wasmless_events::watch;

    let harness = Harness::start(Script::FailFirst(0)).await;
    let (victim, reached) = victim().await;
    let api = wasmless_testkit::FakeApiServer::new();
    let kube = api.client();
    let port = harness.url.port_u16().unwrap();
    let create = |namespace: &str, plural: &str, group_version: &str, kind: &str, object: serde_json::Value| {
        let resource = kube::api::ApiResource {
            group: group_version
                .split_once('/')
                .map(|(group, _)| group.to_string())
                .unwrap_or_default(),
            version: group_version.rsplit('/').next().unwrap().to_string(),
            api_version: group_version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(kube.clone(), namespace, &resource);
        let mut object = object;
        object["apiVersion"] = json!(group_version);
        object["kind"] = json!(kind);
        async move {
            api.create(&PostParams::default(), &serde_json::from_value(object).unwrap())
                .await
                .unwrap()
        }
    };
    let slice = |name: &str, address: &str, port: u16, target: serde_json::Value| {
        json!({
            "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": "orders"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}, "targetRef": target}],
        })
    };
    // The Function's pod; another namespace's, at the address the network gave it after a
    // finished pod of the Function's namespace let it go (that one keeps it in its status).
    let mut uids = HashMap::new();
    for (namespace, name, ip, phase) in [
        ("shop", "orders-abc", "127.0.0.1", "Running"),
        ("victim", "payments", "127.0.0.2", "Running"),
        ("shop", "old-job", "127.0.0.2", "Succeeded"),
    ] {
        let pod = json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": "True"}]},
        });
        let created = create(namespace, "pods", "v1", "Pod", pod).await;
        uids.insert(name, created.metadata.uid.unwrap());
    }
    let pod_ref =
        |namespace: &str, name: &str| json!({"kind": "Pod", "namespace": namespace, "name": name, "uid": uids[name]});
    let own_pod = pod_ref("shop", "orders-abc");
    create(
        "shop",
        "endpointslices",
        "discovery.k8s.io/v1",
        "EndpointSlice",
        slice("orders-ours", "127.0.0.1", port, own_pod.clone()),
    )
    .await;
    // What a user of the namespace may write: slices for the Function's Service leading to
    // another namespace's pod, by its name, by an address that is not the named pod's, by a
    // finished pod of the namespace's that once had the address, or with no pod at all.
    let (victim_ip, victim_port) = (victim.ip().to_string(), victim.port());
    for (name, target) in [
        ("to-their-pod", pod_ref("victim", "payments")),
        ("to-a-wrong-address", own_pod),
        ("to-a-finished-pod", pod_ref("shop", "old-job")),
        ("to-no-pod", json!(null)),
    ] {
        create(
            "shop",
            "endpointslices",
            "discovery.k8s.io/v1",
            "EndpointSlice",
            slice(name, &victim_ip, victim_port, target),
        )
        .await;
    }
    create(
        "shop",
        "functions",
        "wasmless.io/v1alpha1",
        "Function",
        json!({
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {
                "source": "package handlers",
                "triggers": [{"name": "created", "path": "/orders", "queue": {"subject": "orders.*"}}],
                "delivery": {"retries": 1, "backoff": "100ms"},
            },
        }),
    )
    .await;

    let broker = harness.broker.clone();
    let metrics = harness.metrics.clone();
    let writer = kube.clone();
    let component = tokio::spawn(async move {
        let mut running = Running::new(
            broker,
            kube.clone(),
            metrics,
            wasmless_events::journal::Journal::off(),
            256,
        );
        tokio::spawn(wasmless_events::report::keep_reporting(writer, running.progresses()));
        watch::follow_functions(watch::functions_api(kube, Some("shop")), &mut running).await;
    });
    // The component makes the namespace's stream and the trigger's consumer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let consumer = harness.consumer(10, Duration::from_secs(35), &DeliveryPolicy::default());
    while harness.broker.progress(&consumer).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the trigger's consumer was not made within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    harness.broker.ensure_namespace("other").await.unwrap();
    harness
        .broker
        .publish(Publish {
            subject: "wasmless.other.orders.created".into(),
            id: Some("theirs".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    for n in 0..20 {
        harness.publish(Some(&format!("ours-{n}")), r#"{"order":7}"#).await;
    }
    harness
        .wait_until(20, "the messages delivered to the Function's pod", |harness| {
            harness.handler.answered_ok() == 20
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = harness.handler.seen();
    assert_eq!(
        seen.len(),
        20,
        "each of the namespace's own messages once, and not the other namespace's"
    );
    assert!(seen.iter().all(|seen| seen.id.starts_with("ours-")));
    assert_eq!(seen[0].headers["ce-source"], "wasmless/shop/orders/created");
    assert_eq!(seen[0].headers["ce-subject"], "orders.created");
    assert_eq!(*reached.lock().unwrap(), 0, "no event reached another namespace's pod");

    // The Function's status says where its trigger got to, as `kubectl get fn` shows it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let status = api.objects("functions/orders")[0]["status"].clone();
        if status["triggersSummary"] == "created lag 0" && status["triggers"][0]["lastFired"].is_string() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "status.triggers not written within 20 s: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["triggers"][0]["name"], "created");
    assert_eq!(status["triggers"][0]["deadLetters"], 0);
    let writes: Vec<_> = api
        .writes()
        .into_iter()
        // Not the test's own creation of the Function.
        .filter(|write| write.resource() == "functions" && write.method.as_str() != "POST")
        .collect();
    assert!(!writes.is_empty());
    for write in &writes {
        assert!(write.is_status(), "only the status is written: {}", write.path);
        assert!(
            write.content_type.contains("apply-patch") && write.query.contains("fieldManager=wasmless-events"),
            "an apply of its own, which the operator's leaves alone: {} {}",
            write.content_type,
            write.query
        );
    }
    component.abort();
}

/// Publishers' identities as the API server would tell them: a token names a
/// ServiceAccount, or is refused.
struct Tokens(HashMap<&'static str, (&'static str, &'static str)>);

impl wasmless_events::identity::Authenticate for Tokens {
    async fn authenticate(
        &self,
        token: &str,
    ) -> Result<wasmless_events::identity::Caller, wasmless_events::identity::AuthError> {
        use wasmless_events::identity::{AuthError, Caller};
        let (namespace, service_account) = self
            .0
            .get(token)
            .ok_or_else(|| AuthError::Refused("unknown token".into()))?;
        Ok(Caller {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        })
    }
}

/// The broker takes the component alone, by the password the component made in its Secret;
/// a publisher comes in through the ingress with its ServiceAccount's token, and reaches
/// its own namespace's subjects only.
#[tokio::test]
async fn a_publisher_reaches_its_own_namespaces_subjects_through_the_ingress_and_the_broker_takes_no_one_else() {
    use tower::ServiceExt;
    use wasmless_events::credentials;

    let api = wasmless_testkit::FakeApiServer::new();
    let password = credentials::ensure_password(api.client(), "wasmless-system", "wasmless-nats")
        .await
        .unwrap();
    assert_eq!(password.len(), 64, "32 random bytes in hex");
    let again = credentials::ensure_password(api.client(), "wasmless-system", "wasmless-nats")
        .await
        .unwrap();
    assert_eq!(again, password, "a second replica reads the password the first made");

    let nats = Nats::start_with_user(credentials::USER, &password);
    for (who, credentials) in [
        ("no password", None),
        (
            "a wrong password",
            Some((credentials::USER.to_string(), "guess".to_string())),
        ),
    ] {
        let connected = JetStream::connect(&nats.url(), credentials).await;
        assert!(connected.is_err(), "the broker took a connection with {who}");
    }
    let broker = Arc::new(
        JetStream::connect(&nats.url(), Some((credentials::USER.to_string(), password)))
            .await
            .unwrap(),
    );
    broker.ensure_namespace("shop").await.unwrap();
    broker.ensure_namespace("billing").await.unwrap();
    let consumer = ConsumerSpec {
        trigger: TriggerRef::new("shop", "orders", "created"),
        subject: names::subject("shop", "orders.>").unwrap(),
        max_in_flight: 10,
        ack_wait: Duration::from_secs(30),
        max_deliver: 3,
    };
    broker.ensure_consumer(&consumer).await.unwrap();

    let tokens = Tokens(HashMap::from([
        ("shop-token", ("shop", "checkout")),
        ("billing-token", ("billing", "default")),
        ("empty-token", ("empty", "default")),
    ]));
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = wasmless_events::metrics::IngressMetrics::register(&mut registry);
    let ingress = wasmless_events::ingress::router(broker.clone(), Arc::new(tokens), metrics);
    let post = |path: &str, token: Option<&str>, id: Option<&str>, body: Vec<u8>| {
        let mut request = http::Request::post(path).header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(id) = id {
            request = request.header("ce-id", id);
        }
        let request = request.body(axum::body::Body::from(body)).unwrap();
        let ingress = ingress.clone();
        async move {
            let response = ingress.oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
            (status, String::from_utf8_lossy(&body).to_string())
        }
    };

    let order = br#"{"order": 7}"#.to_vec();
    let (status, body) = post(
        "/publish/shop/orders.created",
        Some("shop-token"),
        Some("order-7"),
        order.clone(),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert!(body.contains(r#""id":"order-7""#), "{body}");
    // The same event again: accepted, and kept once.
    let (status, _) = post(
        "/publish/shop/orders.created",
        Some("shop-token"),
        Some("order-7"),
        order.clone(),
    )
    .await;
    assert_eq!(status, 202);

    for (path, token, expected, words) in [
        (
            "/publish/shop/orders.created",
            Some("billing-token"),
            403,
            "publishes into namespace billing only, not shop",
        ),
        ("/publish/shop/orders.created", None, 401, "--audience wasmless-events"),
        ("/publish/shop/orders.created", Some("made-up"), 401, "unknown token"),
        (
            "/publish/shop/orders.*",
            Some("shop-token"),
            400,
            "a message goes to one subject",
        ),
        (
            "/publish/shop/_deadletter.orders.created",
            Some("shop-token"),
            400,
            "Wasmless's own",
        ),
        (
            "/publish/empty/orders.created",
            Some("empty-token"),
            404,
            "no Function of its namespace has a queue trigger",
        ),
    ] {
        let (status, body) = post(path, token, None, order.clone()).await;
        assert_eq!(status, expected, "{path} with {token:?}: {body}");
        assert!(body.contains(words), "{path} with {token:?}: {body}");
    }
    let (status, body) = post(
        "/publish/shop/orders.big",
        Some("shop-token"),
        None,
        vec![b'x'; (1 << 20) + 1],
    )
    .await;
    assert_eq!(status, 413, "{body}");

    // What the namespace's trigger reads: the one order, once, with its id and type.
    assert_eq!(broker.progress(&consumer).await.unwrap().lag, 1);
    let mut deliveries = broker.consume(&consumer).await.unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    use wasmless_events::broker::Delivery as _;
    let message = delivery.message().clone();
    assert_eq!(message.id, "order-7");
    assert_eq!(message.subject, "wasmless.shop.orders.created");
    assert_eq!(message.header("content-type"), Some("application/json"));
    assert_eq!(message.payload, Bytes::from(order));
    delivery.ack().await.unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"wasmless_events_published_total{function_namespace="shop",outcome="accepted"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"wasmless_events_published_total{function_namespace="empty",outcome="failed"} 1"#),
        "{text}"
    );
}

/// A per-second schedule, ticked by two replicas at once, then by one when the other dies,
/// then by none for two seconds and by a third that starts after: every tick is handled
/// exactly once, those with a replica running on time, those of the gap late but not lost.
#[tokio::test]
async fn a_per_second_schedule_fires_once_a_tick_with_two_replicas_one_dying_and_none_for_a_while() {
    use chrono::{DateTime, Utc};
    use wasmless_events::schedule::{self, Schedule};

    let harness = Harness::start(Script::FailFirst(0)).await;
    let policy = DeliveryPolicy::default();
    let consumer = ConsumerSpec {
        trigger: harness.trigger.clone(),
        subject: harness.trigger.schedule_subject(),
        max_in_flight: 1,
        ack_wait: Duration::from_secs(35),
        max_deliver: policy.retries + 2,
    };
    let deliverer = harness.deliver(&consumer, policy).await;
    let replica = || {
        tokio::spawn(schedule::keep_ticking(
            harness.broker.clone(),
            harness.trigger.clone(),
            consumer.subject.clone(),
            Schedule::parse("* * * * * *", None).unwrap(),
        ))
    };
    let started = Utc::now();
    let (first, second) = (replica(), replica());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    first.abort();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    second.abort();
    let gap_from = Utc::now();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let gap_to = Utc::now();
    let third = replica();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    third.abort();
    let stopped = Utc::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    deliverer.abort();

    let prefix = "shop/orders/created@";
    let mut handled: Vec<(DateTime<Utc>, Instant)> = harness
        .handler
        .seen()
        .iter()
        .map(|seen| {
            let tick = seen
                .id
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("ce-id {}", seen.id));
            (DateTime::parse_from_rfc3339(tick).unwrap().with_timezone(&Utc), seen.at)
        })
        .collect();
    handled.sort_by_key(|(tick, _)| *tick);
    let ticks: Vec<DateTime<Utc>> = handled.iter().map(|(tick, _)| *tick).collect();
    let mut distinct = ticks.clone();
    distinct.dedup();
    assert_eq!(ticks, distinct, "a tick was handled twice: {ticks:?}");
    assert!(
        ticks[0] > started && ticks[0] <= started + chrono::Duration::seconds(1),
        "first tick {}",
        ticks[0]
    );
    assert!(*ticks.last().unwrap() <= stopped);
    assert!(ticks.len() >= 8, "only {} ticks in 8.5 s", ticks.len());
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::seconds(1),
            "a tick missing after {}",
            pair[0]
        );
    }
    // On time while a replica ran: handled before the next-but-one tick (the handler's
    // clock is this process's; e2e's events_on_schedule holds the cluster to a second, here
    // the tests of other crates may share the cores).
    let now = (Utc::now(), Instant::now());
    let delays: Vec<(DateTime<Utc>, i64)> = handled
        .iter()
        .filter(|(tick, _)| !(*tick > gap_from && *tick <= gap_to))
        .map(|(tick, at)| {
            let when = now.0 - chrono::Duration::from_std(now.1 - *at).unwrap();
            (*tick, (when - *tick).num_milliseconds())
        })
        .collect();
    assert!(
        delays.iter().all(|(_, late)| *late < 2000),
        "ticks handled this many ms after their time: {delays:?}"
    );
}
