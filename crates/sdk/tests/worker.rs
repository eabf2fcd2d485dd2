//! The worker loop against the real API (in process, on a loopback port, embedded SQLite).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use campanile_planner::{Planner, PlannerConfig};
use campanile_sdk::{Client, Job, JobError, Worker, WorkerConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantCreate};
use campanile_store_sqlite::SqliteStore;
use serde_json::{Value, json};

/// Requests served, by path kind.
type Counts = Arc<Mutex<HashMap<&'static str, u32>>>;

struct Api {
    client: Client,
    store: Arc<dyn Store>,
    counts: Counts,
    /// Reports to answer with 503 (as a node whose database is away would) before passing
    /// them on.
    refuse_reports: Arc<AtomicU32>,
    /// Answer reports that claim as a server older than the SDK does (422, unknown field).
    old_server: Arc<AtomicBool>,
    /// Reports to write and then lose the answer of (the connection breaks mid-answer, as
    /// when a node or the network fails between the commit and the reply).
    lose_answers: Arc<AtomicU32>,
    /// The same for plain claims.
    lose_claim_answers: Arc<AtomicU32>,
    /// Refuse claim keys as a server older than the SDK does (422, unknown field).
    no_claim_keys: Arc<AtomicBool>,
    /// Requests passed on to the API that carried a claim's key.
    keyed: Arc<AtomicU32>,
    /// Reports passed on to the API that carried a claim.
    claiming_reports: Arc<AtomicU32>,
    _dir: tempfile::TempDir,
}

