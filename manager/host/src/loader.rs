//! Loading a plugin library and calling into it: the host side of the C ABI
//! (`switchyard-manager-abi`).
//!
//! [`Library`] opens a plugin (or takes a linked-in table), checks its ABI
//! version and panic strategy, and lists its manager types; [`Plugin`] is
//! one live instance, stepped with batches of messages. All the unsafe code
//! of the host is in this module.

use std::ffi::c_void;
use std::path::Path;
use std::sync::Arc;

use switchyard_manager_abi::messages::{CreateArgs, Description, FromPlugin, JobOutput, LogLevel, ToPlugin};
use switchyard_manager_abi::{
    ABI_SYMBOL, ABI_VERSION, Buffer, HostApi, ManagerEntry, PANIC_ABORT, VTABLE_SYMBOL, VTable,
};
use switchyard_proto::codec;

unsafe extern "C" fn host_log(level: u32, correlation: u64, message: *const u8, len: usize) {
    // SAFETY: the plugin passes a readable `len`-byte buffer for the call.
    let message = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(message, len) });
    crate::callbacks::log(LogLevel::from_code(level), correlation, &message);
}

unsafe extern "C" fn host_wake() {
    crate::callbacks::wake();
}

/// The host side's [`HostApi`].
static HOST_API: HostApi = HostApi {
    log: host_log,
    wake: Some(host_wake),
};

/// Why a plugin cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load plugin {path}: {message}")]
    Open { path: String, message: String },
    #[error("{path} is not a Switchyard plugin (no `switchyard_plugin_abi_version` symbol)")]
    NotAPlugin { path: String },
    #[error(
        "plugin {path} was built for plugin ABI v{found}, but this switchyard speaks ABI v{expected}; rebuild it against this version of switchyard-manager"
    )]
    AbiMismatch { path: String, found: u32, expected: u32 },
    #[error("plugin {path} has no manager `{kind}` (it has: {available})")]
    NoSuchManager {
        path: String,
        kind: String,
        available: String,
    },
    #[error("manager `{kind}` failed to start: {message}")]
    Create { kind: String, message: String },
    #[error("plugin call failed: {0}")]
    Step(String),
    #[error("plugin sent undecodable bytes: {0}")]
    Decode(String),
    #[error("worker pool: {0}")]
    Workers(String),
    #[error("cannot start the watchdog thread: {0}")]
    Watchdog(std::io::Error),
    #[error(
        "plugin {path} was built with `panic = \"abort\"`: a panicking handler would kill its whole process instead of answering 500; remove `panic = \"abort\"` from the profile it is built with"
    )]
    PanicAbort { path: String },
}

/// Where a plugin's code lives.
enum Origin {
    /// Loaded with `dlopen`; held so the code stays mapped. Never unloaded:
    /// a plugin's own threads (stream producers, upload handlers, job
    /// runners) may still be running its code when the instance is gone.
    Library { handle: Arc<libloading::Library> },
    /// Linked into this binary.
    Static,
}

/// A loaded plugin library (or a linked-in vtable).
pub struct Library {
    vtable: &'static VTable,
    origin: Origin,
    path: String,
}

impl Library {
    /// Loads the library at `path` and checks its ABI version.
    pub fn open(path: &Path) -> Result<Library, LoadError> {
        let shown = path.display().to_string();
        // SAFETY: loading runs the library's initializers; a plugin is code
        // the operator chose to run in this group.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::Open {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        // SAFETY: the symbol, when present, has this signature (ABI contract).
        let version = unsafe { lib.get::<unsafe extern "C" fn() -> u32>(ABI_SYMBOL) }
            .map_err(|_| LoadError::NotAPlugin { path: shown.clone() })?;
        // SAFETY: calling the plugin's version function, which takes nothing.
        let found = unsafe { version() };
        if found != ABI_VERSION {
            return Err(LoadError::AbiMismatch {
                path: shown,
                found,
                expected: ABI_VERSION,
            });
        }
        // SAFETY: same contract; the returned table is 'static inside the
        // library, which we keep loaded for as long as the table is used.
        let vtable = unsafe {
            let get = lib
                .get::<unsafe extern "C" fn() -> *const VTable>(VTABLE_SYMBOL)
                .map_err(|_| LoadError::NotAPlugin { path: shown.clone() })?;
            &*get()
        };
        if vtable.abi_version != ABI_VERSION {
            return Err(LoadError::AbiMismatch {
                path: shown,
                found: vtable.abi_version,
                expected: ABI_VERSION,
            });
        }
        // The boundary's `catch_unwind` cannot stop an aborting panic.
        if vtable.panic_strategy == PANIC_ABORT {
            return Err(LoadError::PanicAbort { path: shown });
        }
        let handle = Arc::new(lib);
        // Kept loaded until the process exits (see `Origin::Library`):
        // unloading code a thread still runs would crash the process.
        std::mem::forget(handle.clone());
        Ok(Library {
            vtable,
            origin: Origin::Library { handle },
            path: shown,
        })
    }

    /// A plugin crate linked into this binary, by the
    /// `switchyard_plugin_vtable` function its `export_managers!` generated.
    pub fn linked(vtable: extern "C" fn() -> *const VTable, name: &str) -> Library {
        // SAFETY: `export_managers!` generates this function to return a
        // pointer to a `static` table of the linked crate.
        let vtable = unsafe { &*vtable() };
        Library {
            vtable,
            origin: Origin::Static,
            path: format!("<built-in {name}>"),
        }
    }

