//! Worker pools: where a manager sends work too heavy or too blocking for
//! its own event loop.
//!
//! Reserved in the workspace layout (DESIGN.md section 2); thread and process
//! pools arrive with the workers issue. Nothing depends on this crate yet.

#![forbid(unsafe_code)]
