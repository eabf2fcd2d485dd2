//! A schedule run now by an operator: one manual occurrence of its current version.

use campanile_core::{OccurrenceId, occurrence_id};
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use uuid::Uuid;

use crate::db::{R, execute, pg_err, query, resolve_now, ts};

pub(crate) async fn schedule_trigger(c: &mut Client, p: ScheduleTrigger) -> R<Triggered> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    // Serialized with changes to the schedule, which lock its row for update: a pause that
    // answered first is seen; one that comes after cancels this occurrence.
    let locked = query(
        &tx,
        "SELECT state FROM schedules WHERE id = $1 AND tenant_id = $2 FOR SHARE",
        &[&p.id.0, &p.tenant.0],
    )
    .await?;
    if locked.is_empty() {
        return Err(StoreError::NotFound(format!("schedule {}", p.id.0)));
    }
    let rec = crate::version::schedule_get(&tx, p.tenant, p.id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id.0)))?;
    rules::check_trigger(rec.state)?;
    if let Some(found) = by_key(&tx, &p).await? {
        return Ok(found);
    }
    let at = ts(now)?;
    if crate::occurrence::insert_occurrences(&tx, p.tenant, &[NewOccurrence::manual(&rec, at)], now)
        .await?
        == 0
    {
        return Err(rules::trigger_collides());
    }
    let id = occurrence_id(p.id, rec.version, at);
    execute(
        &tx,
        "UPDATE occurrences SET origin = 'manual', payload = $2 WHERE id = $1",
        &[&id.0, &p.payload],
    )
    .await?;
    // The key, unique per schedule (its own table: occurrences are partitioned by day, and a
    // unique index of theirs can only be per day).
    let marked = match &p.key {
        Some(key) => execute(
            &tx,
            "INSERT INTO occurrence_triggers (schedule_id, trigger_key, occurrence_id)
             VALUES ($1, $2, $3)",
            &[&p.id.0, key, &id.0],
        )
        .await
        .map(|_| ()),
        None => Ok(()),
    };
    match marked {
        Ok(_) => {}
        // The same key, triggered at the same time by another request that committed first.
        Err(StoreError::AlreadyExists(_)) => {
            drop(tx);
            return by_key(&*c, &p).await?.ok_or_else(rules::trigger_collides);
        }
        Err(e) => return Err(e),
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(Triggered {
        occurrence_id: id,
        scheduled_for: at,
        created: true,
    })
}

async fn by_key<C: GenericClient>(c: &C, p: &ScheduleTrigger) -> R<Option<Triggered>> {
    let Some(key) = &p.key else {
        return Ok(None);
    };
    let rows = query(
        c,
        "SELECT o.id, o.scheduled_for, o.payload
           FROM occurrence_triggers k JOIN occurrences o ON o.id = k.occurrence_id
          WHERE k.schedule_id = $1 AND k.trigger_key = $2",
        &[&p.id.0, key],
    )
    .await?;
    rows.first()
        .map(|r| {
            if r.get::<_, Option<String>>(2) != p.payload {
                return Err(rules::trigger_key_reused());
            }
            Ok(Triggered {
                occurrence_id: OccurrenceId(r.get::<_, Uuid>(0)),
                scheduled_for: ts(r.get(1))?,
                created: false,
            })
        })
        .transpose()
}
