//! A plugin links the SDK and the ABI, never the host's side: no library
//! loading, no tokio (so none of its networking), no worker pool.

use std::process::Command;

fn tree(package: &str) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree", "--locked", "-e", "normal", "--prefix", "none", "-p", package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn plugins_link_neither_the_host_nor_tokio() {
    for plugin in ["switchyard-example-shop", "switchyard-demo"] {
        let tree = tree(plugin);
        assert!(
            tree.contains("switchyard-manager-abi "),
            "{plugin} links the ABI crate:\n{tree}"
        );
        for crate_name in [
            "libloading ",
            "tokio ",
            "switchyard-manager-host ",
            "switchyard-worker ",
        ] {
            assert!(
                !tree.lines().any(|line| line.starts_with(crate_name)),
                "{plugin} depends on {crate_name}:\n{tree}"
            );
        }
    }
}
