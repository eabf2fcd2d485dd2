//! The client over TLS: a node (in process, plain HTTP on a loopback port, embedded SQLite)
//! behind a TLS-terminating proxy whose certificate is issued by a CA the test makes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use campanile_planner::{Planner, PlannerConfig};
use campanile_sdk::{Client, Job, JobError, SdkError, Worker, WorkerConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantCreate};
use campanile_store_sqlite::SqliteStore;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

struct Node {
    /// `https://localhost:<port>`: the proxy.
    url: String,
    key: String,
    /// The CA that issued the proxy's certificate, as PEM.
    ca_pem: String,
    store: Arc<dyn Store>,
    /// TLS sessions the proxy completed the handshake of.
    sessions: Arc<AtomicU32>,
    /// Handshakes the proxy saw fail (the client refused the certificate).
    refused: Arc<AtomicU32>,
    _dir: tempfile::TempDir,
}

/// A CA, and a certificate for `localhost` it issued with its key (PKCS#8 DER).
fn certificates() -> (String, rustls::pki_types::CertificateDer<'static>, Vec<u8>) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Campanile test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.der().clone(), key.serialize_der())
}

async fn node_behind_tls() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("tls.db")).unwrap());
    let t = store
        .tenant_create(TenantCreate {
            name: "t".into(),
            now: None,
        })
        .await
        .unwrap();
    let key = issue_key(store.as_ref(), Some(t.id), false).await.unwrap();
    let cfg = ServerConfig::default();
    let app = router(AppState::new(store.clone(), &cfg, None), &cfg);
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = plain.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(plain, app).await });

    let (ca_pem, cert, key_der) = certificates();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sessions, refused) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (counted, failed) = (sessions.clone(), refused.clone());
    // The proxy: TLS in, the same bytes out to the node's plain HTTP port.
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, counted, failed) = (acceptor.clone(), counted.clone(), failed.clone());
            tokio::spawn(async move {
                let mut tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(_) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let mut node = TcpStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut node).await;
            });
        }
    });
    Node {
        url: format!("https://localhost:{port}"),
        key,
        ca_pem,
        store,
        sessions,
        refused,
        _dir: dir,
    }
}

impl Node {
    /// `n` one-offs due now on `queue`, planned.
    async fn due(&self, client: &Client, queue: &str, n: usize) {
        let at = jiff::Timestamp::now().to_string();
        for i in 0..n {
            client
                .create_schedule(
                    &json!({"queue": queue, "at": at, "payload": {"i": i},
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
}

/// With the proxy's CA added, the client claims, renews and completes through TLS, and a
/// worker runs a queue through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_ca_works_through_tls() {
    let node = node_behind_tls().await;
    let client = Client::builder(&node.url, &node.key)
        .ca_pem(&node.ca_pem)
        .build()
        .unwrap();
    node.due(&client, "tls", 1).await;

    let claimed = client.claim("tls", "w", 1, 30).await.unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let c = &claimed[0];
    let renewed = client.renew("w", &[(c.id, c.epoch)], 30).await.unwrap();
    assert!(renewed[0].renewed, "{renewed:?}");
    let done = client
        .complete(c.id, "w", c.epoch, json!({"over": "tls"}))
        .await
        .unwrap();
    assert_eq!(done.outcome, "accepted", "{done:?}");
    let o = client.get_occurrence(c.id).await.unwrap();
    assert_eq!(
        (&o["state"], &o["result"]),
        (&json!("SUCCEEDED"), &json!({"over": "tls"}))
    );

    // A worker through the same proxy: claims, reports that claim, heartbeats.
    node.due(&client, "tls-worker", 3).await;
    let mut cfg = WorkerConfig::new("tls-worker", "tls-w");
    cfg.idle_poll = Duration::from_millis(50);
    cfg.heartbeat = Duration::from_millis(200);
    let worker = Worker::new(client.clone(), cfg);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(async move {
        worker
            .run(
                |job: Job| async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, JobError>(json!({"seen": job.id}))
                },
                stopped,
            )
            .await
    });
    let drained = async {
        loop {
            let v = client
                .list_occurrences("state=SUCCEEDED&limit=100")
                .await
                .unwrap();
            if v["occurrences"].as_array().unwrap().len() == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), drained)
        .await
        .expect("the worker runs every occurrence through TLS");
    stop.send(true).unwrap();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.completed, 3, "{report:?}");
    assert!(node.sessions.load(Ordering::SeqCst) >= 1);
    assert_eq!(node.refused.load(Ordering::SeqCst), 0);
}

/// Without the CA (the platform's roots only), the node is refused with an error that says
/// the certificate is not trusted and how to trust it; nothing reaches the node.
#[tokio::test]
async fn without_the_ca_the_certificate_is_refused_with_a_clear_error() {
    let node = node_behind_tls().await;
    let client = Client::new(&node.url, &node.key).unwrap();
    let err = client
        .create_schedule(&json!({"queue": "q", "every": "1h"}), None)
        .await
        .unwrap_err();
    let SdkError::Transport(text) = &err else {
        panic!("expected a transport error, got {err:?}");
    };
    assert!(text.contains("invalid peer certificate"), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
    assert!(text.contains("ClientBuilder::ca_pem"), "{text}");
    assert_eq!(node.sessions.load(Ordering::SeqCst), 0);
    // The proxy sees the handshake fail once the client's alert reaches it.
    let refused = async {
        while node.refused.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), refused)
        .await
        .expect("the proxy saw the handshake refused");
    eprintln!("the error: {err}");

    // Another CA's certificate does not make the proxy's trusted either.
    let (other_ca, _, _) = certificates();
    let client = Client::builder(&node.url, &node.key)
        .ca_pem(other_ca)
        .build()
        .unwrap();
    let err = client.get_occurrence(uuid::Uuid::nil()).await.unwrap_err();
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    assert_eq!(node.sessions.load(Ordering::SeqCst), 0);
}

/// A CA bundle the client cannot use is refused when the client is built, not at the first
/// request.
#[test]
fn a_ca_bundle_without_a_certificate_is_a_configuration_error() {
    let err = Client::builder("https://localhost:1", "cmp_x")
        .ca_pem("not a certificate")
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, SdkError::Config(m) if m.contains("CA bundle")),
        "{err:?}"
    );
    let err = Client::builder("localhost:1", "cmp_x").build().unwrap_err();
    assert!(matches!(err, SdkError::Config(_)), "{err:?}");
}
