//! Opening the store named by `--database`: a file path (embedded SQLite) or a
//! `postgres://` URL.

use std::sync::Arc;

use campanile_store::{Store, StoreError};
use campanile_store_postgres::{PgOptions, PgStore};
use campanile_store_sqlite::SqliteStore;

use crate::error::CliError;

/// Which backend a `--database` value names.
pub(crate) fn is_postgres(database: &str) -> bool {
    database.starts_with("postgres://") || database.starts_with("postgresql://")
}

/// Opens (and migrates) the store.
pub(crate) async fn open(
    database: &str,
    schema: Option<String>,
) -> Result<Arc<dyn Store>, CliError> {
    if is_postgres(database) {
        let store = PgStore::connect_with(
            database,
            PgOptions {
                schema,
                ..PgOptions::default()
            },
        )
        .await
        .map_err(|e| open_error(format!("cannot open {}: {e}", redact(database)), &e))?;
        Ok(Arc::new(store))
    } else {
        let store = SqliteStore::open(database)
            .map_err(|e| open_error(format!("cannot open {}: {e}", redact(database)), &e))?;
        Ok(Arc::new(store))
    }
}

/// A store that cannot be opened: a malformed URL or name is the user's input (exit 2); an
/// unreachable or failing database is the environment (1).
fn open_error(message: String, e: &StoreError) -> CliError {
    match e {
        StoreError::Invalid(_) => CliError::usage(message),
        _ => CliError::runtime(message),
    }
}

/// What replaces a password in [`redact`]'s answer.
const MASK: &str = "***";

/// A `--database` value as messages and logs show it: every password masked. In a URL
/// (`postgres://user:pw@host/db?password=pw2`), the userinfo's password and the value of any
/// query parameter whose name holds `password` (`sslpassword`, `%70assword` included); in a
/// `key=value` connection string (`host=x password='y z'`), the value of any such key. What
/// is neither (a SQLite path) is shown as given, but for a `password=` in it.
///
/// Masks more rather than less: a password holding an unescaped `@` or `/` is masked whole,
/// and so, at worst, is the host after it.
pub(crate) fn redact(database: &str) -> String {
    match database.find("://") {
        Some(s) => {
            let (scheme, rest) = database.split_at(s + 3);
            let (userinfo, after) = split_userinfo(rest);
            let userinfo = match userinfo {
                None => String::new(),
                Some(u) => match u.split_once(':') {
                    Some((user, _)) => format!("{user}:{MASK}@"),
                    None => format!("{u}@"),
                },
            };
            let after = match after.split_once('?') {
                Some((path, query)) => format!("{path}?{}", redact_query(query)),
                None => after.to_string(),
            };
            format!("{scheme}{userinfo}{after}")
        }
        None => redact_key_values(database),
    }
}

/// A URL's part after `scheme://`, split at its userinfo's `@`: the userinfo (without the
/// `@`), if any, and what follows. PostgreSQL's own parser ends the userinfo at the first
/// `@`; a password with an unescaped `@` (or `/`, `?`) in it means a later one, so the last
/// `@` before the host's end is taken.
fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    let Some(first) = rest.find('@') else {
        return (None, rest);
    };
    let host_end = rest[first..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| first + i);
    match rest[..host_end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// A URL's query with the value of every parameter whose name holds `password` masked.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if names_password(&percent_decoded(key)) => format!("{key}={MASK}"),
            _ => param.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether a parameter's name is (or holds) `password`, in any case.
fn names_password(key: &str) -> bool {
    key.to_ascii_lowercase().contains("password")
}

/// `%XX` escapes decoded (bytes that are not UTF-8 replaced): how PostgreSQL reads a
/// parameter's name.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `key=value` connection string (libpq's other form: whitespace between pairs, spaces
/// around `=` allowed, a value quoted in `'…'` with `\` escapes) with the value of every key
/// that holds `password` masked.
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim_end();
        let key = &key[key.rfind(char::is_whitespace).map_or(0, |i| i + 1)..];
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if !names_password(key) {
            continue;
        }
        let value = rest.trim_start();
        out.push_str(&rest[..rest.len() - value.len()]);
        out.push_str(MASK);
        rest = &value[value_len(value)..];
    }
    out.push_str(rest);
    out
}

/// The length of the value at the start of `text`: up to the closing quote of a quoted one,
/// else up to whitespace; a `\` escapes the character after it.
fn value_len(text: &str) -> usize {
    let quoted = text.starts_with('\'');
    let mut chars = text.char_indices().skip(usize::from(quoted));
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\'' if quoted => return i + 1,
            c if !quoted && c.is_whitespace() => return i,
            _ => {}
        }
    }
    text.len()
}

/// The latest schema version this binary knows for the backend.
pub(crate) fn latest_version(database: &str) -> i64 {
    let migrations = if is_postgres(database) {
        campanile_store_postgres::MIGRATIONS
    } else {
        campanile_store_sqlite::MIGRATIONS
    };
    migrations.last().map_or(0, |m| m.0)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_in_urls_are_masked() {
        for (given, shown) in [
            (
                "postgres://user:pw@host/db?password=pw2",
                "postgres://user:***@host/db?password=***",
            ),
            (
                "postgresql://user:pw@host:5432/db",
                "postgresql://user:***@host:5432/db",
            ),
            ("postgres://:pw@host/db", "postgres://:***@host/db"),
            ("postgres://user@host/db", "postgres://user@host/db"),
            ("postgres://host/db", "postgres://host/db"),
            (
                "postgres://user@host/db?sslmode=disable&password=pw2&application_name=x",
                "postgres://user@host/db?sslmode=disable&password=***&application_name=x",
            ),
            (
                "postgres://host/db?PASSWORD=pw2&%70assword=pw3&sslpassword=pw4",
                "postgres://host/db?PASSWORD=***&%70assword=***&sslpassword=***",
            ),
            (
                "postgres://host?password=pw2",
                "postgres://host?password=***",
            ),
            (
                "postgres://host/db?password=",
                "postgres://host/db?password=***",
            ),
            // An unescaped `@` or `/` in the password: masked whole.
            (
                "postgres://user:p@ss@host/db",
                "postgres://user:***@host/db",
            ),
            (
                "postgres://user:pa/ss@host/db",
                "postgres://user:***@host/db",
            ),
            (
                "postgres://user:pa?ss@host/db",
                "postgres://user:***@host/db",
            ),
            // An `@` in the query is not userinfo.
            (
                "postgres://user@host/db?application_name=a@b",
                "postgres://user@host/db?application_name=a@b",
            ),
            ("nats://user:pw@host:4222", "nats://user:***@host:4222"),
        ] {
            assert_eq!(redact(given), shown, "{given}");
        }
    }

    #[test]
    fn passwords_in_key_value_strings_are_masked() {
        for (given, shown) in [
            ("host=x password=y", "host=x password=***"),
            ("password=y host=x", "password=*** host=x"),
            (
                "host=x password = y dbname=d",
                "host=x password = *** dbname=d",
            ),
            (
                r"host=x password='y z\' w' dbname=d",
                "host=x password=*** dbname=d",
            ),
            ("host=x PassWord=y", "host=x PassWord=***"),
            ("host=x password='unterminated", "host=x password=***"),
            ("host=x password=", "host=x password=***"),
            ("./campanile.db", "./campanile.db"),
            (
                "/var/lib/campanile/campanile.db",
                "/var/lib/campanile/campanile.db",
            ),
        ] {
            assert_eq!(redact(given), shown, "{given}");
        }
    }
}
