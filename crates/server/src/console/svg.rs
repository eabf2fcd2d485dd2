//! The overview's charts, drawn on the server as SVG: numbers only go into them, so they need
//! no escaping, and the console needs no charting script.

use std::fmt::Write;

/// Bucket bounds of the lag histograms, in milliseconds (the last bucket is everything
/// above the last bound).
pub(crate) const LAG_BOUNDS_MS: [i64; 10] =
    [10, 50, 100, 250, 500, 1_000, 5_000, 30_000, 60_000, 300_000];

/// Labels of the buckets of [`LAG_BOUNDS_MS`].
const LAG_LABELS: [&str; 11] = [
    "≤10ms", "≤50ms", "≤100ms", "≤250ms", "≤500ms", "≤1s", "≤5s", "≤30s", "≤1m", "≤5m", ">5m",
];

/// Counts of `values` per bucket of [`LAG_BOUNDS_MS`].
pub(crate) fn buckets(values: &[i64]) -> Vec<u64> {
    let mut out = vec![0u64; LAG_BOUNDS_MS.len() + 1];
    for v in values {
        let i = LAG_BOUNDS_MS
            .iter()
            .position(|b| v <= b)
            .unwrap_or(LAG_BOUNDS_MS.len());
        out[i] += 1;
    }
    out
}

/// The `q`-quantile (0..=1) of `values` in milliseconds, nearest rank.
pub(crate) fn quantile(values: &[i64], q: f64) -> Option<i64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// A bar chart of `bars` (label, value), `width` units wide, `title` read by screen readers.
pub(crate) fn bars(title: &str, width: f64, bars: &[(String, u64)]) -> String {
    let (w, h, pad) = (width, 160.0_f64, 24.0_f64);
    let max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1) as f64;
    let n = bars.len().max(1) as f64;
    let slot = (w - 2.0 * pad) / n;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg class="chart" viewBox="0 0 {w} {h}" role="img" aria-label="{}"><title>{}</title>"#,
        escape(title),
        escape(title)
    );
    let _ = write!(
        out,
        r#"<line x1="{pad}" y1="{y}" x2="{x2}" y2="{y}" class="axis"/>"#,
        y = h - pad,
        x2 = w - pad
    );
    for (i, (label, value)) in bars.iter().enumerate() {
        let bh = (*value as f64 / max) * (h - 2.0 * pad - 12.0);
        let x = pad + i as f64 * slot + slot * 0.1;
        let y = h - pad - bh;
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" class="bar"><title>{}: {value}</title></rect>"#,
            slot * 0.8,
            escape(label)
        );
        if *value > 0 {
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{:.1}" class="value">{value}</text>"#,
                x + slot * 0.4,
                y - 3.0
            );
        }
        if bars.len() <= 12 || i % (bars.len() / 12 + 1) == 0 {
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{:.1}" class="label">{}</text>"#,
                x + slot * 0.4,
                h - pad + 14.0,
                escape(label)
            );
        }
    }
    out.push_str("</svg>");
    out
}

/// A lag histogram of `values` (milliseconds).
pub(crate) fn lag_histogram(title: &str, values: &[i64]) -> String {
    let counts = buckets(values);
    let labelled: Vec<(String, u64)> = LAG_LABELS
        .iter()
        .zip(counts)
        .map(|(l, c)| ((*l).to_string(), c))
        .collect();
    bars(title, 560.0, &labelled)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_quantiles() {
        let v = [5, 10, 11, 400, 2_000, 400_000];
        assert_eq!(buckets(&v), vec![2, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1]);
        assert_eq!(quantile(&v, 0.5), Some(11));
        assert_eq!(quantile(&v, 0.99), Some(400_000));
        assert_eq!(quantile(&[], 0.5), None);
        let svg = lag_histogram("claim <lag>", &v);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("claim &lt;lag&gt;"));
    }
}
