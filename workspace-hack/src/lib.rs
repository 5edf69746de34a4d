//! Empty on purpose: this crate exists for the features its manifest asks of shared dependencies.
