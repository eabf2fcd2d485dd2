//! The console's logins over HTTP, in process: the cookie's attributes, CSRF on every
//! action, tenant scoping, and a revoked key ending its logins. (The pages themselves are
//! driven in a real browser by the CLI's console test.)

use super::*;
use axum::http::header;

/// Signs in with `key`; returns the login cookie (`name=value`).
async fn sign_in(app: &App, key: &str) -> String {
    let (s, _, h) = app
        .raw(Request::get("/ui/login").body(Body::empty()).unwrap())
        .await;
    assert_eq!(s, StatusCode::OK);
    let login = h[header::SET_COOKIE].to_str().unwrap().to_string();
    let token = login
        .split(';')
        .next()
        .unwrap()
        .split_once('=')
        .unwrap()
        .1
        .to_string();
    let (s, _, h) = app
        .raw(
            Request::post("/ui/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .header("cookie", format!("campanile_login_form={token}"))
                .body(Body::from(format!("key={key}&token={token}")))
                .unwrap(),
        )
        .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let set: Vec<String> = h
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let login = set
        .iter()
        .find(|c| c.starts_with("campanile_login="))
        .unwrap()
        .clone();
    assert!(
        login.contains("HttpOnly") && login.contains("SameSite=Strict"),
        "{login}"
    );
    login.split(';').next().unwrap().to_string()
}

async fn get(app: &App, cookie: &str, path: &str) -> (StatusCode, String, axum::http::HeaderMap) {
    let (s, v, h) = app
        .raw(
            Request::get(path)
                .header("cookie", cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    (s, v.as_str().unwrap_or_default().to_string(), h)
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").unwrap() + 19;
    html[at..at + 64].to_string()
}

#[tokio::test]
async fn console_logins_are_scoped_fenced_against_csrf_and_end_with_their_key() {
    let app = app().await;
    // Not signed in: sent to sign in; a wrong key or a sign-in form from elsewhere is refused.
    let (s, _, h) = get(&app, "", "/ui/schedules").await;
    assert_eq!(
        (s, h[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/ui/login")
    );
    let (s, _, _) = app
        .raw(
            Request::post("/ui/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(format!("key={}&token=forged", app.a)))
                .unwrap(),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "no login cookie: refused");
    let a = sign_in(&app, &app.a).await;
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "q", "every": "1h"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let id = v["id"].as_str().unwrap().to_string();
    let (s, html, h) = get(&app, &a, &format!("/ui/schedules/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
    let csrf = csrf_of(&html);
    let post = |path: String, body: String, cookie: String| {
        Request::post(path)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", cookie)
            .body(Body::from(body))
            .unwrap()
    };
    // Without the login's token: refused, nothing done.
    let (s, _, _) = app
        .raw(post(
            format!("/ui/schedules/{id}/pause"),
            "csrf=wrong".into(),
            a.clone(),
        ))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (_, v) = app
        .call("GET", &format!("/v1/schedules/{id}"), Some(&app.a), None)
        .await;
    assert_eq!(v["state"], "ACTIVE");
    // With it: paused.
    let (s, _, h) = app
        .raw(post(
            format!("/ui/schedules/{id}/pause"),
            format!("csrf={csrf}"),
            a.clone(),
        ))
        .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert!(
        h[header::LOCATION]
            .to_str()
            .unwrap()
            .contains("notice=Paused")
    );
    let (_, v) = app
        .call("GET", &format!("/v1/schedules/{id}"), Some(&app.a), None)
        .await;
    assert_eq!(v["state"], "PAUSED");
    // Another tenant's login: the schedule is not found, and cannot be acted on.
    let b = sign_in(&app, &app.b).await;
    let (s, _, _) = get(&app, &b, &format!("/ui/schedules/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, html_b, _) = get(&app, &b, "/ui/schedules").await;
    let (s, _, _) = app
        .raw(post(
            format!("/ui/schedules/{id}/resume"),
            format!("csrf={}", csrf_of(&html_b)),
            b.clone(),
        ))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Each page renders for a tenant.
    for path in [
        "/ui/",
        "/ui/schedules?state=PAUSED",
        "/ui/occurrences?state=DEAD",
    ] {
        let (s, html, _) = get(&app, &a, path).await;
        assert_eq!(s, StatusCode::OK, "{path}: {html}");
    }
    // A revoked key ends its logins.
    let ka = app
        .store
        .api_key_find(campanile_store::ApiKeyFind {
            hash: campanile_server::hash_key(&app.a),
        })
        .await
        .unwrap()
        .unwrap();
    app.store
        .api_key_revoke(campanile_store::ApiKeyRevoke {
            prefix: ka.prefix.clone(),
            now: None,
        })
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await; // the key cache's TTL
    let (s, _, h) = get(&app, &a, "/ui/").await;
    assert_eq!(
        (s, h[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/ui/login")
    );
}
