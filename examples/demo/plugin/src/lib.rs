//! The demo application (`switchyard-demo`) as a loadable plugin: the
//! managers the `switchyard` binary links in for `switchyard up` with no
//! configuration, in a shared library that loads like any other plugin
//! (tests/plugins.rs loads it; bench/run_plugin_vs_static.sh measures the
//! two against each other). Nothing of its own: the demo crate exports the
//! plugin's symbols, and linking it here is what puts them in the library.

pub use switchyard_demo::*;
