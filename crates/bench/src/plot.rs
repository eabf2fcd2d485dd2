//! `--plot FILE.svg`: a picture of a run a person can look at — the drain curve (share of the
//! occurrences held by a worker, by seconds after their planned instant) over a histogram of
//! the same lags. Plain SVG, written by hand: two panels do not justify a plotting crate.

use std::fmt::Write;

const W: f64 = 760.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 60.0;

/// The SVG document for `lags` (seconds, sorted ascending).
pub(crate) fn lag_svg(title: &str, lags: &[f64]) -> String {
    let max = lags.last().copied().unwrap_or(0.0).max(1e-3);
    let plot_w = W - LEFT - RIGHT;
    let height = TOP + 2.0 * PANEL_H + GAP + 50.0;
    let x_of = |v: f64| LEFT + v / max * plot_w;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">{}</text>
"#,
        escape(title)
    );
    // Panel 1: the drain curve.
    let y0 = TOP;
    axes(&mut s, y0, max, "claimed (%)", 100.0);
    let step = (lags.len() / 600).max(1);
    let mut points = format!("{:.1},{:.1}", x_of(0.0), y0 + PANEL_H);
    for (i, lag) in lags
        .iter()
        .enumerate()
        .step_by(step)
        .chain(lags.iter().enumerate().next_back())
    {
        let share = (i + 1) as f64 / lags.len() as f64;
        let _ = write!(
            points,
            " {:.1},{:.1}",
            x_of(*lag),
            y0 + PANEL_H * (1.0 - share)
        );
    }
    let _ = writeln!(
        s,
        r##"<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##
    );
    // Panel 2: the lag histogram.
    let y1 = TOP + PANEL_H + GAP;
    let bins = 40usize;
    let mut counts = vec![0usize; bins];
    for lag in lags {
        let b = ((lag / max) * bins as f64) as usize;
        counts[b.min(bins - 1)] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    axes(&mut s, y1, max, "occurrences", top);
    let bw = plot_w / bins as f64;
    for (b, c) in counts.iter().enumerate() {
        let h = *c as f64 / top * PANEL_H;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#ff7f0e"/>"##,
            LEFT + b as f64 * bw + 0.5,
            y1 + PANEL_H - h,
            (bw - 1.0).max(0.5),
            h
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds after the planned instant (claim lag, end to end)</text>"#,
        LEFT + plot_w / 2.0,
        height - 12.0
    );
    s.push_str("</svg>\n");
    s
}

/// A panel's frame with five ticks on each axis.
fn axes(s: &mut String, y0: f64, x_max: f64, y_label: &str, y_max: f64) {
    let plot_w = W - LEFT - RIGHT;
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#444"/>"##
    );
    for i in 0..=5 {
        let f = f64::from(i) / 5.0;
        let x = LEFT + f * plot_w;
        let y = y0 + PANEL_H * (1.0 - f);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{:.2}</text>"##,
            y0 + PANEL_H,
            y0 + PANEL_H + 15.0,
            f * x_max
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            f * y_max
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        y0 + PANEL_H / 2.0,
        y0 + PANEL_H / 2.0,
        escape(y_label)
    );
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The soak run's picture: database MiB (top) and completions per second (bottom) over the
/// run's seconds; `points` are `(t, mib, completed_per_sec)`.
pub(crate) fn soak_svg(points: &[(f64, f64, f64)]) -> String {
    let t_max = points.iter().map(|p| p.0).fold(1e-3, f64::max);
    let plot_w = W - LEFT - RIGHT;
    let height = TOP + 2.0 * PANEL_H + GAP + 50.0;
    let x_of = |t: f64| LEFT + t / t_max * plot_w;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">campanile bench soak: database size and throughput over time</text>
"#
    );
    for (panel, label, value) in [
        (0.0, "database (MiB)", 1usize),
        (1.0, "completed per second", 2usize),
    ] {
        let y0 = TOP + panel * (PANEL_H + GAP);
        let v = |p: &(f64, f64, f64)| if value == 1 { p.1 } else { p.2 };
        let top = points.iter().map(v).fold(1e-3, f64::max) * 1.1;
        axes(&mut s, y0, t_max, label, top);
        let line: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x_of(p.0), y0 + PANEL_H * (1.0 - v(p) / top)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##,
            line.join(" ")
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since the load started</text>
</svg>"#,
        LEFT + plot_w / 2.0,
        height - 12.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_picture_is_well_formed_and_shows_every_lag() {
        let lags: Vec<f64> = (0..1000).map(|i| f64::from(i) / 100.0).collect();
        let svg = lag_svg("peak <test>", &lags);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("peak &lt;test&gt;"));
        // 40 histogram bars whose counts add up to every lag.
        assert_eq!(svg.matches(r##"fill="#ff7f0e""##).count(), 40);
        // The drain curve ends at 100%: its last point is at the top of the first panel.
        let curve = svg.split("<polyline points=\"").nth(1).unwrap();
        let last = curve
            .split('"')
            .next()
            .unwrap()
            .split(' ')
            .next_back()
            .unwrap();
        assert_eq!(last, format!("{:.1},{:.1}", W - RIGHT, TOP));
        // No lags: still a valid, empty picture.
        assert!(lag_svg("empty", &[]).contains("</svg>"));
    }
}
