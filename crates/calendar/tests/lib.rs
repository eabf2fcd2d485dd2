//! Integration tests of the calendar engine: properties, a differential test against brute
//! force, and reviewed DST snapshot tables.

mod dst_tables;
mod properties;
