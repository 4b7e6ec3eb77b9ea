//! The plugin side of the boundary: the `extern "C"` functions of each
//! manager type's [`ManagerEntry`] and the [`export_managers!`] macro that
//! puts them in a plugin's [`VTable`](switchyard_manager_abi::VTable).
//!
//! The C types and messages are `switchyard-manager-abi`'s; this module
//! turns them into calls on a [`Runtime`]. Every call catches panics, so a
//! panicking handler becomes an answer, never an unwind across `extern "C"`.
//! All the unsafe code of the SDK is here.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use switchyard_manager_abi::messages::{CreateArgs, LogLevel, ToPlugin};
use switchyard_manager_abi::{Buffer, HostApi, ManagerEntry};
use switchyard_proto::codec;

use crate::registry::Manager;
use crate::runtime::Runtime;

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
    crate::trace::install(log.clone());
    let wake: Option<crate::runtime::WakeHost> = host.wake.map(|wake| {
        // SAFETY: the host's wake function may be called from any thread.
        Arc::new(move || unsafe { wake() }) as crate::runtime::WakeHost
    });
    log_panics(&log);
    // Inside the plugin's tokio runtime (decision 0120): a pool or client
    // made in `create` finds its reactor.
    let _io = crate::reactor::enter();
    let made = catch_unwind(AssertUnwindSafe(|| {
        let args: CreateArgs = codec::decode(bytes).map_err(|e| format!("bad create arguments: {e}"))?;
        let (runtime, description) = Runtime::<M>::create(args, Some(log), wake).map_err(|e| e.message)?;
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

/// Sends this plugin's panics to the host's log as one ERROR record each,
/// the backtrace (when `RUST_BACKTRACE` enables one) inside it. The plugin
/// has its own copy of std, whose default hook would write the panic to
/// stderr line by line, where the supervisor merges each line as a record
/// of its own without a level. Installed once, by the first `create`.
fn log_panics(log: &crate::runtime::LogSink) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let log = log.clone();
    ONCE.call_once(move || {
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload_as_str().unwrap_or("Box<dyn Any>");
            let mut text = match info.location() {
                Some(at) => format!(
                    "panicked at {}:{}:{}: {message}",
                    at.file(),
                    at.line(),
                    at.column()
                ),
                None => format!("panicked: {message}"),
            };
            let backtrace = std::backtrace::Backtrace::capture();
            if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
                text.push_str(&format!("\nstack backtrace:\n{backtrace}"));
            }
            log(LogLevel::Error, 0, &text);
        }));
    });
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
    let _io = crate::reactor::enter();
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
    // The manager's pools and sockets close inside the runtime they were
    // made in.
    let _io = crate::reactor::enter();
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
    // A job may block on the plugin's runtime (`Handle::current().block_on`).
    let _io = crate::reactor::enter();
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
        static __SWITCHYARD_MANAGERS: &[$crate::abi::ManagerEntry] = &[$($crate::export::entry::<$manager>()),+];
        static __SWITCHYARD_VTABLE: $crate::abi::VTable = $crate::abi::VTable {
            abi_version: $abi,
            panic_strategy: $crate::abi::panic_strategy!(),
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
