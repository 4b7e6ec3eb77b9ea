//! What the rules read of the route table: each routed event type's path
//! templates, so that a `prefix` rule covers an event that comes without a
//! path (a WebSocket message, a gRPC call) as it covers its routes. The
//! listener's route table holds one, made anew with every table it merges.

use std::collections::HashMap;

/// Each routed event type's path templates, and which snapshot of the
/// route table they were taken from.
#[derive(Default)]
pub struct EventPaths {
    paths: HashMap<String, Vec<String>>,
    generation: u64,
}

impl EventPaths {
    /// `paths` (event type to its templates) of snapshot `generation`.
    pub fn new(paths: HashMap<String, Vec<String>>, generation: u64) -> EventPaths {
        EventPaths { paths, generation }
    }

    /// Which snapshot of the route table this is (each merge counts one
    /// more).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The path templates of the routes of event type `name` (none for a
    /// type without a route).
    pub fn paths_of(&self, name: &str) -> &[String] {
        self.paths.get(name).map_or(&[], Vec::as_slice)
    }

    /// Every routed event type with its path templates.
    pub fn typed_paths(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.paths.iter().map(|(t, p)| (t.as_str(), p.as_slice()))
    }
}
