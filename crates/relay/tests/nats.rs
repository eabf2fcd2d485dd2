//! The relay against a real NATS JetStream server and both stores. Skipped (with a notice)
//! when `CAMPANILE_TEST_NATS_URL` is unset; the PostgreSQL variants also need
//! `CAMPANILE_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use campanile_core::{ErrorClass, Misfire, OccurrenceId, OccurrenceState, Overlap, ScheduleId};
use campanile_relay::{Relay, RelayConfig};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};
use uuid::Uuid;

const T0: i64 = 1_800_000_000_000;

fn at(s: i64) -> Timestamp {
    Timestamp::from_millisecond(T0 + s * 1000).unwrap()
}

/// A store, a NATS client, a stream over a fresh subject prefix, and what keeps them alive.
struct Env {
    store: Arc<dyn Store>,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: String,
    prefix: String,
    _guard: Box<dyn std::any::Any + Send>,
}

impl Env {
    async fn new(backend: &str) -> Option<Env> {
        let nats = campanile_testkit::nats_url("relay test")?;
        let (store, guard): (Arc<dyn Store>, Box<dyn std::any::Any + Send>) = match backend {
            "sqlite" => {
                let (s, dir) = campanile_testkit::sqlite_store();
                (Arc::new(s), Box::new(dir))
            }
            _ => {
                let url = campanile_testkit::pg_url("PostgreSQL relay test")?;
                let (pg, _) = campanile_testkit::pg_store(&url, 4).await;
                (Arc::new(pg.clone()), Box::new(pg.drop_schema_on_drop()))
            }
        };
        let client = campanile_relay::connect(&nats).await.unwrap();
        let js = jetstream::new(client.clone());
        let id = Uuid::now_v7().simple().to_string();
        let prefix = format!("campanile.test.{id}");
        let stream = format!("CAMPANILE_TEST_{id}");
        // Tests run in parallel and each deletes its stream when done; the server can fail a
        // create racing a delete that empties its storage directory ("error creating store
        // for stream", seen once in CI). Such a failure is the server's, not the relay's.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let created = js
                .create_stream(jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![format!("{prefix}.>")],
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                })
                .await;
            match created {
                Ok(_) => break,
                Err(e) if attempt < 5 => {
                    eprintln!("creating the test stream failed ({e}); again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot create the test stream: {e}"),
            }
        }
        Some(Env {
            store,
            client,
            js,
            stream,
            prefix,
            _guard: guard,
        })
    }

    fn relay(&self, node: &str) -> Relay {
        let mut cfg = RelayConfig::new(node);
        cfg.lease = SignedDuration::from_secs(5);
        Relay::new(self.store.clone(), self.client.clone(), cfg)
    }

    async fn messages(&self) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let mut stream = self.js.get_stream(&self.stream).await.unwrap();
        let n = stream.info().await.unwrap().state.messages;
        let mut out = Vec::new();
        for seq in 1..=n {
            out.push(stream.get_raw_message(seq).await.unwrap());
        }
        out
    }

    async fn cleanup(self) {
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

/// A tenant with one schedule routed to `queue`, and occurrences due at `dues` (seconds).
async fn seed(
    store: &dyn Store,
    name: &str,
    queue: &str,
    max_attempts: u32,
    dues: &[i64],
) -> (TenantId, Vec<OccurrenceId>) {
    let tenant = store
        .tenant_create(TenantCreate {
            name: name.into(),
            now: Some(at(0)),
        })
        .await
        .unwrap()
        .id;
    let schedule = ScheduleId(Uuid::now_v7());
    store
        .schedule_create(ScheduleCreate {
            tenant,
            id: schedule,
            spec: ScheduleSpec {
                timing: Timing::At(at(10)),
                queue: queue.into(),
                payload: Some(format!("{{\"tenant\":\"{name}\"}}")),
                priority: 0,
                lease: SignedDuration::from_secs(5),
                max_attempts,
                backoff_initial: SignedDuration::from_secs(1),
                backoff_max: SignedDuration::from_secs(1),
                misfire: Misfire::default(),
                overlap: Overlap::Allow,
                flex_window: SignedDuration::ZERO,
            },
            shard: 0,
            next_run_at: None,
            fires_per_hour: 0,
            idempotency: None,
            now: Some(at(0)),
        })
        .await
        .unwrap();
    let items: Vec<NewOccurrence> = dues
        .iter()
        .map(|d| NewOccurrence {
            schedule_id: schedule,
            version: 1,
            scheduled_for: at(*d),
            available_at: at(*d),
            queue: queue.into(),
            priority: 0,
            max_attempts,
            backoff_initial: SignedDuration::from_secs(1),
            backoff_max: SignedDuration::from_secs(1),
            state: OccurrenceState::Ready,
            overlap: Overlap::Allow,
            lease: SignedDuration::from_secs(30),
        })
        .collect();
    let ids = items
        .iter()
        .map(|o| campanile_core::occurrence_id(o.schedule_id, o.version, o.scheduled_for))
        .collect();
    store
        .occurrence_insert_many(OccurrenceInsertMany {
            tenant,
            items,
            now: Some(at(0)),
        })
        .await
        .unwrap();
    (tenant, ids)
}

async fn detail(
    store: &dyn Store,
    tenant: TenantId,
    id: OccurrenceId,
    now: Timestamp,
) -> OccurrenceDetail {
    store
        .occurrence_get(OccurrenceGet {
            tenant,
            key: OccurrenceKey::Id(id),
            now: Some(now),
        })
        .await
        .unwrap()
        .unwrap()
}

fn header(m: &async_nats::jetstream::message::StreamMessage, name: &str) -> String {
    m.headers
        .get(name)
        .map(|v| v.as_str().to_string())
        .unwrap_or_default()
}

async fn delivers_due_occurrences_with_their_id_as_msg_id(backend: &str) {
    let Some(env) = Env::new(backend).await else {
        return;
    };
    let s = env.store.as_ref();
    let subject = format!("{}.billing", env.prefix);
    let route = format!("$nats:{subject}");
    let (acme, acme_ids) = seed(s, "acme", &route, 3, &[10, 20, 900]).await;
    let (globex, globex_ids) = seed(s, "globex", &route, 3, &[15]).await;
    let relay = env.relay("relay-1");

    let none = relay.step(Some(at(9))).await.unwrap();
    assert_eq!(none.claimed, 0, "nothing is due at 9 s");
    let r = relay.step(Some(at(30))).await.unwrap();
    assert_eq!(
        (r.claimed, r.published, r.failed, r.duplicates),
        (3, 3, 0, 0)
    );

    let msgs = env.messages().await;
    let ids: Vec<String> = msgs.iter().map(|m| header(m, "Nats-Msg-Id")).collect();
    let expected: Vec<String> = [acme_ids[0], globex_ids[0], acme_ids[1]]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        ids, expected,
        "one message per due occurrence, earliest first"
    );
    assert!(msgs.iter().all(|m| m.subject.as_str() == subject));
    assert_eq!(&msgs[0].payload[..], b"{\"tenant\":\"acme\"}");
    assert_eq!(&msgs[1].payload[..], b"{\"tenant\":\"globex\"}");
    assert_eq!(
        header(&msgs[0], "Campanile-Scheduled-For"),
        at(10).to_string()
    );
    assert_eq!(header(&msgs[0], "Campanile-Attempt"), "1");

    // Each occurrence is SUCCEEDED with the stream's acknowledgement as its result.
    let d = detail(s, acme, acme_ids[0], at(31)).await;
    assert_eq!(d.occurrence.state, OccurrenceState::Succeeded);
    let result: serde_json::Value =
        serde_json::from_str(d.occurrence.result.as_deref().unwrap()).unwrap();
    assert_eq!(result["stream"], env.stream.as_str());
    assert_eq!(result["seq"], 1);
    assert_eq!(result["duplicate"], false);
    assert_eq!(
        detail(s, globex, globex_ids[0], at(31))
            .await
            .occurrence
            .state,
        OccurrenceState::Succeeded
    );
    // Nothing more until the future one is due; the outbox is settled.
    assert_eq!(relay.step(Some(at(31))).await.unwrap().claimed, 0);
    assert_eq!(
        s.backlog(BacklogGet { now: Some(at(31)) })
            .await
            .unwrap()
            .outbox_pending,
        0
    );
    assert_eq!(env.messages().await.len(), 3);
    env.cleanup().await;
}

