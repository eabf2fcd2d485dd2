//! Campanile's domain types.
