//! The shipped alert rules and dashboard only name metrics that /metrics exports.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeSet;

fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("campanile_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = &text[start..end];
        // Histogram series name their metric plus a suffix.
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        out.insert(base.to_string());
        i = end;
    }
    out
}

#[test]
fn every_metric_named_by_the_ops_files_is_exported() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let alerts = std::fs::read_to_string(root.join("ops/prometheus/campanile-alerts.yml")).unwrap();
    let dashboard =
        std::fs::read_to_string(root.join("ops/grafana/campanile-dashboard.json")).unwrap();
    let _: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let exported: BTreeSet<String> = campanile_server::METRICS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    for (file, text) in [("alerts", &alerts), ("dashboard", &dashboard)] {
        let named = names_in(text);
        assert!(!named.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = named.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics that are not exported: {unknown:?}"
        );
    }
}
