//! The web console, served by the node itself under `/ui/`: sign-in with an API key turned
//! into a server-side login (an `HttpOnly`, `SameSite=Strict` cookie naming it), a CSRF token
//! on every form that acts, pages rendered on the server from templates embedded in the
//! binary, and the same tenant scoping as the API: every read and action goes through the
//! store with the login's tenant.

mod logins;
mod pages;
mod svg;

use std::sync::OnceLock;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use campanile_store::TenantId;
use minijinja::Environment;
use serde::Serialize;

use crate::AppState;

pub(crate) use logins::Logins;

/// The login cookie's name.
const COOKIE: &str = "campanile_login";
/// The sign-in form's own token (double-submit: a cookie and a form field that must match).
const LOGIN_COOKIE: &str = "campanile_login_form";

/// The console's routes (merged into the node's router).
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(pages::overview))
        .route("/ui/login", get(pages::login_form).post(pages::login))
        .route("/ui/logout", post(pages::logout))
        .route("/ui/schedules", get(pages::schedules))
        .route("/ui/schedules/{id}", get(pages::schedule))
        .route("/ui/schedules/{id}/{action}", post(pages::schedule_action))
        .route("/ui/occurrences", get(pages::occurrences))
        .route("/ui/occurrences/{id}", get(pages::occurrence))
        .route(
            "/ui/occurrences/{id}/{action}",
            post(pages::occurrence_action),
        )
        .route("/ui/tenants", get(pages::tenants))
        .route("/ui/assets/console.css", get(css))
        .route("/ui/assets/console.js", get(js))
}

async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("assets/console.css"),
    )
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/console.js"),
    )
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

/// The templates, parsed once.
fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        for (name, text) in [
            ("layout.html", include_str!("templates/layout.html")),
            ("login.html", include_str!("templates/login.html")),
            ("overview.html", include_str!("templates/overview.html")),
            ("schedules.html", include_str!("templates/schedules.html")),
            ("schedule.html", include_str!("templates/schedule.html")),
            (
                "occurrences.html",
                include_str!("templates/occurrences.html"),
            ),
            ("occurrence.html", include_str!("templates/occurrence.html")),
            ("tenants.html", include_str!("templates/tenants.html")),
            ("message.html", include_str!("templates/message.html")),
        ] {
            // The templates are part of the binary: one that does not parse is caught by the
            // console's tests, and renders as an error page rather than stopping the node.
            if let Err(e) = env.add_template(name, text) {
                tracing::error!(template = name, error = %e, "console template does not parse");
            }
        }
        env
    })
}

/// A page: `template` rendered with `ctx`, or a plain 500 naming the template if rendering
/// fails (a bug, logged).
fn page<S: Serialize>(status: StatusCode, template: &str, ctx: S) -> Response {
    let rendered = env().get_template(template).and_then(|t| t.render(ctx));
    match rendered {
        Ok(html) => (
            status,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            // The console is never framed (clickjacking) and runs only its own script.
            [
                (header::X_FRAME_OPTIONS, "DENY"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                     script-src 'self'; form-action 'self'; frame-ancestors 'none'; \
                     base-uri 'none'",
                ),
            ],
            html,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(template, error = %e, "console page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the console page {template} failed to render; see the node's log"),
            )
                .into_response()
        }
    }
}

/// The value of cookie `name` in the request, if sent.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// A `Set-Cookie` value: `HttpOnly`, `SameSite=Strict`, for the whole node.
fn set_cookie(name: &str, value: &str, max_age_secs: i64) -> HeaderValue {
    let text = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// The signed-in login of a console request; a request without one is sent to sign in.
#[derive(Debug, Clone)]
pub(crate) struct Signed {
    /// The key's tenant (`None`: an admin key).
    pub(crate) tenant: Option<TenantId>,
    /// Whether the key manages tenants (the API's `is_admin`).
    pub(crate) admin: bool,
    /// The login's CSRF token, which every form that acts carries.
    pub(crate) csrf: String,
    /// What the header shows: the key's prefix and tenant.
    pub(crate) label: String,
}

impl Signed {
    pub(crate) fn is_admin(&self) -> bool {
        self.admin
    }
}

/// Sent to the sign-in page (a 303, so that a form that met an expired login is not
/// resent).
pub(crate) struct SignIn;

impl IntoResponse for SignIn {
    fn into_response(self) -> Response {
        Redirect::to("/ui/login").into_response()
    }
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = SignIn;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Signed, SignIn> {
        let token = cookie(&parts.headers, COOKIE).ok_or(SignIn)?;
        let login = state.logins.get(&token).ok_or(SignIn)?;
        // The key is checked again on every request (through the node's key cache, as the
        // API does): a revoked key ends its logins.
        match crate::auth::find_by_hash(state, login.key_hash.clone()).await {
            Ok(_) => Ok(Signed {
                tenant: login.tenant,
                admin: login.admin,
                csrf: login.csrf.clone(),
                label: login.label.clone(),
            }),
            // Revoked (or gone): the login ends.
            Err(e) if e.status() == StatusCode::UNAUTHORIZED => {
                state.logins.remove(&token);
                Err(SignIn)
            }
            // The database is away for a moment: the login stays; this page cannot be
            // shown (the sign-in page says nothing is wrong with the key).
            Err(_) => Err(SignIn),
        }
    }
}
