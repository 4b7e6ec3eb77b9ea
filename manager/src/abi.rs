//! The versioned C ABI between the manager host and a plugin library.
//!
//! A plugin exports two symbols: `switchyard_plugin_abi_version() -> u32`,
//! read first so that a mismatch is refused before anything else is
//! touched, and `switchyard_plugin_vtable() -> *const VTable`. Only C types
//! and bincode-encoded bytes ([`crate::messages`]) cross: a plugin built by
//! another compiler version loads as long as the ABI version matches. Each
//! side frees what it allocated (`VTable::free` for plugin buffers).
//!
//! All the unsafe code of the SDK is in this module.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use switchyard_proto::codec;

use crate::messages::{
    CreateArgs, Description, FromPlugin, JobOutput, LogLevel, RawBody, RawStream, ToPlugin,
};
use crate::registry::Manager;
use crate::runtime::Runtime;

/// The ABI this SDK speaks. Bump on any change to [`VTable`] or to the
/// encoding of [`crate::messages`].
///
/// v2: jobs (`FromPlugin::Job`, `ToPlugin::JobResult`, `ManagerEntry::run_job`).
/// v3: streaming bodies (`RawStream` in requests and responses,
/// `ToPlugin::Wake`, `HostApi::wake`).
pub const ABI_VERSION: u32 = 3;

/// Symbol of `extern "C" fn() -> u32`.
pub const ABI_SYMBOL: &[u8] = b"switchyard_plugin_abi_version\0";
/// Symbol of `extern "C" fn() -> *const VTable`.
pub const VTABLE_SYMBOL: &[u8] = b"switchyard_plugin_vtable\0";

/// Bytes allocated on one side of the boundary.
#[repr(C)]
pub struct Buffer {
    pub ptr: *mut u8,
    pub len: usize,
    pub cap: usize,
}

impl Buffer {
    fn from_vec(v: Vec<u8>) -> Buffer {
        let mut v = std::mem::ManuallyDrop::new(v);
        Buffer {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            cap: v.capacity(),
        }
    }

    fn empty() -> Buffer {
        Buffer::from_vec(Vec::new())
    }
}

/// What the host offers the plugin: logging, so that a slow handler's log
/// lines appear while it runs, not after; and a wake-up for plugin threads.
#[repr(C)]
pub struct HostApi {
    /// Logs a UTF-8 message. `level`: 0 error, 1 warn, 2 info, 3 debug.
    /// Callable from any thread.
    pub log: unsafe extern "C" fn(level: u32, correlation: u64, message: *const u8, len: usize),
    /// Asks the host to step the plugin soon (with `ToPlugin::Wake` if
    /// nothing else is pending). Callable from any thread, at any time.
    pub wake: unsafe extern "C" fn(),
}

unsafe extern "C" fn host_log(level: u32, correlation: u64, message: *const u8, len: usize) {
    // SAFETY: the plugin passes a readable `len`-byte buffer for the call.
    let message = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(message, len) });
    crate::host::log(LogLevel::from_code(level), correlation, &message);
}

unsafe extern "C" fn host_wake() {
    crate::host::wake();
}

/// The host side's [`HostApi`].
pub static HOST_API: HostApi = HostApi {
    log: host_log,
    wake: host_wake,
};

/// Hands a pipe's descriptors across the boundary: they leave Rust's
/// ownership here and must be [`adopt_stream`]ed exactly once on the other
/// side (same process, so the numbers stay valid).
pub(crate) fn release_stream(handle: switchyard_proto::StreamHandle) -> std::io::Result<RawStream> {
    use std::os::fd::IntoRawFd;
    let (ring, wake, length) = handle.into_parts().map_err(std::io::Error::other)?;
    Ok(RawStream {
        ring: ring.into_raw_fd(),
        wake: wake.into_raw_fd(),
        length,
    })
}

/// Hands a pool segment's body across the boundary (a duplicate of the
/// descriptor; the pool keeps its own).
pub(crate) fn release_pooled(body: &switchyard_proto::ShmBody) -> std::io::Result<RawBody> {
    use std::os::fd::IntoRawFd;
    Ok(RawBody::Pooled {
        fd: body.fd_clone().map_err(std::io::Error::other)?.into_raw_fd(),
        len: body.len(),
    })
}

/// Takes ownership of a response body's descriptors released by
/// [`release_stream`] or [`release_pooled`].
pub(crate) fn adopt_body(raw: RawBody) -> switchyard_proto::Result<switchyard_proto::Payload> {
    use std::os::fd::{FromRawFd, OwnedFd};
    match raw {
        RawBody::Stream(raw) => Ok(switchyard_proto::Payload::Stream(adopt_stream(raw))),
        RawBody::Pooled { fd, len } => {
            // SAFETY: as in `adopt_stream`: released once, adopted once.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            switchyard_proto::ShmBody::adopt_pooled(fd, len).map(switchyard_proto::Payload::Shm)
        }
    }
}