    fn entries(&self) -> &[ManagerEntry] {
        // SAFETY: the table was made by `export_managers!` (checked by its
        // ABI version): a 'static slice.
        unsafe { self.vtable.entries() }
    }

    /// The manager types the library provides.
    pub fn kinds(&self) -> Vec<String> {
        self.entries().iter().map(ManagerEntry::name).collect()
    }

    /// Whether the plugin was loaded from a file (not linked in).
    pub fn is_dynamic(&self) -> bool {
        matches!(self.origin, Origin::Library { .. })
    }

    fn take(&self, buffer: Buffer) -> Vec<u8> {
        // SAFETY: `buffer` was written by the plugin; copy it, then hand it
        // back to the plugin's allocator exactly once.
        let copy = unsafe { buffer.bytes() }.to_vec();
        unsafe { (self.vtable.free)(buffer) };
        copy
    }

    fn index_of(&self, kind: &str) -> Result<usize, LoadError> {
        let kinds = self.kinds();
        kinds
            .iter()
            .position(|k| k == kind)
            .ok_or_else(|| LoadError::NoSuchManager {
                path: self.path.clone(),
                kind: kind.to_owned(),
                available: kinds.join(", "),
            })
    }

    /// Runs the job functions of manager type `kind` (for worker threads and
    /// worker processes): thread-safe, and keeps the library loaded.
    pub fn job_runner(&self, kind: &str) -> Result<switchyard_worker::Runner, LoadError> {
        let index = self.index_of(kind)?;
        Ok(self.runner_at(index))
    }

    fn runner_at(&self, index: usize) -> switchyard_worker::Runner {
        let run = self.entries()[index].run_job;
        let free = self.vtable.free;
        let keep = match &self.origin {
            Origin::Library { handle } => Some(handle.clone()),
            Origin::Static => None,
        };
        Arc::new(move |job_type: switchyard_proto::EventType, input: &[u8]| {
            let _loaded = &keep;
            let mut out = Buffer::empty();
            // SAFETY: `run_job` may be called from any thread (ABI contract);
            // valid input slice and out pointer for the call's duration; the
            // library stays loaded while `keep` holds it.
            let ok = unsafe { run(job_type.0, input.as_ptr(), input.len(), &mut out) };
            // SAFETY: `out` was written by the plugin; copy it, then hand it
            // back to the plugin's allocator exactly once.
            let bytes = unsafe { out.bytes() }.to_vec();
            unsafe { free(out) };
            if !ok {
                return switchyard_worker::JobOutput::error(500, String::from_utf8_lossy(&bytes));
            }
            match codec::decode_local::<JobOutput>(&bytes) {
                Ok(o) => switchyard_worker::JobOutput {
                    status: o.status,
                    body: o.body,
                },
                Err(e) => {
                    switchyard_worker::JobOutput::error(500, format!("plugin sent undecodable bytes: {e}"))
                }
            }
        })
    }

    /// Creates an instance of manager type `kind`.
    pub fn instantiate(self, kind: &str, args: &CreateArgs) -> Result<(Plugin, Description), LoadError> {
        let index = self.index_of(kind)?;
        let encoded = codec::encode(args).map_err(|e| LoadError::Decode(e.to_string()))?;
        let entry = &self.entries()[index];
        let mut out = Buffer::empty();
        // SAFETY: valid input slice and out pointer for the call's duration.
        let instance = unsafe { (entry.create)(encoded.as_ptr(), encoded.len(), &HOST_API, &mut out) };
        let bytes = self.take(out);
        if instance.is_null() {
            return Err(LoadError::Create {
                kind: kind.to_owned(),
                message: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        let description: Description = codec::decode(&bytes).map_err(|e| LoadError::Decode(e.to_string()))?;
        Ok((
            Plugin {
                library: self,
                index,
                instance,
            },
            description,
        ))
    }
}

/// A live manager instance inside a plugin.
pub struct Plugin {
    library: Library,
    index: usize,
    instance: *mut c_void,
}

impl Plugin {
    /// One round over the boundary: inputs in, outputs out.
    pub fn step(&mut self, inputs: &[ToPlugin]) -> Result<Vec<FromPlugin>, LoadError> {
        let encoded = codec::encode(inputs).map_err(|e| LoadError::Decode(e.to_string()))?;
        let entry = &self.library.entries()[self.index];
        let mut out = Buffer::empty();
        // SAFETY: `instance` is alive (destroyed only in Drop) and used from
        // this one `&mut self` at a time.
        let ok = unsafe { (entry.step)(self.instance, encoded.as_ptr(), encoded.len(), &mut out) };
        let bytes = self.library.take(out);
        if !ok {
            return Err(LoadError::Step(String::from_utf8_lossy(&bytes).into_owned()));
        }
        codec::decode_local(&bytes).map_err(|e| LoadError::Decode(e.to_string()))
    }
}

impl Plugin {
    /// Runs this manager type's job functions; see [`Library::job_runner`].
    pub fn job_runner(&self) -> switchyard_worker::Runner {
        self.library.runner_at(self.index)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let entry = &self.library.entries()[self.index];
        // SAFETY: the instance was created by this entry and is destroyed
        // once, before the library (a field dropped after this) is unloaded.
        unsafe { (entry.destroy)(self.instance) };
    }
}
