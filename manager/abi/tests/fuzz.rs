//! Property tests of the messages that cross the plugin boundary (issue
//! 12): whatever bytes a plugin (or a host) hands over, decoding them never
//! panics and never allocates out of proportion to them — with the wire
//! codec's limit (`codec::decode`) and with the boundary's own
//! (`codec::decode_local`, whose limit is the address space's). A few
//! hundred random and mutated inputs per message type.

use bytes::Bytes;
use proptest::prelude::*;
use switchyard_manager_abi::messages::{
    Caller, CreateArgs, Description, FromPlugin, JobOutput, LogLevel, RawBody, RawStream, ToPlugin,
};
use switchyard_proto::control::HandledType;
use switchyard_proto::{EventType, Meta, codec};

#[path = "../../../proto/tests/support/counting.rs"]
mod counting;

use counting::bounded;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 384,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn text() -> impl Strategy<Value = String> {
    ".{0,24}"
}

fn meta() -> impl Strategy<Value = Meta> {
    prop::collection::vec((text(), text()), 0..4).prop_map(Meta)
}

fn body() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..512).prop_map(Bytes::from)
}

fn raw_stream() -> impl Strategy<Value = RawStream> {
    (any::<i32>(), any::<i32>(), any::<Option<u64>>()).prop_map(|(ring, wake, length)| RawStream {
        ring,
        wake,
        length,
    })
}

fn to_plugin() -> impl Strategy<Value = ToPlugin> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u64>(),
            meta(),
            body(),
            prop::option::of(raw_stream()),
            any::<bool>(),
            any::<u128>(),
        )
            .prop_map(
                |(correlation, ty, meta, body, stream, client, id)| ToPlugin::Request {
                    correlation,
                    event_type: EventType(ty),
                    meta,
                    body,
                    stream,
                    caller: if client { Caller::Client } else { Caller::Manager },
                    context: switchyard_proto::RequestContext {
                        request_id: Some(switchyard_proto::RequestId::Made(id)),
                        trace: Some(switchyard_proto::TraceContext::make()),
                    },
                }
            ),
        (any::<u64>(), meta(), body()).prop_map(|(ty, meta, body)| ToPlugin::Notification {
            event_type: EventType(ty),
            meta,
            body,
        }),
        (any::<u64>(), any::<u16>(), meta(), body()).prop_map(|(call, status, meta, body)| {
            ToPlugin::CallResult {
                call,
                status,
                meta,
                body,
            }
        }),
        (any::<u64>(), any::<u16>(), body()).prop_map(|(job, status, body)| ToPlugin::JobResult {
            job,
            status,
            body
        }),
        Just(ToPlugin::Wake),
        any::<u64>().prop_map(|ahead_ms| ToPlugin::Timers { ahead_ms }),
        any::<u64>().prop_map(|correlation| ToPlugin::Cancel { correlation }),
    ]
}

fn from_plugin() -> impl Strategy<Value = FromPlugin> {
    let handle = prop::option::of(prop_oneof![
        raw_stream().prop_map(RawBody::Stream),
        (any::<i32>(), any::<u64>()).prop_map(|(fd, len)| RawBody::Pooled { fd, len }),
        (any::<i32>(), any::<u64>()).prop_map(|(fd, len)| RawBody::Sealed { fd, len }),
    ]);
    let level = prop_oneof![
        Just(LogLevel::Error),
        Just(LogLevel::Warn),
        Just(LogLevel::Info),
        Just(LogLevel::Debug)
    ];
    prop_oneof![
        (any::<u64>(), any::<u16>(), meta(), body(), handle).prop_map(
            |(correlation, status, meta, body, handle)| FromPlugin::Response {
                correlation,
                status,
                meta,
                body,
                handle,
            }
        ),
        (any::<u64>(), any::<u64>(), meta(), body(), any::<u64>()).prop_map(
            |(call, ty, meta, body, timeout_ms)| FromPlugin::Call {
                call,
                event_type: EventType(ty),
                meta,
                body,
                timeout_ms,
                context: switchyard_proto::RequestContext::default(),
            }
        ),
        (any::<u64>(), meta(), body()).prop_map(|(ty, meta, body)| FromPlugin::Notify {
            event_type: EventType(ty),
            meta,
            body,
        }),
        (any::<u64>(), any::<u64>(), body(), any::<u64>(), any::<u64>()).prop_map(
            |(job, ty, body, timeout_ms, correlation)| FromPlugin::Job {
                job,
                job_type: EventType(ty),
                body,
                timeout_ms,
                correlation,
            }
        ),
        (level, any::<u64>(), text()).prop_map(|(level, correlation, message)| FromPlugin::Log {
            level,
            correlation,
            message,
        }),
        any::<u64>().prop_map(|in_ms| FromPlugin::NextTimer { in_ms }),
        any::<u64>().prop_map(|id| FromPlugin::Cancel { id }),
    ]
}

