//! Where a schedule's occurrences go: the built-in queue (claimed over HTTP or the SDK) or an
//! external target fed by the relay from the transactional outbox.
//!
//! An occurrence's `queue` column is its route. A user queue is any name that does not start
//! with `$`; names starting with `$` are reserved for the relay, and `$nats:<subject>` means
//! "publish to this NATS JetStream subject". Keeping the route in the queue column means the
//! HTTP claim path can never hand an externally targeted occurrence to a worker (it refuses
//! reserved names), and no index or table changes shape for it.

use std::fmt;

/// The prefix of reserved queue names.
pub const RESERVED_PREFIX: char = '$';

/// The queue-name prefix of NATS JetStream targets.
pub const NATS_PREFIX: &str = "$nats:";

/// Where occurrences are delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The built-in queue of that name, claimed by workers.
    Queue(String),
    /// Published to a NATS JetStream subject by the relay.
    Nats {
        /// The subject (no wildcards).
        subject: String,
    },
}

/// Why a queue name or target is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TargetError(pub String);

impl Target {
    /// Reads a stored or requested queue name as a target.
    ///
    /// # Errors
    ///
    /// A reserved name that is not a valid `$nats:<subject>`, or a queue name of the wrong
    /// length.
    pub fn from_queue(queue: &str) -> Result<Target, TargetError> {
        if let Some(subject) = queue.strip_prefix(NATS_PREFIX) {
            check_subject(subject)?;
            return Ok(Target::Nats {
                subject: subject.to_string(),
            });
        }
        if queue.starts_with(RESERVED_PREFIX) {
            return Err(TargetError(format!(
                "queue names starting with '{RESERVED_PREFIX}' are reserved; \
                 use target {{\"type\": \"nats\", \"subject\": …}} for NATS"
            )));
        }
        check_queue(queue)?;
        Ok(Target::Queue(queue.to_string()))
    }

    /// The queue name occurrences of this target are stored under.
    #[must_use]
    pub fn queue(&self) -> String {
        match self {
            Target::Queue(q) => q.clone(),
            Target::Nats { subject } => format!("{NATS_PREFIX}{subject}"),
        }
    }

    /// Whether the relay delivers it (not a worker).
    #[must_use]
    pub fn is_external(&self) -> bool {
        !matches!(self, Target::Queue(_))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.queue())
    }
}

/// Whether a queue name is one of the relay's (reserved) routes.
#[must_use]
pub fn is_reserved_queue(queue: &str) -> bool {
    queue.starts_with(RESERVED_PREFIX)
}

/// Whether workers may claim from `queue`: not a relay's reserved queue, and a name some
/// schedule could target (not empty, no NUL, at most 200 bytes). A looser rule than creation's
/// ([`Target::from_queue`]): a worker polling a name no schedule can have is misconfigured and
/// hears so, rather than wait forever.
///
/// # Errors
///
/// What makes `queue` one no worker can claim from.
pub fn check_claimable_queue(queue: &str) -> Result<(), TargetError> {
    if is_reserved_queue(queue) {
        return Err(TargetError(format!(
            "queue {queue:?} is reserved: the relay delivers its occurrences, workers cannot \
             claim them"
        )));
    }
    if queue.is_empty() || queue.contains('\0') {
        return Err(TargetError(format!(
            "queue {queue:?}: no schedule can target an empty queue name or one with NUL"
        )));
    }
    if queue.len() > 200 {
        return Err(TargetError(format!(
            "queue names are at most 200 bytes ({} given): no schedule can target this queue",
            queue.len()
        )));
    }
    Ok(())
}

/// Invisible format characters: a name holding one looks like another name without it (the
/// soft hyphen, zero-width spaces and joiners, bidirectional controls, the word joiner and
/// invisible operators, the byte-order mark).
fn is_invisible(c: char) -> bool {
    // U+2028/U+2029 (line and paragraph separators) break lines like a newline does.
    matches!(c,
        '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}' | '\u{feff}')
}

/// A queue name is printable: control characters (NUL, newline, …), invisible format
/// characters and leading or trailing whitespace make a name a worker can only claim by
/// percent-encoding what it cannot see.
fn check_queue(queue: &str) -> Result<(), TargetError> {
    if queue.trim().is_empty() || queue.len() > 200 {
        return Err(TargetError(
            "queue must be 1 to 200 bytes (UTF-8) and not blank".into(),
        ));
    }
    if queue.chars().any(char::is_control) {
        return Err(TargetError(format!(
            "queue {queue:?} contains control characters"
        )));
    }
    if let Some(c) = queue.chars().find(|c| is_invisible(*c)) {
        return Err(TargetError(format!(
            "queue {queue:?} contains the invisible character U+{:04X}",
            u32::from(c)
        )));
    }
    if queue.trim() != queue {
        return Err(TargetError(format!(
            "queue {queue:?} starts or ends with whitespace"
        )));
    }
    Ok(())
}

/// A NATS subject one can publish to: dot-separated non-empty tokens of printable characters
/// without whitespace or wildcards, at most 190 bytes (so the route fits a queue name).
fn check_subject(subject: &str) -> Result<(), TargetError> {
    if subject.is_empty() || subject.len() > 190 {
        return Err(TargetError(
            "target.subject must be 1 to 190 bytes (UTF-8)".into(),
        ));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err(TargetError(format!(
                "target.subject {subject:?} has an empty token (leading, trailing or double '.')"
            )));
        }
        if token == "*" || token == ">" || token.contains(['*', '>']) {
            return Err(TargetError(format!(
                "target.subject {subject:?} contains a wildcard; publish subjects must be literal"
            )));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TargetError(format!(
                "target.subject {subject:?} contains whitespace or control characters"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_queues_and_nats_subjects_round_trip() {
        let q = Target::from_queue("emails").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q, Target::Queue("emails".into()));
        assert_eq!(q.queue(), "emails");
        assert!(!q.is_external());
        let n = Target::from_queue("$nats:billing.nightly").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            n,
            Target::Nats {
                subject: "billing.nightly".into()
            }
        );
        assert_eq!(n.queue(), "$nats:billing.nightly");
        assert!(n.is_external());
        assert!(is_reserved_queue(&n.queue()));
    }

    #[test]
    fn reserved_names_and_bad_subjects_are_refused_with_a_reason() {
        for bad in [
            "$other",
            "$",
            "$nats:",
            "$nats:a..b",
            "$nats:.a",
            "$nats:a.*",
            "$nats:a.>",
        ] {
            assert!(Target::from_queue(bad).is_err(), "{bad} accepted");
        }
        let e = Target::from_queue("$nats:a b").err().map(|e| e.0);
        assert!(e.is_some_and(|m| m.contains("whitespace")));
        assert!(Target::from_queue("").is_err());
        for bad in [
            "\u{0}",
            "q\n",
            " q",
            "q ",
            "a\tb",
            "bill\u{200b}ing",
            "\u{feff}q",
            "line\u{2028}break",
            "q\u{202e}",
            "so\u{ad}ft",
        ] {
            let e = Target::from_queue(bad)
                .err()
                .map(|e| e.0)
                .unwrap_or_default();
            assert!(e.contains("queue"), "{bad:?} accepted: {e}");
        }
        assert!(
            Target::from_queue("a/b c").is_ok(),
            "printable names stay valid"
        );
        assert!(
            Target::from_queue("rapports-quotidiens-été").is_ok(),
            "non-ASCII letters stay valid"
        );
        assert!(Target::from_queue(&"x".repeat(201)).is_err());
        assert!(Target::from_queue(&format!("$nats:{}", "x".repeat(191))).is_err());
    }
}