/// Takes ownership of descriptors released by [`release_stream`].
pub(crate) fn adopt_stream(raw: RawStream) -> switchyard_proto::StreamHandle {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: `raw` came from `release_stream` in this process, and the
    // message carrying it is consumed once: nothing else owns or closes
    // these descriptors.
    let (ring, wake) = unsafe { (OwnedFd::from_raw_fd(raw.ring), OwnedFd::from_raw_fd(raw.wake)) };
    switchyard_proto::StreamHandle::from_parts(ring, wake, raw.length)
}

/// One manager type a plugin library provides.
#[repr(C)]
pub struct ManagerEntry {
    /// `Manager::NAME`, UTF-8, not NUL-terminated.
    pub name_ptr: *const u8,
    pub name_len: usize,
    /// Creates an instance from bincode [`CreateArgs`]. On success returns the
    /// instance and writes the bincode [`Description`] to `out`; on failure
    /// returns null and writes a UTF-8 message to `out`.
    pub create: unsafe extern "C" fn(
        args: *const u8,
        len: usize,
        host: *const HostApi,
        out: *mut Buffer,
    ) -> *mut c_void,
    /// Feeds bincode `Vec<ToPlugin>`, writes bincode `Vec<FromPlugin>` to `out`.
    /// Returns false (with a UTF-8 message in `out`) if the input was unusable.
    pub step:
        unsafe extern "C" fn(instance: *mut c_void, input: *const u8, len: usize, out: *mut Buffer) -> bool,
    pub destroy: unsafe extern "C" fn(instance: *mut c_void),
    /// Runs one job function of this manager type, statelessly: no instance
    /// needed, callable from any thread at any time. `job_type` is the job's
    /// [`EventType`](switchyard_proto::EventType) number, `input` its bincode
    /// bytes. Writes the bincode [`JobOutput`] to `out` and returns true
    /// (a panicking job is a 500 output); false (with a UTF-8 message in
    /// `out`) only if the call itself could not be made.
    pub run_job: unsafe extern "C" fn(job_type: u64, input: *const u8, len: usize, out: *mut Buffer) -> bool,
}

// SAFETY: the entries only hold pointers to 'static data and functions.
unsafe impl Sync for ManagerEntry {}

/// What `switchyard_plugin_vtable` returns.
#[repr(C)]
pub struct VTable {
    pub abi_version: u32,
    pub managers: *const ManagerEntry,
    pub manager_count: usize,
    /// Frees a buffer the plugin wrote.
    pub free: unsafe extern "C" fn(buffer: Buffer),
}

// SAFETY: as for ManagerEntry.
unsafe impl Sync for VTable {}

/// The entry of manager type `M` (used by [`export_managers!`](crate::export_managers)).
#[doc(hidden)]
pub const fn entry<M: Manager>() -> ManagerEntry {
    ManagerEntry {
        name_ptr: M::NAME.as_ptr(),
        name_len: M::NAME.len(),
        create: create::<M>,
        step: step::<M>,
        destroy: destroy::<M>,
        run_job: run_job::<M>,
    }
}

/// Frees a [`Buffer`] made by this side.
#[doc(hidden)]
pub unsafe extern "C" fn free_buffer(buffer: Buffer) {
    // SAFETY: `buffer` came from `Buffer::from_vec` on this side of the
    // boundary and is freed once (the caller gives up ownership).
    drop(unsafe { Vec::from_raw_parts(buffer.ptr, buffer.len, buffer.cap) });
}

unsafe extern "C" fn create<M: Manager>(
    args: *const u8,
    len: usize,
    host: *const HostApi,
    out: *mut Buffer,
) -> *mut c_void {
    // SAFETY: the host passes a readable `len`-byte buffer for the call's
    // duration, and a HostApi that lives as long as the process.
    let (bytes, host): (&[u8], &'static HostApi) = unsafe { (std::slice::from_raw_parts(args, len), &*host) };
    let log: crate::runtime::LogSink = Arc::new(move |level: LogLevel, correlation: u64, message: &str| {
        // SAFETY: the host's log function takes a readable buffer for the call.
        unsafe { (host.log)(level.code(), correlation, message.as_ptr(), message.len()) }
    });
    // SAFETY: the host's wake function may be called from any thread.
    let wake: crate::runtime::WakeHost = Arc::new(move || unsafe { (host.wake)() });
    let made = catch_unwind(AssertUnwindSafe(|| {
        let args: CreateArgs = codec::decode(bytes).map_err(|e| format!("bad create arguments: {e}"))?;
        let (runtime, description) =
            Runtime::<M>::create(args, Some(log), Some(wake)).map_err(|e| e.message)?;
        let encoded = codec::encode(&description).map_err(|e| e.to_string())?;
        Ok::<_, String>((runtime, encoded))
    }));
    let (result, ptr) = match made {
        Ok(Ok((runtime, description))) => (description, Box::into_raw(Box::new(runtime)) as *mut c_void),
        Ok(Err(message)) => (message.into_bytes(), std::ptr::null_mut()),
        Err(_) => (b"the manager's create panicked".to_vec(), std::ptr::null_mut()),
    };
    // SAFETY: the host passes a valid, writable `out`.
    unsafe { out.write(Buffer::from_vec(result)) };
    ptr
}

unsafe extern "C" fn step<M: Manager>(
    instance: *mut c_void,
    input: *const u8,
    len: usize,
    out: *mut Buffer,
) -> bool {
    // SAFETY: `instance` came from `create::<M>` and is used by one thread at
    // a time (the host's); `input` is readable for `len` bytes.
    let (runtime, bytes) = unsafe {
        (
            &mut *(instance as *mut Runtime<M>),
            std::slice::from_raw_parts(input, len),
        )
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let inputs: Vec<ToPlugin> = codec::decode_local(bytes).map_err(|e| format!("bad step input: {e}"))?;
        codec::encode(&runtime.step(inputs)).map_err(|e| e.to_string())
    }));
    let (ok, bytes) = match outcome {
        Ok(Ok(bytes)) => (true, bytes),
        Ok(Err(message)) => (false, message.into_bytes()),
        Err(_) => (false, b"the plugin runtime panicked".to_vec()),
    };
    // SAFETY: the host passes a valid, writable `out`.
    unsafe { out.write(Buffer::from_vec(bytes)) };
    ok
}

