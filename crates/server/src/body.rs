//! The JSON body extractor: rejections come back in the API's own error format, and the raw
//! bytes are kept for idempotency hashing.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
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

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json") || ct.contains("+json"));
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send JSON with Content-Type: application/json",
            ));
        }
        let raw = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "the request body is larger than the configured limit",
                )
            } else {
                ApiError::bad_request(r.body_text())
            }
        })?;
        let value = parse(&raw)?;
        Ok(JsonBody { value, raw })
    }
}

/// Parses JSON: malformed JSON is a 400, well-formed JSON of the wrong shape a 422 naming the
/// field (`retry.max_attempts: invalid type …`).
pub(crate) fn parse<T: DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(raw);
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
