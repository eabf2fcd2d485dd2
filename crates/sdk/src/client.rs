//! The typed HTTP client.

use jiff::Timestamp;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

/// The API's error body.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ApiErrorBody {
    /// Stable code.
    pub code: String,
    /// Human message.
    pub message: String,
    /// Structured detail (e.g. `{"check": "stale_epoch", …}` for a lease conflict).
    #[serde(default)]
    pub details: Option<Value>,
}

/// A client failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SdkError {
    /// The API answered with an error.
    #[error("{status}: {} ({})", body.message, body.code)]
    Api {
        /// HTTP status.
        status: u16,
        /// The error body.
        body: ApiErrorBody,
    },
    /// The request did not get an answer (connection refused, timeout, …). Retryable.
    #[error("transport: {0}")]
    Transport(String),
    /// The answer was not what the API documents.
    #[error("unexpected response: {0}")]
    Decode(String),
    /// The client was set up wrong (bad base URL, bad key characters).
    #[error("configuration: {0}")]
    Config(String),
}

/// A claim's own key ([`Client::claim_keyed`]). Make a new one for each claim you mean to make;
/// should a claim get no answer (a broken connection, a timeout), send it again with
/// [`ClaimKey::again`]: the server then answers what the first sending claimed, if it did and
/// you still hold it, instead of claiming more work that nobody would run until its lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimKey {
    /// The key.
    pub id: Uuid,
    /// This claim was sent before with this key.
    pub resent: bool,
}

impl ClaimKey {
    /// A new key (a random UUID), for a claim not sent before.
    pub fn new() -> ClaimKey {
        ClaimKey {
            id: Uuid::new_v4(),
            resent: false,
        }
    }

    /// The same key, for the same claim sent again.
    #[must_use]
    pub fn again(self) -> ClaimKey {
        ClaimKey {
            resent: true,
            ..self
        }
    }

    /// Writes the key's fields into a claim's JSON object.
    fn write(key: Option<ClaimKey>, claim: &mut Value) {
        if let (Some(k), Some(obj)) = (key, claim.as_object_mut()) {
            obj.insert("claim_key".into(), json!(k.id));
            if k.resent {
                obj.insert("resent".into(), json!(true));
            }
        }
    }
}

impl Default for ClaimKey {
    fn default() -> ClaimKey {
        ClaimKey::new()
    }
}

impl SdkError {
    /// Whether this is a fencing refusal (409 `lease_conflict`), and which check failed.
    pub fn lease_conflict(&self) -> Option<&str> {
        match self {
            SdkError::Api { status: 409, body } if body.code == "lease_conflict" => {
                body.details.as_ref().and_then(|d| d["check"].as_str())
            }
            _ => None,
        }
    }
}

/// A claimed occurrence.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Claimed {
    /// The occurrence id: the idempotency key of the work.
    pub id: Uuid,
    /// Schedule.
    pub schedule_id: Uuid,
    /// Schedule version.
    pub version: u32,
    /// Planned instant.
    pub scheduled_for: Timestamp,
    /// When it became claimable (the planned instant, moved by a flexible window, a retry's
    /// backoff or catch-up pacing); `None` from a server older than this SDK.
    #[serde(default)]
    pub available_at: Option<Timestamp>,
    /// When the claim was made (server clock); `None` from a server older than this SDK.
    #[serde(default)]
    pub claimed_at: Option<Timestamp>,
    /// Fencing token.
    pub epoch: i64,
    /// Lease end (server clock).
    pub lease_until: Timestamp,
    /// Attempt number.
    pub attempt: u32,
    /// The schedule's payload, exactly as stored.
    #[serde(default)]
    pub payload: Option<crate::Payload>,
}

/// One renewal result.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Renewal {
    /// Occurrence.
    pub occurrence_id: Uuid,
    /// Epoch sent.
    pub epoch: i64,
    /// False: the lease is lost.
    pub renewed: bool,
    /// New lease end.
    #[serde(default)]
    pub lease_until: Option<Timestamp>,
    /// Cancellation was requested.
    pub cancel_requested: bool,
}

/// The outcome of a complete / fail / batch item.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Outcome {
    /// Occurrence.
    pub occurrence_id: Uuid,
    /// `accepted` or `conflict`.
    pub outcome: String,
    /// State after an accepted write; for a `wrong_state` or `not_claimed` conflict, the
    /// state the occurrence is in.
    #[serde(default)]
    pub state: Option<String>,
    /// For conflicts: the failed check. `stale_epoch`, `not_owner`, `lease_expired` and
    /// `not_claimed` (no worker holds the occurrence and this one did not at this epoch: never
    /// claimed, or released by a redrive) all mean the lease is not this worker's; `wrong_state`
    /// means this worker's claim of this epoch has ended otherwise (its outcome was written,
    /// or it was canceled), and `state` says how.
    #[serde(default)]
    pub check: Option<String>,
    /// For conflicts: what happened.
    #[serde(default)]
    pub message: Option<String>,
}

