//! The web console in a real browser: `campanile serve` on a temporary database, Debian's
//! Chromium driven through chromedriver (WebDriver). Signs in, watches a schedule's occurrence
//! run to SUCCEEDED, opens its attempts, redrives a dead one, pauses the schedule, and checks
//! that another tenant's ids are not found. A screenshot of each page is saved under
//! `target/tmp/console-screenshots/`.
//!
//! Skipped with a notice when chromedriver is not installed, unless
//! `CAMPANILE_TEST_BROWSER=required` (as in CI), where a missing browser fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use campanile_sdk::Client;
use common::free_port;
use fantoccini::{ClientBuilder, Locator};
use serde_json::json;

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromedriver() -> Option<PathBuf> {
    let required = std::env::var("CAMPANILE_TEST_BROWSER").as_deref() == Ok("required");
    let found = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            !required,
            "CAMPANILE_TEST_BROWSER=required but chromedriver is not installed \
             (apt-get install chromium chromium-driver)"
        );
        eprintln!("skipping the console browser test: chromedriver is not installed");
    }
    found
}

fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(b: &fantoccini::Client, name: &str) {
    let png = b.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(shots().join(format!("{name}.png")), png).unwrap();
}

/// Waits until the element `css` exists and its text contains `want`.
async fn text_of(b: &fantoccini::Client, css: &str, want: &str) -> String {
    let start = Instant::now();
    loop {
        if let Ok(e) = b.find(Locator::Css(css)).await
            && let Ok(t) = e.text().await
            && t.contains(want)
        {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{css} never showed {want:?} on {}:\n{}",
            b.current_url().await.unwrap(),
            b.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sign_in(b: &fantoccini::Client, base: &str, key: &str) {
    b.goto(&format!("{base}/ui/")).await.unwrap();
    // Not signed in: sent to the sign-in page.
    assert!(b.current_url().await.unwrap().path().ends_with("/ui/login"));
    b.find(Locator::Id("key"))
        .await
        .unwrap()
        .send_keys(key)
        .await
        .unwrap();
    b.find(Locator::Id("sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_of(b, "h1", "Overview").await;
}

/// Clicks the button `id`, accepts the confirmation it asks for (if it asks), and waits for
/// the next page.
async fn act(b: &fantoccini::Client, id: &str, confirms: bool) {
    b.find(Locator::Id(id))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    if confirms {
        let start = Instant::now();
        while b.accept_alert().await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{id}: no confirmation"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let Some(driver) = chromedriver() else {
        return;
    };
    // The node.
    let node = common::Node::start("console.db");
    let (key, db) = (node.key.clone(), node.db.clone());
    let base = node.url.clone();
    // Another tenant, with a key of its own.
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_campanile"))
            .args(args)
            .arg("--database")
            .arg(&db)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    cli(&["tenant", "create", "other"]);
    let other_key = cli(&["key", "create", "--tenant", "other"]);

    // The browser.
    let wd_port = free_port();
    let _driver = Kill(
        Command::new(driver)
            .arg(format!("--port={wd_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--window-size=1280,1100"]}),
    );
    let start = Instant::now();
    let b = loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{wd_port}"))
            .await
        {
            Ok(b) => break b,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "chromedriver: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };

    // A wrong key is refused on the sign-in page.
    b.goto(&format!("{base}/ui/login")).await.unwrap();
    shot(&b, "1-sign-in").await;
    b.find(Locator::Id("key"))
        .await
        .unwrap()
        .send_keys("cmp_nope")
        .await
        .unwrap();
    b.find(Locator::Id("sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_of(&b, "#login-error", "not valid").await;

    sign_in(&b, &base, &key).await;
    text_of(&b, "#signed-in-as", "default").await;

    // A schedule, made over the API; its occurrences come due every two seconds.
    let api = Client::new(&base, &key).unwrap();
    let made = api
        .create_schedule(
            &json!({"queue": "console", "every": "2s", "payload": {"n": 7},
                                 "retry": {"max_attempts": 1}}),
            None,
        )
        .await
        .unwrap();
    let sid = made["id"].as_str().unwrap().to_string();

    // A worker runs one to SUCCEEDED.
    let claim_one = || async {
        let start = Instant::now();
        loop {
            let got = api.claim("console", "console-worker", 1, 30).await.unwrap();
            if let Some(c) = got.into_iter().next() {
                return c;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nothing came due"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let ok = claim_one().await;
    api.complete(ok.id, "console-worker", ok.epoch, json!({"rows": 42}))
        .await
        .unwrap();

    // The overview counts it.
    b.goto(&format!("{base}/ui/")).await.unwrap();
    text_of(&b, "#finished", "1").await;
    shot(&b, "2-overview").await;

    // The schedules list links to it; its page shows the definition and next fires.
    b.goto(&format!("{base}/ui/schedules")).await.unwrap();
    text_of(&b, "#schedules", &sid).await;
    shot(&b, "3-schedules").await;
    b.find(Locator::Css(&format!("a[href='/ui/schedules/{sid}']")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_of(&b, "#schedule-state", "ACTIVE").await;
    let fires = b
        .find_all(Locator::Css("#next-fires tbody tr"))
        .await
        .unwrap();
    assert_eq!(fires.len(), 10, "ten next fires");
    shot(&b, "4-schedule").await;

    // The succeeded occurrence and its attempt.
    b.goto(&format!("{base}/ui/occurrences/{}", ok.id))
        .await
        .unwrap();
    text_of(&b, "#occurrence-state", "SUCCEEDED").await;
    text_of(&b, "#attempts", "console-worker").await;
    text_of(&b, "#result", "42").await;
    shot(&b, "5-occurrence").await;

    // One fails for good (DEAD), and is redriven from its page.
    let bad = claim_one().await;
    api.fail(
        bad.id,
        "console-worker",
        bad.epoch,
        "permanent",
        "no such customer",
    )
    .await
    .unwrap();
    b.goto(&format!("{base}/ui/occurrences/{}", bad.id))
        .await
        .unwrap();
    text_of(&b, "#occurrence-state", "DEAD").await;
    text_of(&b, "#attempts", "no such customer").await;
    shot(&b, "6-dead").await;
    act(&b, "redrive", true).await;
    text_of(&b, "#notice", "READY").await;
    text_of(&b, "#occurrence-state", "READY").await;

    // The occurrences list, filtered to the schedule.
    b.goto(&format!("{base}/ui/occurrences?schedule={sid}"))
        .await
        .unwrap();
    text_of(&b, "#occurrences", &ok.id.to_string()).await;
    shot(&b, "7-occurrences").await;

    // Pause the schedule from its page.
    b.goto(&format!("{base}/ui/schedules/{sid}")).await.unwrap();
    act(&b, "pause", false).await;
    text_of(&b, "#notice", "Paused").await;
    text_of(&b, "#schedule-state", "PAUSED").await;
    shot(&b, "8-paused").await;
    assert_eq!(
        api.get_schedule(sid.parse().unwrap()).await.unwrap()["state"],
        "PAUSED"
    );

    // Signed out, the console asks to sign in again.
    act(&b, "sign-out", false).await;
    b.goto(&format!("{base}/ui/schedules")).await.unwrap();
    assert!(b.current_url().await.unwrap().path().ends_with("/ui/login"));

    // Another tenant does not see the first one's schedule or occurrences.
    sign_in(&b, &base, &other_key).await;
    text_of(&b, "#signed-in-as", "other").await;
    for path in [
        format!("/ui/schedules/{sid}"),
        format!("/ui/occurrences/{}", ok.id),
    ] {
        b.goto(&format!("{base}{path}")).await.unwrap();
        text_of(&b, "#problem", "Not found").await;
    }
    shot(&b, "9-not-found").await;
    b.goto(&format!("{base}/ui/schedules")).await.unwrap();
    text_of(&b, "#schedules", "No schedule matches").await;
    b.close().await.unwrap();
}
