//! `campanile preview`: the next fire times of a cron expression, as a person or a script
//! wants to read them.

use std::fmt::Write as _;

use campanile_calendar::{Calendar, DstFold, DstGap, DstPolicy, Fire, FireNote};
use clap::Args;
use jiff::Timestamp;

use crate::error::CliError;

/// Arguments of `campanile preview`.
#[derive(Debug, Args)]
pub(crate) struct PreviewArgs {
    /// Cron expression: 5 fields (min hour dom month dow), 6 with seconds first, or a macro
    /// such as @daily.
    #[arg(long)]
    cron: String,
    /// IANA time zone whose wall clock the expression reads.
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// List fire times strictly after this RFC 3339 instant (default: now).
    #[arg(long)]
    after: Option<String>,
    /// How many fire times to list.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: u32,
    /// Wall times in a spring-forward gap: skip them, or shift to the end of the gap.
    #[arg(long, default_value = "skip")]
    dst_gap: DstGap,
    /// Wall times in a fall-back fold: fire once (earlier instant) or twice.
    #[arg(long, default_value = "once")]
    dst_fold: DstFold,
    /// Print one JSON array of UTC instants and nothing else.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &PreviewArgs) -> Result<(), CliError> {
    let dst = DstPolicy {
        gap: args.dst_gap,
        fold: args.dst_fold,
    };
    let cal =
        Calendar::cron(&args.cron, &args.tz, dst).map_err(|e| CliError::usage(e.to_string()))?;
    let after = match &args.after {
        Some(s) => campanile_calendar::parse_instant(s)
            .map_err(|e| CliError::usage(format!("--after: {e}")))?,
        None => Timestamp::now(),
    };
    let mut fires = Vec::new();
    let mut cursor = after;
    while fires.len() < args.count as usize {
        let Some(fire) = cal.next_fire(cursor) else {
            break;
        };
        cursor = fire.at;
        fires.push(fire);
    }
    if args.json {
        let list: Vec<String> = fires.iter().map(|f| format_utc(f.at)).collect();
        println!("{}", serde_json::Value::from(list));
    } else {
        print!("{}", table(&cal, dst, &fires));
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ`, the exact format of the JSON output.
fn format_utc(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn table(cal: &Calendar, dst: DstPolicy, fires: &[Fire]) -> String {
    let Calendar::Cron { zone, .. } = cal else {
        return String::new();
    };
    let tz = zone.tz();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4}  {:<20}  {:<32}  note",
        "#",
        "UTC",
        format!("local ({})", zone.name())
    );
    for (i, f) in fires.iter().enumerate() {
        let local =
            f.at.to_zoned_datetime(tz.clone())
                .strftime("%Y-%m-%d %H:%M:%S %:z %Z")
                .to_string();
        let note = match f.note {
            None => String::new(),
            Some(FireNote::AfterSkippedGap { wall }) => format!(
                "after DST gap: {} did not exist, skipped (dst-gap={})",
                wall.strftime("%Y-%m-%d %H:%M:%S"),
                dst.gap
            ),
            Some(FireNote::ShiftedFromGap { wall }) => format!(
                "DST gap: {} did not exist, fired at end of gap (dst-gap={})",
                wall.strftime("%Y-%m-%d %H:%M:%S"),
                dst.gap
            ),
            Some(FireNote::FoldEarlier) if dst.fold == DstFold::Once => format!(
                "DST fold: wall time occurs twice, fired once at the earlier (dst-fold={})",
                dst.fold
            ),
            Some(FireNote::FoldEarlier) => {
                format!("DST fold: first of two fires (dst-fold={})", dst.fold)
            }
            Some(FireNote::FoldLater) => {
                format!("DST fold: second of two fires (dst-fold={})", dst.fold)
            }
            Some(_) => "DST rule applied".to_string(),
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<20}  {:<32}  {}",
            i + 1,
            format_utc(f.at),
            local,
            note
        );
    }
    if fires.is_empty() {
        out.push_str("(no fire times)\n");
    }
    out
}
