//! Backfills and the tenant's catch-up pace: a past range made into occurrences once, paced,
//! answered again by its key; slots of the pace shared by every reservation.

use campanile_core::{OccurrenceState, Overlap};
use tokio::runtime::Runtime;

use super::*;

fn at_ms(base: Timestamp, ms: i64) -> Timestamp {
    base.checked_add(SignedDuration::from_millis(ms)).unwrap()
}

pub fn catch_up_slots_are_shared_by_every_reservation(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let reserve = |count: u32, now: Timestamp| CatchupReserve {
            tenant: f.tenant,
            count,
            now: Some(now),
        };
        // No catch-up rate: nothing is paced.
        assert_eq!(
            s.tenant_catchup_reserve(reserve(5, secs(100)))
                .await
                .unwrap(),
            None
        );
        s.tenant_quota_set(TenantQuota {
            tenant: f.tenant,
            max_catchup_per_sec: Some(4),
            ..Default::default()
        })
        .await
        .unwrap();
        let a = s
            .tenant_catchup_reserve(reserve(3, secs(100)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((a.start, a.rate, a.count), (secs(100), 4, 3));
        assert_eq!(a.slot(2), at_ms(secs(100), 500));
        // The next reservation, made at the same moment, starts where the first ends.
        let b = s
            .tenant_catchup_reserve(reserve(2, secs(100)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((b.start, b.slot(1)), (at_ms(secs(100), 750), secs(101)));
        // Later than the pace's end: from the present.
        let c = s
            .tenant_catchup_reserve(reserve(1, secs(200)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(c.start, secs(200));
        // A rate that does not divide a second: spans round up, never faster than the rate.
        s.tenant_quota_set(TenantQuota {
            tenant: f.tenant,
            max_catchup_per_sec: Some(3),
            ..Default::default()
        })
        .await
        .unwrap();
        let starts: Vec<Timestamp> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(
                    s.tenant_catchup_reserve(reserve(1, secs(300)))
                        .await
                        .unwrap()
                        .unwrap()
                        .start,
                );
            }
            v
        };
        assert_eq!(
            starts,
            vec![
                secs(300),
                at_ms(secs(300), 334),
                at_ms(secs(300), 668),
                at_ms(secs(300), 1002)
            ]
        );
        // Another tenant's pace is its own.
        let g = fixture(s, "beta", "q").await;
        assert_eq!(
            s.tenant_catchup_reserve(CatchupReserve {
                tenant: g.tenant,
                count: 1,
                now: Some(secs(300))
            })
            .await
            .unwrap(),
            None
        );
    });
}

pub fn a_backfill_makes_each_missing_instant_once_at_the_tenant_pace(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        s.tenant_quota_set(TenantQuota {
            tenant: f.tenant,
            max_catchup_per_sec: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
        // 3 s already has an occurrence (planned, and it failed for good); 4 s one the
        // misfire policy recorded MISSED (it never ran).
        let planned = insert(s, &f, vec![new_occ(&f, "q", secs(3), 1)]).await;
        let missed = insert(
            s,
            &f,
            vec![NewOccurrence {
                state: OccurrenceState::Missed,
                ..new_occ(&f, "q", secs(4), 1)
            }],
        )
        .await;
        let c = claim(s, &f, "q", "w", 1, 30, secs(50)).await;
        let failed = Finish::Failed {
            class: campanile_core::ErrorClass::Permanent,
            message: "no".into(),
        };
        finish(s, &f, "w", c[0].id, c[0].epoch, failed, secs(51)).await;
        let backfill = |key: Option<&str>, from: i64, to: i64, now: i64| ScheduleBackfill {
            tenant: f.tenant,
            id: f.schedule,
            version: 1,
            from: secs(from),
            to: secs(to),
            instants: (1..=5)
                .map(secs)
                .filter(|t| *t >= secs(from) && *t < secs(to))
                .collect(),
            overlap: None,
            key: key.map(str::to_string),
            now: Some(secs(now)),
        };
        let first = s
            .schedule_backfill(backfill(Some("b1"), 0, 6, 100))
            .await
            .unwrap();
        assert!(!first.replayed);
        assert_eq!(
            (first.version, first.instants, first.from, first.to),
            (1, 5, secs(0), secs(6))
        );
        let made: Vec<(Timestamp, Timestamp, Origin)> = first
            .created
            .iter()
            .map(|o| (o.scheduled_for, o.available_at, o.origin))
            .collect();
        assert_eq!(
            made,
            vec![
                (secs(1), secs(100), Origin::Backfill),
                (secs(2), at_ms(secs(100), 500), Origin::Backfill),
                (secs(5), at_ms(secs(100), 1500), Origin::Backfill),
            ],
            "each instant without an occurrence, oldest first at 2 per second"
        );
        let again: Vec<(OccurrenceId, OccurrenceState, Timestamp, Origin)> = first
            .rerun
            .iter()
            .map(|o| (o.id, o.state, o.available_at, o.origin))
            .collect();
        assert_eq!(
            again,
            vec![(
                missed[0],
                OccurrenceState::Scheduled,
                secs(101),
                Origin::Backfill
            )],
            "the missed one runs again, under its id, in its place in the pace"
        );
        assert_eq!(
            first
                .existing
                .iter()
                .map(|o| (o.id, o.state))
                .collect::<Vec<_>>(),
            vec![(planned[0], OccurrenceState::Dead)],
            "listed, not made again"
        );
        // Sent again with its key: the same answer, nothing new.
        let again = s
            .schedule_backfill(backfill(Some("b1"), 0, 6, 120))
            .await
            .unwrap();
        assert!(again.replayed);
        assert_eq!(again.backfill_id, first.backfill_id);
        assert_eq!(
            again.created.iter().map(|o| o.id).collect::<Vec<_>>(),
            first.created.iter().map(|o| o.id).collect::<Vec<_>>()
        );
        // The same key for another range is refused; without a key, nothing new is made.
        let reused = s.schedule_backfill(backfill(Some("b1"), 0, 4, 120)).await;
        assert!(matches!(reused, Err(StoreError::Invalid(_))), "{reused:?}");
        let plain = s
            .schedule_backfill(backfill(None, 0, 6, 120))
            .await
            .unwrap();
        assert!(plain.created.is_empty() && plain.rerun.is_empty() && !plain.replayed);
        assert_eq!(plain.existing.len(), 5);
        assert_eq!(schedule_occurrences(s, f.tenant, f.schedule).await.len(), 5);
        // They run as paced: two are due at 100.5 s, the rest later.
        let c = claim(s, &f, "q", "w", 10, 30, at_ms(secs(100), 500)).await;
        assert_eq!(c.len(), 2);
        let c = claim(s, &f, "q", "w", 10, 30, at_ms(secs(100), 1500)).await;
        assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>().len(), 2);
        assert!(
            c.iter().any(|c| c.id == missed[0]),
            "the missed one is claimed"
        );
        // The pace goes on from where the backfill left it.
        let next = s
            .tenant_catchup_reserve(CatchupReserve {
                tenant: f.tenant,
                count: 1,
                now: Some(secs(100)),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next.start, secs(102));

        // The rules: the range, the present, the bound, the version, the state.
        let bad = |p: ScheduleBackfill| async move { s.schedule_backfill(p).await };
        assert!(matches!(
            bad(backfill(None, 6, 6, 120)).await,
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            bad(backfill(None, 0, 200, 120)).await,
            Err(StoreError::Invalid(_))
        ));
        let too_many = ScheduleBackfill {
            instants: (0..=rules::BACKFILL_MAX as i64).map(at).collect(),
            ..backfill(None, 0, 6, 120)
        };
        assert!(matches!(bad(too_many).await, Err(StoreError::Invalid(_))));
        let stale = ScheduleBackfill {
            version: 7,
            ..backfill(None, 0, 6, 120)
        };
        assert!(matches!(
            bad(stale).await,
            Err(StoreError::VersionConflict { current: 1 })
        ));
        let unknown = ScheduleBackfill {
            id: ScheduleId(Uuid::now_v7()),
            ..backfill(None, 0, 6, 120)
        };
        assert!(matches!(bad(unknown).await, Err(StoreError::NotFound(_))));
        let other = fixture(s, "other", "q").await;
        let foreign = ScheduleBackfill {
            tenant: other.tenant,
            ..backfill(None, 0, 6, 120)
        };
        assert!(matches!(bad(foreign).await, Err(StoreError::NotFound(_))));
        // An overlap policy of its own.
        let g = fixture(s, "gamma", "q").await;
        let own = s
            .schedule_backfill(ScheduleBackfill {
                tenant: g.tenant,
                id: g.schedule,
                overlap: Some(Overlap::SkipIfRunning),
                ..backfill(None, 0, 6, 120)
            })
            .await
            .unwrap();
        assert_eq!((own.created.len(), own.existing.len()), (5, 0));
        // A paused schedule is not backfilled.
        s.schedule_transition(ScheduleTransition {
            tenant: g.tenant,
            id: g.schedule,
            to: ScheduleState::Paused,
            superseded: Superseded::default(),
            now: Some(secs(121)),
        })
        .await
        .unwrap();
        let paused = s
            .schedule_backfill(ScheduleBackfill {
                tenant: g.tenant,
                id: g.schedule,
                ..backfill(None, 0, 6, 122)
            })
            .await;
        assert!(
            matches!(paused, Err(StoreError::WrongState(_))),
            "{paused:?}"
        );

        // After a pause and a resume (a new version), an instant that ran under the old
        // version is not run again; one the pause retired before it ran is.
        let d = fixture(s, "delta", "q").await;
        let ids = insert(
            s,
            &d,
            vec![new_occ(&d, "q", secs(1), 1), new_occ(&d, "q", secs(2), 1)],
        )
        .await;
        let c = claim(s, &d, "q", "w", 1, 30, secs(50)).await;
        assert_eq!(c[0].id, ids[0]);
        finish(s, &d, "w", c[0].id, c[0].epoch, ok("1"), secs(51)).await;
        for (to, at) in [(ScheduleState::Paused, 60), (ScheduleState::Active, 61)] {
            s.schedule_transition(ScheduleTransition {
                tenant: d.tenant,
                id: d.schedule,
                to,
                superseded: Superseded::default(),
                now: Some(secs(at)),
            })
            .await
            .unwrap();
        }
        let current = s
            .schedule_get(ScheduleGet {
                tenant: d.tenant,
                id: d.schedule,
            })
            .await
            .unwrap()
            .unwrap()
            .version;
        assert!(current > 1);
        let after = s
            .schedule_backfill(ScheduleBackfill {
                tenant: d.tenant,
                id: d.schedule,
                version: current,
                ..backfill(None, 0, 3, 120)
            })
            .await
            .unwrap();
        assert_eq!(
            after
                .existing
                .iter()
                .map(|o| (o.scheduled_for, o.state, o.version))
                .collect::<Vec<_>>(),
            vec![(secs(1), OccurrenceState::Succeeded, 1)],
            "ran under version 1: listed, not run again"
        );
        assert_eq!(
            after
                .created
                .iter()
                .map(|o| (o.scheduled_for, o.version))
                .collect::<Vec<_>>(),
            vec![(secs(2), current)],
            "retired by the pause before it ran: it runs now, under the current version"
        );
    });
}
