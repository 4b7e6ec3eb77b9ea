//! With the `grpc` feature: compiles proto/switchyard/v1/events.proto with
//! protox (pure Rust, no system protoc) and generates the tonic client and
//! server plus the encoded file descriptor set (for server reflection).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "grpc")]
    grpc();
}

#[cfg(feature = "grpc")]
fn grpc() {
    let proto = "proto/switchyard/v1/events.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"]).unwrap_or_else(|e| panic!("{e:?}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(
        out.join("switchyard_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )
    .expect("write the descriptor set");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .bytes(".switchyard.v1")
        .compile_fds(fds)
        .expect("generate the gRPC code");
}
