//! `campanile schedule …` and `campanile occurrence …`: a tenant's schedules and occurrences
//! on a running node, through its HTTP API (`--server`, `--key`), printed as tables or, with
//! `--json`, as the node's own answers.
//!
//! `client` sends requests and turns answers into exit codes, `table` lays text out, `show`
//! reads each kind of answer; `schedule` and `occurrence` are the commands.

mod client;
mod occurrence;
mod schedule;
mod show;
mod table;

pub(crate) use occurrence::{OccurrenceArgs, command as occurrence};
pub(crate) use schedule::{ScheduleArgs, command as schedule};
