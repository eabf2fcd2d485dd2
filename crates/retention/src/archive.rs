//! The archive: gzip-compressed JSON Lines files, one per retention batch, tenant and UTC day,
//! under `<dir>/<tenant id>-<tenant name>/<YYYY-MM-DD>/batch-<batch>.jsonl.gz`.
//!
//! A file is written whole under a temporary name, flushed to disk and renamed into place,
//! and its directory flushed: a crash leaves either the whole file or none (a stray
//! temporary file at most, removed when the batch is written again or given up). A batch
//! finished again after a crash writes the same names again, replacing what the first try
//! wrote: nothing is archived twice.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use campanile_store::{Attempt, Retired};
use flate2::Compression;
use flate2::write::GzEncoder;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// One archived occurrence: one line of an archive file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveLine {
    /// The tenant's name.
    pub tenant: String,
    /// The occurrence's id.
    pub id: String,
    /// Its schedule.
    pub schedule_id: String,
    /// The schedule version that planned it.
    pub version: u32,
    /// The planned instant.
    pub scheduled_for: Timestamp,
    /// When it was (last) claimable.
    pub available_at: Timestamp,
    /// Its queue.
    pub queue: String,
    /// Its priority.
    pub priority: i32,
    /// Its final state (`SUCCEEDED`, `DEAD`, `CANCELED`, `MISSED`, `SKIPPED_OVERLAP`).
    pub state: String,
    /// The epoch of its last claim (0: never claimed).
    pub epoch: i64,
    /// Claims made.
    pub attempt_count: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// Whether a cancel was requested while it ran.
    pub cancel_requested: bool,
    /// The accepted result (JSON), if any.
    pub result: Option<Box<RawValue>>,
    /// The last error's class (`transient`, `permanent`), if any.
    pub last_error_class: Option<String>,
    /// The last error's message, if any.
    pub last_error: Option<String>,
    /// When it reached its final state.
    pub finished_at: Option<Timestamp>,
    /// `planned` (from the calendar) or `manual` (triggered by an operator).
    #[serde(default = "planned")]
    pub origin: String,
    /// The run's own payload (JSON), when it was triggered with one in place of its version's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Box<RawValue>>,
    /// Its attempts, oldest first.
    pub attempts: Vec<ArchivedAttempt>,
}

fn planned() -> String {
    "planned".into()
}

/// One attempt of an archived occurrence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedAttempt {
    /// The claim's epoch.
    pub epoch: i64,
    /// The worker that claimed.
    pub owner: String,
    /// When it was claimed.
    pub started_at: Timestamp,
    /// The end of its last lease.
    pub lease_until: Timestamp,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
    /// How (`succeeded`, `failed`, `lease_expired`, …).
    pub outcome: String,
    /// The error's class, for failures.
    pub error_class: Option<String>,
    /// The error's message, for failures.
    pub error_message: Option<String>,
}

impl ArchiveLine {
    /// The line of one retired occurrence.
    pub fn of(r: &Retired) -> ArchiveLine {
        let o = &r.detail.occurrence;
        ArchiveLine {
            tenant: r.tenant_name.clone(),
            id: o.id.0.to_string(),
            schedule_id: o.schedule_id.0.to_string(),
            version: o.version,
            scheduled_for: o.scheduled_for,
            available_at: o.available_at,
            queue: o.queue.clone(),
            priority: o.priority,
            state: o.state.as_str().to_string(),
            epoch: o.epoch,
            attempt_count: o.attempts,
            max_attempts: o.max_attempts,
            cancel_requested: o.cancel_requested,
            // Stored results are JSON, kept as sent; a line break in valid JSON can only be
            // whitespace between tokens, so it becomes a space and the line stays one line. One
            // that is not JSON (written by hand) is kept as a string.
            result: o.result.as_ref().and_then(|text| {
                RawValue::from_string(text.replace(['\n', '\r'], " "))
                    .or_else(|_| serde_json::value::to_raw_value(text))
                    .ok()
            }),
            last_error_class: o.last_error_class.map(|c| c.as_str().to_string()),
            last_error: o.last_error.clone(),
            finished_at: o.finished_at,
            origin: o.origin.as_str().to_string(),
            payload: r.payload.as_ref().and_then(|text| {
                RawValue::from_string(text.replace(['\n', '\r'], " "))
                    .or_else(|_| serde_json::value::to_raw_value(text))
                    .ok()
            }),
            attempts: r.detail.attempts.iter().map(ArchivedAttempt::of).collect(),
        }
    }
}

