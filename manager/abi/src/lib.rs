//! The plugin ABI: what crosses between a manager host and a plugin library.
//!
//! A manager plugin is a `cdylib` built against `switchyard-manager` (the
//! SDK); the manager host (`switchyard-manager-host`) loads it. Between the
//! two only what this crate defines travels: a few `repr(C)` types, the
//! bincode messages of [`messages`], and descriptors handed over by the
//! rules of [`handover`]. Both sides depend on this crate and on nothing of
//! each other, so a plugin built by another compiler still loads as long as
//! [`ABI_VERSION`] matches, and a plugin never links the host's side
//! (library loading, tokio's networking, the worker pool).
//!
//! A plugin exports two symbols: [`ABI_SYMBOL`] (`extern "C" fn() -> u32`),
//! read first so that a mismatch is refused before anything else is
//! touched, and [`VTABLE_SYMBOL`] (`extern "C" fn() -> *const VTable`).
//! Each side frees what it allocated ([`VTable::free`] for plugin buffers).
//!
//! # Layout
//! - this file: the C types ([`Buffer`], [`HostApi`], [`ManagerEntry`],
//!   [`VTable`]) and the version.
//! - [`messages`]: the bincode messages (create, step, jobs).
//! - [`handover`]: how shared-memory descriptors change hands across the
//!   boundary (the only unsafe code of this crate besides [`free_buffer`]).

pub mod handover;
pub mod messages;

use std::ffi::c_void;

/// The ABI this crate describes. Bump on any change to the C types or to
/// the encoding of [`messages`]; `tests/snapshot.rs` fails until you do.
///
/// v2: jobs (`FromPlugin::Job`, `ToPlugin::JobResult`, `ManagerEntry::run_job`).
/// v3: streaming bodies (`RawStream` in requests and responses,
/// `ToPlugin::Wake`, `HostApi::wake`).
/// v4: the ABI crate of its own; `VTable::panic_strategy`,
/// `ToPlugin::Timers`, `Description::timers`, `CreateArgs::validation`,
/// an optional `HostApi::wake`.
/// v5: the request context: `ToPlugin::Request::caller`,
/// `HandledType::needs` in the description (decision 0041).
/// v6: `Description::types`, the JSON Schemas of the manager's event types
/// (decision 0060).
/// v7: `FromPlugin::Job::correlation`, so a job's log lines in workers
/// name the request's trace (decision 0058).
/// v8: `FromPlugin::NextTimer`: the host steps a manager's timers when
/// they are due instead of every `TICK_PERIOD`.
/// v9: cancellation: `ToPlugin::Cancel` (a request its client gave up)
/// and `FromPlugin::Cancel` (a job or call no longer awaited).
/// v10: internal events: `HandledType::public` and
/// `Description::notifications` (decision 0108).
/// v11: `TypeRole::Form`, a multipart form's event described (decision 0125).
/// v12: the request id and trace context as a typed
/// `ToPlugin::Request::context` and `FromPlugin::Call::context` instead of
/// meta entries (decision 0146).
/// v13: `RawBody::Sealed`, a body the plugin keeps sealed and answers with
/// again, handed over as its memfd (decision 0160).
pub const ABI_VERSION: u32 = 13;

/// Symbol of `extern "C" fn() -> u32`.
pub const ABI_SYMBOL: &[u8] = b"switchyard_plugin_abi_version\0";
/// Symbol of `extern "C" fn() -> *const VTable`.
pub const VTABLE_SYMBOL: &[u8] = b"switchyard_plugin_vtable\0";

/// The resolution of a manager's timers, and how often a host steps a
/// manager that has timers ([`messages::ToPlugin::Timers`]) until the
/// plugin has said when the next one is due
/// ([`messages::FromPlugin::NextTimer`]).
pub const TICK_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);

/// [`VTable::panic_strategy`]: panics unwind, so the plugin's
/// `catch_unwind` turns a panicking handler into a 500.
pub const PANIC_UNWIND: u32 = 0;
/// [`VTable::panic_strategy`]: the plugin was built with `panic = "abort"`;
/// a panicking handler would kill its whole process.
pub const PANIC_ABORT: u32 = 1;

/// The panic strategy of the crate this expands in (for
/// [`VTable::panic_strategy`]; `export_managers!` evaluates it inside the
/// plugin, where the profile's `panic` setting applies).
#[macro_export]
macro_rules! panic_strategy {
    () => {
        if cfg!(panic = "abort") {
            $crate::PANIC_ABORT
        } else {
            $crate::PANIC_UNWIND
        }
    };
}

/// Bytes allocated on one side of the boundary.
#[repr(C)]
pub struct Buffer {
    pub ptr: *mut u8,
    pub len: usize,
    pub cap: usize,
}