/// A typed client of one tenant's API.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// How a [`Client`] is set up beyond its base URL and key: made by [`Client::builder`].
///
/// An `https://` base URL is reached over TLS (rustls): the server's certificate must chain
/// to one of the platform's trusted roots (on Linux the system's CA bundle; `SSL_CERT_FILE`
/// and `SSL_CERT_DIR` name others) or to a CA added with [`ClientBuilder::ca_pem`], such as
/// the private CA of a proxy in front of the nodes.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    api_key: String,
    ca_pem: Vec<Vec<u8>>,
    timeout: std::time::Duration,
}

impl ClientBuilder {
    /// Trusts the CA certificates of a PEM bundle (one or more `BEGIN CERTIFICATE` blocks)
    /// besides the platform's roots. May be called more than once.
    #[must_use]
    pub fn ca_pem(mut self, pem: impl AsRef<[u8]>) -> ClientBuilder {
        self.ca_pem.push(pem.as_ref().to_vec());
        self
    }

    /// How long one request may take, answer included (default 30 s).
    #[must_use]
    pub fn timeout(mut self, timeout: std::time::Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// The client.
    ///
    /// # Errors
    ///
    /// [`SdkError::Config`] for a base URL that is not http(s), or a CA bundle that holds no
    /// certificate or one that cannot be read.
    pub fn build(self) -> Result<Client, SdkError> {
        let base = self.base_url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SdkError::Config(format!(
                "base URL '{}' must start with http:// or https://",
                self.base_url
            )));
        }
        let mut extra = Vec::new();
        for pem in &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| SdkError::Config(format!("CA bundle: {}", chain(&e))))?;
            if certs.is_empty() {
                return Err(SdkError::Config(
                    "CA bundle: no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
                ));
            }
            extra.extend(certs);
        }
        let http = reqwest::Client::builder()
            .timeout(self.timeout)
            .tls_certs_merge(extra)
            .build()
            .map_err(|e| SdkError::Config(chain(&e)))?;
        Ok(Client {
            http,
            base,
            key: self.api_key,
        })
    }
}

/// An error with its causes, outermost first: reqwest's own message alone ("error sending
/// request for url …") leaves out what went wrong (a refused connection, a certificate the
/// client does not trust).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// A request that got no answer, as [`SdkError::Transport`]; one refused by TLS says what the
/// client trusts and how to trust more.
fn transport(e: &reqwest::Error) -> SdkError {
    let text = chain(e);
    if e.is_connect() && text.contains("certificate") {
        return SdkError::Transport(format!(
            "{text} (TLS: the server's certificate was refused; the client trusts the \
             platform's roots and the CAs given to ClientBuilder::ca_pem)"
        ));
    }
    SdkError::Transport(text)
}

impl Client {
    /// A client for the API at `base_url` (e.g. `http://127.0.0.1:7070`, or `https://…`
    /// trusting the platform's roots) with a tenant key; [`Client::builder`] sets more.
    ///
    /// # Errors
    ///
    /// [`SdkError::Config`] for a base URL that is not http(s).
    pub fn new(base_url: &str, api_key: &str) -> Result<Client, SdkError> {
        Client::builder(base_url, api_key).build()
    }

    /// A [`ClientBuilder`] for the API at `base_url` with a tenant key: to trust a private CA
    /// ([`ClientBuilder::ca_pem`]) or change the request timeout.
    pub fn builder(base_url: &str, api_key: &str) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.to_string(),
            api_key: api_key.to_string(),
            ca_pem: Vec::new(),
            timeout: std::time::Duration::from_secs(30),
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Result<T, SdkError> {
        self.send_text(method, path, body.map(|b| b.to_string()), headers)
            .await
    }

