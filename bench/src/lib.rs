//! Switchyard's measuring stick: load generation, and the zero-hop baseline
//! every Switchyard figure is compared against. The baseline is a plain
//! in-process hyper server answering the demo application's routes with the
//! same bytes, so that a benchmark run can put both side by side on the same
//! machine and report each Switchyard number as a ratio to it.
//!
//! - [`baseline`]: the in-process server (also the `switchyard-baseline` binary).
//! - [`group`]: a group started by a benchmark binary, waited on until it serves.
//! - [`load`]: the load generator, crate `switchyard-loadgen` (also the
//!   `switchyard-load` binary); the product binary links that crate alone.
//! - [`suite`]: the scenario suite (the `switchyard-suite` binary).
//! - [`tls`]: the servers' TLS (the baseline's certificate, the suite's
//!   test certificates).

pub mod baseline;
pub mod group;
pub mod suite;
pub mod tls;

pub use switchyard_loadgen as load;