unsafe extern "C" fn destroy<M: Manager>(instance: *mut c_void) {
    // SAFETY: `instance` came from `create::<M>` and is destroyed once.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        drop(unsafe { Box::from_raw(instance as *mut Runtime<M>) })
    }));
}

unsafe extern "C" fn run_job<M: Manager>(
    job_type: u64,
    input: *const u8,
    len: usize,
    out: *mut Buffer,
) -> bool {
    // SAFETY: the host passes a readable `len`-byte buffer for the call.
    let bytes = unsafe { std::slice::from_raw_parts(input, len) };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let output = crate::runtime::run_job::<M>(switchyard_proto::EventType(job_type), bytes);
        codec::encode(&output).map_err(|e| e.to_string())
    }));
    let (ok, bytes) = match outcome {
        Ok(Ok(bytes)) => (true, bytes),
        Ok(Err(message)) => (false, message.into_bytes()),
        Err(_) => (false, b"the plugin's job runner panicked".to_vec()),
    };
    // SAFETY: the host passes a valid, writable `out`.
    unsafe { out.write(Buffer::from_vec(bytes)) };
    ok
}

/// Exports the manager types of a plugin crate (a `cdylib`):
///
/// ```ignore
/// switchyard_manager::export_managers!(Orders, Inventory);
/// ```
#[macro_export]
macro_rules! export_managers {
    ($($manager:ty),+ $(,)?) => {
        $crate::__export_managers_with_abi!($crate::abi::ABI_VERSION; $($manager),+);
    };
}

/// Exports one manager type (see [`export_managers!`]).
#[macro_export]
macro_rules! export_manager {
    ($manager:ty) => {
        $crate::export_managers!($manager);
    };
}

/// Like [`export_managers!`] with a chosen ABI version: only for testing
/// that a host refuses a mismatch.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_managers_with_abi {
    ($abi:expr; $($manager:ty),+) => {
        static __SWITCHYARD_MANAGERS: &[$crate::abi::ManagerEntry] = &[$($crate::abi::entry::<$manager>()),+];
        static __SWITCHYARD_VTABLE: $crate::abi::VTable = $crate::abi::VTable {
            abi_version: $abi,
            managers: __SWITCHYARD_MANAGERS.as_ptr(),
            manager_count: __SWITCHYARD_MANAGERS.len(),
            free: $crate::abi::free_buffer,
        };
        /// The plugin's ABI version (read before anything else).
        #[unsafe(no_mangle)]
        pub extern "C" fn switchyard_plugin_abi_version() -> u32 {
            $abi
        }
        /// The plugin's table of manager types.
        #[unsafe(no_mangle)]
        pub extern "C" fn switchyard_plugin_vtable() -> *const $crate::abi::VTable {
            &__SWITCHYARD_VTABLE
        }
    };
}

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
        // SAFETY: the table's pointer and count describe a 'static slice.
        unsafe { std::slice::from_raw_parts(self.vtable.managers, self.vtable.manager_count) }
    }

    /// The manager types the library provides.
    pub fn kinds(&self) -> Vec<String> {
        self.entries()
            .iter()
            // SAFETY: name_ptr/name_len describe a 'static UTF-8 string.
            .map(|e| {
                String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(e.name_ptr, e.name_len) })
                    .into_owned()
            })
            .collect()
    }

    /// Whether the plugin was loaded from a file (not linked in).
    pub fn is_dynamic(&self) -> bool {
        matches!(self.origin, Origin::Library { .. })
    }

    fn take(&self, buffer: Buffer) -> Vec<u8> {
        // SAFETY: `buffer` was written by the plugin; copy it, then hand it
        // back to the plugin's allocator exactly once.
        let copy = unsafe { std::slice::from_raw_parts(buffer.ptr, buffer.len) }.to_vec();
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
            let bytes = unsafe { std::slice::from_raw_parts(out.ptr, out.len) }.to_vec();
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
