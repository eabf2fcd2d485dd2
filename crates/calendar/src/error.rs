//! The calendar's one error type.

use crate::cron::Field;

/// Why a calendar definition (cron expression, zone, interval, instant) was refused.
///
/// Every variant is a user's mistake, never an internal failure: the server maps them to
/// 400/422 responses and the CLI to exit code 2. Messages name the field and the token that
/// are wrong so that a person can fix the expression without reading the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalendarError {
    /// The expression was empty or only whitespace.
    #[error("cron expression is empty")]
    Empty,
    /// The expression has a number of fields other than 5 or 6.
    #[error(
        "cron expression has {found} field(s); expected 5 (minute hour day-of-month month \
         day-of-week) or 6 (second minute hour day-of-month month day-of-week)"
    )]
    FieldCount {
        /// How many whitespace-separated fields were found.
        found: usize,
    },
    /// An `@` macro that is not one of the supported ones.
    #[error(
        "unknown cron macro '{0}'; expected one of @yearly, @annually, @monthly, @weekly, \
         @daily, @midnight, @hourly"
    )]
    UnknownMacro(String),
    /// One token (a comma-separated element) of one field is invalid.
    #[error("invalid {field} field: token '{token}': {reason}")]
    InvalidToken {
        /// The field the token belongs to.
        field: Field,
        /// The offending token exactly as the user wrote it.
        token: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The expression is well formed but no calendar day can ever match it.
    #[error(
        "cron expression '{0}' can never fire: no date matches its day-of-month, month and \
         day-of-week fields together"
    )]
    NeverFires(String),
    /// The zone name is not in the system's IANA time zone database.
    #[error("unknown time zone '{0}': expected an IANA zone name such as 'Europe/Paris' or 'UTC'")]
    UnknownZone(String),
    /// The zone name is refused on purpose: a file path, or a name a zone database holds that
    /// is not a place's zone (`localtime`, `posixrules`, `Factory`, `posix/…`, `right/…`).
    #[error(
        "time zone '{name}' is not accepted: {reason}; expected an IANA zone name such as \
         'Europe/Paris' or 'UTC'"
    )]
    RefusedZone {
        /// The name as given (cut short if long).
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// An instant that is not RFC 3339 with an offset within `±23:59`.
    #[error("'{text}' is not an RFC 3339 instant: {reason}")]
    InvalidInstant {
        /// The text as given (cut short if long).
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An instant outside the years RFC 3339 can write.
    #[error("{0} is outside the years 0000 to 9999 that RFC 3339 instants can write")]
    InstantOutOfRange(String),
    /// A fixed interval that is zero or negative.
    #[error("interval must be positive, got {0}")]
    NonPositiveInterval(String),
}

/// `text` as an error message quotes it: whole up to 64 characters, else its first 64 and an
/// ellipsis, so that a refusal of a 100 kB name is not 100 kB long.
pub fn echo(text: &str) -> String {
    const MAX: usize = 64;
    match text.char_indices().nth(MAX) {
        None => text.to_string(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

#[cfg(test)]
mod echo_tests {
    #[test]
    fn long_names_are_cut_short_in_messages() {
        assert_eq!(super::echo("Europe/Paris"), "Europe/Paris");
        let long = "é".repeat(100_000);
        let quoted = super::echo(&long);
        assert_eq!(quoted.chars().count(), 65);
        assert!(quoted.ends_with('…'));
    }
}