async fn a_relay_that_died_after_publishing_is_deduplicated(backend: &str) {
    let Some(env) = Env::new(backend).await else {
        return;
    };
    let s = env.store.as_ref();
    let subject = format!("{}.reports", env.prefix);
    let route = format!("$nats:{subject}");
    let (tenant, ids) = seed(s, "acme", &route, 3, &[10]).await;
    // Relay A claims and publishes, then dies before recording the completion.
    let claimed = s
        .relay_claim(RelayClaim {
            node: "relay-A".into(),
            max: 10,
            lease: SignedDuration::from_secs(5),
            now: Some(at(10)),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    env.js
        .send_publish(
            subject.clone(),
            jetstream::message::PublishMessage::build()
                .payload("{}".into())
                .message_id(ids[0].to_string()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // Relay B sees nothing inside A's lease, then re-delivers; the stream drops the copy.
    let b = env.relay("relay-B");
    assert_eq!(b.step(Some(at(14))).await.unwrap().claimed, 0);
    let r = b.step(Some(at(15))).await.unwrap();
    assert_eq!((r.claimed, r.published, r.duplicates), (1, 1, 1));
    assert_eq!(
        env.messages().await.len(),
        1,
        "exactly one message in the stream"
    );
    let d = detail(s, tenant, ids[0], at(16)).await;
    assert_eq!(d.occurrence.state, OccurrenceState::Succeeded);
    assert_eq!(d.occurrence.owner.as_deref(), Some("relay-B"));
    // A, back from the dead, cannot overwrite B's result.
    let acks = s
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant,
            worker_id: "relay-A".into(),
            items: vec![FinishItem {
                lease: LeaseRef {
                    occurrence_id: ids[0],
                    epoch: claimed[0].claim.epoch,
                },
                finish: Finish::Succeeded {
                    result: Some("{\"by\":\"A\"}".into()),
                },
            }],
            now: Some(at(16)),
        })
        .await
        .unwrap();
    assert_eq!(acks[0].rows, 0);
    let d = detail(s, tenant, ids[0], at(16)).await;
    let result: serde_json::Value =
        serde_json::from_str(d.occurrence.result.as_deref().unwrap()).unwrap();
    assert_eq!(result["duplicate"], true);
    env.cleanup().await;
}

async fn a_subject_without_a_stream_backs_off_then_dead_letters(backend: &str) {
    let Some(env) = Env::new(backend).await else {
        return;
    };
    let s = env.store.as_ref();
    // Outside the test stream's subjects: no stream takes it.
    let route = format!("$nats:campanile.nostream.{}", Uuid::now_v7().simple());
    let (tenant, ids) = seed(s, "acme", &route, 2, &[10]).await;
    let relay = env.relay("relay-1");
    let r = relay.step(Some(at(10))).await.unwrap();
    assert_eq!((r.claimed, r.published, r.failed), (1, 0, 1));
    let d = detail(s, tenant, ids[0], at(10)).await;
    assert_eq!(d.occurrence.state, OccurrenceState::RetryWait);
    let attempt = &d.attempts[0];
    assert_eq!(attempt.error_class, Some(ErrorClass::Transient));
    assert!(
        attempt
            .error_message
            .as_deref()
            .unwrap_or("")
            .contains("publish to $nats:campanile.nostream"),
        "{:?}",
        attempt.error_message
    );
    // After the back-off (at most 1 s here) the second and last attempt fails too: DEAD.
    let r = relay.step(Some(at(12))).await.unwrap();
    assert_eq!((r.claimed, r.failed), (1, 1));
    let d = detail(s, tenant, ids[0], at(12)).await;
    assert_eq!(d.occurrence.state, OccurrenceState::Dead);
    assert_eq!(relay.step(Some(at(13))).await.unwrap().claimed, 0);
    assert_eq!(
        s.backlog(BacklogGet { now: Some(at(13)) })
            .await
            .unwrap()
            .outbox_pending,
        0
    );
    env.cleanup().await;
}

/// A TCP proxy in front of the NATS server, so a test can cut the relay's connection (a broker
/// outage) or freeze it (a broker that stops answering but keeps the socket open) without
/// touching the shared server. Send `FREEZE` to freeze; drop the sender to cut.
async fn proxy(listen: std::net::SocketAddr, upstream: String) -> tokio::sync::watch::Sender<u8> {
    let (ctl, rx) = tokio::sync::watch::channel(0u8);
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    tokio::spawn(async move {
        let mut rx_accept = rx.clone();
        loop {
            tokio::select! {
                got = listener.accept() => {
                    let Ok((mut inbound, _)) = got else { return };
                    let upstream = upstream.clone();
                    let mut rx_conn = rx.clone();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else { return };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            changed = rx_conn.changed() => {
                                if changed.is_ok() && *rx_conn.borrow() == FREEZE {
                                    // Hold both sockets open and forward nothing, for ever.
                                    let _held = (inbound, outbound);
                                    std::future::pending::<()>().await;
                                }
                            }
                        }
                    });
                }
                changed = rx_accept.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    });
    ctl
}

const FREEZE: u8 = 1;

fn local_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

async fn a_broker_that_stops_answering_costs_one_attempt_within_the_lease(backend: &str) {
    let Some(env) = Env::new(backend).await else {
        return;
    };
    let s = env.store.as_ref();
    let nats = std::env::var("CAMPANILE_TEST_NATS_URL").unwrap();
    let addr = local_addr();
    let ctl = proxy(addr, nats.trim_start_matches("nats://").to_string()).await;
    let client = campanile_relay::connect(&format!("nats://{addr}"))
        .await
        .unwrap();
    let mut cfg = RelayConfig::new("relay-1");
    cfg.lease = SignedDuration::from_secs(5);
    let relay = Relay::new(env.store.clone(), client, cfg);
    let route = format!("$nats:{}.frozen", env.prefix);
    let (tenant, ids) = seed(s, "acme", &route, 3, &[10, 11, 12]).await;
    ctl.send(FREEZE).unwrap();
    // The messages go out and no acknowledgement ever comes back: the batch gives up inside
    // the lease and records a transient failure for each, instead of waiting per message.
    let started = std::time::Instant::now();
    let r = relay.step(Some(at(20))).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited {:?}, past the 5 s lease",
        started.elapsed()
    );
    assert_eq!((r.claimed, r.published, r.failed, r.stale), (3, 0, 3, 0));
    for id in &ids {
        let d = detail(s, tenant, *id, at(20)).await;
        assert_eq!(d.occurrence.state, OccurrenceState::RetryWait);
        let msg = d.attempts[0].error_message.clone().unwrap_or_default();
        assert!(msg.contains("no acknowledgement"), "{msg}");
    }
    env.cleanup().await;
}

