//! Extractors whose rejections come back in the API's own JSON error format: the JSON body
//! (its raw bytes kept for idempotency hashing), the query string and the path parameters.
//! axum's own extractors answer a malformed query or path with a plain-text 400.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::ApiError;

/// A JSON request body.
#[derive(Debug)]
pub(crate) struct JsonBody<T> {
    /// The parsed value.
    pub(crate) value: T,
    /// The bytes it was parsed from.
    pub(crate) raw: Bytes,
}

/// `application/json` or a `+json` type (`application/merge-patch+json`), with any
/// parameters; media types are case-insensitive. `application/jsonx` is not JSON.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .split_once('/')
            .is_some_and(|(kind, sub)| kind == "application" && sub.ends_with("+json"))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        json_headers(&req)?;
        let raw = read_body(req, state).await?;
        let value = parse(&raw)?;
        Ok(JsonBody { value, raw })
    }
}

/// Refuses a request whose body is not declared as JSON, or is compressed.
fn json_headers(req: &Request) -> Result<(), ApiError> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send JSON with Content-Type: application/json",
        ));
    }
    // A compressed body would be parsed as if it were not: refuse what is not identity.
    if let Some(enc) = req.headers().get(header::CONTENT_ENCODING) {
        let enc = enc.to_str().unwrap_or("?").trim().to_ascii_lowercase();
        if enc != "identity" && !enc.is_empty() {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("Content-Encoding {enc:?} is not accepted: send the JSON uncompressed"),
            ));
        }
    }
    Ok(())
}

/// The request's body, read within the body-read deadline and the size limit.
async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    // A client that declared a body and stops sending it does not hold the request (and
    // the node's shutdown) for longer than the body-read deadline.
    let deadline = req
        .extensions()
        .get::<crate::http::BodyReadTimeout>()
        .map(|t| t.0);
    let read = Bytes::from_request(req, state);
    let read = match deadline {
        Some(deadline) => tokio::time::timeout(deadline, read).await.map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    deadline.as_secs_f64()
                ),
            )
        })?,
        None => read.await,
    };
    read.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is larger than the configured limit",
            )
        } else {
            ApiError::bad_request(r.body_text())
        }
    })
}

/// A JSON request body that may be left out: an empty body is none, whatever its
/// `Content-Type`; anything else is read as a [`JsonBody`].
#[derive(Debug)]
pub(crate) struct OptionalJsonBody<T>(pub(crate) Option<JsonBody<T>>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let declared = req.headers().get(header::CONTENT_TYPE).is_some();
        if declared {
            json_headers(&req)?;
        }
        let raw = read_body(req, state).await?;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        if !declared {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send JSON with Content-Type: application/json, or no body",
            ));
        }
        let value = parse(&raw)?;
        Ok(OptionalJsonBody(Some(JsonBody { value, raw })))
    }
}

/// The query string, parsed into `T`; a malformed one is a JSON 400 naming the parameter.
#[derive(Debug)]
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| QueryParams(q))
            .map_err(|r| ApiError::bad_request(r.body_text()))
    }
}

/// The path parameters, parsed into `T`; one that cannot be (not UTF-8) is a JSON 400.
#[derive(Debug)]
pub(crate) struct PathParams<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(p)| PathParams(p))
            .map_err(|r| ApiError::bad_request(r.body_text()))
    }
}

/// Parses JSON: malformed JSON (including anything after the value) is a 400, well-formed
/// JSON of the wrong shape a 422 naming the field (`retry.max_attempts: invalid type …`).
/// Every body is an object: serde would also take a struct as a positional array, which no
/// client means to send.
pub(crate) fn parse<T: DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    let first = raw
        .iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(b'{') && serde_json::from_slice::<serde::de::IgnoredAny>(raw).is_ok() {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    }
    let de = &mut serde_json::Deserializer::from_slice(raw);
    let value = deserialize(de)?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))?;
    Ok(value)
}

fn deserialize<'de, T: DeserializeOwned>(
    de: &mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data if path == "." => {
                ApiError::invalid(format!("invalid request body: {inner}"))
            }
            serde_json::error::Category::Data => {
                ApiError::invalid(format!("invalid request body at `{path}`: {inner}"))
            }
            _ => ApiError::bad_request(format!("malformed JSON: {inner}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        max_attempts: Option<u32>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        queue: Option<String>,
        retry: Option<Inner>,
    }

    #[test]
    fn a_body_is_one_json_object_and_nothing_else() {
        for (raw, status, needle) in [
            (
                &br#"{"queue": "q"} trailing"#[..],
                StatusCode::BAD_REQUEST,
                "trailing",
            ),
            (
                br#"{"queue": "q"}{"queue": "z"}"#,
                StatusCode::BAD_REQUEST,
                "trailing",
            ),
            (
                br#"[null, null]"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "JSON object",
            ),
            (br#""q""#, StatusCode::UNPROCESSABLE_ENTITY, "JSON object"),
            (b"5", StatusCode::UNPROCESSABLE_ENTITY, "JSON object"),
            (b"nul", StatusCode::BAD_REQUEST, "malformed"),
        ] {
            let e = parse::<Outer>(raw).unwrap_err();
            let shown = String::from_utf8_lossy(raw);
            assert_eq!(e.status(), status, "{shown}: {}", e.message());
            assert!(e.message().contains(needle), "{shown}: {}", e.message());
        }
        assert!(parse::<Outer>(b" {\"queue\": \"q\"}\n").is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse::<Outer>(br#"{"queue": 42}"#).unwrap_err();
        assert!(e.message().contains("`queue`"), "{}", e.message());
        let e = parse::<Outer>(br#"{"retry": {"max_attempts": "three"}}"#).unwrap_err();
        assert!(
            e.message().contains("`retry.max_attempts`"),
            "{}",
            e.message()
        );
        let e = parse::<Outer>(br#"{"queue": "#).unwrap_err();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }
}
