//! Retention: a tenant's finished occurrences older than its policy leave the hot store —
//! archived first, then removed, and counted in per (schedule, version, day, state) rollups
//! that `campanile reconcile` reads (docs/DESIGN.md, "Why is history archived and removed?").
//!
//! A pass is three steps, each restartable: the store opens a batch (recording which
//! occurrences it chose), the archive writes them ([`Archive::write`]), the store closes the
//! batch (removing exactly those, if none changed). A node that dies after the first or the
//! second step leaves the batch open; when its lease ends, the next pass (on any node) finishes
//! that batch before choosing another, writing its files again under the same names.

mod archive;

use std::sync::Arc;
use std::time::Duration;

use campanile_store::{
    ArchivedKey, OccurrenceDaysPrepare, RetentionBatchClose, RetentionBatchOpen, RetentionClosed,
    RetentionDay, RetentionDayClose, RetentionDayClosed, RetentionDayOpen, RetentionDayRead, Store,
    StoreError,
};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

pub use archive::{Archive, ArchiveLine, ArchivedAttempt, read_file};

/// A retention pass's failure.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// The store failed or refused.
    #[error("retention: {0}")]
    Store(#[from] StoreError),
    /// The archive could not be written (or a given-up batch's files removed).
    #[error("retention archive {dir}: {source}")]
    Archive {
        /// The archive directory.
        dir: String,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
}

/// How retention runs.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// This node: the owner of the batches it opens.
    pub node: String,
    /// The operator's default retention for tenants without their own (`None`: forever).
    pub default_retention: Option<SignedDuration>,
    /// Where the archive goes; `None`: no archive (the operator's choice: removed history is
    /// then only counted in the rollups).
    pub archive: Option<Archive>,
    /// Most occurrences per batch.
    pub batch: u32,
    /// Most occurrences one pass examines, eligible or not (what bounds a pass's cost on the
    /// database whatever history it steps over).
    pub window: u32,
    /// Pause between passes while there is more to do (paces the deletes, so that claims and
    /// planning keep the writer).
    pub pace: Duration,
    /// Pause after a pass that found nothing more to do, or failed.
    pub idle: Duration,
    /// How long a batch stays this node's (then another node may finish it).
    pub lease: SignedDuration,
}

impl RetentionConfig {
    /// Defaults: 14 days, no archive, batches of 1,000 out of windows of 5,000, 200 ms
    /// between passes while there is more to look at, 30 s when idle, 5 min leases.
    pub fn new(node: impl Into<String>) -> RetentionConfig {
        RetentionConfig {
            node: node.into(),
            default_retention: Some(SignedDuration::from_hours(14 * 24)),
            archive: None,
            batch: 1_000,
            window: 5_000,
            pace: Duration::from_millis(200),
            idle: Duration::from_secs(30),
            lease: SignedDuration::from_mins(5),
        }
    }
}