impl ArchivedAttempt {
    fn of(a: &Attempt) -> ArchivedAttempt {
        ArchivedAttempt {
            epoch: a.epoch,
            owner: a.owner.clone(),
            started_at: a.started_at,
            lease_until: a.lease_until,
            finished_at: a.finished_at,
            outcome: a.outcome.as_str().to_string(),
            error_class: a.error_class.map(|c| c.as_str().to_string()),
            error_message: a.error_message.clone(),
        }
    }
}

/// An archive directory.
#[derive(Debug, Clone)]
pub struct Archive {
    dir: PathBuf,
}

impl Archive {
    /// The archive under `dir` (created when first written).
    pub fn new(dir: impl Into<PathBuf>) -> Archive {
        Archive { dir: dir.into() }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of a batch's occurrences of one tenant and UTC day.
    pub fn file_of(&self, batch: i64, r: &Retired) -> PathBuf {
        self.day_dir(r).join(batch_file_name(batch))
    }

    /// Writes a batch's occurrences, one file per tenant and day, each durably in place before
    /// this returns. Returns the files written and how many lines.
    ///
    /// # Errors
    ///
    /// The file system's.
    pub fn write(&self, batch: i64, items: &[Retired]) -> std::io::Result<Vec<PathBuf>> {
        write_grouped(items, |r| self.file_of(batch, r))
    }

    /// Writes the rows of a day retention takes as a whole, chunk `chunk` of it, as
    /// `<tenant>/<YYYY-MM-DD>/day-<chunk>.jsonl.gz` (fsynced, atomically renamed into place;
    /// written again under the same name if the day is archived again).
    ///
    /// # Errors
    ///
    /// What the file system says.
    pub fn write_day_chunk(&self, chunk: u64, items: &[Retired]) -> std::io::Result<Vec<PathBuf>> {
        write_grouped(items, |r| self.day_dir(r).join(day_file_name(chunk)))
    }

    /// Removes every chunk file of a day taken as a whole (`day-*.jsonl.gz` in each tenant's
    /// directory of that date), before the day is archived again.
    ///
    /// # Errors
    ///
    /// What the file system says.
    pub fn remove_day(&self, day: jiff::civil::Date) -> std::io::Result<()> {
        let Ok(tenants) = std::fs::read_dir(&self.dir) else {
            return Ok(()); // no archive yet
        };
        for tenant in tenants {
            let dir = tenant?.path().join(day.to_string());
            if !dir.is_dir() {
                continue;
            }
            let mut removed = false;
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let file = entry.file_name();
                let file = file.to_string_lossy();
                if file.starts_with("day-")
                    && (file.ends_with(".jsonl.gz") || file.ends_with(".tmp"))
                {
                    match std::fs::remove_file(entry.path()) {
                        Ok(()) => removed = true,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            if removed {
                std::fs::File::open(&dir)?.sync_all()?;
            }
        }
        Ok(())
    }

    /// The directory of `r`'s tenant and UTC day.
    fn day_dir(&self, r: &Retired) -> PathBuf {
        let day = jiff::tz::Offset::UTC
            .to_datetime(r.detail.occurrence.scheduled_for)
            .date();
        self.dir.join(tenant_dir(r)).join(day.to_string())
    }

    /// Removes every file of a batch given up, whichever node wrote it, and any temporary
    /// file a write of it left: a walk of the archive's tenant and day directories.
    ///
    /// # Errors
    ///
    /// The file system's (a file already gone is not an error).
    pub fn remove_batch(&self, batch: i64) -> std::io::Result<()> {
        let name = batch_file_name(batch);
        let Ok(tenants) = std::fs::read_dir(&self.dir) else {
            return Ok(()); // no archive yet
        };
        for tenant in tenants {
            let tenant = tenant?.path();
            if !tenant.is_dir() {
                continue;
            }
            for day in std::fs::read_dir(&tenant)? {
                let day = day?.path();
                if !day.is_dir() {
                    continue;
                }
                if remove_named(&day, &name, true)? {
                    std::fs::File::open(&day)?.sync_all()?;
                }
            }
        }
        Ok(())
    }
}

/// Writes `items` into the files `path_of` names, one file per name; the paths written.
fn write_grouped(
    items: &[Retired],
    path_of: impl Fn(&Retired) -> PathBuf,
) -> std::io::Result<Vec<PathBuf>> {
    let mut files: BTreeMap<PathBuf, Vec<&Retired>> = BTreeMap::new();
    for r in items {
        files.entry(path_of(r)).or_default().push(r);
    }
    let mut written = Vec::with_capacity(files.len());
    for (path, lines) in files {
        write_file(&path, &lines)?;
        written.push(path);
    }
    Ok(written)
}

fn day_file_name(chunk: u64) -> String {
    format!("day-{chunk}.jsonl.gz")
}

fn batch_file_name(batch: i64) -> String {
    format!("batch-{batch}.jsonl.gz")
}

/// Removes the temporary files of writes of `name` from `dir`, and `name` itself with
/// `and_file`; whether any was there.
fn remove_named(dir: &Path, name: &str, and_file: bool) -> std::io::Result<bool> {
    let tmp_prefix = format!("{name}.");
    let mut removed = false;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let ours =
            (and_file && file == name) || (file.starts_with(&tmp_prefix) && file.ends_with(".tmp"));
        if !ours {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// `<tenant id>-<name>`: the id keeps names apart and makes the directory safe whatever the
/// name; anything in the name but letters, digits, `-`, `_` and `.` becomes `_`.
fn tenant_dir(r: &Retired) -> String {
    let name: String = r
        .tenant_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{}-{name}", r.tenant.0)
}

fn write_file(path: &Path, lines: &[&Retired]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other(format!("{} has no directory", path.display())))?;
    create_dirs_durably(dir)?;
    // A name of this write's own: two nodes finishing the same batch (one whose hold on it
    // passed without its knowing) never write into one file.
    let unique = format!(
        "{}.{}-{}.tmp",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let tmp = dir.join(unique);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let mut gz = GzEncoder::new(std::io::BufWriter::new(file), Compression::default());
    for r in lines {
        serde_json::to_writer(&mut gz, &ArchiveLine::of(r))?;
        gz.write_all(b"\n")?;
    }
    let file = gz
        .finish()?
        .into_inner()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    // What earlier writes of this file left half-written (a node killed mid-write) goes.
    if let Some(name) = path.file_name() {
        remove_named(dir, &name.to_string_lossy(), false)?;
    }
    // The rename (and those removals) are durable once the directory is.
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Creates `dir` and its missing parents, each one's entry made durable in its parent before
/// anything is written under it.
fn create_dirs_durably(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        missing.push(d.to_path_buf());
        at = d.parent();
    }
    std::fs::create_dir_all(dir)?;
    for d in missing.iter().rev() {
        if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
}

/// Reads an archive file back: its lines, in order.
///
/// # Errors
///
/// The file system's, or a line that is not an [`ArchiveLine`].
pub fn read_file(path: &Path) -> std::io::Result<Vec<ArchiveLine>> {
    use std::io::BufRead;
    let file = std::fs::File::open(path)?;
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    let mut out = Vec::new();
    for line in reader.lines() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(std::io::Error::other)?);
    }
    Ok(out)
}
