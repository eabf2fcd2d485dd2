//! Cron expressions: the grammar, and the search for the next matching wall-clock time.
//!
//! Parsing of individual field tokens is delegated to [`croner`] (parsing only); this module
//! adds what a scheduler's users need on top of it — per-field name handling, errors that name
//! the field and the token, rejection of expressions that can never fire — and evaluates the
//! expression itself on civil (wall-clock) time, so that the DST contract in [`crate::zone`]
//! stays in one place.
//!
//! # Grammar
//!
//! Five fields `minute hour day-of-month month day-of-week`, or six with `second` first.
//! Each field is a comma list of `*`, `N`, `A-B`, `*/S`, `A-B/S`, `N/S`. Months accept
//! `JAN`–`DEC`, weekdays `SUN`–`SAT`; weekday `0` and `7` are both Sunday. Day-of-month also
//! accepts `L` (last day), `NW` (nearest weekday to day N, within the month) and `LW` (last
//! weekday); day-of-week accepts `DL` / `FRIL` (last such weekday of the month) and `D#n` (the
//! n-th such weekday). `?` alone is a synonym of `*` in day-of-month and day-of-week. Macros:
//! `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`.
//!
//! **Steps** count from the start of the range they apply to: `*/S` from the field's minimum
//! (`*/2` minutes is 0,2,…,58; `*/2` days-of-month is 1,3,…,31), `N/S` from N to the field's
//! maximum (6, Saturday, for day-of-week), and they restart every period (so `*/2` days fires on the 31st and again on the
//! 1st).
//!
//! **Day-of-month and day-of-week**: when both are restricted — neither is written as a bare
//! `*` or `?` — a day matches if *either* matches (the POSIX/Vixie rule); otherwise the
//! restricted one must match. A stepped wildcard such as `*/2` counts as a restriction (Vixie
//! cron treats it as `*` here; we follow the literal rule so that what you read is what runs).

mod search;

use std::fmt;

use croner::parser::{CronParser, Seconds, Year};
use croner::{CronPattern, Weekday};

use crate::CalendarError;

/// A field of a cron expression, named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// Seconds, 0–59 (only in six-field expressions).
    Second,
    /// Minutes, 0–59.
    Minute,
    /// Hours, 0–23.
    Hour,
    /// Day of the month, 1–31.
    DayOfMonth,
    /// Month, 1–12 or `JAN`–`DEC`.
    Month,
    /// Day of the week, 0–7 (0 and 7 are Sunday) or `SUN`–`SAT`.
    DayOfWeek,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        })
    }
}

const FIELDS: [Field; 6] = [
    Field::Second,
    Field::Minute,
    Field::Hour,
    Field::DayOfMonth,
    Field::Month,
    Field::DayOfWeek,
];

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// A parsed, validated cron expression.
///
/// Matching values are kept as bit masks so that [`CronExpr::next_civil`] costs a handful of
/// bit operations per call; the `L`/`W`/`#` modifiers, which depend on the month, are
/// evaluated through the parsed [`croner`] pattern.
#[derive(Debug, Clone)]
pub struct CronExpr {
    source: String,
    seconds: u64,
    minutes: u64,
    hours: u32,
    /// Bit `m` for month `m` in 1..=12.
    months: u16,
    /// Bit `d` for day `d` in 1..=31 (plain values only).
    dom: u32,
    /// Bit `w` for weekday `w` in 0..=6, 0 = Sunday (plain values only).
    dow: u8,
    star_dom: bool,
    star_dow: bool,
    /// Whether `L`, `W` or `#` appear, which need the slow, month-aware day test.
    modifiers: bool,
    pattern: Box<CronPattern>,
}

impl PartialEq for CronExpr {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}
impl Eq for CronExpr {}

impl fmt::Display for CronExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for CronExpr {
    type Err = CalendarError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CronExpr::parse(s)
    }
}