impl Buffer {
    /// Gives `v`'s allocation to a buffer; whoever receives it hands it
    /// back to this side's [`free_buffer`].
    pub fn from_vec(v: Vec<u8>) -> Buffer {
        let mut v = std::mem::ManuallyDrop::new(v);
        Buffer {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            cap: v.capacity(),
        }
    }

    /// An empty buffer (no allocation), to be written by the other side.
    pub fn empty() -> Buffer {
        Buffer::from_vec(Vec::new())
    }

    /// The buffer's bytes.
    ///
    /// # Safety
    /// `ptr` and `len` must describe a live allocation written by one side
    /// of the boundary (as every `out` buffer is after a call returns).
    pub unsafe fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Frees a [`Buffer`] made by [`Buffer::from_vec`] on this side of the
/// boundary (each side exports its own as [`VTable::free`]).
///
/// # Safety
/// `buffer` came from `Buffer::from_vec` in this same library and is freed
/// once.
pub unsafe extern "C" fn free_buffer(buffer: Buffer) {
    // SAFETY: per this function's contract: the parts of a Vec of this
    // allocator, given up by the caller.
    drop(unsafe { Vec::from_raw_parts(buffer.ptr, buffer.len, buffer.cap) });
}

/// What the host offers the plugin.
#[repr(C)]
pub struct HostApi {
    /// Logs a UTF-8 message, so that a slow handler's lines appear while it
    /// runs, not after. `level`: see [`messages::LogLevel::code`]. Callable
    /// from any thread.
    pub log: unsafe extern "C" fn(level: u32, correlation: u64, message: *const u8, len: usize),
    /// Asks the host to step the plugin soon (with `ToPlugin::Wake` if
    /// nothing else is pending). Callable from any thread, at any time.
    /// `None`: the host steps only when it has input (in-process tests),
    /// and upload handlers then run inline.
    pub wake: Option<unsafe extern "C" fn()>,
}

/// One manager type a plugin library provides.
#[repr(C)]
pub struct ManagerEntry {
    /// `Manager::NAME`, UTF-8, not NUL-terminated.
    pub name_ptr: *const u8,
    pub name_len: usize,
    /// Creates an instance from bincode [`messages::CreateArgs`]. On
    /// success returns the instance and writes the bincode
    /// [`messages::Description`] to `out`; on failure returns null and
    /// writes a UTF-8 message to `out`.
    pub create: unsafe extern "C" fn(
        args: *const u8,
        len: usize,
        host: *const HostApi,
        out: *mut Buffer,
    ) -> *mut c_void,
    /// Feeds bincode `Vec<ToPlugin>`, writes bincode `Vec<FromPlugin>` to
    /// `out`. Returns false (with a UTF-8 message in `out`) if the input
    /// was unusable. Called by one thread at a time per instance.
    pub step:
        unsafe extern "C" fn(instance: *mut c_void, input: *const u8, len: usize, out: *mut Buffer) -> bool,
    /// Destroys an instance made by `create`, once.
    pub destroy: unsafe extern "C" fn(instance: *mut c_void),
    /// Runs one job function of this manager type, statelessly: no instance
    /// needed, callable from any thread at any time. `job_type` is the
    /// job's `EventType` number, `input` its bincode bytes. Writes the
    /// bincode [`messages::JobOutput`] to `out` and returns true (a
    /// panicking job is a 500 output); false (with a UTF-8 message in
    /// `out`) only if the call itself could not be made.
    pub run_job: unsafe extern "C" fn(job_type: u64, input: *const u8, len: usize, out: *mut Buffer) -> bool,
}

// SAFETY: the entries only hold pointers to 'static data and functions.
unsafe impl Sync for ManagerEntry {}

impl ManagerEntry {
    /// The manager type's name.
    pub fn name(&self) -> String {
        // SAFETY: name_ptr/name_len describe a 'static UTF-8 string of the
        // library (ABI contract).
        let bytes = unsafe { std::slice::from_raw_parts(self.name_ptr, self.name_len) };
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// What `switchyard_plugin_vtable` returns.
#[repr(C)]
pub struct VTable {
    pub abi_version: u32,
    /// [`PANIC_UNWIND`] or [`PANIC_ABORT`].
    pub panic_strategy: u32,
    pub managers: *const ManagerEntry,
    pub manager_count: usize,
    /// Frees a buffer the plugin wrote.
    pub free: unsafe extern "C" fn(buffer: Buffer),
}

// SAFETY: as for ManagerEntry.
unsafe impl Sync for VTable {}

impl VTable {
    /// The manager types of the table.
    ///
    /// # Safety
    /// `managers` and `manager_count` must describe a 'static slice (as a
    /// table made by `export_managers!` does).
    pub unsafe fn entries(&self) -> &[ManagerEntry] {
        if self.manager_count == 0 {
            return &[];
        }
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts(self.managers, self.manager_count) }
    }
}
