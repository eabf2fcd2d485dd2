//! Payloads exactly as the server stores them.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A schedule's payload as the server stores it: the JSON text it was created with, digit for
/// digit. Parsing it into a `serde_json::Value` on the way in would round what an `f64` cannot
/// hold (`12345678901234567890123`, long decimals) and refuse `1e400`; [`Payload::parse`] lets
/// the handler choose the type that keeps what it needs (`u128`, a decimal type, its own
/// struct).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(Box<RawValue>);

impl Payload {
    /// The JSON text, as stored.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The payload read as `T`.
    ///
    /// # Errors
    /// When the JSON does not fit `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The payload as a `serde_json::Value` (numbers an `f64` cannot hold are rounded).
    ///
    /// # Errors
    /// When a number is out of an `f64`'s range (`1e400`).
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.parse()
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Payload {}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::Payload;

    #[test]
    fn payloads_keep_every_digit() {
        let text = r#"{"n":12345678901234567890123,"d":0.1000000000000000000000001,"big":1e400}"#;
        let p: Payload = serde_json::from_str(text).unwrap();
        assert_eq!(p.as_str(), text);
        #[derive(serde::Deserialize)]
        struct N {
            n: u128,
        }
        assert_eq!(p.parse::<N>().unwrap().n, 12_345_678_901_234_567_890_123);
        assert!(p.to_value().is_err(), "1e400 is out of an f64's range");
        assert_eq!(serde_json::to_string(&p).unwrap(), text);
    }
}