impl CronExpr {
    /// Parses and validates a cron expression.
    ///
    /// # Errors
    ///
    /// [`CalendarError::Empty`], [`CalendarError::FieldCount`],
    /// [`CalendarError::UnknownMacro`], [`CalendarError::InvalidToken`] (naming the field and
    /// the token) for malformed input, and [`CalendarError::NeverFires`] for an expression such
    /// as `0 0 30 2 *` that no date can match.
    ///
    /// # Example
    ///
    /// ```
    /// use campanile_calendar::CronExpr;
    ///
    /// let err = CronExpr::parse("0 25 * * *").unwrap_err();
    /// assert!(err.to_string().contains("hour"));
    /// assert!(err.to_string().contains("'25'"));
    /// assert!(CronExpr::parse("0 0 30 2 *").is_err());
    /// ```
    pub fn parse(expr: &str) -> Result<CronExpr, CalendarError> {
        let source = expr.trim();
        if source.is_empty() {
            return Err(CalendarError::Empty);
        }
        let expanded = if source.starts_with('@') {
            expand_macro(source)?
        } else {
            source
        };
        let raw: Vec<&str> = expanded.split_whitespace().collect();
        let raw: Vec<&str> = match raw.len() {
            5 => std::iter::once("0").chain(raw).collect(),
            6 => raw,
            found => return Err(CalendarError::FieldCount { found }),
        };

        let mut normalized = Vec::with_capacity(6);
        for (field, text) in FIELDS.iter().zip(&raw) {
            normalized.push(normalize_field(*field, text)?);
        }
        // One parse of the whole (normalized) pattern; only when it fails, let croner judge
        // each token on its own so that the error names exactly one field and token.
        let joined = normalized.join(" ");
        let pattern = match parser().parse(&joined) {
            Ok(cron) => cron.pattern,
            Err(whole) => return Err(blame_token(&raw, &normalized, &whole)),
        };

        let expr = CronExpr {
            source: source.to_string(),
            seconds: mask(&pattern.seconds, 0, 59) as u64,
            minutes: mask(&pattern.minutes, 0, 59) as u64,
            hours: mask(&pattern.hours, 0, 23) as u32,
            months: mask(&pattern.months, 1, 12) as u16,
            dom: mask(&pattern.days, 1, 31) as u32,
            dow: mask(&pattern.days_of_week, 0, 6) as u8,
            star_dom: normalized[3] == "*",
            star_dow: normalized[5] == "*",
            modifiers: pattern.days.has_modifiers() || pattern.days_of_week.has_modifiers(),
            pattern: Box::new(pattern),
        };
        if !expr.can_fire() {
            return Err(CalendarError::NeverFires(crate::error::echo(source)));
        }
        Ok(expr)
    }

    /// The expression as the user wrote it (trimmed).
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the day `y-m-d` (with weekday `wd`, 0 = Sunday) matches the day-of-month,
    /// month and day-of-week fields.
    pub(crate) fn day_matches(&self, y: i32, m: u32, d: u32, wd: u32) -> bool {
        if self.months & (1 << m) == 0 {
            return false;
        }
        if !self.modifiers {
            let dm = self.dom & (1 << d) != 0;
            let wm = self.dow & (1 << wd) != 0;
            return match (self.star_dom, self.star_dow) {
                (true, true) => true,
                (true, false) => wm,
                (false, true) => dm,
                (false, false) => dm || wm,
            };
        }
        let weekday = match wd {
            0 => Weekday::Sunday,
            1 => Weekday::Monday,
            2 => Weekday::Tuesday,
            3 => Weekday::Wednesday,
            4 => Weekday::Thursday,
            5 => Weekday::Friday,
            _ => Weekday::Saturday,
        };
        self.pattern.day_match(y, m, d, weekday).unwrap_or(false)
    }

    /// Whether a wall-clock time matches every field (sub-seconds are ignored).
    pub fn matches(&self, dt: jiff::civil::DateTime) -> bool {
        let (y, m, d) = (i32::from(dt.year()), dt.month() as u32, dt.day() as u32);
        let (h, mi, s) = (dt.hour() as u32, dt.minute() as u32, dt.second() as u32);
        self.hours & (1 << h) != 0
            && self.minutes & (1 << mi) != 0
            && self.seconds & (1 << s) != 0
            && self.day_matches(y, m, d, search::weekday(y, m, d))
    }

    /// The Gregorian calendar repeats every 400 years (146,097 days, a whole number of
    /// weeks), so if no day of one 400-year cycle matches, none ever will.
    fn can_fire(&self) -> bool {
        for y in 2001..=2400 {
            for m in 1..=12 {
                if self.months & (1 << m) == 0 {
                    continue;
                }
                let mut wd = search::weekday(y, m, 1);
                for d in 1..=search::days_in_month(y, m) {
                    if self.day_matches(y, m, d, wd) {
                        return true;
                    }
                    wd = (wd + 1) % 7;
                }
            }
        }
        false
    }
}

/// Finds the token croner refuses, by trying each one alone in an otherwise all-`*` pattern.
fn blame_token(
    raw: &[&str],
    normalized: &[String],
    whole: &croner::errors::CronError,
) -> CalendarError {
    for (i, field) in FIELDS.iter().enumerate() {
        let originals: Vec<&str> = raw[i].split(',').collect();
        for (j, token) in normalized[i].split(',').enumerate() {
            let mut probe: Vec<&str> = vec!["*"; 6];
            probe[i] = token;
            if let Err(e) = parser().parse(&probe.join(" ")) {
                return CalendarError::InvalidToken {
                    field: *field,
                    token: crate::error::echo(originals.get(j).copied().unwrap_or(token)),
                    reason: croner_reason(&e),
                };
            }
        }
    }
    CalendarError::InvalidToken {
        field: Field::DayOfWeek,
        token: crate::error::echo(raw[5]),
        reason: croner_reason(whole),
    }
}

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Required)
        .year(Year::Disallowed)
        .build()
}

