//! Switchyard's measuring stick: load generation, and the zero-hop baseline
//! every Switchyard figure is compared against. The baseline is a plain
//! in-process hyper server answering the demo application's routes with the
//! same bytes, so that a benchmark run can put both side by side on the same
//! machine and report each Switchyard number as a ratio to it.
//!
//! - [`baseline`]: the in-process server (also the `switchyard-baseline` binary).
//! - [`load`]: the load generator (also the `switchyard-load` binary).
//! - [`suite`]: the scenario suite (the `switchyard-suite` binary).
//! - [`h3`]: the load generator's HTTP/3 client (`--http3`).
//! - [`tls`]: TLS for all three (a CA to trust or none, the baseline's
//!   certificate, the suite's test certificates).

pub mod baseline;
pub mod h3;
pub mod load;
pub mod suite;
pub mod tls;
