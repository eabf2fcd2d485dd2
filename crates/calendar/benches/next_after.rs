//! `next_after` throughput for typical expressions. Target: >= 2 million computations per
//! second on one core, so the planner's cost is storage, not calendar arithmetic.

#![allow(missing_docs)]

use std::hint::black_box;

use campanile_calendar::{Calendar, DstFold, DstGap, DstPolicy};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jiff::{SignedDuration, Timestamp};

fn bench(c: &mut Criterion) {
    let cases = [
        ("daily", "0 9 * * *", "Europe/Paris", DstPolicy::default()),
        ("hourly", "0 * * * *", "UTC", DstPolicy::default()),
        (
            "every_5_min",
            "*/5 * * * *",
            "America/New_York",
            DstPolicy::default(),
        ),
        (
            "weekdays_0930",
            "30 9 * * MON-FRI",
            "Asia/Kolkata",
            DstPolicy::default(),
        ),
        (
            "last_friday",
            "0 18 * * 5L",
            "Europe/London",
            DstPolicy::default(),
        ),
        (
            "dst_heavy_twice",
            "*/15 1-3 * * *",
            "Australia/Lord_Howe",
            DstPolicy {
                gap: DstGap::Shift,
                fold: DstFold::Twice,
            },
        ),
    ];
    let mut group = c.benchmark_group("next_after");
    group.throughput(Throughput::Elements(1));
    for (name, expr, zone, dst) in cases {
        let cal = Calendar::cron(expr, zone, dst).expect("valid");
        // Walk a year of start instants so DST edges are included in the mix.
        let starts: Vec<Timestamp> = (0..1024)
            .map(|i| {
                let t: Timestamp = "2026-01-01T00:00:00Z".parse().expect("ts");
                t.checked_add(SignedDuration::from_secs(i * 30_817))
                    .expect("ts")
            })
            .collect();
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                black_box(cal.next_after(black_box(starts[i])))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