fn croner_reason(e: &croner::errors::CronError) -> String {
    let msg = e.to_string();
    let msg = msg
        .strip_prefix("Component error: ")
        .or_else(|| msg.strip_prefix("Invalid pattern: "))
        .unwrap_or(&msg);
    msg.trim_end_matches('.').to_string()
}

fn mask(c: &croner::CronComponent, lo: u16, hi: u16) -> u128 {
    c.values()
        .into_iter()
        .filter(|v| (lo..=hi).contains(v))
        .fold(0u128, |m, v| m | (1 << v))
}

fn expand_macro(source: &str) -> Result<&'static str, CalendarError> {
    Ok(match source.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => return Err(CalendarError::UnknownMacro(crate::error::echo(source))),
    })
}

/// Upper-cases a field, replaces names by numbers (months only in the month field, weekdays
/// only in the day-of-week field), turns a lone `?` into `*`, and rejects any character the
/// field does not allow, naming the token that holds it.
fn normalize_field(field: Field, text: &str) -> Result<String, CalendarError> {
    let upper = text.to_ascii_uppercase();
    if upper == "?" {
        return match field {
            Field::DayOfMonth | Field::DayOfWeek => Ok("*".to_string()),
            _ => Err(invalid(
                field,
                text,
                "'?' is only allowed in day-of-month and day-of-week",
            )),
        };
    }
    let mut out_tokens = Vec::new();
    for (token, orig) in upper.split(',').zip(text.split(',')) {
        if token.is_empty() {
            return Err(invalid(field, orig, "empty element in a comma list"));
        }
        let mut out = String::with_capacity(token.len());
        let mut chars = token.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '0'..='9' | '*' | '/' | '-' => out.push(c),
                '?' => {
                    return Err(invalid(
                        field,
                        orig,
                        "'?' must stand alone as the whole field",
                    ));
                }
                '#' if field == Field::DayOfWeek => out.push(c),
                'A'..='Z' => {
                    let mut end = i + 1;
                    while let Some(&(j, c2)) = chars.peek() {
                        if !c2.is_ascii_uppercase() {
                            break;
                        }
                        end = j + 1;
                        chars.next();
                    }
                    out.push_str(&name_to_number(field, &token[i..end], orig)?);
                }
                other => {
                    return Err(invalid(
                        field,
                        orig,
                        &format!("unexpected character '{other}'"),
                    ));
                }
            }
        }
        // `N/S` means `N-max/S`; croner only accepts the long form.
        if let Some((n, step)) = out.split_once('/')
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            out = format!("{n}-{}/{step}", field_max(field));
        }
        if field == Field::DayOfWeek && out == "L" {
            return Err(invalid(
                field,
                orig,
                "'L' in day-of-week needs a weekday before it, e.g. 5L or FRIL",
            ));
        }
        out_tokens.push(out);
    }
    Ok(out_tokens.join(","))
}

fn field_max(field: Field) -> u32 {
    match field {
        Field::Second | Field::Minute => 59,
        Field::Hour => 23,
        Field::DayOfMonth => 31,
        Field::Month => 12,
        // Sunday is 0; stepping into 7 would name Sunday twice.
        Field::DayOfWeek => 6,
    }
}

fn name_to_number(field: Field, word: &str, orig: &str) -> Result<String, CalendarError> {
    let find = |names: &[&str], w: &str| names.iter().position(|n| *n == w);
    match field {
        Field::Month => {
            if let Some(i) = find(&MONTHS, word) {
                return Ok((i + 1).to_string());
            }
            Err(invalid(
                field,
                orig,
                &format!(
                    "unknown month name '{}' (use JAN-DEC)",
                    crate::error::echo(word)
                ),
            ))
        }
        Field::DayOfWeek => {
            if let Some(i) = find(&WEEKDAYS, word) {
                return Ok(i.to_string());
            }
            if word == "L" {
                return Ok("L".to_string());
            }
            if let Some(i) = word.strip_suffix('L').and_then(|w| find(&WEEKDAYS, w)) {
                return Ok(format!("{i}L"));
            }
            Err(invalid(
                field,
                orig,
                &format!(
                    "unknown weekday name '{}' (use SUN-SAT)",
                    crate::error::echo(word)
                ),
            ))
        }
        Field::DayOfMonth if matches!(word, "L" | "W" | "LW") => Ok(word.to_string()),
        _ => Err(invalid(field, orig, &format!("unexpected '{word}'"))),
    }
}

fn invalid(field: Field, token: &str, reason: &str) -> CalendarError {
    CalendarError::InvalidToken {
        field,
        token: crate::error::echo(token),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests;