async fn a_nats_outage_pauses_the_relay_without_burning_attempts(backend: &str) {
    let Some(env) = Env::new(backend).await else {
        return;
    };
    let s = env.store.as_ref();
    let nats = std::env::var("CAMPANILE_TEST_NATS_URL").unwrap();
    let upstream = nats.trim_start_matches("nats://").to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cut = proxy(addr, upstream.clone()).await;
    let client = campanile_relay::connect(&format!("nats://{addr}"))
        .await
        .unwrap();
    let mut cfg = RelayConfig::new("relay-1");
    cfg.lease = SignedDuration::from_secs(5);
    let relay = Relay::new(env.store.clone(), client.clone(), cfg);
    let subject = format!("{}.outage", env.prefix);
    let (tenant, ids) = seed(s, "acme", &format!("$nats:{subject}"), 2, &[10, 11]).await;

    // The broker goes away: the relay claims nothing, however often it tries.
    drop(cut);
    let start = std::time::Instant::now();
    while client.connection_state() == async_nats::connection::State::Connected {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the client never noticed the cut"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in [20, 30, 40] {
        let r = relay.step(Some(at(t))).await.unwrap();
        assert!(r.paused, "{r:?}");
        assert_eq!(r.claimed, 0);
    }
    for id in &ids {
        let d = detail(s, tenant, *id, at(40)).await;
        assert_eq!(
            (d.occurrence.state, d.attempts.len()),
            (OccurrenceState::Ready, 0)
        );
    }
    // It comes back: the client reconnects and both are delivered on their first attempt.
    let _back = proxy(addr, upstream).await;
    let start = std::time::Instant::now();
    while client.connection_state() != async_nats::connection::State::Connected {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the client never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = relay.step(Some(at(50))).await.unwrap();
    assert_eq!((r.paused, r.claimed, r.published), (false, 2, 2));
    for id in &ids {
        let d = detail(s, tenant, *id, at(51)).await;
        assert_eq!(
            (d.occurrence.state, d.attempts.len()),
            (OccurrenceState::Succeeded, 1)
        );
    }
    assert_eq!(env.messages().await.len(), 2);
    env.cleanup().await;
}

macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name("sqlite").await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name("postgres").await;
            }
        }
    };
}