impl RetentionConfig {
    /// How long to wait before the next pass after `pass`: `pace` while there is more to look
    /// at, `idle` when there is not or the pass failed.
    pub fn wait_after<E>(&self, pass: &Result<Pass, E>) -> Duration {
        match pass {
            Ok(p) if p.more => self.pace,
            _ => self.idle,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// The batch, if one was open or opened.
    pub batch: Option<i64>,
    /// Whether it was a batch left open by a node that stopped.
    pub resumed: bool,
    /// Occurrences chosen.
    pub chosen: usize,
    /// Archive files written.
    pub files: Vec<std::path::PathBuf>,
    /// What closing the batch did.
    pub closed: RetentionClosed,
    /// Whether the scan stopped short of the youngest occurrence that could be due (or the
    /// batch was given up): the next pass should follow at once.
    pub more: bool,
    /// The day taken out as a whole, if this pass worked on one (PostgreSQL); the other
    /// fields but `more` and `files` then stay empty.
    pub day: Option<String>,
    /// What closing the day did.
    pub day_closed: RetentionDayClosed,
}

/// Retention over one store.
#[derive(Debug, Clone)]
pub struct Retention {
    store: Arc<dyn Store>,
    cfg: RetentionConfig,
    /// Where the scan goes on from (`None`: the oldest occurrence).
    cursor: Arc<std::sync::Mutex<Option<campanile_core::OccurrenceId>>>,
}

impl Retention {
    /// Retention over `store`.
    pub fn new(store: Arc<dyn Store>, cfg: RetentionConfig) -> Retention {
        Retention {
            store,
            cfg,
            cursor: Arc::default(),
        }
    }

    /// Its settings.
    pub fn config(&self) -> &RetentionConfig {
        &self.cfg
    }

    /// One pass at `now` (`None`: the store's clock): finishes the open batch, or opens one,
    /// archives it and closes it. A default pass when nothing is due or another node holds
    /// the open batch.
    ///
    /// # Errors
    ///
    /// The store's, or the archive's; nothing is removed then.
    pub async fn pass(&self, now: Option<Timestamp>) -> Result<Pass, RetentionError> {
        self.pass_until(now, Step::Close).await
    }

    /// A pass that stops after `step` (tests of a node dying mid-batch).
    #[doc(hidden)]
    pub async fn pass_until(
        &self,
        now: Option<Timestamp>,
        step: Step,
    ) -> Result<Pass, RetentionError> {
        // Whole days first, where the store keeps occurrences by day.
        if let Some(day) = self
            .store
            .retention_day_open(RetentionDayOpen {
                node: self.cfg.node.clone(),
                default_retention: self.cfg.default_retention,
                lease: self.cfg.lease,
                now,
            })
            .await?
        {
            return self.day_pass(day, now, step).await;
        }
        let after = *self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        let scan = self
            .store
            .retention_batch_open(RetentionBatchOpen {
                node: self.cfg.node.clone(),
                default_retention: self.cfg.default_retention,
                limit: self.cfg.batch,
                after,
                window: self.cfg.window,
                lease: self.cfg.lease,
                now,
            })
            .await?;
        if scan.busy {
            // Another node holds the open batch: nothing to do here until it is done.
            return Ok(Pass::default());
        }
        *self.cursor.lock().unwrap_or_else(|e| e.into_inner()) = scan.scanned_to;
        let more = scan.scanned_to.is_some();
        let Some(batch) = scan.batch else {
            return Ok(Pass {
                more,
                ..Pass::default()
            });
        };
        let mut pass = Pass {
            batch: Some(batch.id),
            resumed: batch.resumed,
            chosen: batch.items.len(),
            more,
            ..Pass::default()
        };
        if batch.resumed {
            tracing::info!(
                batch = batch.id,
                "finishing a retention batch a node left open"
            );
        }
        if step == Step::Open {
            return Ok(pass);
        }
        if let Some(archive) = &self.cfg.archive {
            let items = batch.items.clone();
            let id = batch.id;
            pass.files = on_archive(archive, move |a| a.write(id, &items)).await?;
            metrics::counter!("campanile_retention_archived_total")
                .increment(batch.items.len() as u64);
        }
        if step == Step::Archive {
            return Ok(pass);
        }
        pass.closed = self
            .store
            .retention_batch_close(RetentionBatchClose {
                batch: batch.id,
                node: self.cfg.node.clone(),
                items: batch
                    .items
                    .iter()
                    .map(|r| ArchivedKey::of(&r.detail.occurrence))
                    .collect(),
                now,
            })
            .await?;
        metrics::counter!("campanile_retention_removed_total").increment(pass.closed.removed);
        if pass.closed.abandoned {
            // Something in it was redriven after the archive read it: its files would hold a
            // state the hot store no longer has. They go; the rest is chosen again.
            metrics::counter!("campanile_retention_abandoned_batches_total").increment(1);
            tracing::info!(
                batch = batch.id,
                "retention batch given up: an occurrence in it changed after it was archived"
            );
            pass.closed = self.forget(batch.id, now).await?;
            pass.files.clear();
            pass.more = true;
        }
        Ok(pass)
    }

    /// Archives a day taken as a whole, a chunk at a time (its earlier files, if a node that
    /// stopped wrote some, removed first), and closes it.
    async fn day_pass(
        &self,
        day: RetentionDay,
        now: Option<Timestamp>,
        step: Step,
    ) -> Result<Pass, RetentionError> {
        let mut pass = Pass {
            day: Some(day.name.clone()),
            resumed: day.resumed,
            chosen: usize::try_from(day.leaving).unwrap_or(usize::MAX),
            more: true,
            ..Pass::default()
        };
        if day.resumed {
            tracing::info!(day = %day.name, "finishing a retention day a node left open");
        }
        if step == Step::Open {
            return Ok(pass);
        }
        if !day.detached
            && let Some(archive) = &self.cfg.archive
        {
            // Still this node's (the read renews the hold) before an earlier try's files go.
            self.store
                .retention_day_read(RetentionDayRead {
                    name: day.name.clone(),
                    after: None,
                    limit: 0,
                    node: self.cfg.node.clone(),
                    lease: self.cfg.lease,
                    now,
                })
                .await?;
            let date = jiff::tz::Offset::UTC.to_datetime(day.day).date();
            on_archive(archive, move |a| a.remove_day(date)).await?;
            let mut after = None;
            let mut chunk = 0_u64;
            loop {
                let items = self
                    .store
                    .retention_day_read(RetentionDayRead {
                        name: day.name.clone(),
                        after,
                        limit: self.cfg.batch,
                        node: self.cfg.node.clone(),
                        lease: self.cfg.lease,
                        now,
                    })
                    .await?;
                // In id order: the cursor goes on from the highest id read.
                let Some(last) = items.iter().map(|r| r.detail.occurrence.id).max() else {
                    break;
                };
                after = Some(last);
                let n = items.len() as u64;
                let files = on_archive(archive, move |a| a.write_day_chunk(chunk, &items)).await?;
                pass.files.extend(files);
                metrics::counter!("campanile_retention_archived_total").increment(n);
                chunk += 1;
            }
        }
        if step == Step::Archive {
            return Ok(pass);
        }
        pass.day_closed = self
            .store
            .retention_day_close(RetentionDayClose {
                name: day.name.clone(),
                node: self.cfg.node.clone(),
                now,
            })
            .await?;
        if pass.day_closed.redo {
            tracing::info!(
                day = %day.name,
                "retention day archived again: a row was planned into it after it was decided"
            );
            pass.files.clear();
        } else {
            metrics::counter!("campanile_retention_removed_total")
                .increment(pass.day_closed.removed);
            metrics::counter!("campanile_retention_days_dropped_total").increment(1);
        }
        Ok(pass)
    }

    /// Creates the coming days' partitions where the store keeps occurrences by day.
    ///
    /// # Errors
    ///
    /// The store's.
    pub async fn prepare_days(&self) -> Result<u32, RetentionError> {
        Ok(self
            .store
            .occurrence_days_prepare(OccurrenceDaysPrepare {
                ahead: DAYS_AHEAD,
                now: None,
            })
            .await?)
    }

    /// Deletes every archive file of a batch given up (whichever node wrote it), then closes
    /// the batch, which forgets it. A node that dies in between leaves the batch marked, and
    /// the next pass does both again.
    async fn forget(
        &self,
        batch: i64,
        now: Option<Timestamp>,
    ) -> Result<RetentionClosed, RetentionError> {
        if let Some(archive) = &self.cfg.archive {
            on_archive(archive, move |a| a.remove_batch(batch)).await?;
        }
        Ok(self
            .store
            .retention_batch_close(RetentionBatchClose {
                batch,
                node: self.cfg.node.clone(),
                items: Vec::new(),
                now,
            })
            .await?)
    }

    /// Samples the oldest retained occurrence's age into its gauge.
    ///
    /// # Errors
    ///
    /// The store's.
    pub async fn sample(&self) -> Result<(), RetentionError> {
        let status = self.store.retention_status().await?;
        let now = self.store.store_now().await?;
        let age = status.oldest.map_or(0.0, |t| {
            (now.as_millisecond() - t.as_millisecond()).max(0) as f64 / 1000.0
        });
        metrics::gauge!("campanile_retention_oldest_age_seconds").set(age);
        Ok(())
    }

    /// Runs passes until `stop` says so: paced while there is more to look at, then every
    /// `idle`. A failed pass is logged and counted, and tried again after `idle`.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        // When the coming days' partitions were last made sure of: passes follow one another
        // at once while a backlog drains, and the days need it far less often than that.
        let mut prepared: Option<tokio::time::Instant> = None;
        loop {
            if prepared.is_none_or(|at| at.elapsed() >= PREPARE_EVERY) {
                match self.prepare_days().await {
                    Ok(_) => prepared = Some(tokio::time::Instant::now()),
                    Err(e) => {
                        metrics::counter!("campanile_retention_failures_total").increment(1);
                        tracing::warn!(error = %e, "the coming days' partitions were not created");
                    }
                }
            }
            let pass = self.pass(None).await;
            match &pass {
                Ok(Pass {
                    day: Some(day),
                    day_closed,
                    files,
                    ..
                }) if !day_closed.redo => {
                    tracing::info!(
                        day = %day,
                        removed = day_closed.removed,
                        kept = day_closed.kept,
                        files = files.len(),
                        "retention: a whole day archived and its partition dropped"
                    );
                }
                Ok(pass) if pass.closed.removed > 0 => {
                    tracing::debug!(
                        batch = pass.batch,
                        removed = pass.closed.removed,
                        files = pass.files.len(),
                        "retention batch archived and removed"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    metrics::counter!("campanile_retention_failures_total").increment(1);
                    tracing::warn!(error = %e, "retention pass failed; nothing was removed by it");
                }
            }
            let wait = self.cfg.wait_after(&pass);
            if let Err(e) = self.sample().await {
                tracing::debug!(error = %e, "retention status not sampled");
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// Days after today whose partitions are made sure of (PostgreSQL).
const DAYS_AHEAD: u32 = 3;

/// How often, at most, [`Retention::run`] makes sure of the coming days' partitions (and
/// after a failure, at the next pass): days are made three ahead, so an hour leaves ample
/// time.
const PREPARE_EVERY: Duration = Duration::from_secs(3600);

/// Where [`Retention::pass_until`] stops.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// After the batch is opened.
    Open,
    /// After its archive is written.
    Archive,
    /// After it is closed (a whole pass).
    Close,
}

/// Runs `work` on the archive off the async threads (its file system calls block).
async fn on_archive<T: Send + 'static>(
    archive: &Archive,
    work: impl FnOnce(&Archive) -> std::io::Result<T> + Send + 'static,
) -> Result<T, RetentionError> {
    let a = archive.clone();
    tokio::task::spawn_blocking(move || work(&a))
        .await
        .map_err(|e| archive_err(archive, std::io::Error::other(e.to_string())))?
        .map_err(|e| archive_err(archive, e))
}

fn archive_err(archive: &Archive, source: std::io::Error) -> RetentionError {
    RetentionError::Archive {
        dir: archive.dir().display().to_string(),
        source,
    }
}

/// Starts [`Retention::run`] on its own task; send `true` to stop it.
pub fn spawn(retention: Retention) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, rx) = watch::channel(false);
    (stop, tokio::spawn(retention.run(rx)))
}
