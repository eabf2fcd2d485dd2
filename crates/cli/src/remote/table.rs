//! Text layout of the remote commands' answers: tables with a header row and columns
//! aligned by two spaces (as `campanile preview` prints), and `name  value` blocks (as
//! `campanile tenant show`).

use std::fmt::Write as _;

use serde_json::Value;

/// Columns padded to their widest cell, two spaces apart; the last column is not padded.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let width = widths.get(i).copied().unwrap_or(0);
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `name  value` lines, names padded to the longest; a value of several lines continues
/// under the first.
pub(crate) fn block(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (name, value) in pairs {
        let mut lines = value.lines();
        let first = lines.next().unwrap_or("");
        let _ = writeln!(out, "{name:<width$}  {first}");
        for more in lines {
            let _ = writeln!(out, "{:<width$}  {more}", "");
        }
    }
    out
}

/// A field as a cell: strings bare, numbers and booleans as JSON, null or absent as `-`.
pub(crate) fn cell(v: &Value, field: &str) -> String {
    text(v.get(field).unwrap_or(&Value::Null))
}

/// A value as a cell (see [`cell`]); objects and arrays as compact JSON.
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The value at `path` (object fields, outermost first) of the JSON `text`, exactly as
/// written there (a payload or result keeps every digit), or `-` when absent or null.
pub(crate) fn raw_field(text: &str, path: &[&str]) -> String {
    type Fields<'a> = std::collections::BTreeMap<String, &'a serde_json::value::RawValue>;
    let mut raw = text;
    for field in path {
        let Ok(fields) = serde_json::from_str::<Fields<'_>>(raw) else {
            return "-".into();
        };
        match fields.get(*field) {
            Some(&r) => raw = r.get(),
            None => return "-".into(),
        }
    }
    match raw.trim() {
        "null" => "-".into(),
        other => other.to_string(),
    }
}

/// The array field `field` of `v`, empty when absent.
pub(crate) fn items<'a>(v: &'a Value, field: &str) -> &'a [Value] {
    v.get(field)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_the_last_is_not_padded() {
        let t = table(
            &["id", "state", "note"],
            &[
                vec!["a".into(), "ACTIVE".into(), "x".into()],
                vec!["bbbb".into(), "-".into(), "".into()],
            ],
        );
        assert_eq!(t, "id    state   note\na     ACTIVE  x\nbbbb  -\n");
    }

    #[test]
    fn raw_fields_keep_their_digits() {
        let text = r#"{"payload":{"n":12345678901234567890123},"result":null}"#;
        assert_eq!(
            raw_field(text, &["payload"]),
            r#"{"n":12345678901234567890123}"#
        );
        assert_eq!(
            raw_field(text, &["payload", "n"]),
            "12345678901234567890123"
        );
        assert_eq!(raw_field(text, &["result"]), "-");
        assert_eq!(raw_field(text, &["absent", "x"]), "-");
    }

    #[test]
    fn blocks_continue_long_values_under_the_first_line() {
        let b = block(&[("id", "1".into()), ("next fires", "a\nb".into())]);
        assert_eq!(b, "id          1\nnext fires  a\n            b\n");
    }
}
