//! Links `switchyard` as a position-dependent executable (`-no-pie`).
//!
//! Every process of the group is this one binary. As a PIE, each process
//! relocates the binary's 1 MiB of `.data.rel.ro` at start (61 000
//! relocations) into private pages: 12 MiB of the demo group's 63 MiB of
//! PSS, and part of every child's start. Linked at a fixed address the
//! pages stay the file's, shared by all (decision 0159, which weighs the
//! address-space randomisation of the executable this gives up).
//! `SWITCHYARD_PIE=1` at build time keeps the default PIE.

fn main() {
    println!("cargo:rerun-if-env-changed=SWITCHYARD_PIE");
    let pie = std::env::var_os("SWITCHYARD_PIE").is_some_and(|v| v == "1");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && !pie {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