    /// [`Client::send`] with the body as JSON text (a definition whose payload is kept as
    /// written).
    async fn send_text<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> Result<T, SdkError> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b);
        }
        let resp = req.send().await.map_err(|e| transport(&e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
        if status.is_success() {
            serde_json::from_slice(&bytes)
                .map_err(|e| SdkError::Decode(format!("{e}: {}", String::from_utf8_lossy(&bytes))))
        } else {
            let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiErrorBody {
                code: if status == StatusCode::SERVICE_UNAVAILABLE {
                    "unavailable".into()
                } else {
                    "unknown".into()
                },
                message: String::from_utf8_lossy(&bytes).into_owned(),
                details: None,
            });
            Err(SdkError::Api {
                status: status.as_u16(),
                body,
            })
        }
    }

    /// `POST /v1/schedules` with the definition as JSON (see the API docs for fields);
    /// `idempotency_key` makes a retried create safe.
    ///
    /// # Errors
    ///
    /// [`SdkError::Api`] with `validation_failed` for a bad definition, and the others.
    ///
    /// The definition is anything that serializes to the API's JSON: a `serde_json::Value`, or
    /// your own struct, whose payload may be a `serde_json::value::RawValue` to keep numbers a
    /// `Value` would round (`12345678901234567890123`).
    pub async fn create_schedule<D: Serialize + ?Sized>(
        &self,
        definition: &D,
        idempotency_key: Option<&str>,
    ) -> Result<Value, SdkError> {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| vec![("idempotency-key", k)])
            .unwrap_or_default();
        let body = serde_json::to_string(definition)
            .map_err(|e| SdkError::Config(format!("schedule definition: {e}")))?;
        self.send_text(Method::POST, "/v1/schedules", Some(body), &headers)
            .await
    }

    /// `GET /v1/schedules/{id}`.
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`].
    pub async fn get_schedule(&self, id: Uuid) -> Result<Value, SdkError> {
        self.send(Method::GET, &format!("/v1/schedules/{id}"), None, &[])
            .await
    }

    /// `PATCH /v1/schedules/{id}` with the version read.
    ///
    /// # Errors
    ///
    /// `version_conflict` (409) when the schedule changed meanwhile.
    pub async fn update_schedule(
        &self,
        id: Uuid,
        version: u32,
        definition: &Value,
    ) -> Result<Value, SdkError> {
        let mut body = definition.clone();
        body["version"] = json!(version);
        self.send(
            Method::PATCH,
            &format!("/v1/schedules/{id}"),
            Some(body),
            &[],
        )
        .await
    }

    /// `POST /v1/schedules/{id}/{pause|resume|cancel}`.
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`].
    pub async fn schedule_action(&self, id: Uuid, action: &str) -> Result<Value, SdkError> {
        if !matches!(action, "pause" | "resume" | "cancel") {
            return Err(SdkError::Config(format!(
                "unknown schedule action '{action}'"
            )));
        }
        self.send(
            Method::POST,
            &format!("/v1/schedules/{id}/{action}"),
            None,
            &[],
        )
        .await
    }

    /// `GET /v1/occurrences/{id}`: with attempts and result.
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`].
    pub async fn get_occurrence(&self, id: Uuid) -> Result<Value, SdkError> {
        self.send(Method::GET, &format!("/v1/occurrences/{id}"), None, &[])
            .await
    }

    /// `GET /v1/occurrences?…` with a raw query string (`schedule_id=…&state=…`).
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`].
    pub async fn list_occurrences(&self, query: &str) -> Result<Value, SdkError> {
        self.send(Method::GET, &format!("/v1/occurrences?{query}"), None, &[])
            .await
    }

    /// Claims up to `max` due occurrences of `queue`.
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`].
    pub async fn claim(
        &self,
        queue: &str,
        worker_id: &str,
        max: u32,
        lease_seconds: u32,
    ) -> Result<Vec<Claimed>, SdkError> {
        self.claim_keyed(queue, worker_id, max, lease_seconds, None)
            .await
    }

    /// [`Client::claim`] with the claim's own key ([`ClaimKey`]).
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`]; a server older than this SDK refuses the key with 422
    /// (`unknown field`).
    pub async fn claim_keyed(
        &self,
        queue: &str,
        worker_id: &str,
        max: u32,
        lease_seconds: u32,
        key: Option<ClaimKey>,
    ) -> Result<Vec<Claimed>, SdkError> {
        #[derive(Deserialize)]
        struct Out {
            occurrences: Vec<Claimed>,
        }
        let mut body =
            json!({ "worker_id": worker_id, "max": max, "lease_seconds": lease_seconds });
        ClaimKey::write(key, &mut body);
        let out: Out = self
            .send(
                Method::POST,
                &format!("/v1/queues/{queue}/claim"),
                Some(body),
                &[],
            )
            .await?;
        Ok(out.occurrences)
    }

    /// Renews held leases in one call.
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`].
    pub async fn renew(
        &self,
        worker_id: &str,
        leases: &[(Uuid, i64)],
        lease_seconds: u32,
    ) -> Result<Vec<Renewal>, SdkError> {
        #[derive(Deserialize)]
        struct Out {
            leases: Vec<Renewal>,
        }
        let leases: Vec<Value> = leases
            .iter()
            .map(|(id, e)| json!({ "occurrence_id": id, "epoch": e }))
            .collect();
        let body =
            json!({ "worker_id": worker_id, "leases": leases, "lease_seconds": lease_seconds });
        let out: Out = self
            .send(Method::POST, "/v1/leases/renew", Some(body), &[])
            .await?;
        Ok(out.leases)
    }

    /// Completes an occurrence.
    ///
    /// # Errors
    ///
    /// [`SdkError::lease_conflict`] names the failed check when the lease is no longer ours.
    pub async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        epoch: i64,
        result: Value,
    ) -> Result<Outcome, SdkError> {
        let body = json!({ "worker_id": worker_id, "epoch": epoch, "result": result });
        self.send(
            Method::POST,
            &format!("/v1/occurrences/{id}/complete"),
            Some(body),
            &[],
        )
        .await
    }

    /// Reports a failure (`transient` or `permanent`).
    ///
    /// # Errors
    ///
    /// As [`Client::complete`].
    pub async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        epoch: i64,
        class: &str,
        message: &str,
    ) -> Result<Outcome, SdkError> {
        let body =
            json!({ "worker_id": worker_id, "epoch": epoch, "class": class, "message": message });
        self.send(
            Method::POST,
            &format!("/v1/occurrences/{id}/fail"),
            Some(body),
            &[],
        )
        .await
    }

    /// Many outcomes in one request (items as the API documents them).
    ///
    /// # Errors
    ///
    /// As [`Client::create_schedule`]; per-item refusals are in the outcomes.
    pub async fn completions(
        &self,
        worker_id: &str,
        items: Vec<Value>,
    ) -> Result<Vec<Outcome>, SdkError> {
        #[derive(Deserialize)]
        struct Out {
            results: Vec<Outcome>,
        }
        let out: Out = self
            .send(
                Method::POST,
                "/v1/completions",
                Some(json!({ "worker_id": worker_id, "items": items })),
                &[],
            )
            .await?;
        Ok(out.results)
    }

    /// Reports many outcomes, each fenced on its own, and in the same request claims up to
    /// `max` more occurrences of `queue` for the same worker (one round trip instead of two).
    /// The claim comes back empty when nothing is due or the server could not hand out work
    /// right now; the outcomes are recorded either way.
    ///
    /// # Errors
    ///
    /// As [`Client::completions`] and [`Client::claim`]: a refused request writes nothing.
    pub async fn completions_and_claim(
        &self,
        worker_id: &str,
        items: Vec<Value>,
        queue: &str,
        max: u32,
        lease_seconds: u32,
    ) -> Result<(Vec<Outcome>, Vec<Claimed>), SdkError> {
        self.completions_and_claim_keyed(worker_id, items, queue, max, lease_seconds, None)
            .await
    }

    /// [`Client::completions_and_claim`] with the claim's own key ([`ClaimKey`]). Sent again
    /// after no answer, with [`ClaimKey::again`], the outcomes are fenced as any report sent
    /// twice is, and the claim answers what the first sending claimed.
    ///
    /// # Errors
    ///
    /// As [`Client::claim_keyed`].
    pub async fn completions_and_claim_keyed(
        &self,
        worker_id: &str,
        items: Vec<Value>,
        queue: &str,
        max: u32,
        lease_seconds: u32,
        key: Option<ClaimKey>,
    ) -> Result<(Vec<Outcome>, Vec<Claimed>), SdkError> {
        #[derive(Deserialize)]
        struct Out {
            results: Vec<Outcome>,
            #[serde(default)]
            claimed: Vec<Claimed>,
        }
        let mut claim = json!({ "queue": queue, "max": max, "lease_seconds": lease_seconds });
        ClaimKey::write(key, &mut claim);
        let body = json!({
            "worker_id": worker_id,
            "items": items,
            "claim": claim,
        });
        let out: Out = self
            .send(Method::POST, "/v1/completions", Some(body), &[])
            .await?;
        Ok((out.results, out.claimed))
    }

    /// Re-readies a dead letter.
    ///
    /// # Errors
    ///
    /// `wrong_state` (409) when it is not `DEAD`.
    pub async fn redrive(&self, id: Uuid) -> Result<Outcome, SdkError> {
        self.send(
            Method::POST,
            &format!("/v1/occurrences/{id}/redrive"),
            None,
            &[],
        )
        .await
    }
}
