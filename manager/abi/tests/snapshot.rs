//! The boundary's shape, snapshotted: a change to the C types or to the
//! messages' encoding must come with a new `ABI_VERSION`, or a host would
//! load a plugin it misreads.
//!
//! The description covers the layout of every `repr(C)` type (size,
//! alignment, each field's offset and type, function signatures included),
//! the serde format of every message (traced with `serde-reflection`: field
//! and variant order and types, which is what bincode encodes), and the
//! bytes of a sample message under the wire codec's configuration.
//!
//! After an intended change: bump `ABI_VERSION`, then record the new shape
//! with `UPDATE_ABI_SNAPSHOT=1 cargo nextest run -p switchyard-manager-abi`.

use std::fmt::Write;
use std::mem::{align_of, offset_of, size_of};

use serde_reflection::{Tracer, TracerConfig};
use switchyard_manager_abi::messages::{
    Caller, CreateArgs, Description, FromPlugin, JobOutput, LogLevel, RawBody, RawStream, ToPlugin,
};
use switchyard_manager_abi::{ABI_VERSION, Buffer, HostApi, ManagerEntry, VTable};

const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/abi.snapshot");

/// Prints a `repr(C)` type's layout, and fails to compile unless the
/// fields listed are the type's fields, in full, with these types.
macro_rules! layout {
    ($out:expr, $ty:ident { $($field:ident: $fty:ty),* $(,)? }) => {{
        #[allow(clippy::let_underscore_untyped)]
        let _listed_in_full = |value: $ty| {
            let $ty { $($field),* } = value;
            $(let _: $fty = $field;)*
        };
        writeln!($out, "{} size={} align={}", stringify!($ty), size_of::<$ty>(), align_of::<$ty>()).unwrap();
        $(
            writeln!(
                $out,
                "  {} @{}: {}",
                stringify!($field),
                offset_of!($ty, $field),
                std::any::type_name::<$fty>()
            )
            .unwrap();
        )*
    }};
}

fn describe() -> String {
    let mut out = String::new();
    layout!(out, Buffer { ptr: *mut u8, len: usize, cap: usize });
    layout!(out, HostApi {
        log: unsafe extern "C" fn(u32, u64, *const u8, usize),
        wake: Option<unsafe extern "C" fn()>,
    });
    layout!(out, ManagerEntry {
        name_ptr: *const u8,
        name_len: usize,
        create: unsafe extern "C" fn(*const u8, usize, *const HostApi, *mut Buffer) -> *mut std::ffi::c_void,
        step: unsafe extern "C" fn(*mut std::ffi::c_void, *const u8, usize, *mut Buffer) -> bool,
        destroy: unsafe extern "C" fn(*mut std::ffi::c_void),
        run_job: unsafe extern "C" fn(u64, *const u8, usize, *mut Buffer) -> bool,
    });
    layout!(out, VTable {
        abi_version: u32,
        panic_strategy: u32,
        managers: *const ManagerEntry,
        manager_count: usize,
        free: unsafe extern "C" fn(Buffer),
    });

    let mut tracer = Tracer::new(TracerConfig::default());
    // A trace context refuses all-zero ids when read, so the tracer is
    // shown a real one first.
    let mut samples = serde_reflection::Samples::new();
    tracer
        .trace_value(
            &mut samples,
            &switchyard_proto::RequestContext {
                request_id: Some(switchyard_proto::RequestId::Made(1)),
                trace: Some(switchyard_proto::TraceContext::make()),
            },
        )
        .unwrap();
    tracer.trace_simple_type::<CreateArgs>().unwrap();
    tracer.trace_simple_type::<Description>().unwrap();
    tracer.trace_type::<ToPlugin>(&samples).unwrap();
    tracer.trace_type::<FromPlugin>(&samples).unwrap();
    tracer.trace_simple_type::<JobOutput>().unwrap();
    tracer.trace_simple_type::<LogLevel>().unwrap();
    tracer.trace_simple_type::<RawBody>().unwrap();
    tracer.trace_simple_type::<RawStream>().unwrap();
    tracer.trace_simple_type::<Caller>().unwrap();
    tracer
        .trace_simple_type::<switchyard_proto::api::TypeRole>()
        .unwrap();
    let registry = tracer.registry().unwrap();
    for (name, format) in &registry {
        writeln!(out, "{name}: {format:#?}").unwrap();
    }

    let sample = CreateArgs {
        name: "m".into(),
        instance: 1,
        config_json: "{}".into(),
        expose_errors: true,
        shm_threshold: 65536,
        shm_budget: 1 << 30,
        validation: false,
    };
    let bytes = switchyard_proto::codec::encode(&sample).unwrap();
    writeln!(out, "sample CreateArgs: {bytes:02x?}").unwrap();
    out
}

#[test]
fn the_boundary_matches_its_snapshot_for_this_abi_version() {
    let now = format!("abi_version: {ABI_VERSION}\n{}", describe());
    if std::env::var_os("UPDATE_ABI_SNAPSHOT").is_some() {
        std::fs::write(SNAPSHOT, &now).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(SNAPSHOT).unwrap_or_default();
    let recorded_version = recorded.lines().next().unwrap_or_default();
    let version_line = format!("abi_version: {ABI_VERSION}");
    if recorded_version == version_line {
        assert!(
            recorded == now,
            "the plugin boundary changed but ABI_VERSION is still {ABI_VERSION}: bump it in \
             manager/abi/src/lib.rs, then record the new shape with UPDATE_ABI_SNAPSHOT=1.\n\
             --- recorded\n{recorded}\n--- now\n{now}"
        );
    } else {
        panic!(
            "ABI_VERSION is {ABI_VERSION} but the snapshot records `{recorded_version}`: record the \
             new version's shape with UPDATE_ABI_SNAPSHOT=1 cargo nextest run -p switchyard-manager-abi"
        );
    }
}