/// `bytes` with up to 8 bytes flipped, and possibly cut short.
fn mutated(bytes: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = bytes.len().max(1);
    (
        prop::collection::vec((0..len, 1u8..=255), 0..8),
        prop::option::of(0..len),
    )
        .prop_map(move |(flips, cut)| {
            let mut out = bytes.clone();
            for (at, xor) in flips {
                if let Some(b) = out.get_mut(at) {
                    *b ^= xor;
                }
            }
            if let Some(cut) = cut {
                out.truncate(cut);
            }
            out
        })
}

/// Every boundary message decoded from `bytes`, both ways; none may panic
/// or allocate beyond the allowance.
fn decode_all(bytes: &[u8]) {
    let _ = bounded(bytes, codec::decode_local::<Vec<ToPlugin>>);
    let _ = bounded(bytes, codec::decode_local::<Vec<FromPlugin>>);
    let _ = bounded(bytes, codec::decode_local::<JobOutput>);
    let _ = bounded(bytes, codec::decode::<CreateArgs>);
    let _ = bounded(bytes, codec::decode::<Description>);
    let _ = bounded(bytes, codec::decode::<Vec<ToPlugin>>);
    let _ = bounded(bytes, codec::decode::<Vec<FromPlugin>>);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic_a_boundary_decoder(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        decode_all(&bytes);
    }

    #[test]
    fn mutated_step_inputs_never_panic(
        bytes in prop::collection::vec(to_plugin(), 0..6).prop_flat_map(|v| mutated(codec::encode(&v).unwrap()))
    ) {
        decode_all(&bytes);
    }

    #[test]
    fn mutated_step_outputs_never_panic(
        bytes in prop::collection::vec(from_plugin(), 0..6).prop_flat_map(|v| mutated(codec::encode(&v).unwrap()))
    ) {
        decode_all(&bytes);
    }

    #[test]
    fn mutated_create_args_and_descriptions_never_panic(
        bytes in prop_oneof![
            (text(), any::<u32>(), text(), any::<bool>(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
                |(name, instance, config_json, expose_errors, shm_threshold, shm_budget, validation)| {
                    codec::encode(&CreateArgs {
                        name, instance, config_json, expose_errors, shm_threshold, shm_budget, validation,
                    }).unwrap()
                }
            ),
            (text(), prop::collection::vec((text(), any::<u64>()), 0..4), any::<bool>()).prop_map(
                |(kind, handles, timers)| {
                    codec::encode(&Description {
                        kind,
                        subscribes: handles.iter().map(|h| EventType(h.1)).collect(),
                        handles: handles
                            .into_iter()
                            .map(|(name, ty)| HandledType { name, event_type: EventType(ty), route: None, needs: Default::default(), public: false })
                            .collect(),
                        timers,
                        types: Vec::new(),
                        notifications: Vec::new(),
                    }).unwrap()
                }
            ),
        ].prop_flat_map(mutated)
    ) {
        decode_all(&bytes);
    }

    #[test]
    fn step_messages_round_trip(inputs in prop::collection::vec(to_plugin(), 0..6)) {
        let bytes = codec::encode(&inputs).unwrap();
        let back: Vec<ToPlugin> = codec::decode_local(&bytes).unwrap();
        prop_assert_eq!(codec::encode(&back).unwrap(), bytes);
    }
}

/// The input the fuzzer found: a job output whose body claims ~3.5 GB in
/// six bytes. bincode allocated the claim before reading; now it fails
/// first.
#[test]
fn a_length_claiming_gigabytes_allocates_nothing() {
    let bytes = [0u8, 252, 184, 212, 7, 209];
    assert!(bounded(&bytes, codec::decode_local::<JobOutput>).is_err());
    let mut message = vec![1u8, 4, 0, 0];
    message.extend_from_slice(&[252, 0, 0, 0, 0xf0]);
    let _ = bounded(&message, codec::decode_local::<Vec<FromPlugin>>);
}