async fn api() -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("w.db")).unwrap());
    let t = store
        .tenant_create(TenantCreate {
            name: "t".into(),
            now: None,
        })
        .await
        .unwrap();
    let key = issue_key(store.as_ref(), Some(t.id), false).await.unwrap();
    let cfg = ServerConfig::default();
    let counts: Counts = Arc::default();
    let refuse_reports = Arc::new(AtomicU32::new(0));
    let old_server = Arc::new(AtomicBool::new(false));
    let lose_answers = Arc::new(AtomicU32::new(0));
    let lose_claim_answers = Arc::new(AtomicU32::new(0));
    let no_claim_keys = Arc::new(AtomicBool::new(false));
    let keyed = Arc::new(AtomicU32::new(0));
    let claiming_reports = Arc::new(AtomicU32::new(0));
    let (passed_keyed, passed_claiming) = (keyed.clone(), claiming_reports.clone());
    let (seen, refuse, old, lose, lose_claims, keyless) = (
        counts.clone(),
        refuse_reports.clone(),
        old_server.clone(),
        lose_answers.clone(),
        lose_claim_answers.clone(),
        no_claim_keys.clone(),
    );
    let app = router(AppState::new(store.clone(), &cfg, None), &cfg).layer(middleware::from_fn(
        move |req: Request, next: Next| {
            let kind = match req.uri().path() {
                p if p.ends_with("/claim") => "claim",
                "/v1/completions" => "completions",
                p if p.ends_with("/complete") || p.ends_with("/fail") => "one outcome",
                _ => "other",
            };
            *seen.lock().unwrap().entry(kind).or_default() += 1;
            let refused = kind == "completions" && take_one(&refuse);
            let old = kind == "completions" && old.load(Ordering::SeqCst);
            let lost = (kind == "completions" && take_one(&lose))
                || (kind == "claim" && take_one(&lose_claims));
            let keyless = keyless.load(Ordering::SeqCst);
            let (passed_keyed, passed_claiming) = (passed_keyed.clone(), passed_claiming.clone());
            async move {
                let (parts, body) = req.into_parts();
                let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                let text = String::from_utf8_lossy(&bytes);
                let (has_key, has_claim) = (text.contains("\"claim_key\""), text.contains("\"claim\""));
                if keyless && has_key {
                    let body = json!({"code": "validation_failed",
                        "message": "unknown field `claim_key`, expected one of `queue`, `max`, `lease_seconds`"});
                    return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response();
                }
                if old && has_claim {
                    let body = json!({"code": "validation_failed",
                        "message": "unknown field `claim`, expected `worker_id` or `items`"});
                    return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response();
                }
                if has_key {
                    passed_keyed.fetch_add(1, Ordering::SeqCst);
                }
                if kind == "completions" && has_claim {
                    passed_claiming.fetch_add(1, Ordering::SeqCst);
                }
                let req = Request::from_parts(parts, axum::body::Body::from(bytes));
                if lost {
                    // Written, then the answer's body breaks off: the client sees no answer.
                    let written = next.run(req).await;
                    assert_eq!(written.status(), StatusCode::OK);
                    let broken = futures_util::stream::once(async {
                        Err::<axum::body::Bytes, _>(std::io::Error::other("answer lost"))
                    });
                    return (StatusCode::OK, axum::body::Body::from_stream(broken)).into_response();
                }
                if refused {
                    let body = json!({"code": "unavailable", "message": "database unavailable"});
                    return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
                }
                next.run(req).await
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Api {
        client: Client::new(&url, &key).unwrap(),
        store,
        counts,
        refuse_reports,
        old_server,
        lose_answers,
        lose_claim_answers,
        no_claim_keys,
        keyed,
        claiming_reports,
        _dir: dir,
    }
}

/// Takes one from a countdown of reports to mistreat: false once it is at zero.
fn take_one(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl Api {
    /// `n` one-offs due now on queue `q`, planned.
    async fn due(&self, n: usize) {
        let at = jiff::Timestamp::now().to_string();
        for i in 0..n {
            self.client
                .create_schedule(
                    &json!({"queue": "q", "at": at, "payload": {"i": i},
                            "misfire": {"policy": "fire_once", "max_lateness_seconds": 600}}),
                    None,
                )
                .await
                .unwrap();
        }
        let mut cfg = PlannerConfig::new("test");
        cfg.shards = ServerConfig::default().shards;
        Planner::new(self.store.clone(), cfg)
            .tick(None)
            .await
            .unwrap();
    }

    async fn in_state(&self, state: &str) -> usize {
        let v = self
            .client
            .list_occurrences(&format!("state={state}&limit=1000"))
            .await
            .unwrap();
        v["occurrences"].as_array().unwrap().len()
    }

    /// Waits (30 s at most) until `n` occurrences have succeeded.
    async fn succeeded(&self, n: usize) {
        let drained = async {
            while self.in_state("SUCCEEDED").await < n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), drained)
            .await
            .expect("every outcome lands");
    }

    fn count(&self, kind: &str) -> u32 {
        self.counts.lock().unwrap().get(kind).copied().unwrap_or(0)
    }
}

fn config(concurrency: usize) -> WorkerConfig {
    let mut cfg = WorkerConfig::new("q", "w");
    cfg.concurrency = concurrency;
    cfg.batch = 1;
    cfg.idle_poll = Duration::from_millis(50);
    cfg
}

/// Each handler's report claims the occurrence that takes its place, so a worker draining a
/// backlog makes one request per occurrence, not two: failures too, each recorded as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_report_claims_its_successor() {
    let api = api().await;
    api.due(40).await;
    let worker = Worker::new(api.client.clone(), config(2));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(async move {
        worker
            .run(
                |job: Job| async move {
                    match job
                        .payload
                        .as_ref()
                        .and_then(|p| p.parse::<Value>().ok()?["i"].as_u64())
                    {
                        Some(i) if i % 10 == 3 => Err(JobError::Permanent(format!("no {i}"))),
                        _ => Ok(json!({"ok": true})),
                    }
                },
                stopped,
            )
            .await
    });
    let drained = async {
        while api.in_state("SUCCEEDED").await + api.in_state("DEAD").await < 40 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the worker drains the backlog");
    let (claims, reports) = (api.count("claim"), api.count("completions"));
    stop.send(true).unwrap();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.completed, report.failed), (36, 4), "{report:?}");
    assert_eq!(api.in_state("DEAD").await, 4);
    assert_eq!(reports, 40, "one report per occurrence");
    assert_eq!(api.count("one outcome"), 0);
    // Plain claims only to fill the slots at the start and to poll once a report found the
    // queue empty (each idle poll of two slots is one claim).
    assert!(
        claims < 10,
        "{claims} claims for 40 occurrences: reports did not claim"
    );
}

/// A worker shutting down reports without claiming, and runs to the end what a report
/// claimed just before: nothing it leased is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_shutting_down_leaves_nothing_running() {
    let api = api().await;
    api.due(60).await;
    let worker = Worker::new(api.client.clone(), config(4));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(async move {
        worker
            .run(
                |_job: Job| async move {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    Ok::<Value, JobError>(json!(1))
                },
                stopped,
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(120)).await;
    stop.send(true).unwrap();
    let report = run.await.unwrap().unwrap();
    assert!(report.completed > 0 && report.completed < 60, "{report:?}");
    assert_eq!(api.in_state("RUNNING").await, 0, "{report:?}");
    assert_eq!(api.in_state("SUCCEEDED").await as u64, report.completed);
    assert_eq!(
        api.in_state("READY").await as u64,
        60 - report.completed,
        "the rest are still there to claim"
    );
}

/// Runs `worker` with a handler that succeeds until `n` occurrences have succeeded (30 s at
/// most), then shuts it down; its report.
async fn succeed_all(api: &Api, worker: Worker, n: usize) -> campanile_sdk::WorkerReport {
    let (stop, run) = run_succeeding(worker);
    api.succeeded(n).await;
    stop.send(true).unwrap();
    run.await.unwrap().unwrap()
}

/// Runs `worker` with a handler that succeeds at once, until the sender is told to stop.
fn run_succeeding(
    worker: Worker,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<campanile_sdk::WorkerReport, campanile_sdk::SdkError>>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(async move {
        worker
            .run(
                |_job: Job| async move { Ok::<Value, JobError>(json!(1)) },
                stopped,
            )
            .await
    });
    (stop, run)
}

/// A report the server could not take (503: its database away, the node starting) is sent
/// again within the lease rather than lost, which would run the occurrence a second time
/// once the lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_refused_with_503_is_sent_again() {
    let api = api().await;
    api.due(5).await;
    api.refuse_reports.store(3, Ordering::SeqCst);
    let worker = Worker::new(api.client.clone(), config(1));
    let report = succeed_all(&api, worker, 5).await;
    assert_eq!((report.completed, report.refused), (5, 0), "{report:?}");
    assert_eq!(
        api.count("completions"),
        5 + 3,
        "three reports were sent twice"
    );
    assert_eq!(api.in_state("RUNNING").await, 0);
}

/// A report written whose answer was lost is sent again, and the refusal it then gets (the
/// occurrence is already SUCCEEDED, at the worker's own epoch) is read as what it is: the
/// outcome was written. It is counted as completed, not as refused to a successor. One
/// occurrence only: the lost report's claim finds nothing, so nothing is left leased to a
/// worker that never heard of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_whose_answer_was_lost_counts_as_written() {
    let api = api().await;
    api.due(1).await;
    api.lose_answers.store(1, Ordering::SeqCst);
    let worker = Worker::new(api.client.clone(), config(1));
    let report = succeed_all(&api, worker, 1).await;
    assert_eq!(
        api.count("completions"),
        2,
        "the report was sent again after its answer was lost"
    );
    assert_eq!((report.completed, report.refused), (1, 0), "{report:?}");
    assert_eq!(api.in_state("RUNNING").await, 0);
}

