//! Test fixture: a well-formed manager exported with a plugin ABI version
//! from the future, so that tests can show a host refusing it at load.

#![forbid(unsafe_code)]

use switchyard_manager::{Config, Error, Manager, Registry};

/// Serves nothing; only its ABI version matters.
pub struct FromTheFuture;

impl Manager for FromTheFuture {
    const NAME: &'static str = "future";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(FromTheFuture)
    }
    fn register(_: &mut Registry<Self>) {}
}

switchyard_manager::__export_managers_with_abi!(999; FromTheFuture);