/// A relay in a node whose liveness mark lapsed claims nothing (as the node's API hands out
/// no work): due deliveries wait, no attempt is spent, and they go once it is live again.
async fn a_relay_claims_nothing_while_its_node_is_not_live(backend: &str) {
    let Some(env) = Env::new(backend).await else {
        return;
    };
    let s = env.store.as_ref();
    let route = format!("$nats:{}.live", env.prefix);
    let (tenant, ids) = seed(s, "acme", &route, 1, &[10]).await;
    let live = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = live.clone();
    let relay = env
        .relay("relay-1")
        .with_liveness(campanile_relay::Liveness(std::sync::Arc::new(move || {
            flag.load(std::sync::atomic::Ordering::SeqCst)
        })));
    let r = relay.step(Some(at(10))).await.unwrap();
    assert!(r.paused && r.claimed == 0, "{r:?}");
    let d = detail(s, tenant, ids[0], at(10)).await;
    assert_eq!(d.occurrence.state, OccurrenceState::Ready);
    assert!(d.attempts.is_empty());
    live.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = relay.step(Some(at(11))).await.unwrap();
    assert_eq!((r.claimed, r.published), (1, 1), "{r:?}");
    env.cleanup().await;
}

both!(delivers_due_occurrences_with_their_id_as_msg_id);
both!(a_relay_claims_nothing_while_its_node_is_not_live);
both!(a_relay_that_died_after_publishing_is_deduplicated);
both!(a_subject_without_a_stream_backs_off_then_dead_letters);
both!(a_nats_outage_pauses_the_relay_without_burning_attempts);
both!(a_broker_that_stops_answering_costs_one_attempt_within_the_lease);