/// `config(concurrency)` with leases far longer than any test waits: an occurrence leased to
/// the worker without its knowing would not run again within the test.
fn long_leases(concurrency: usize) -> WorkerConfig {
    let mut cfg = config(concurrency);
    cfg.lease_seconds = 600;
    cfg
}

/// How many occurrences are in `state` having used exactly one attempt.
async fn first_attempts(api: &Api, state: &str) -> usize {
    let v = api
        .client
        .list_occurrences(&format!("state={state}&limit=1000"))
        .await
        .unwrap();
    v["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["attempt_count"] == 1)
        .count()
}

/// A report whose answer was lost had claimed the next occurrence: sent again with its claim
/// key, it gets that occurrence back, and the worker runs it at once, on its first attempt.
/// Before claim keys it lay leased to a worker that never heard of it until the lease ended
/// (here 10 minutes: the test would time out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_whose_answer_was_lost_gets_what_it_claimed() {
    let api = api().await;
    api.due(3).await;
    api.lose_answers.store(1, Ordering::SeqCst);
    let worker = Worker::new(api.client.clone(), long_leases(1));
    let report = succeed_all(&api, worker, 3).await;
    assert_eq!((report.completed, report.refused), (3, 0), "{report:?}");
    assert_eq!(
        api.count("completions"),
        4,
        "one report was sent twice, each claiming the next occurrence"
    );
    assert_eq!(first_attempts(&api, "SUCCEEDED").await, 3);
}

/// The same for a plain claim whose answer was lost: sent again, it gets what it claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_gets_what_it_claimed() {
    let api = api().await;
    api.due(2).await;
    api.lose_claim_answers.store(1, Ordering::SeqCst);
    let mut cfg = long_leases(2);
    cfg.batch = 2;
    let worker = Worker::new(api.client.clone(), cfg);
    let report = succeed_all(&api, worker, 2).await;
    assert_eq!((report.completed, report.refused), (2, 0), "{report:?}");
    assert_eq!(first_attempts(&api, "SUCCEEDED").await, 2);
}

