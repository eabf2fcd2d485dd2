//! The planner on both backends (PostgreSQL when `CAMPANILE_TEST_PG_URL` is set).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod changes;
mod engine;
mod harness;
mod lifecycle;
mod misfire;
mod overlap;
mod planning;
mod processes;
mod races;
mod reconcile;