/// Against a server that takes no claim keys (older than the SDK: 422, unknown field,
/// nothing written), the worker claims without them: every outcome lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_takes_no_claim_keys_still_gets_every_outcome() {
    let api = api().await;
    api.due(6).await;
    api.no_claim_keys.store(true, Ordering::SeqCst);
    let worker = Worker::new(api.client.clone(), config(2));
    let report = succeed_all(&api, worker, 6).await;
    assert_eq!((report.completed, report.refused), (6, 0), "{report:?}");
}

/// Against a server older than the SDK (it refuses a report that claims, writing nothing),
/// the worker reports on its own and claims apart: every outcome lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_takes_no_claim_with_reports_still_gets_every_outcome() {
    let api = api().await;
    api.due(6).await;
    api.old_server.store(true, Ordering::SeqCst);
    let worker = Worker::new(api.client.clone(), config(2));
    let report = succeed_all(&api, worker, 6).await;
    assert_eq!((report.completed, report.refused), (6, 0), "{report:?}");
}

/// A field an older server refused is tried again once `recheck_refused` has passed: behind a
/// load balancer during a rolling upgrade the next request may reach an upgraded node, and one
/// old node must not cost the worker its claim keys, or its reports' claims, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_an_old_server_refused_are_tried_again_after_it_is_upgraded() {
    let api = api().await;
    api.no_claim_keys.store(true, Ordering::SeqCst);
    api.old_server.store(true, Ordering::SeqCst);
    let mut cfg = config(2);
    cfg.recheck_refused = Duration::from_millis(300);
    let (stop, run) = run_succeeding(Worker::new(api.client.clone(), cfg));
    api.due(4).await;
    api.succeeded(4).await;
    let passed = || {
        (
            api.keyed.load(Ordering::SeqCst),
            api.claiming_reports.load(Ordering::SeqCst),
        )
    };
    assert_eq!(passed(), (0, 0), "the old server took neither field");
    // The node behind the address is upgraded; the worker keeps running.
    api.no_claim_keys.store(false, Ordering::SeqCst);
    api.old_server.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    api.due(4).await;
    api.succeeded(8).await;
    let (keyed, claiming) = passed();
    assert!(keyed > 0, "claims carry keys again");
    assert!(claiming > 0, "reports carry claims again");
    stop.send(true).unwrap();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.completed, report.refused), (8, 0), "{report:?}");
}

/// A payload reaches the handler as it was written, digit for digit, also when the schedule
/// was created through the client from the caller's own definition type: numbers no `f64`
/// holds are not rounded on the way. (Not `1e400` here: the client answers a create with the
/// schedule as a `serde_json::Value`, which cannot hold it; the API test
/// `payloads_and_results_keep_every_digit` covers it over HTTP, and `Payload`'s unit test in
/// the handler's type.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_reach_handlers_digit_for_digit() {
    #[derive(serde::Serialize)]
    struct Definition<'a> {
        queue: &'a str,
        at: String,
        payload: &'a serde_json::value::RawValue,
    }
    let api = api().await;
    let text = r#"{"n":12345678901234567890123,"d":0.1000000000000000000000001}"#;
    let payload = serde_json::value::RawValue::from_string(text.into()).unwrap();
    api.client
        .create_schedule(
            &Definition {
                queue: "q",
                at: (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(1)).to_string(),
                payload: &payload,
            },
            None,
        )
        .await
        .unwrap();
    let mut cfg = PlannerConfig::new("test");
    cfg.shards = ServerConfig::default().shards;
    Planner::new(api.store.clone(), cfg)
        .tick(Some(
            jiff::Timestamp::now() + jiff::SignedDuration::from_secs(5),
        ))
        .await
        .unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let worker = Worker::new(api.client.clone(), config(1));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let got = seen.clone();
    let run = tokio::spawn(async move {
        worker
            .run(
                move |job: Job| {
                    let got = got.clone();
                    async move {
                        #[derive(serde::Deserialize)]
                        struct P {
                            n: u128,
                        }
                        let p = job.payload.expect("a payload");
                        assert_eq!(p.parse::<P>().unwrap().n, 12_345_678_901_234_567_890_123);
                        got.lock().unwrap().push(p.as_str().to_owned());
                        Ok::<_, JobError>(json!({"ok": true}))
                    }
                },
                stopped,
            )
            .await
    });
    let ran = async {
        while seen.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), ran)
        .await
        .expect("the occurrence runs");
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![text.to_owned()]);
}
